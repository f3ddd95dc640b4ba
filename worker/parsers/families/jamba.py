"""AI21 Jamba 1.5 / 1.6 / 1.7 family: ``--tool-parser jamba``.

Format (Jamba chat template; vLLM ``jamba``): one block holding a JSON list of calls,
``<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>``; a block
left open at the end of the output keeps the list's complete call objects (``json_list_prefix``).

``--tool-call-streaming incremental``: each list element's name, then its raw JSON arguments
(``worker.parsers.incremental.LIST_ARGS``).
"""
from worker.parsers.marker import json_call_list, json_list_prefix
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedToolParser


@register_tool("jamba", "AI21 Jamba 1.5 / 1.6 / 1.7", '<tool_calls>[{"name", "arguments"}, …]</tool_calls>')
class JambaToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<tool_calls>",)
    ends = ("</tool_calls>",)
    parse_body = staticmethod(json_call_list)

    def complete_prefix(self, body: str) -> str | None:
        return json_list_prefix(body)  # an open list keeps its complete call objects
