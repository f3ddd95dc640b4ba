"""Microsoft Phi-4-mini family: ``--tool-parser phi4_mini_json``.

Format (Phi-4-mini-instruct function-calling template; vLLM ``phi4_mini_json``): the calls are
a JSON list after the word ``functools``:
``functools[{"name": "get_weather", "arguments": {"city": "Seattle"}}]``. Text before it is
content; the list runs to the end of the output (``jsontail`` engine); a list that does not
parse comes back as content, marker included. ``--tool-call-streaming incremental``: each
element's name, then its raw JSON arguments (``worker.parsers.incremental``).
"""
from worker.parsers.incremental import LIST_ARGS, NAME_ARGS_HEAD, JsonArgs
from worker.parsers.jsontail import JsonTailToolParser
from worker.parsers.marker import json_call_list
from worker.parsers.registry import register_tool


@register_tool("phi4_mini_json", "Microsoft Phi-4-mini-instruct", 'functools[{"name", "arguments"}, …]')
class Phi4MiniJsonToolParser(JsonTailToolParser):
    markers = ("functools[",)
    stream_spec = JsonArgs(head=NAME_ARGS_HEAD, next=LIST_ARGS.next)  # the "[" is in the marker

    def parse_body(self, body: str):
        body = body.strip()
        return json_call_list("[" + body) if body else None

    def malformed_content(self, body: str) -> str:
        return "functools[" + body
