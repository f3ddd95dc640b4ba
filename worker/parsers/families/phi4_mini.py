"""Microsoft Phi-4-mini family: ``--tool-parser phi4_mini_json``.

Format (Phi-4-mini-instruct function-calling template; vLLM ``phi4_mini_json``): the calls are
a JSON list after the word ``functools``:
``functools[{"name": "get_weather", "arguments": {"city": "Seattle"}}]``. Text before it is
content; the list is parsed at the end of the output (``jsontail`` engine); text after a
complete list is content (prose after the calls, bug-013; vLLM's common test
``test_surrounding_text``); a list that does not parse comes back as content, marker included.
``--tool-call-streaming incremental``: each element's name, then its raw JSON arguments (``worker.parsers.incremental``).
"""
import json

from worker.parsers.incremental import LIST_ARGS, NAME_ARGS_HEAD, JsonArgs
from worker.parsers.jsontail import JsonTailToolParser
from worker.parsers.marker import call_from_obj, json_call_list
from worker.parsers.registry import register_tool


@register_tool("phi4_mini_json", "Microsoft Phi-4-mini-instruct", 'functools[{"name", "arguments"}, …]')
class Phi4MiniJsonToolParser(JsonTailToolParser):
    markers = ("functools[",)
    stream_spec = JsonArgs(head=NAME_ARGS_HEAD, next=LIST_ARGS.next)  # the "[" is in the marker

    def parse_body(self, body: str):
        body = body.strip()
        return json_call_list("[" + body) if body else None

    def parse_calls(self, body: str) -> tuple[list[tuple[str, str]] | None, str]:
        """The calls of the list and the text after it (content); ``(None, "")`` when the body
        does not open with a list of calls."""
        calls = self.parse_body(body)
        if calls is not None or not body.strip():
            return calls, ""
        try:
            obj, end = json.JSONDecoder().raw_decode("[" + body.lstrip())
        except ValueError:
            return None, ""
        found = [call_from_obj(x) for x in obj] if isinstance(obj, list) else []
        if not found or None in found:
            return None, ""
        return found, ("[" + body.lstrip())[end:]  # type: ignore[return-value]

    def malformed_content(self, body: str) -> str:
        return "functools[" + body
