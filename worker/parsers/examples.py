"""Realistic output templates for every registered parser, the marker tokens of each family, and
the reasoning + tool pairings vLLM serves together. Used by ``worker.bench_parsers`` (parse
throughput per family) and by ``tests/test_parser_families.py`` (marker table; every parser has a
template that parses into the expected structure).

A template is model output in the family's real format (see each ``families/`` module's
docstring) with two padding slots: ``PAD_R`` (inside the reasoning block) and ``PAD_C`` (answer
content, or a long string argument where the format has no room for prose around the calls).
The benchmark fills them with ordinary prose to reach a token budget; everything else is kept
verbatim so the markup stays complete.

Markers: the strings of each family that are added/special tokens in the real vocabularies. The
benchmark and the tests add them as special tokens to the Qwen3 tokenizer (which already has
``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``); the text-level parsers must not
depend on that.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: padding slots in templates (never produced by a model, never inside a marker)
PAD_R = "\x00R\x00"
PAD_C = "\x00C\x00"

# markers per family, added to the tokenizer as special tokens (they are special/added tokens
# in the real vocabularies; the text-level parsers must not depend on it)
MARKERS: dict[str, list[str]] = {
    "deepseek": ["<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                 "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"],
    "mistral": ["[THINK]", "[/THINK]"],
    "cohere": ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"],
    "glm": ["<|assistant|>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
    "kimi": ["<|im_assistant|>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
             "<|tool_call_argument_begin|>", "<|tool_call_end|>"],
    "minimax": ["<minimax:tool_call>", "</minimax:tool_call>"],
    "seed": ["<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>"],
    "ernie": ["<response>", "</response>"],
    "hunyuan": ["<tool_calls>", "</tool_calls>"],
    "step3": ["<｜tool_calls_begin｜>", "<｜tool_calls_end｜>", "<｜tool_call_begin｜>", "<｜tool_call_end｜>",
              "<｜tool_sep｜>"],
    "gemma4": ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|turn>"],
    "granite": ["<|tool_call|>"],
    "internlm": ["<|action_start|>", "<|plugin|>", "<|action_end|>"],
    "longcat": ["<longcat_tool_call>", "</longcat_tool_call>"],
    "llama4": ["<|python_start|>", "<|python_end|>"],
    "harmony": ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"],
    "plain": [],
    # families only the benchmark templates use (not in the golden vectors)
    "deepseek_v4": ["<｜Assistant｜>", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"],
    "mistral_tools": ["[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]"],
    "llama3": ["<|python_tag|>"],
}

#: the tools every tool template calls (``notes`` takes argument padding)
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"},
                                          "notes": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                      "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]

#: ordinary prose used for padding: ASCII, no quotes, brackets, braces, ``<`` or marker words
PROSE = ("The user wants the forecast for Paris over the next few days, so I should check which units "
         "they prefer, whether they plan to travel soon, and whether wind or humidity matter for their "
         "plans. A short answer with the key figures first and the details after it reads best. ")


@dataclass(frozen=True)
class Example:
    """One output template. ``markers``: keys of :data:`MARKERS`; ``calls``: tool calls the
    template yields (0 for reasoning parsers); ``reasoning``: the reasoning block is returned as
    reasoning (False for parsers that keep it in the content); ``kwargs``: the request's
    ``chat_template_kwargs``."""

    template: str
    markers: tuple[str, ...] = ("plain",)
    calls: int = 0
    reasoning: bool = True
    kwargs: dict[str, Any] | None = None
    #: reasoning examples: where the answer starts (the tool template replaces it in a pairing)
    answer_at: int = -1


def _r(prefix: str, answer: str, marker: str, **kw: Any) -> Example:
    return Example(template=prefix + answer, markers=(marker,), answer_at=len(prefix), **kw)


def _t(template: str, marker: str, calls: int) -> Example:
    return Example(template=template, markers=(marker,), calls=calls)


R, C = PAD_R, PAD_C
_ANS = C + " The forecast is mild."

REASONING_EXAMPLES: dict[str, Example] = {
    "qwen3": _r(f"<think>\n{R}\n</think>\n\n", _ANS, "plain"),
    "deepseek_r1": _r(f"{R}\n</think>\n\n", _ANS, "deepseek"),
    "deepseek_v3": _r(f"{R}</think>", _ANS, "deepseek", kwargs={"thinking": True}),
    "deepseek_v4": _r(f"{R}</think>", _ANS, "deepseek_v4"),
    "mistral": _r(f"[THINK]{R}[/THINK]", _ANS, "mistral"),
    "cohere_command3": Example(template=f"<|START_THINKING|>{R}<|END_THINKING|><|START_RESPONSE|>{_ANS}<|END_RESPONSE|>",
                               markers=("cohere",)),
    "nemotron_v3": _r(f"<think>\n{R}\n</think>\n", _ANS, "plain"),
    "granite": _r(f"Here is my thought process: {R}\nHere is my response: ", _ANS, "plain"),
    "glm45": _r(f"<think>{R}</think>", _ANS, "glm"),
    "glm47": _r(f"<think>{R}</think>", _ANS, "glm"),
    "kimi_k2": _r(f"<think>{R}</think>", _ANS, "kimi"),
    "minimax_m2": _r(f"{R}\n</think>\n\n", _ANS, "minimax"),
    "minimax_m2_append_think": _r(f"{R}\n</think>\n\n", _ANS, "minimax", reasoning=False),
    "openai_gptoss": Example(template=f"<|channel|>analysis<|message|>{R}<|end|><|start|>assistant<|channel|>final"
                                      f"<|message|>{_ANS}", markers=("harmony",)),
    "seed_oss": _r(f"<seed:think>{R}</seed:think>", _ANS, "seed"),
    "ernie45": Example(template=f"{R}\n</think>\n\n<response>\n{_ANS}\n</response>\n", markers=("ernie",)),
    "hunyuan_a13b": Example(template=f"<think>\n{R}\n</think>\n<answer>\n{_ANS}\n</answer>", markers=("plain",)),
    "olmo3": _r(f"<think>{R}</think>", _ANS, "plain"),
    "step3": _r(f"{R}\n</think>\n", _ANS, "plain"),
    "gemma4": _r(f"<|channel>thought\n{R}<channel|>", _ANS, "gemma4"),
}

_W = '{"city": "Paris", "days": 3}'
_WN = '{"city": "Paris", "days": 3, "notes": "' + C + '"}'
_TM = '{"tz": "CET"}'
_DSML_BODY = ('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
              '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
              '<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="tz" string="true">CET</｜DSML｜parameter>\n'
              '</｜DSML｜invoke>\n')
_CODER = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
          "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n"
          "</parameter>\n</function>\n</tool_call>")
_HARMONY_CALL = ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + _WN + "<|call|>")

TOOL_EXAMPLES: dict[str, Example] = {
    "hermes": _t(f'{C}\n<tool_call>\n{{"name": "get_weather", "arguments": {_W}}}\n</tool_call>\n'
                 f'<tool_call>\n{{"name": "get_time", "arguments": {_TM}}}\n</tool_call>', "plain", 2),
    "qwen3_coder": _t(f"{C}\n{_CODER}", "plain", 2),
    "qwen3_xml": _t(f"{C}\n{_CODER}", "plain", 2),
    "deepseek_v3": _t(f"{C}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{_W}\n```"
                      f"<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{_TM}\n```"
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "deepseek", 2),
    "deepseek_v31": _t(f"{C}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{_W}<｜tool▁call▁end｜>"
                       f"<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{_TM}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "deepseek", 2),
    "deepseek_v32": _t(f"{C}\n\n<｜DSML｜function_calls>\n{_DSML_BODY}</｜DSML｜function_calls>", "deepseek", 2),
    "deepseek_v4": _t(f"{C}\n\n<｜DSML｜tool_calls>\n{_DSML_BODY}</｜DSML｜tool_calls>", "deepseek_v4", 2),
    "kimi_k2": _t(f"{C}<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                  f"{_W}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{_TM}"
                  "<|tool_call_end|><|tool_calls_section_end|>", "kimi", 2),
    "glm45": _t(f"{C}\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"
                "</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>\n"
                "<arg_value>CET</arg_value>\n</tool_call>", "glm", 2),
    "glm47": _t(f"{C}<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
                "<arg_value>3</arg_value></tool_call><tool_call>get_time<arg_key>tz</arg_key><arg_value>CET</arg_value>"
                "</tool_call>", "glm", 2),
    "minimax_m2": _t(f'{C}\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                     '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="tz">'
                     'CET</parameter>\n</invoke>\n</minimax:tool_call>', "minimax", 2),
    "seed_oss": _t(f"{C}\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</seed:tool_call>\n<seed:tool_call>\n"
                   "<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</seed:tool_call>", "seed", 2),
    "ernie45": _t(f'{C}\n<tool_call>\n{{"name": "get_weather", "arguments": {_W}}}\n</tool_call>\n', "ernie", 1),
    "granite4": _t(f'{C}<tool_call>{{"name": "get_weather", "arguments": {_W}}}</tool_call>\n'
                   f'<tool_call>{{"name": "get_time", "arguments": {_TM}}}</tool_call>', "plain", 2),
    "longcat": _t(f'{C}<longcat_tool_call>{{"name": "get_weather", "arguments": {_W}}}</longcat_tool_call>',
                  "longcat", 1),
    "hunyuan_a13b": _t(f'{C}<tool_calls>[{{"name": "get_weather", "arguments": {_W}}}, '
                       f'{{"name": "get_time", "arguments": {_TM}}}]</tool_calls>', "hunyuan", 2),
    "jamba": _t(f'{C}<tool_calls>[{{"name": "get_weather", "arguments": {_W}}}, '
                f'{{"name": "get_time", "arguments": {_TM}}}]</tool_calls>', "hunyuan", 2),
    "step3": _t(f'{C}<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">'
                '<steptml:parameter name="city">Paris</steptml:parameter><steptml:parameter name="days">3'
                '</steptml:parameter></steptml:invoke><｜tool_call_end｜>\n<｜tool_call_begin｜>function<｜tool_sep｜>'
                '<steptml:invoke name="get_time"><steptml:parameter name="tz">CET</steptml:parameter></steptml:invoke>'
                "<｜tool_call_end｜><｜tool_calls_end｜>", "step3", 2),
    "gemma4": _t(f'{C}<|tool_call>call:get_weather{{city:<|"|>Paris<|"|>,days:3}}<tool_call|>'
                 '<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>', "gemma4", 2),
    "granite": _t(f'<|tool_call|>[{{"name": "get_weather", "arguments": {_WN}}}, '
                  f'{{"name": "get_time", "arguments": {_TM}}}]', "granite", 2),
    "granite-20b-fc": _t(f'{C} <function_call> {{"name": "get_weather", "arguments": {_W}}} '
                         f'<function_call> {{"name": "get_time", "arguments": {_TM}}}', "plain", 2),
    "internlm": _t(f'{C}<|action_start|><|plugin|>\n{{"name": "get_weather", "parameters": {_W}}}<|action_end|>',
                   "internlm", 1),
    "phi4_mini_json": _t(f'functools[{{"name": "get_weather", "arguments": {_WN}}}, '
                         f'{{"name": "get_time", "arguments": {_TM}}}]', "plain", 2),
    "xlam": _t(f'[{{"name": "get_weather", "arguments": {_WN}}}, {{"name": "get_time", "arguments": {_TM}}}]',
               "plain", 2),
    "pythonic": _t(f'[get_weather(city="Paris", days=3, notes="{C}"), get_time(tz="CET")]', "plain", 2),
    "llama4_pythonic": _t(f'<|python_start|>[get_weather(city="Paris", days=3, notes="{C}"), get_time(tz="CET")]'
                          "<|python_end|>", "llama4", 2),
    "llama4_json": _t(f'{{"name": "get_weather", "parameters": {_WN}}}', "plain", 1),
    "llama3_json": _t(f'<|python_tag|>{{"name": "get_weather", "parameters": {_WN}}}; '
                      f'{{"name": "get_time", "parameters": {_TM}}}', "llama3", 2),
    "mistral": _t(f'{C}[TOOL_CALLS][{{"name": "get_weather", "arguments": {_W}}}, '
                  f'{{"name": "get_time", "arguments": {_TM}}}]', "mistral_tools", 2),
    "olmo3": _t(f'{C}<function_calls>\nget_weather(city="Paris", days=3)\nget_time(tz="CET")\n</function_calls>',
                "plain", 2),
    "openai": _t(_HARMONY_CALL, "harmony", 1),
}

#: reasoning parser -> tool parser pairs vLLM serves together (one model family each), with the
#: combined template when prefixing the tool template with the reasoning block is not the format
PAIRINGS: list[tuple[str, str]] = [
    ("qwen3", "hermes"), ("qwen3", "qwen3_coder"), ("deepseek_r1", "deepseek_v3"), ("deepseek_v3", "deepseek_v31"),
    ("deepseek_v3", "deepseek_v32"), ("deepseek_v4", "deepseek_v4"), ("kimi_k2", "kimi_k2"), ("glm45", "glm45"),
    ("glm47", "glm47"), ("minimax_m2", "minimax_m2"), ("openai_gptoss", "openai"), ("seed_oss", "seed_oss"),
    ("ernie45", "ernie45"), ("hunyuan_a13b", "hunyuan_a13b"), ("step3", "step3"), ("gemma4", "gemma4"),
    ("olmo3", "olmo3"), ("granite", "granite"), ("mistral", "mistral"), ("nemotron_v3", "qwen3_coder"),
]

_PAIR_TEMPLATES: dict[tuple[str, str], str] = {
    ("openai_gptoss", "openai"): f"<|channel|>analysis<|message|>{R}<|end|><|start|>assistant" + _HARMONY_CALL,
    ("hunyuan_a13b", "hunyuan_a13b"): (f"<think>\n{R}\n</think>\n<answer>\n{C}<tool_calls>[{{\"name\": \"get_weather\", "
                                       f"\"arguments\": {_W}}}, {{\"name\": \"get_time\", \"arguments\": {_TM}}}]"
                                       "</tool_calls>\n</answer>"),
    ("ernie45", "ernie45"): f'{R}\n</think>\n\n{TOOL_EXAMPLES["ernie45"].template}',
}


def pair_example(reasoning: str, tool: str) -> Example:
    """The combined template of a pairing: the reasoning block, then the tool template."""
    r, t = REASONING_EXAMPLES[reasoning], TOOL_EXAMPLES[tool]
    template = _PAIR_TEMPLATES.get((reasoning, tool))
    if template is None:
        template = r.template[:r.answer_at] + t.template
    markers = tuple(dict.fromkeys(r.markers + t.markers))
    return Example(template=template, markers=markers, calls=t.calls, reasoning=r.reasoning, kwargs=r.kwargs)


@dataclass(frozen=True)
class Case:
    """One benchmark / check run: ``kind`` is ``reasoning``, ``tool`` or ``pair``."""

    name: str
    kind: str
    reasoning_parser: str | None
    tool_parser: str | None
    example: Example
    tools: list[dict[str, Any]] | None = field(default=None)


def cases() -> list[Case]:
    """Every reasoning parser alone, every tool parser alone (tools, ``tool_choice`` auto), and
    every pairing."""
    out = [Case(n, "reasoning", n, None, e) for n, e in REASONING_EXAMPLES.items()]
    out += [Case(n, "tool", None, n, e, TOOLS) for n, e in TOOL_EXAMPLES.items()]
    out += [Case(f"{r}+{t}", "pair", r, t, pair_example(r, t), TOOLS) for r, t in PAIRINGS]
    return out
