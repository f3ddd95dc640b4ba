"""Parser vectors shared by the parser test modules: the Qwen3 test tokenizer with a family's markers
added (``tokenizer``), the vector type ``V`` and its constructors ``R``/``T``, the standard calls
``W``/``TM``, delta splits and the run of a vector through a ``ParserStack`` (text level); and the
token-level split machinery over the parity corpus (``CASES``, ``chunks``, ``setup``,
``run_ids``)."""
from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from tokenizers import Tokenizer as HFTokenizer

from schemas import DerenderChatRequest
from tests.parity import corpus, service
from tests.parity_tools import to_requests
from worker.bench.parsers import build_ids, family_tokenizer
from worker.config import ServedModelConfig
from worker.core import derender as D
from worker.core.detokenize import IncrementalDetokenizer
from worker.core.tokenizers import FastTokenizer, Tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import Delta, RequestContext
from worker.parsers.examples import MARKERS
from worker.parsers.stack import ParserStack

TOK_JSON = Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "qwen3" / "tokenizer.json"


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]


@functools.lru_cache(maxsize=1)
def base_json() -> str:
    return TOK_JSON.read_text(encoding="utf-8")


@functools.cache
def tokenizer(family: str) -> Tokenizer:
    fast = HFTokenizer.from_str(base_json())
    if MARKERS[family]:
        fast.add_special_tokens(MARKERS[family])
    return FastTokenizer.from_fast(fast, path=f"<qwen3+{family}>")


@dataclass
class V:
    """One golden vector: parsers, output text, expected final reasoning/content/calls."""

    id: str
    reasoning_parser: str | None
    tool_parser: str | None
    family: str
    text: str
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] | None = field(default_factory=lambda: TOOLS)
    parallel: bool = True
    kwargs: dict[str, Any] | None = None
    finish: str | None = None  # expected finish_reason when the stop was natural


def R(id, name, fam, text, reasoning="", content="", **kw):  # noqa: N802
    return V(id=f"{name}:{id}", reasoning_parser=name, tool_parser=None, family=fam, text=text,
             reasoning=reasoning, content=content, tools=None, **kw)


def T(id, name, fam, text, content="", calls=(), **kw):  # noqa: N802
    return V(id=f"{name}:{id}", reasoning_parser=kw.pop("rp", None), tool_parser=name, family=fam, text=text,
             content=content, calls=list(calls), reasoning=kw.pop("reasoning", ""), **kw)


W = ("get_weather", {"city": "Paris"})


TM = ("get_time", {"tz": "CET"})


def splits(text: str) -> list[list[str]]:
    out = [[text], list(text)]
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        parts, i = [], 0
        while i < len(text):
            n = rng.randint(1, 9)
            parts.append(text[i:i + n])
            i += n
        out.append(parts)
    return out


def stack_for(v: V) -> ParserStack:
    tok = tokenizer(v.family)
    return ParserStack(make_reasoning_parser(v.reasoning_parser, tok), make_tool_parser(v.tool_parser, tok),
                       enable_auto_tool_choice=True)


def finish_reason(mode: str, n_calls: int) -> str:
    """vLLM's rule for a natural stop: ``tool_calls`` when an auto request produced calls."""
    return "tool_calls" if mode == "auto" and n_calls else "stop"


def run(v: V, parts: list[str]) -> tuple[str, str, list[tuple[str, Any]], str]:
    stack = stack_for(v)
    ctx = RequestContext(tools=v.tools, tool_choice=v.tool_choice, parallel_tool_calls=v.parallel,
                         chat_template_kwargs=v.kwargs)
    st = stack.initial_state(ctx)
    reasoning, content = [], []
    calls: dict[int, list[str]] = {}
    names: dict[int, str] = {}

    def take(d):
        reasoning.append(d.reasoning)
        content.append(d.content)
        for c in d.tool_calls:
            if c.name is not None:
                assert c.index not in names, "a call's name comes once"
                names[c.index] = c.name
            calls.setdefault(c.index, []).append(c.arguments)

    for p in parts:
        take(stack.feed(st, p, []))
        st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    take(stack.finish(st))
    assert sorted(calls) == list(range(len(calls))), "call indexes are 0..n-1"
    out_calls = [(names[i], json.loads("".join(calls[i]))) for i in sorted(calls)]
    return "".join(reasoning), "".join(content), out_calls, finish_reason(st.mode, len(out_calls))


