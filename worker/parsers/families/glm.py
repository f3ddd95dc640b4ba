"""GLM-4.5 / 4.6 / 4.7 family (Zhipu / Z.ai): ``--reasoning-parser glm45`` (also ``glm47``),
``--tool-parser glm45`` and ``glm47``.

Reasoning (GLM-4.5+ chat templates; vLLM ``glm45``/``glm47``): ``<think>…</think>`` special
tokens; the model opens the block itself (GLM-4.5/4.6) or the generation prompt already ends
with ``<think>`` (GLM-4.7, seen in the prompt ids); ``enable_thinking=false`` puts an empty
``<think></think>`` in the prompt, so the output is content. A ``<tool_call>`` straight from the
thinking block ends it. Output that opens no block is content.

Tool calls (vLLM ``glm4_moe``/``glm47_moe`` tool parsers, SGLang ``glm``): one block per call,
the function name then key/value pairs as special-token tags:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

GLM-4.7 writes the same without the newlines (``<tool_call>get_weather<arg_key>city</arg_key>
<arg_value>Beijing</arg_value></tool_call>``); both parsers accept both. A value stays a string when the request's schema types the parameter
``string``, else it is decoded as JSON when it is JSON (vLLM's ``glm4_moe`` rule), else a string.
"""
import json
import re

from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec
from worker.parsers.xmlcall import json_or_text, match_all

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm_value(raw: str, fn_types, key: str):
    t = (fn_types or {}).get(key)
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if isinstance(t, str) and t.lower() in ("string", "str", "text"):
        return raw
    return json_or_text(raw)


def parse_glm_call(body: str, types: dict) -> list[tuple[str, str]] | None:
    """``NAME <arg_key>k</arg_key><arg_value>v</arg_value> ...`` -> one call; None if malformed."""
    i = body.find("<arg_key>")
    name = (body if i < 0 else body[:i]).strip()
    if not name or any(c.isspace() or c in "<>{}" for c in name):
        return None
    args = {}
    if i >= 0:
        pairs = match_all(_PAIR, body[i:])
        if pairs is None:
            return None
        for m in pairs:
            key = m.group(1).strip()
            args[key] = _glm_value(m.group(2), types.get(name), key)
    return [(name, json.dumps(args, ensure_ascii=False))]


_GLM_THINK = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=False,
                       turn_token="<|assistant|>", implicit_end=("<tool_call>",))


@register_reasoning("glm45", "GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.5V",
                    "<think>…</think>, opened by the model or the prompt; <tool_call> ends it")
class Glm45ReasoningParser(ThinkReasoningParser):
    needs_special_tokens = True
    spec = _GLM_THINK


@register_reasoning("glm47", "GLM-4.7", "<think>…</think>, generation prompt pre-opens <think>")
class Glm47ReasoningParser(ThinkReasoningParser):
    needs_special_tokens = True
    spec = _GLM_THINK


@register_tool("glm45", "GLM-4.5, GLM-4.5-Air, GLM-4.6",
               "<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>")
class Glm45ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<tool_call>",)
    ends = ("</tool_call>",)
    param_types = True

    def parse_call(self, st: TaggedState, body: str):
        return parse_glm_call(body.strip(), st.types)


@register_tool("glm47", "GLM-4.7", "<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>")
class Glm47ToolParser(Glm45ToolParser):
    pass
