"""Declarative engine for tool calls wrapped in start/end markers (Hermes ``<tool_call>``,
and families of the same shape). The call body is buffered until its end marker, then parsed by
the spec's ``parse_body``; a body that does not parse, or a call left open at the end of the
output, comes back as content, verbatim (never a call with broken JSON: the parity corpus' rule
"one answer for both modes").

Content rules (coupled vLLM's non-streaming answer, kept split-independent):

* text before the first call is content, except that a whitespace-only stretch before a call is
  dropped (content ``null``), also between calls and after the last call;
* with ``parallel_tool_calls=false`` only the first call is returned.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from worker.parsers.base import Delta, RequestContext, ToolCallDelta, ToolParser, find_first, hold_back


class TaggedState(msgspec.Struct, kw_only=True, array_like=True):
    """``in_call``: inside a call body; ``buf``: held-back text or the open call's body;
    ``scan``: offset in ``buf`` already searched for the end marker; ``calls``: calls emitted;
    ``seg_text``: non-whitespace content seen since the last call; ``pending_ws``: whitespace
    not yet emitted; ``marker``: the start marker of the open call."""

    in_call: bool = False
    buf: str = ""
    scan: int = 0
    calls: int = 0
    seg_text: bool = False
    pending_ws: str = ""
    marker: str = ""
    parallel: bool = True


def json_name_arguments(body: str) -> list[tuple[str, str]] | None:
    """Parse ``{"name": ..., "arguments"|"parameters": {...}}`` -> ``[(name, arguments JSON)]``;
    None when the body is not such an object. Arguments are re-serialized with
    ``json.dumps(ensure_ascii=False)`` (what vLLM's Hermes parser returns)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return [(obj["name"], args)]
    return [(obj["name"], json.dumps(args, ensure_ascii=False))]


class TaggedToolParser(ToolParser):
    """Tool parser for ``START body END`` calls; subclasses set ``starts``, ``ends`` and
    ``parse_body`` (body text -> list of ``(name, arguments JSON)`` or None when malformed)."""

    starts: ClassVar[tuple[str, ...]] = ("<tool_call>",)
    ends: ClassVar[tuple[str, ...]] = ("</tool_call>",)
    parse_body: ClassVar[Callable[[str], list[tuple[str, str]] | None]] = staticmethod(json_name_arguments)

    def __init__(self, tok):
        self.tok = tok

    def initial_state(self, ctx: RequestContext) -> TaggedState:
        return TaggedState(parallel=ctx.parallel_tool_calls is not False)

    def _text(self, st: TaggedState, out: Delta, t: str) -> None:
        if not t:
            return
        if st.seg_text:
            out.content += t
        elif t.isspace():
            st.pending_ws += t
        else:
            out.content += st.pending_ws + t
            st.pending_ws = ""
            st.seg_text = True

    def _close(self, st: TaggedState, out: Delta, body: str, end: str) -> None:
        parsed = type(self).parse_body(body.strip())
        if parsed is None:
            self._text(st, out, st.marker + body + end)
            return
        for name, args in parsed:
            if st.parallel or st.calls == 0:
                out.tool_calls.append(ToolCallDelta(index=st.calls, name=name, arguments=args))
                st.calls += 1
        st.seg_text = False
        st.pending_ws = ""

    def feed(self, state: TaggedState, text: str, token_ids: list[int]) -> Delta:
        out = Delta()
        st = state
        st.buf += text
        while st.buf:
            if not st.in_call:
                s = st.buf
                i, m = find_first(s, self.starts)
                if i < 0:
                    keep = hold_back(s, self.starts)
                    self._text(st, out, s[: len(s) - keep])
                    st.buf = s[len(s) - keep:]
                    return out
                self._text(st, out, s[:i])
                if not st.seg_text:
                    st.pending_ws = ""
                st.in_call, st.marker, st.buf, st.scan = True, m, s[i + len(m):], 0
                continue
            s = st.buf
            longest = max(len(e) for e in self.ends)
            j, e = find_first(s[st.scan:], self.ends)
            if j < 0:
                st.scan = max(0, len(s) - longest + 1)
                return out
            j += st.scan
            st.in_call, st.buf, st.scan = False, s[j + len(e):], 0
            self._close(st, out, s[:j], e)
        return out

    def finish(self, state: TaggedState) -> Delta:
        out = Delta()
        st = state
        rest, st.buf = st.buf, ""
        if st.in_call:
            st.in_call = False
            self._text(st, out, st.marker + rest)
        else:
            self._text(st, out, rest)
        if st.calls == 0 and st.pending_ws:
            out.content += st.pending_ws
        st.pending_ws = ""
        return out


