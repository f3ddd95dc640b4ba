"""DeepSeek-V3 tool calls: ``--tool-parser deepseek_v3`` (DeepSeek-V3 / V3-0324, R1-0528).

Format (DeepSeek-V3 chat template; vLLM ``deepseek_v3``, SGLang ``deepseekv3``): a section of
special tokens, each call typed ``function``, named, with its JSON arguments in a fenced block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Hangzhou"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The section is parsed when it closes; a malformed section is content. A section left open at
the end of the output keeps its complete calls (``TaggedToolParser.call_ends``), the cut-off
call after them is dropped; with no complete call it is content.
(``deepseek_v31``, the unfenced V3.1 form, lives with the other DeepSeek families.)

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): the name once the fenced
JSON's ``{`` arrives, then the raw JSON arguments.
"""
import re

from worker.parsers.incremental import JsonArgs
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedToolParser
from worker.parsers.xmlcall import json_args, match_all

_CALL = re.compile(r"<｜tool▁call▁begin｜>\s*(\w+)\s*<｜tool▁sep｜>\s*([^\n`<]+?)\s*\n\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*"
                   r"<｜tool▁call▁end｜>", re.DOTALL)


_HEAD = r"\s*<｜tool▁call▁begin｜>\s*function\s*<｜tool▁sep｜>\s*(?P<name>[^\n`<]+?)\s*\n\s*```(?:json)?\s*\n?\s*\{"


def parse_v3_section(body: str) -> list[tuple[str, str]] | None:
    calls = match_all(_CALL, body)
    if calls is None:
        return None
    out = []
    for m in calls:
        if m.group(1) != "function":
            return None
        args = json_args(m.group(3).strip())
        if args is None:
            return None
        out.append((m.group(2).strip(), args))
    return out


@register_tool("deepseek_v3", "DeepSeek-V3, V3-0324, R1-0528",
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{…}\\n```"
               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
class DeepSeekV3ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<｜tool▁calls▁begin｜>",)
    ends = ("<｜tool▁calls▁end｜>",)
    call_ends = ("<｜tool▁call▁end｜>",)
    #: incremental streaming: the name once the fenced JSON's ``{`` arrives, then the
    #: arguments' raw JSON (``worker.parsers.incremental``)
    stream_spec = JsonArgs(head=_HEAD, next=r"\n?\s*```\s*<｜tool▁call▁end｜>" + _HEAD)

    def stream_name(self, st, raw: str) -> str | None:
        return raw.strip() or None
    parse_body = staticmethod(parse_v3_section)
