"""AI21 Jamba 1.5 / 1.6 / 1.7 family: ``--tool-parser jamba``.

Format (Jamba chat template; vLLM ``jamba``): one block holding a JSON list of calls,
``<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>``.
"""
from worker.parsers.marker import json_call_list
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedToolParser


@register_tool("jamba", "AI21 Jamba 1.5 / 1.6 / 1.7", '<tool_calls>[{"name", "arguments"}, …]</tool_calls>')
class JambaToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<tool_calls>",)
    ends = ("</tool_calls>",)
    parse_body = staticmethod(json_call_list)
