"""Mistral family: ``--tool-parser mistral`` (Mistral 7B Instruct v0.3 with the HF tokenizer,
and the v7 tokenizer through ``--tokenizer-mode mistral``).

Format (mistral-common tokenizers v3/v7 and the v0.3 chat template; vLLM
``mistral_tool_parser``): the ``[TOOL_CALLS]`` control token, then a JSON list of
``{"name": ..., "arguments": {...}}`` running to the end of the output. The marker is a special
token, so the parser needs ``skip_special_tokens`` off (vLLM's ``adjust_request``). Tool call ids
are 9 alphanumerics (the v0.3 template rejects any other shape).

Newer Mistral tokenizers (v11+) write each call as ``[TOOL_CALLS]NAME[ARGS]{json}``, one
``[TOOL_CALLS]`` per call (bug-011): a body in that shape gives one call per segment, also
with ``[ARGS]`` not written (``NAME{json}``: the text vLLM's v11 tests hand the parser).

Parity rules (corpus ``mistral-tool-*``): text before the marker is content, as written
(``" Let me check. "``); a body that is not such a list (``mistral-tool-malformed-v0``) is
content, stripped and without the marker (coupled's non-stream answer).

Lenient reading (vLLM 0.33 ``test_extract_tool_calls_pre_v11_*``, issue 24): a body that is not
one clean list still gives its calls when they are there: text after the list is dropped
(``trailing_data_after_json``), junk before it skipped (``regex_fallback``), bare objects
without brackets read, non-object list entries skipped, and every ``[TOOL_CALLS]`` segment
(two blocks, consecutive markers) read (``parse_lenient``). Same answer in both modes and with
``--tool-call-streaming incremental`` (the stream settles against this parse).

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): each call's name once its
``{"name": "…", "arguments": {`` (or ``NAME[ARGS]{``) arrived, then the raw JSON arguments.
"""
from __future__ import annotations

import json
import re

from worker.parsers.incremental import NAME_ARGS_HEAD, JsonArgs
from worker.parsers.jsontail import JsonTailToolParser, call_of
from worker.parsers.registry import register_tool

_ARGS = "[ARGS]"
_SEGMENT_HEAD = r"\s*(?P<name>[^\s\[\]]+)\[ARGS\]\s*\{"
#: incremental streaming heads: a list (or lone object) of ``{"name", "arguments"}``, or
#: ``NAME[ARGS]{`` segments (``regex`` allows the ``name`` group in both alternatives)
STREAM = JsonArgs(head=r"(?:\s*\[?" + NAME_ARGS_HEAD + "|" + _SEGMENT_HEAD + ")",
                  next=r"(?:\s*\}\s*," + NAME_ARGS_HEAD + r"|\s*\[TOOL_CALLS\]" + _SEGMENT_HEAD + ")")
_DECODER = json.JSONDecoder()


def parse_args_segments(body: str) -> list[tuple[str, str]] | None:
    """``NAME[ARGS]{json}[TOOL_CALLS]NAME[ARGS]{json}...`` (the first marker already removed)
    -> one call per segment; None unless every segment is ``name[ARGS]`` + one JSON object."""
    out = []
    for seg in body.split("[TOOL_CALLS]"):
        name, sep, args = seg.partition(_ARGS)
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            return None
        args = args.strip()
        try:
            obj, end = _DECODER.raw_decode(args)
        except ValueError:
            return None
        if not isinstance(obj, dict) or args[end:].strip():
            return None
        out.append((name, json.dumps(obj, ensure_ascii=False)))
    return out or None


_NAME_JSON = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?=\{)")


