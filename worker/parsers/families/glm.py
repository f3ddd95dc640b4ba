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

Malformed GLM markup seen in production (vLLM issue #49248, pull requests #54971, #49249,
#47190) is recovered when the name and the pairs are certain (``worker.parsers.xmlcall``
rules): ``<arg_key>path</arg_key></arg_key>`` (repeated tag) -> ``{"path": …}`` (vLLM's regex
gives the key ``path</arg_key>``); ``<arg_key>q</arg_key>text</arg_value>`` (missing
``<arg_value>``) -> ``{"q": "text"}`` (vLLM: ``{}``); ``get_weather city</arg_key>…`` (missing
first ``<arg_key>``) -> name ``get_weather``, key ``city``. Anything else malformed stays
content.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): the name goes out with the
first ``<arg_key>`` after it, a declared ``string`` value as it arrives,
any other pair (typed as above) when its ``</arg_value>`` arrives, ``}``
when the block closes; a call without parameters goes out whole. Malformed markup met after the
name: streaming stops there and the block's close adds what the parse above recovers.
"""
import re

from worker.parsers.incremental import XmlArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec
from worker.parsers.values import dumps_args
from worker.parsers.xmlcall import XmlFormat, json_or_text, read_calls

#: GLM's parameter tags; the call name is the text before the first tag
GLM_FORMAT = XmlFormat(key_open=r"<arg_key>", key_close=r"</arg_key>",
                       value_open=r"<arg_value>", value_close=r"</arg_value>")
_FIRST_TAG = re.compile(r"</?arg_(?:key|value)>")


def _glm_string(t) -> bool:
    """The schema type keeps a GLM value as its raw text (declared ``string``/``str``/``text``)."""
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return isinstance(t, str) and t.lower() in ("string", "str", "text")


def _glm_value(raw: str, fn_types, key: str):
    if _glm_string((fn_types or {}).get(key)):
        return raw
    return json_or_text(raw)


def _valid_name(name: str) -> bool:
    return bool(name) and not any(c.isspace() or c in "<>{}" for c in name)


def _split_name_key(lead: str, declared) -> tuple[str, str] | None:
    """``NAME KEY`` written without the ``<arg_key>`` between them (the key's ``</arg_key>``
    follows): split at the whitespace (GLM-4.5 puts a newline after the name), else at the end
    of the one declared tool name the text starts with (GLM-4.7 writes no newline); None when
    that is not unique."""
    parts = lead.split(None, 1)
    if len(parts) == 2:
        return parts[0], parts[1]
    hits = [n for n in declared if lead.startswith(n) and len(lead) > len(n)]
    return (hits[0], lead[len(hits[0]):]) if len(hits) == 1 else None


def parse_glm_call(body: str, types: dict) -> list[tuple[str, str]] | None:
    """``NAME <arg_key>k</arg_key><arg_value>v</arg_value> ...`` -> one call; None if
    unreadable. Malformed but unambiguous tags are recovered by ``xmlcall.read_calls``
    (repeated tag; missing ``<arg_key>`` or ``<arg_value>`` whose closing tag is there; missing
    ``</arg_key>`` before ``<arg_value>``, missing ``</arg_value>`` before the next key or the
    end); a first ``<arg_key>`` missing right after the name is recovered when the name/key
    boundary is certain (``_split_name_key``)."""
    m = _FIRST_TAG.search(body)
    lead = (body if m is None else body[:m.start()]).strip()
    rest = "" if m is None else body[m.start():]
    if m is not None and m.group() == "</arg_key>":
        split = _split_name_key(lead, types)
        if split is None:
            return None
        lead, rest = split[0], split[1] + rest
    elif m is not None and m.group() != "<arg_key>":
        return None  # a value before any key
    if not _valid_name(lead):
        return None
    calls = read_calls(GLM_FORMAT, rest, name=lead)
    if calls is None:
        return None
    fn_types = types.get(lead)
    args = {key: _glm_value(raw, fn_types, key) for key, raw in calls[0][1]}
    return [(lead, dumps_args(args))]


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
    #: incremental streaming: the name with the first ``<arg_key>``, each pair at its
    #: ``</arg_value>`` (``worker.parsers.incremental``)
    stream_spec = XmlArgs(GLM_FORMAT, named=True)

    def parse_call(self, st: TaggedState, body: str):
        return parse_glm_call(body.strip(), st.types)

    def stream_name(self, st: TaggedState, raw: str):
        name = raw.strip()
        return name if _valid_name(name) else None

    stream_strip = "none"  # a string value is the raw text (``_glm_value``)
    stream_null = False

    def string_param(self, st: TaggedState, name: str, key: str) -> bool:
        return _glm_string((st.types.get(name) or {}).get(key))

    def stream_value(self, st: TaggedState, name: str, key: str, raw: str):
        return _glm_value(raw, st.types.get(name), key)


@register_tool("glm47", "GLM-4.7", "<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>")
class Glm47ToolParser(Glm45ToolParser):
    pass
