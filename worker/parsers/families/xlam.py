"""Salesforce xLAM family: ``--tool-parser xlam``.

Format (xLAM-2 chat template; vLLM ``xlam``): the answer is a JSON list of
``{"name", "arguments"}`` calls, ``[{"name": "get_weather", "arguments": {"city": "NYC"}}]``,
also seen wrapped as a fenced block (```` ```json\\n[…]\\n``` ````), after ``[TOOL_CALLS]`` or in
``<tool_call>…</tool_call>``. The call list must be the whole output (leading whitespace
aside); anything else is content.
"""
from worker.parsers.marker import MarkerToolParser, json_call_list
from worker.parsers.registry import register_tool


@register_tool("xlam", "Salesforce Llama-xLAM-2, xLAM-2 (Qwen)",
               '[{"name", "arguments"}, …] (whole output; fenced, [TOOL_CALLS] or <tool_call> forms too)')
class XLamToolParser(MarkerToolParser):
    markers = ("```", "<tool_call>", "[")
    at_start = True

    def parse(self, marker: str, body: str):
        body = body.strip()
        if marker == "[":
            if body.startswith("TOOL_CALLS]"):
                body = body[len("TOOL_CALLS]"):].strip()
            else:
                body = "[" + body
        elif marker == "```":
            if not body.endswith("```"):
                return None
            body = body[:-3].strip()
            if body.startswith("json"):
                body = body[4:].strip()
        elif marker == "<tool_call>":
            if not body.endswith("</tool_call>"):
                return None
            body = body[: -len("</tool_call>")].strip()
        return json_call_list(body)