def parse_name_segments(body: str) -> list[tuple[str, str]] | None:
    """``NAME{json}[TOOL_CALLS]NAME{json}...``: the v11 form as vLLM's parser sees it with the
    ``[ARGS]`` control token not written (vLLM 0.33 ``test_extract_tool_calls[single_tool_add]``
    …) -> one call per segment; None unless every segment is a name and one JSON object."""
    out = []
    for seg in body.split("[TOOL_CALLS]"):
        m = _NAME_JSON.match(seg)
        if m is None:
            return None
        try:
            obj, end = _DECODER.raw_decode(seg, m.end())
        except ValueError:
            return None
        if not isinstance(obj, dict) or seg[end:].strip():
            return None
        out.append((m.group(1), json.dumps(obj, ensure_ascii=False)))
    return out or None


#: JSON openings ``_lenient_values`` tries per segment before it gives up (bounds the work)
_MAX_TRIES = 16


def _lenient_values(seg: str) -> list:
    """The JSON values of one ``[TOOL_CALLS]`` segment read as vLLM's pre-v11 fallback does:
    from the first ``[`` / ``{`` that opens a JSON value (junk before it skipped), then the
    values that follow separated only by whitespace or commas (bare objects); text after them
    is dropped. At most ``_MAX_TRIES`` openings are tried."""
    out: list = []
    i, tries, n = 0, 0, len(seg)
    while tries < _MAX_TRIES:
        js = [k for k in (seg.find("[", i), seg.find("{", i)) if k >= 0]
        if not js:
            break
        j = min(js)
        try:
            obj, i = _DECODER.raw_decode(seg, j)
        except ValueError:
            if out:
                break
            tries += 1
            i = j + 1
            continue
        out.append(obj)
        while i < n and (seg[i].isspace() or seg[i] == ","):
            i += 1
        if i >= n or seg[i] not in "[{":
            break
    return out


def parse_lenient(body: str) -> list[tuple[str, str]] | None:
    """Calls of a pre-v11 body that is not one clean JSON list, as vLLM 0.33's parser reads it
    (``test_extract_tool_calls_pre_v11_*``: trailing text after the list, junk before it, bare
    objects, a non-object entry, several or consecutive ``[TOOL_CALLS]`` markers): the call
    objects of every segment's values (``_lenient_values``), non-object list entries skipped.
    None when there is no call or an object entry is not a call."""
    calls: list[tuple[str, str]] = []
    for seg in body.split("[TOOL_CALLS]"):
        for v in _lenient_values(seg):
            for x in v if isinstance(v, list) else [v]:
                if not isinstance(x, dict):
                    continue
                c = call_of(x)
                if c is None:
                    return None
                calls.append(c)
    return calls or None


def parse_mistral_body(body: str) -> list[tuple[str, str]] | None:
    """Calls of a ``[TOOL_CALLS]`` body: a JSON list of call objects (a lone object accepted),
    or ``NAME[ARGS]{json}`` segments, else the lenient reading (``parse_lenient``)."""
    try:
        obj = json.loads(body.strip())
    except ValueError:
        if _ARGS in body:
            return parse_args_segments(body)
        return parse_name_segments(body) or parse_lenient(body)
    items = obj if isinstance(obj, list) else [obj]
    calls = [call_of(x) for x in items]
    if not calls or any(c is None for c in calls):
        return parse_lenient(body)
    return calls  # type: ignore[return-value]


@register_tool("mistral", "Mistral 7B v0.3, Mistral v7 tokenizers", "[TOOL_CALLS] [{\"name\", \"arguments\"}, …]",
               "text after the list, junk before it, bare objects, non-object entries, several `[TOOL_CALLS]` "
               "(vLLM 0.33 pre-v11 tests)")
class MistralToolParser(JsonTailToolParser):
    """``[TOOL_CALLS]`` + JSON list."""

    #: vLLM 0.32 runs it on its parser engine: leading whitespace-only content joins the next
    #: text (``ToolParser.defers_leading_ws``)
    defers_leading_ws = True

    markers = ("[TOOL_CALLS]",)
    needs_special_tokens = True
    id_format = "alnum9"
    stream_spec = STREAM

    def parse_body(self, body: str) -> list[tuple[str, str]] | None:
        return parse_mistral_body(body)

    def malformed_content(self, body: str) -> str:
        return body.strip()