MODELS = ("qwen3", "qwen3-coder", "deepseek-v4", "deepseek-v31-markup", "mistral-7b-v0.3",
          "mistral-v7-mistral-mode", "llama3")


def cases() -> list[dict]:
    return [c for c in corpus() if c["model"] in MODELS and c["endpoint"] == "chat"
            and (c.get("expected") or {}).get("nonstream") and not (c["expected"].get("error"))]


CASES = cases()


def outcome(d: Delta) -> tuple:
    calls = D.merge_tool_calls("r", 0, d, "chatcmpl-tool")
    return (d.reasoning, d.content, [(c.function.name, c.function.arguments) for c in calls],
            d.reasoning_tokens)


def chunks(ids: list[int], how: str, rng: random.Random) -> list[list[int]]:
    if how == "one":
        return [ids]
    out, i = [], 0
    while i < len(ids):
        n = {"1": 1, "3": 3}.get(how) or rng.randint(1, 7)
        out.append(ids[i:i + n])
        i += n
    return out


def setup(case: dict):
    body = msgspec.json.decode(json.dumps(to_requests.nonstream_body(case)).encode(), type=DerenderChatRequest)
    rt = service().runtime(case["model"])
    req = body.chat_request or D._DEFAULT_CHAT_REQUEST
    gr = body.generate_response
    prompt_ids = body.prompt_token_ids if body.prompt_token_ids is not None else gr.prompt_token_ids
    ctx = D.request_context(req, prompt_ids)
    skip = D.effective_skip_special_tokens(rt, req.skip_special_tokens, rt.stack.tool_mode(ctx))
    return rt, req, gr, prompt_ids, ctx, skip


def run_ids(rt, ctx, req, prompt_ids, skip, ids, chunks, roundtrip: bool) -> tuple[tuple, str]:
    stack = rt.stack
    special = rt.tokenizer.special_ids if skip else frozenset()
    detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=skip,
                                   spaces_between_special_tokens=req.spaces_between_special_tokens,
                                   prompt_token_ids=prompt_ids)
    st = stack.initial_state(ctx)
    total = Delta()
    text_all = ""
    for chunk in chunks:
        text = detok.add(chunk)
        text_all += text
        total.extend(stack.feed(st, text, [t for t in chunk if t not in special]))
        if roundtrip:
            st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    total.extend(stack.finish(st))
    return outcome(total), text_all


