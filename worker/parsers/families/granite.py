"""IBM Granite family: ``--reasoning-parser granite``, ``--tool-parser granite`` (Granite 3.x),
``granite4`` (Granite 4) and ``granite-20b-fc`` (Granite-20B-FunctionCalling).

Reasoning (Granite 3.2/3.3 template with ``thinking=true``; vLLM ``granite``): plain-text
section headers, ``Here is my thought process:`` (or ``Here's my thought process:``) then the
reasoning, then ``Here is my response:`` (or ``Here's …``) then the answer. Output that does not
start with the thought header is content. Example: ``Here is my thought process: 2+2.
Here is my response: 4`` -> reasoning `` 2+2.\\n``-style text, content `` 4``.

Tool calls:

* ``granite`` (Granite 3.x template; vLLM ``granite``): the output is a JSON list of
  ``{"name", "arguments"}`` optionally preceded by ``<|tool_call|>`` (3.0) or ``<tool_call>``
  (3.1): ``<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Boston"}}]``;
* ``granite4`` (Granite 4.0 template; vLLM ``granite4``): Hermes-like blocks,
  ``<tool_call>{"name": …, "arguments": …}</tool_call>``;
* ``granite-20b-fc`` (Granite-20B-FunctionCalling; vLLM ``granite-20b-fc``): each call is
  ``<function_call> {"name": …, "arguments": …}``, repeated, no end marker; text before the
  first marker is content.
"""
from worker.parsers.incremental import NAME_ARGS_HEAD, JsonArgs
from worker.parsers.jsontail import JsonTailToolParser
from worker.parsers.marker import MarkerToolParser, json_call_list, json_objects_split
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec


@register_reasoning("granite", "IBM Granite 3.2 / 3.3 (thinking=true)",
                    "'Here is my thought process:' … 'Here is my response:' (text headers)")
class GraniteReasoningParser(ThinkReasoningParser):
    spec = ThinkSpec(start=("Here is my thought process:", "Here's my thought process:"),
                     end=("Here is my response:", "Here's my response:"), default_reasoning=False,
                     drop_repeated_end=False)


def _granite_list(body: str):
    body = body.strip()
    if not body.startswith("["):
        return None
    return json_call_list(body)


@register_tool("granite", "IBM Granite 3.0 / 3.1 / 3.2 / 3.3",
               '[<|tool_call|>|<tool_call>][{"name", "arguments"}, …] (whole output)')
class GraniteToolParser(MarkerToolParser):
    needs_special_tokens = True
    markers = ("<|tool_call|>", "<tool_call>", "[")
    at_start = True

    def parse(self, marker: str, body: str):
        return _granite_list("[" + body if marker == "[" else body)


@register_tool("granite4", "IBM Granite 4.0", '<tool_call>{"name", "arguments"}</tool_call>')
class Granite4ToolParser(TaggedToolParser):
    #: tools in play -> skip_special_tokens off (vLLM ``granite4``'s ``adjust_request``: the
    #: markers are special tokens in some Granite 4 tokenizers)
    needs_special_tokens = True
    starts = ("<tool_call>",)
    ends = ("</tool_call>",)
    #: no ``eos_closes``: vLLM's Granite 4 parser enforces a complete block (its Hermes test
    #: ``test_hermes_parser_non_streaming_tool_call_until_eos`` is skipped for it)


@register_tool("granite-20b-fc", "IBM Granite-20B-FunctionCalling",
               '<function_call> {"name", "arguments"} (repeated, no end marker)')
class Granite20bFCToolParser(JsonTailToolParser):
    markers = ("<function_call>",)
    #: incremental streaming: each ``<function_call> {"name", "arguments": {`` then raw JSON
    stream_spec = JsonArgs(head=NAME_ARGS_HEAD, next=r"\s*\}\s*<function_call>" + NAME_ARGS_HEAD)

    def parse_body(self, body: str):
        return json_objects_split(body, "<function_call>")

    def malformed_content(self, body: str) -> str:
        return "<function_call>" + body
