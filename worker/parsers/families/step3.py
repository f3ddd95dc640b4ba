"""StepFun Step-3 family: ``--reasoning-parser step3``, ``--tool-parser step3``.

Reasoning (Step-3 chat template; vLLM ``step3``): the prompt opens the thinking, the output is
reasoning up to ``</think>`` and content after it; no ``</think>`` -> all reasoning.

Tool calls (Step-3 template; vLLM ``step3``): a section of calls, each an XML invoke:

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
    <steptml:parameter name="city">Beijing</steptml:parameter></steptml:invoke><｜tool_call_end｜>
    <｜tool_calls_end｜>

values are stripped of surrounding whitespace (as vLLM does) and typed by the request's tool
schema (undeclared parameters stay strings). A section left open at the end of the output keeps
its complete calls (``TaggedToolParser.call_ends``), the cut-off call after them is dropped.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): each invoke's name goes
out with ``<steptml:invoke name=…>``, a string parameter's value as it arrives (surrounding
whitespace held back), any other parameter when its closing tag arrives, ``}`` with
``</steptml:invoke>``.
"""
import re

from worker.parsers.incremental import XmlArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec
from worker.parsers.xmlcall import invoke_format, match_all, parse_invokes, typed_value

_CALL = re.compile(r"<｜tool_call_begin｜>\s*function\s*<｜tool_sep｜>(.*?)<｜tool_call_end｜>", re.DOTALL)


def parse_step3_section(body: str, types: dict) -> list[tuple[str, str]] | None:
    calls = match_all(_CALL, body)
    if calls is None:
        return None
    out = []
    for m in calls:
        one = parse_invokes(m.group(1), "steptml:invoke", "steptml:parameter", types, strip_values=True)
        if one is None:
            return None
        out.extend(one)
    return out


@register_reasoning("step3", "StepFun Step-3", "reasoning until </think> (prompt pre-opens it)")
class Step3ReasoningParser(ThinkReasoningParser):
    needs_special_tokens = True
    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True)


@register_tool("step3", "StepFun Step-3",
               '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="f">'
               '<steptml:parameter name="k">v</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>')
class Step3ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<｜tool_calls_begin｜>",)
    ends = ("<｜tool_calls_end｜>",)
    call_ends = ("<｜tool_call_end｜>",)
    param_types = True
    #: incremental streaming: the name at ``<steptml:invoke name=…>``, each parameter at its
    #: closing tag; the ``<｜tool_call_begin｜>function<｜tool_sep｜>`` framing is skipped
    stream_spec = XmlArgs(invoke_format("steptml:invoke", "steptml:parameter"), outside=True)

    stream_strip = "all"

    def stream_value(self, st: TaggedState, name: str, key: str, raw: str):
        return typed_value(raw.strip(), st.types.get(name), key)  # values stripped, as parse_invokes

    def parse_call(self, st: TaggedState, body: str):
        return parse_step3_section(body.strip(), st.types)
