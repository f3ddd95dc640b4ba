"""StepFun Step-3 family: ``--reasoning-parser step3``, ``--tool-parser step3``.

Reasoning (Step-3 chat template; vLLM ``step3``): the prompt opens the thinking, the output is
reasoning up to ``</think>`` and content after it; no ``</think>`` -> all reasoning.

Tool calls (Step-3 template; vLLM ``step3``): a section of calls, each an XML invoke:

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
    <steptml:parameter name="city">Beijing</steptml:parameter></steptml:invoke><｜tool_call_end｜>
    <｜tool_calls_end｜>

The ``function<｜tool_sep｜>`` framing is optional (vLLM's tests omit it or put the name after it);
a value of a parameter the schema declares a string keeps its surrounding whitespace (it sits
inline between the tags: vLLM's ``TestStep3ParameterWhitespace``), any other value is stripped;
values are typed by the request's tool schema (undeclared parameters stay strings). A section left open at the end of the output keeps
its complete calls (``TaggedToolParser.call_ends``), the cut-off call after them is dropped.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): each invoke's name goes
out with ``<steptml:invoke name=…>``, a declared string parameter's value as it arrives, any
other parameter when its closing tag arrives, ``}`` with
``</steptml:invoke>``.
"""
import re

from worker.parsers.incremental import XmlArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec
from worker.parsers.values import dumps_args, is_string_param
from worker.parsers.xmlcall import invoke_format, match_all, read_calls, typed_value

#: a call block; the ``function<｜tool_sep｜>NAME`` framing before the invoke is optional, a
#: ``<｜tool_sep｜>`` between blocks is skipped (vLLM's common tests write both forms)
_CALL = re.compile(r"(?:<｜tool_sep｜>\s*)?<｜tool_call_begin｜>\s*(?:function\s*<｜tool_sep｜>[^<]*)?(.*?)<｜tool_call_end｜>",
                   re.DOTALL)


def parse_step3_section(body: str, types: dict) -> list[tuple[str, str]] | None:
    calls = match_all(_CALL, body)
    if calls is None:
        return None
    out = []
    for m in calls:
        one = read_calls(invoke_format("steptml:invoke", "steptml:parameter"), m.group(1))
        if one is None:
            return None
        out.extend((n, dumps_args({k: _value(types.get(n), k, raw) for k, raw in ps})) for n, ps in one)
    return out


def _declared_string(fn_types: dict | None, key: str) -> bool:
    return fn_types is not None and key in fn_types and is_string_param(fn_types[key])


def _value(fn_types: dict | None, key: str, raw: str):
    """A parameter's JSON value: a declared string keeps its whitespace (the value sits inline
    between the tags: vLLM's ``TestStep3ParameterWhitespace``), any other value is stripped,
    then typed by the schema."""
    return typed_value(raw if _declared_string(fn_types, key) else raw.strip(), fn_types, key)


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

    stream_strip = "none"

    def string_param(self, st: TaggedState, name: str, key: str) -> bool:
        # only a declared string streams as it arrives (kept whole); any other value is
        # stripped, so it goes out when its closing tag arrives
        return _declared_string(st.types.get(name), key)

    def stream_value(self, st: TaggedState, name: str, key: str, raw: str):
        return _value(st.types.get(name), key, raw)  # as parse_step3_section

    def parse_call(self, st: TaggedState, body: str):
        return parse_step3_section(body.strip(), st.types)
