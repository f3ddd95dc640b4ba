"""Salesforce xLAM family: ``--tool-parser xlam``.

Format (xLAM-2 chat template; vLLM ``xlam``): the answer is a JSON list of
``{"name", "arguments"}`` calls, ``[{"name": "get_weather", "arguments": {"city": "NYC"}}]``,
also seen wrapped as a fenced block (```` ```json\\n[…]\\n``` ````), after ``[TOOL_CALLS]`` or in
``<tool_call>…</tool_call>``. The output may open with text (vLLM's
``test_extract_tool_calls[single_tool_with_think_tag|json_code_block|tool_calls_tag|tool_call_xml_tags]``):
a later marker opens the call list when what follows it is one (``[{"name"`` / ``[TOOL_CALLS]``,
```` ```json[ ````, ``<tool_call>[``); the text before it is content, its trailing whitespace
dropped when the calls parse. A body that is not calls is content, verbatim.
"""
from worker.parsers.marker import MarkerToolParser, json_call_list
from worker.parsers.registry import register_tool


@register_tool("xlam", "Salesforce Llama-xLAM-2, xLAM-2 (Qwen)",
               '[{"name", "arguments"}, …] (whole output; fenced, [TOOL_CALLS] or <tool_call> forms too)')
class XLamToolParser(MarkerToolParser):
    markers = ("```", "<tool_call>", "[")
    at_start = True
    after_text = True
    strip_before_body = True

    def confirm_start(self, st, marker: str, rest: str) -> bool | None:
        """A marker after text opens the list when the list follows it (module docstring);
        None while ``rest`` is too short to tell (at most a few characters are held)."""
        if marker == "```":
            if len(rest) < 4:
                return None if "json".startswith(rest) else False
            if not rest.startswith("json"):
                return False
            r = rest[4:].lstrip()
            return (r.startswith("[") or None) if r else None
        r = rest.lstrip()
        heads = ('{"name"', "TOOL_CALLS]") if marker == "[" else ("[",)
        if any(r.startswith(h) for h in heads):
            return True
        if any(h.startswith(r) for h in heads):
            return None
        return False

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