VECTORS: list[V] = [
    # ----------------------------------------------------------------- reasoning families --
    R("r1", "deepseek_r1", "deepseek", "<think>\nhmm\n</think>\n\nAnswer.", "\nhmm\n", "\n\nAnswer."),
    R("r2", "deepseek_r1", "deepseek", "hmm</think>ok", "hmm", "ok"),
    R("r3", "deepseek_r1", "deepseek", "still thinking", "still thinking"),
    R("r1", "mistral", "mistral", "[THINK]2+2 is 4.[/THINK]The answer is 4.", "2+2 is 4.", "The answer is 4."),
    R("r4", "mistral", "mistral", "No thinking here.", "", "No thinking here."),
    R("r3", "mistral", "mistral", "Intro [THINK]cut off", "cut off", "Intro "),
    R("r2", "mistral", "mistral", "stray[/THINK] end", "", "stray end"),
    R("r1", "cohere_command3", "cohere",
      "<|START_THINKING|>Check units.<|END_THINKING|><|START_RESPONSE|>5 km.<|END_RESPONSE|>", "Check units.", "5 km."),
    R("r4", "cohere_command3", "cohere", "Plain answer.", "", "Plain answer."),
    # nemotron_v3 / minimax_m2: the reasoning's trailing whitespace is template framing (vLLM's
    # strip_trailing_reasoning_whitespace): dropped, whatever comes after; content untouched
    R("r1", "nemotron_v3", "plain", "<think>\nUser greets.\n</think>\nHello!", "\nUser greets.", "\nHello!"),
    R("r1f", "nemotron_v3", "plain", "<think>\nR\n</think>\nA", "\nR", "\nA"),
    R("r1ws", "nemotron_v3", "plain", "<think>\na \n\n b\t\n \n</think>\n\nA", "\na \n\n b", "\n\nA"),
    R("r2ws", "nemotron_v3", "plain", "\n\n</think>A", "", "A"),
    R("r3", "nemotron_v3", "plain", "thinking forever", "thinking forever"),
    R("r3ws", "nemotron_v3", "plain", "<think>\nthinking \n", "\nthinking"),
    R("r5", "nemotron_v3", "plain", "Just the answer.", "", "Just the answer.", kwargs={"enable_thinking": False}),
    R("r1", "granite", "plain", "Here is my thought process: 2+2. Here is my response: 4", " 2+2. ", " 4"),
    R("r1b", "granite", "plain", "Here's my thought process:a\nHere's my response:b", "a\n", "b"),
    R("r4", "granite", "plain", "Hello there.", "", "Hello there."),
    R("r1", "glm45", "glm", "<think>Let me see.</think>It is 4.", "Let me see.", "It is 4."),
    R("r4", "glm45", "glm", "It is 4.", "", "It is 4."),
    R("r5", "glm45", "glm", "It is 4.", "", "It is 4.", kwargs={"enable_thinking": False}),
    R("r1", "glm47", "glm", "<think>a</think>b", "a", "b"),
    R("r1", "kimi_k2", "kimi", "<think>plan</think>Done.", "plan", "Done."),
    R("r2", "kimi_k2", "kimi", "plan</think>Done.", "plan", "Done."),
    R("r5", "kimi_k2", "kimi", "plan</think>Done.", "", "plan</think>Done.", kwargs={"thinking": False}),
    R("r2", "minimax_m2", "minimax", "weigh options\n</think>\n\nPick A.", "weigh options", "\n\nPick A."),
    R("r2f", "minimax_m2", "minimax", "R\n</think>\n\nA", "R", "\n\nA"),
    R("r1", "minimax_m2", "minimax", "<think>\nR\n</think>\n\nA", "\nR", "\n\nA"),
    R("r2ws", "minimax_m2", "minimax", "one\n\ntwo \n</think>\n\n", "one\n\ntwo", "\n\n"),
    R("r3", "minimax_m2", "minimax", "weigh options", "weigh options"),
    R("r3ws", "minimax_m2", "minimax", "weigh options\n\n", "weigh options"),
    R("r2", "minimax_m2_append_think", "minimax", "weigh\n</think>\nA.", "", "<think>weigh\n</think>\nA."),
    R("r1", "minimax_m2_append_think", "minimax", "<think>weigh</think>A.", "", "<think>weigh</think>A."),
    R("r4", "minimax_m2_append_think", "minimax", "<thi", "", "<think><thi"),
    R("r1", "openai_gptoss", "harmony",
      "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
      "User asks 2+2.", "4"),
    R("r3", "openai_gptoss", "harmony", "<|channel|>analysis<|message|>cut", "cut"),
    R("r4", "openai_gptoss", "harmony", "no harmony markup", "", "no harmony markup"),
    R("r1b", "openai_gptoss", "harmony", "<|channel|>final<|message|>Hi<|end|>", "", "Hi"),
    R("r1", "seed_oss", "seed", "<seed:think>budget ok</seed:think>Answer", "budget ok", "Answer"),
    R("r2", "seed_oss", "seed", "budget ok</seed:think>Answer", "budget ok", "Answer"),
    R("r1", "ernie45", "ernie", "abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n", "def"),
    R("r1b", "ernie45", "ernie", "abc\n</think>\ndef", "abc\n", "def"),
    R("r3", "ernie45", "ernie", "abc", "abc"),
    R("r1", "hunyuan_a13b", "plain", "<think>\nEasy.\n</think>\n<answer>\n42\n</answer>", "Easy.", "42"),
    R("r4", "hunyuan_a13b", "plain", "42", "", "42"),
    R("r1", "olmo3", "plain", "<think>hmm</think>Yes.", "hmm", "Yes."),
    R("r2", "olmo3", "plain", "hmm</think>Yes.", "hmm", "Yes."),
    R("r2", "step3", "plain", "consider\n</think>\nYes.", "consider\n", "\nYes."),
    R("r3", "step3", "plain", "consider", "consider"),
    R("r1", "gemma4", "gemma4", "<|channel>thought\nUser wants X.<channel|>Here is X.", "User wants X.", "Here is X."),
    R("r1b", "gemma4", "gemma4", "<|channel>thoughtful<channel|>A", "thoughtful", "A"),
    R("r4", "gemma4", "gemma4", "Here is X.", "", "Here is X."),
    R("r3", "gemma4", "gemma4", "<|channel>thought\nhmm", "hmm"),
    # ---------------------------------------------------------------------- tool families --
    # kimi_k2
    T("1", "kimi_k2", "kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', calls=[W],
      finish="tool_calls"),
    T("2", "kimi_k2", "kimi", "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
      '<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>', "Sure.", [W, TM]),
    T("2p", "kimi_k2", "kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
      '<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|><|tool_calls_section_end|>', "", [W], parallel=False),
    T("3", "kimi_k2", "kimi", "No tools needed.", "No tools needed.", finish="stop"),
    T("4", "kimi_k2", "kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{city: Paris}<|tool_call_end|><|tool_calls_section_end|>",
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{city: Paris}<|tool_call_end|><|tool_calls_section_end|>"),
    T("5", "kimi_k2", "kimi", '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
      '<|tool_call_argument_begin|>{"city": "Paris"}',
      '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'),
    T("7", "kimi_k2", "kimi", "<think>need weather<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', calls=[W],
      rp="kimi_k2", reasoning="need weather"),
    # glm45 / glm47
    T("1", "glm45", "glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", calls=[("get_weather", {"city": "Paris", "days": 3})]),
    T("1s", "glm45", "glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n</tool_call>",
      calls=[("get_weather", {"city": "123"})]),
    T("2", "glm45", "glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n"
      "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>", calls=[W, TM]),
    T("3", "glm45", "glm", "Nothing to call.", "Nothing to call."),
    T("4", "glm45", "glm", "<tool_call>get weather<arg_key>city</arg_value></tool_call>",
      "<tool_call>get weather<arg_key>city</arg_value></tool_call>"),
    T("5", "glm45", "glm", "<tool_call>get_weather\n<arg_key>city</arg_key>", "<tool_call>get_weather\n<arg_key>city</arg_key>"),
    T("7", "glm45", "glm", "<think>call it</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Paris</arg_value>\n</tool_call>", calls=[W], rp="glm45", reasoning="call it"),
    T("7b", "glm45", "glm", "<think>call it<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
      "</tool_call>", calls=[W], rp="glm45", reasoning="call it"),
    T("1", "glm47", "glm", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
      calls=[W]),
    T("1n", "glm47", "glm", "<tool_call>get_time</tool_call>", calls=[("get_time", {})]),
    # minimax_m2
    T("1", "minimax_m2", "minimax", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
      '</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
      calls=[("get_weather", {"city": "Paris", "days": 2})]),
    T("2", "minimax_m2", "minimax", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
      '</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="tz">CET</parameter>\n</invoke>\n'
      '</minimax:tool_call>', calls=[W, TM]),
    T("3", "minimax_m2", "minimax", "Plain.", "Plain."),
    T("4", "minimax_m2", "minimax", '<minimax:tool_call><invoke>oops</invoke></minimax:tool_call>',
      '<minimax:tool_call><invoke>oops</invoke></minimax:tool_call>'),
    T("5", "minimax_m2", "minimax", '<minimax:tool_call><invoke name="get_weather">',
      '<minimax:tool_call><invoke name="get_weather">'),
    T("7", "minimax_m2", "minimax", 'weigh</think>\n<minimax:tool_call><invoke name="get_weather"><parameter name="city">'
      'Paris</parameter></invoke></minimax:tool_call>', calls=[W], rp="minimax_m2", reasoning="weigh"),
    T("7ws", "minimax_m2", "minimax", 'weigh\n</think>\n\n<minimax:tool_call><invoke name="get_weather"><parameter '
      'name="city">Paris</parameter></invoke></minimax:tool_call>', "", calls=[W], rp="minimax_m2",
      reasoning="weigh"),
    T("7nemotron", "qwen3_coder", "plain", "<think>\nneed weather\n</think>\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", calls=[W], rp="nemotron_v3",
      reasoning="\nneed weather"),
    # seed_oss
    T("1", "seed_oss", "seed", "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n4\n</parameter>\n</function>\n</seed:tool_call>",
      calls=[("get_weather", {"city": "Paris", "days": 4})]),
    T("2", "seed_oss", "seed", "<seed:tool_call><function=get_weather><parameter=city>Paris</parameter></function>"
      "</seed:tool_call><seed:tool_call><function=get_time><parameter=tz>CET</parameter></function></seed:tool_call>",
      calls=[W, TM]),
    T("4", "seed_oss", "seed", "<seed:tool_call>no function</seed:tool_call>", "<seed:tool_call>no function</seed:tool_call>"),
    T("5", "seed_oss", "seed", "<seed:tool_call><function=get_weather>", "<seed:tool_call><function=get_weather>"),
    T("7", "seed_oss", "seed", "<seed:think>use tool</seed:think><seed:tool_call><function=get_weather>"
      "<parameter=city>Paris</parameter></function></seed:tool_call>", calls=[W], rp="seed_oss", reasoning="use tool"),
    # ernie45 / granite4 / longcat (Hermes-like JSON blocks)
    T("1", "ernie45", "plain", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
      calls=[W]),
    T("4", "ernie45", "plain", "<tool_call>\n{bad json}\n</tool_call>", "<tool_call>\n{bad json}\n</tool_call>"),
    T("7", "ernie45", "ernie", 'think\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
      "\n</tool_call>\n", calls=[W], rp="ernie45", reasoning="think\n"),
    T("1", "granite4", "plain", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
      calls=[W]),
    T("2", "granite4", "plain", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
      '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>', calls=[W, TM]),
    T("5", "granite4", "plain", '<tool_call>{"name": "get_weather"', '<tool_call>{"name": "get_weather"'),
    T("1", "longcat", "longcat", '<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
      "</longcat_tool_call>", calls=[W]),
    T("3", "longcat", "longcat", "Hi.", "Hi."),
    # hunyuan_a13b / jamba (JSON list blocks)
    T("2", "hunyuan_a13b", "hunyuan", '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
      '{"name": "get_time", "arguments": {"tz": "CET"}}]</tool_calls>', calls=[W, TM]),
    T("4", "hunyuan_a13b", "hunyuan", "<tool_calls>[oops]</tool_calls>", "<tool_calls>[oops]</tool_calls>"),
    T("7", "hunyuan_a13b", "hunyuan", '<think>\nweather\n</think>\n<answer>\n<tool_calls>[{"name": "get_weather", '
      '"arguments": {"city": "Paris"}}]</tool_calls>\n</answer>', calls=[W], rp="hunyuan_a13b", reasoning="weather"),
    T("1", "jamba", "hunyuan", '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>',
      calls=[W]),
    T("5", "jamba", "hunyuan", '<tool_calls>[{"name": "get_weather"', '<tool_calls>[{"name": "get_weather"'),
    # step3
    T("1", "step3", "step3", '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter><steptml:parameter name="days">5'
      "</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>",
      calls=[("get_weather", {"city": "Paris", "days": 5})]),
    T("2", "step3", "step3", '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜>'
      '\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_time"><steptml:parameter name="tz">CET'
      "</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>", calls=[W, TM]),
    T("5", "step3", "step3", "<｜tool_calls_begin｜><｜tool_call_begin｜>function", "<｜tool_calls_begin｜><｜tool_call_begin｜>function"),
    T("7", "step3", "step3", 'go\n</think>\n<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜>'
      "<｜tool_calls_end｜>", "", [W], rp="step3", reasoning="go\n"),
    # deepseek_v3 / deepseek_v32
    T("1", "deepseek_v3", "deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', calls=[W]),
    T("2", "deepseek_v3", "deepseek", "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n'
      '{"tz": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Checking.", [W, TM]),
    T("4", "deepseek_v3", "deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "{no fence}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n{no fence}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    T("7", "deepseek_v3", "deepseek", "<think>need tool</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', calls=[W], rp="deepseek_r1",
      reasoning="need tool"),
    T("1", "deepseek_v32", "deepseek", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter '
      'name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">3'
      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>", calls=[("get_weather", {"city": "Paris", "days": 3})]),
    T("5", "deepseek_v32", "deepseek", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">',
      '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">'),
    # gemma4
    T("1", "gemma4", "gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
      calls=[("get_weather", {"city": "Paris", "days": 3})]),
    T("1n", "gemma4", "gemma4", '<|tool_call>call:get_weather{city:<|"|>a, b {c}<|"|>,o:{k:[1,true,<|"|>x<|"|>],n:null}}'
      "<tool_call|>", calls=[("get_weather", {"city": "a, b {c}", "o": {"k": [1, True, "x"], "n": None}})]),
    T("2", "gemma4", "gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
      '<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>', calls=[W, TM]),
    T("4", "gemma4", "gemma4", '<|tool_call>get_weather{city:Paris}<tool_call|>', '<|tool_call>get_weather{city:Paris}<tool_call|>'),
    T("5", "gemma4", "gemma4", '<|tool_call>call:get_weather{city:<|"|>Pa', '<|tool_call>call:get_weather{city:<|"|>Pa'),
    T("7", "gemma4", "gemma4", '<|channel>thought\nneed it<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
      calls=[W], rp="gemma4", reasoning="need it"),
    # granite (3.x) / granite-20b-fc
    T("1", "granite", "granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', calls=[W]),
    T("1b", "granite", "granite", ' [{"name": "get_weather", "arguments": {"city": "Paris"}}]', calls=[W]),
    T("2", "granite", "granite", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
      '{"name": "get_time", "arguments": {"tz": "CET"}}]', calls=[W, TM]),
    T("3", "granite", "granite", "  Hello [not a call]", "  Hello [not a call]"),
    T("4", "granite", "granite", '<|tool_call|>[{"name": "get_weather", ', '<|tool_call|>[{"name": "get_weather", '),
    T("2", "granite-20b-fc", "plain", 'Sure. <function_call> {"name": "get_weather", "arguments": {"city": "Paris"}} '
      '<function_call> {"name": "get_time", "arguments": {"tz": "CET"}}', "Sure. ", [W, TM]),
    T("4", "granite-20b-fc", "plain", '<function_call> {"name": oops}', '<function_call> {"name": oops}'),
    # internlm
    T("1", "internlm", "internlm", 'Let me check.<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": '
      '{"city": "Paris"}}<|action_end|>', "Let me check.", [W]),
    T("5", "internlm", "internlm", '<|action_start|><|plugin|>\n{"name": "get_weather"',
      '<|action_start|><|plugin|>\n{"name": "get_weather"'),
    # phi4_mini_json
    T("1", "phi4_mini_json", "plain", 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]', calls=[W]),
    T("4", "phi4_mini_json", "plain", 'functools[{"name": "get_weather", oops]', 'functools[{"name": "get_weather", oops]'),
    T("3", "phi4_mini_json", "plain", "I used functools once.", "I used functools once."),
    # xlam
    T("1", "xlam", "plain", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', calls=[W]),
    T("1f", "xlam", "plain", '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```', calls=[W]),
    T("1t", "xlam", "plain", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', calls=[W]),
    T("3", "xlam", "plain", "The weather is nice.", "The weather is nice."),
    T("4", "xlam", "plain", "[1, 2, 3]", "[1, 2, 3]"),
    # pythonic / llama4_pythonic / llama4_json / olmo3
    T("2", "pythonic", "plain", '[get_weather(city="Paris"), get_time(tz="CET")]', calls=[W, TM]),
    T("1", "pythonic", "plain", "[get_weather(city='Paris', days=-2)]", calls=[("get_weather", {"city": "Paris", "days": -2})]),
    T("3", "pythonic", "plain", "Hello [world]", "Hello [world]"),
    T("4", "pythonic", "plain", "[get_weather(city=Paris)]", "[get_weather(city=Paris)]"),
    T("5", "pythonic", "plain", '[get_weather(city="Paris"', '[get_weather(city="Paris"'),
    T("1", "llama4_pythonic", "llama4", '<|python_start|>[get_weather(city="Paris")]<|python_end|>', calls=[W]),
    T("1b", "llama4_pythonic", "llama4", '[get_weather(city="Paris")]', calls=[W]),
    T("5", "llama4_pythonic", "llama4", '<|python_start|>[get_weather(city="Paris"',
      '<|python_start|>[get_weather(city="Paris"'),
    T("1", "llama4_json", "plain", '{"name": "get_weather", "parameters": {"city": "Paris"}}', calls=[W]),
    T("2", "olmo3", "plain", '<function_calls>\nget_weather(city="Paris")\nget_time(tz="CET")\n</function_calls>',
      calls=[W, TM]),
    T("1", "olmo3", "plain", "<function_calls>\nget_weather(city=\"Paris\", days=null, x=true)\n</function_calls>",
      calls=[("get_weather", {"city": "Paris", "days": None, "x": True})]),
    T("5", "olmo3", "plain", '<function_calls>\nget_weather(city="Pa', '<function_calls>\nget_weather(city="Pa'),
    T("7", "olmo3", "plain", '<think>tool</think><function_calls>\nget_weather(city="Paris")\n</function_calls>',
      calls=[W], rp="olmo3", reasoning="tool"),
    # openai (gpt-oss Harmony)
    T("1", "openai", "harmony", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
      '{"city": "Paris"}<|call|>', calls=[W]),
    T("1b", "openai", "harmony", '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
      '{"city": "Paris"}<|call|>', calls=[W]),
    T("3", "openai", "harmony", "<|channel|>final<|message|>All good.<|return|>", "All good."),
    T("4", "openai", "harmony", "<|channel|>commentary to=functions.get_weather<|message|>{city}<|call|>",
      "<|channel|>commentary to=functions.get_weather<|message|>{city}<|call|>"),
    T("5", "openai", "harmony", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}',
      '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}'),
    T("7", "openai", "harmony", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
      'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>', calls=[W],
      rp="openai_gptoss", reasoning="Need weather."),
    T("7b", "openai", "harmony", "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
      "<|message|>Answer.<|return|>", "Answer.", rp="openai_gptoss", reasoning="Think."),
    # 8: tool_choice none / required / named, 9: finish_reason
    T("8none", "kimi_k2", "kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', tool_choice="none",
      finish="stop"),
    T("8req", "gemma4", "gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', calls=[W],
      tool_choice="required", finish="stop"),
    T("8req-json", "pythonic", "plain", '[{"name": "get_weather", "parameters": {"city": "Paris"}}]', calls=[W],
      tool_choice="required"),
    T("8named", "glm45", "glm", '{"city": "Paris"}', calls=[W],
      tool_choice={"type": "function", "function": {"name": "get_weather"}}, finish="stop"),
    T("8notools", "openai", "harmony", '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>',
      '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>', tools=None, finish="stop"),
    T("9", "seed_oss", "seed", "<seed:tool_call><function=get_time><parameter=tz>CET</parameter></function>"
      "</seed:tool_call>", calls=[TM], finish="tool_calls"),
]


def reference_reasoning_count(p, r: bool, explicit: bool, ids: list[int]) -> tuple[int, bool, bool]:
    """A think parser's (``worker.parsers.think.ThinkReasoningParser``) id-level reasoning rule
    stepped one token at a time: ``(reasoning ids counted, reasoning mode after, explicit block
    after)`` from mode ``r`` / ``explicit`` (the ``think`` module docstring): the reference the
    C-level ``_count`` scans are tested against (tests/test_hot_path.py, tests/test_id_scan.py)."""
    n = 0
    for t in ids:
        if t in p.start_ids:
            r, explicit = True, p.spec.explicit_needs_end
        elif t in p.end_ids:
            r = False
        elif t in p.implicit_end_ids:
            if not explicit:
                r = False
            elif r:
                n += 1
        elif r:
            n += 1
    return n, r, explicit


@functools.cache
def _family_tokenizer(markers: tuple[str, ...]):
    return family_tokenizer(markers, str(TOK_JSON))


def family_runtime(case, streaming: str = "whole") -> D.ModelRuntime:
    """A runtime for a parser example ``case`` (``worker.parsers.examples.cases``): the test
    Qwen3 tokenizer with the example's markers as added tokens (one per tokenizer, cached), the
    case's parsers, auto tool choice, ``max_logprobs`` 20, ``--tool-call-streaming`` ``streaming``."""
    return D.ModelRuntime(ServedModelConfig(name="m", tokenizer="<test>", reasoning_parser=case.reasoning_parser,
                                            tool_parser=case.tool_parser, enable_auto_tool_choice=True,
                                            max_logprobs=20, tool_call_streaming=streaming),
                          tokenizer=_family_tokenizer(case.example.markers))


def family_service(case, streaming: str = "whole") -> Any:
    """A ``DerenderService`` serving ``family_runtime(case, streaming)`` as model ``m`` (the
    family's tokenizer is built in memory, not read from a directory: the runtime is given to the
    service's cache)."""
    from worker.core.service import DerenderService

    rt = family_runtime(case, streaming)
    svc = DerenderService([rt.config])
    svc._runtimes[rt.config.name] = rt
    return svc


def example_outputs(tok: Any, case: Any, rng: random.Random, spliced: int = 6) -> list[list[int]]:
    """Output ids of a parser example ``case`` on its tokenizer ``tok``: the example short (12
    ids of padding) and long (60), the long one cut at a random point, and ``spliced`` outputs
    whose markup is cut and repeated at random (pieces of the long one joined)."""
    base = build_ids(tok, case.example, 60)
    outputs = [build_ids(tok, case.example, 12), base, base[:rng.randrange(len(base) + 1)]]
    for _ in range(spliced):
        ids: list[int] = []
        for _ in range(rng.randrange(1, 5)):
            i = rng.randrange(len(base))
            ids += base[i:rng.randrange(i, len(base) + 1)]
        outputs.append(ids)
    return outputs


def pieces_ids(rng: random.Random, tok: Any, pieces: list[str], most: int, added: list[int]) -> list[int]:
    """Random output ids: up to ``most`` - 1 of ``pieces`` joined and encoded, 0-3 ids inserted
    anywhere (from ``added`` or, twice as likely, any id of the vocabulary: stray ids, characters
    split), and, 30% of the time, a stretch of the ids repeated in place."""
    text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, most)))
    ids = tok.encode(text) if text else []
    for _ in range(rng.choice([0, 0, 1, 3])):
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(added + [rng.randrange(tok.vocab_size)] * 2))
    if ids and rng.random() < 0.3:
        i = rng.randrange(len(ids))
        ids[i:i] = ids[i:rng.randrange(i, len(ids) + 1)]
    return ids
