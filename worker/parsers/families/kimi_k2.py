"""Kimi K2 family (Moonshot): ``--reasoning-parser kimi_k2``, ``--tool-parser kimi_k2``.

Reasoning (Kimi-K2-Thinking template; vLLM ``kimi_k2``): ``<think>…</think>``, the opener
optional; the tool-call section token ``<|tool_calls_section_begin|>`` also ends the reasoning
(the section stays in the content for the tool parser); output with no end is reasoning;
``chat_template_kwargs.thinking=false`` -> all content.

Tool calls (Kimi-K2 chat template; vLLM/SGLang ``kimi_k2``): one section of special tokens,
each call's id is ``functions.NAME:INDEX`` and its arguments are JSON:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>

The singular spelling ``<|tool_call_section_begin|>``/``…_end|>`` is accepted too. The section is
parsed when it closes; a section that does not parse is content. A section that never closes
(``finish_reason: "length"``) keeps its complete calls (``TaggedToolParser.call_ends``), the
cut-off call after them is dropped; with no complete call it is content.

Kimi-K2.5 sometimes drops the ``.``/``:`` of the call id (``functionsexec5``, bug-020): an id
whose canonical name is not a declared tool resolves to the declared tool it spells with
those separators removed (``functions`` prefix and index digits around it); a non-canonical id
that spells no declared tool is skipped, a bare counter id (``0``) names the declared tool its
arguments fit (``resolve_kimi_name``; vLLM's tests). Text between the section opener and the
first call is dropped.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): a call's name (resolved as
above) goes out once ``<|tool_call_argument_begin|>{`` arrives, then the arguments' raw JSON text;
a call cut off after its name keeps the raw text that went out.
"""
import json
import re

from worker.parsers.incremental import JsonArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec
from worker.parsers.xmlcall import json_args, match_all

_CALL = re.compile(r"<\|tool_call_begin\|>\s*([^<]*?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>",
                   re.DOTALL)


_HEAD = r"\s*<\|tool_call_begin\|>\s*(?P<name>[^<]*?)\s*<\|tool_call_argument_begin\|>\s*\{"


def kimi_name(call_id: str) -> str | None:
    """``functions.get_weather:0`` -> ``get_weather`` (bare ``get_weather:0`` accepted)."""
    head = call_id.split(":", 1)[0]
    if head.startswith("functions."):
        head = head[len("functions."):]
    return head or None


_CANONICAL = re.compile(r"\s*(?:functions\.)?[^:\s]+:\d+\s*")


def resolve_kimi_name(call_id: str, declared, args: str | None = None) -> str | None:
    """The function a call id names: ``kimi_name`` when that is a declared tool (or no tools
    are known); else the longest declared tool the id spells in a non-canonical form
    (``functionsexec5``, ``functions_exec_5``, ``exec5``); else ``kimi_name`` for a canonical id
    (``[functions.]NAME:i``); else None (the call is skipped, vLLM's
    ``test_invalid_funcall_id_skipped``). A bare counter id (``0``) names the only declared
    tool, or the only one whose parameters hold every key of ``args`` (None when ``args`` is
    not given, not a JSON object, or fits several tools: vLLM's ``test_bare_counter*``)."""
    if call_id.strip().isdigit() and declared:
        return _tool_of_args(declared, args)
    name = kimi_name(call_id)
    if not declared or name in declared:
        return name
    best = None
    for tool in declared:
        if re.fullmatch(r"(?:functions[._:]?)?" + re.escape(tool) + r"(?:[._:]?\d+)?", call_id.strip()):
            if best is None or len(tool) > len(best):
                best = tool
    return best or (name if _CANONICAL.fullmatch(call_id) else None)


def _tool_of_args(declared, args: str | None) -> str | None:
    """The declared tool a bare-counter call names (``resolve_kimi_name``)."""
    if len(declared) == 1:
        return next(iter(declared))
    if args is None or not isinstance(declared, dict):
        return None
    try:
        obj = json.loads(args)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    fits = [t for t, props in declared.items() if set(obj) <= set(props or ())]
    return fits[0] if len(fits) == 1 else None


def parse_kimi_section(body: str, declared=()) -> list[tuple[str, str]] | None:
    """The calls of a section body; text before the first call is dropped (vLLM's
    ``test_noise_between_markers_suppressed``), a call whose id names no function is skipped
    (``resolve_kimi_name``); None when the calls do not parse or none is left."""
    i = body.find("<|tool_call_begin|>")
    calls = match_all(_CALL, body[i:] if i > 0 else body)
    if calls is None:
        return None
    out = []
    for m in calls:
        args = json_args(m.group(2).strip())
        if args is None:
            return None
        name = resolve_kimi_name(m.group(1), declared, args)
        if name is not None:
            out.append((name, args))
    return out or None


@register_reasoning("kimi_k2", "Kimi K2 Thinking, Kimi K2.5",
                    "<think>…</think>, opener optional, <|tool_calls_section_begin|> ends it")
class KimiK2ReasoningParser(ThinkReasoningParser):
    needs_special_tokens = True
    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True,
                     turn_token="<|im_assistant|>", implicit_end=("<|tool_calls_section_begin|>",))


@register_tool("kimi_k2", "Kimi K2 Instruct/Thinking",
               "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:i<|tool_call_argument_begin|>{json}"
               "<|tool_call_end|>…<|tool_calls_section_end|>")
class KimiK2ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    ends = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    call_ends = ("<|tool_call_end|>",)
    #: incremental streaming: the name once ``<|tool_call_argument_begin|>{`` arrives, then the
    #: arguments' raw JSON (``worker.parsers.incremental``)
    stream_spec = JsonArgs(head=_HEAD, next=r"\s*<\|tool_call_end\|>" + _HEAD)
    parse_body = staticmethod(parse_kimi_section)
    param_types = True  # the state keeps the declared tool names (call ids resolve against them)

    def parse_call(self, st, body: str):
        return parse_kimi_section(body.strip(), st.types)

    def stream_name(self, st, raw: str) -> str | None:
        # a bare counter with several declared tools is named by its arguments: not streamed
        return resolve_kimi_name(raw, st.types)
