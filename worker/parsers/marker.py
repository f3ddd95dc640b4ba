"""Declarative engine for "the whole output is a call list" tool calls: the first
non-whitespace text of the output is an opening marker (Granite 3's ``<|tool_call|>[...]`` or a
bare ``[``, xLAM's JSON list, the pythonic ``[f(a=1)]`` lists of ``pythonic.py``); anything
else makes the output content, streamed without delay. (Calls after a marker that may follow
text, e.g. Phi-4-mini's ``functools[...]``, use ``jsontail.JsonTailToolParser``.) Also the JSON
body helpers shared by the families whose calls are JSON lists or repeated JSON objects (Jamba,
Hunyuan-A13B, Granite-20B-FC).

Rules:

* text before the first marker is content, streamed (a partial marker at a delta's end is held
  back); with ``at_start`` the marker only counts as the first non-whitespace text of the
  output, anything else makes the whole output content;
* from the marker on, the text is the call body, buffered to the end of the output (the only
  unbounded buffer, that of the open call) and parsed once by ``parse(marker, body)`` (default:
  the spec's ``parse_body(body)``, the body stripped, without the marker ->
  ``[(name, arguments JSON)]`` or None); the pythonic engine (``pythonic.py``) is this engine
  with an ``ast`` parser;
* a body that does not parse comes back as content, verbatim (marker included);
* content before calls that is only whitespace is dropped; ``parallel_tool_calls=false`` keeps
  the first call;
* ``after_text`` (with ``at_start``): once the output began with text, a later marker still
  opens the body when ``confirm_start`` accepts it (e.g. pythonic: ``[`` followed by
  ``name(`` of a declared tool); the text before it is content. While undecided, the marker
  and the few chars after it are held back (bounded).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from worker.parsers.base import (
    AppendedBody,
    BodyNeeded,
    Delta,
    RequestContext,
    ToolCallDelta,
    ToolParser,
    find_first,
    hold_back,
    names_ok,
)


def _args_json(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def call_from_obj(obj: Any) -> tuple[str, str] | None:
    """``{"name": str, "arguments"|"parameters": {...}}`` -> ``(name, arguments JSON)``; None
    when ``obj`` is not such a dict (missing arguments count as ``{}``)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if not isinstance(args, (dict, str)):
        return None
    return obj["name"], _args_json(args)


def json_call_list(body: str) -> list[tuple[str, str]] | None:
    """A JSON list of call objects (a single object is accepted as a one-call list) ->
    ``[(name, arguments JSON)]``; None when the text is not exactly that (trailing text fails)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for it in items:
        c = call_from_obj(it)
        if c is None:
            return None
        out.append(c)
    return out or None


def json_list_prefix(body: str) -> str | None:
    """The complete part of a JSON list cut off before its end: ``[{…}, {…}, {"na`` ->
    ``[{…}, {…}]`` (elements decoded with ``json.JSONDecoder.raw_decode``, so an element counts
    only when its JSON value is whole); None when ``body`` does not open a list or no element is
    complete. Used for open ``<tool_calls>[…`` sections (``TaggedToolParser.complete_prefix``)."""
    dec = json.JSONDecoder()
    n = len(body)
    i = 0
    while i < n and body[i].isspace():
        i += 1
    if i >= n or body[i] != "[":
        return None
    i += 1
    last = -1
    while True:
        while i < n and body[i].isspace():
            i += 1
        try:
            _, j = dec.raw_decode(body, i)
        except ValueError:
            break
        last = j
        while j < n and body[j].isspace():
            j += 1
        if j < n and body[j] == ",":
            i = j + 1
            continue
        break
    return body[:last] + "]" if last >= 0 else None


def json_objects_split(body: str, marker: str) -> list[tuple[str, str]] | None:
    """Body made of JSON call objects each introduced by ``marker`` (the first one's marker
    already removed), separated by whitespace only -> calls; None otherwise."""
    dec = json.JSONDecoder()
    out: list[tuple[str, str]] = []
    i, n = 0, len(body)
    first = True
    while True:
        while i < n and body[i].isspace():
            i += 1
        if i >= n:
            break
        if not first:
            if not body.startswith(marker, i):
                return None
            i += len(marker)
            while i < n and body[i].isspace():
                i += 1
        first = False
        try:
            obj, i = dec.raw_decode(body, i)
        except ValueError:
            return None
        c = call_from_obj(obj)
        if c is None:
            return None
        out.append(c)
    return out or None


class MarkerState(msgspec.Struct, kw_only=True, array_like=True):
    """``phase``: ``start`` (nothing but whitespace seen) | ``text`` | ``body`` (after the
    marker); ``buf``: held-back text or the body; ``marker``: the marker seen; ``ws``: leading
    whitespace not yet emitted; ``parallel``."""

    phase: str = "start"
    buf: str = ""
    marker: str = ""
    ws: str = ""
    parallel: bool = True
    #: declared tool names (``after_text`` parsers only)
    names: list[str] = msgspec.field(default_factory=list)
    #: characters at the start of the body moved out of the state (``spill``: to the stream's
    #: append-only pieces, ``worker.core.stream``)
    spilled: int = 0


def declared_tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    """Function names of an OpenAI tool list."""
    out = []
    for t in tools or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append(fn["name"])
    return out


class MarkerToolParser(AppendedBody, ToolParser):
    """Tool parser for ``MARKER <calls...>`` to the end of the output (module docstring).
    Subclasses set ``markers``, ``at_start`` and ``parse_body`` (or override ``parse``).

    Bounded stream state (``worker.core.stream``, "Bounded state"): the body is only appended
    to until ``finish`` parses it, so all of it may leave the state (``spill_point``);
    ``finish`` raises ``BodyNeeded`` while some of it is out."""

    markers: ClassVar[tuple[str, ...]] = ()
    at_start: ClassVar[bool] = False
    after_text: ClassVar[bool] = False
    #: ``after_text``: whitespace ending the text before a body that parses is dropped (held
    #: back while streaming; emitted when more text follows or the body is not calls)
    strip_before_body: ClassVar[bool] = False
    parse_body: ClassVar[Callable[[str], list[tuple[str, str]] | None]] = staticmethod(json_call_list)

    def __init__(self, tok):
        self.tok = tok

    def parse(self, marker: str, body: str) -> list[tuple[str, str]] | None:
        """Calls of one output's body (after ``marker``), or None when malformed."""
        return type(self).parse_body(body.strip())

    def initial_state(self, ctx: RequestContext) -> MarkerState:
        return MarkerState(parallel=ctx.parallel_tool_calls is not False,
                           names=declared_tool_names(ctx.tools) if self.after_text else [])

    def body_held(self, st: MarkerState) -> int:
        """Characters of the body held (0 before the marker)."""
        return len(st.buf) if st.phase == "body" else 0

    def spill_point(self, st: MarkerState) -> int:
        """The whole body: no step reads it before ``finish``."""
        return self.body_held(st)

    def confirm_start(self, st: MarkerState, marker: str, rest: str) -> bool | None:
        """``after_text``: does ``marker`` followed by ``rest`` (the text after it so far) open
        the call body? True / False / None (undecided yet: hold it back)."""
        return True

    def _scan_text(self, st: MarkerState, out: Delta, s: str) -> None:
        """``after_text``: content up to a confirmed marker, which opens the body."""
        pos = 0
        while True:
            i, m = find_first(s[pos:], self.markers)
            if i < 0:
                keep = hold_back(s[pos:], self.markers)
                self._content(st, out, s[pos: len(s) - keep])
                st.buf = s[len(s) - keep:]
                return
            i += pos
            ok = self.confirm_start(st, m, s[i + len(m):])
            if ok is None:
                self._content(st, out, s[pos:i])
                st.buf = s[i:]
                return
            if ok:
                self._content(st, out, s[pos:i])
                st.phase, st.marker, st.buf = "body", m, s[i + len(m):]
                return
            self._content(st, out, s[pos: i + len(m)])
            pos = i + len(m)

    def _content(self, st: MarkerState, out: Delta, t: str) -> None:
        if not t:
            return
        if st.phase == "start":
            if t.isspace():
                st.ws += t
                return
            st.phase = "text"
            t, st.ws = st.ws + t, ""
            if self.strip_before_body:
                st.ws, t = t[len(t.rstrip()):], t.rstrip()
            out.content += t
            return
        if self.strip_before_body:
            r = st.ws + t
            k = len(r.rstrip())
            out.content += r[:k]
            st.ws = r[k:]
            return
        out.content += t

    def feed(self, state: MarkerState, text: str, token_ids: list[int]) -> Delta:
        out = Delta()
        st = state
        if st.phase == "body":
            st.buf += text
            return out
        s = st.buf + text
        st.buf = ""
        if st.phase == "text" and self.at_start:
            if self.after_text:
                self._scan_text(st, out, s)
            else:
                out.content = s
            return out
        if self.at_start:
            # only the first non-whitespace text may be the marker
            stripped = s.lstrip()
            lead = s[: len(s) - len(stripped)]
            if lead:
                st.ws += lead
            if not stripped:
                return out
            for m in self.markers:
                if stripped.startswith(m):
                    st.phase, st.marker, st.buf = "body", m, stripped[len(m):]
                    return out
            if any(m.startswith(stripped) for m in self.markers):
                st.buf = stripped
                return out
            if self.after_text:
                self._scan_text(st, out, stripped)
            else:
                self._content(st, out, stripped)
            return out
        i, m = find_first(s, self.markers)
        if i < 0:
            keep = hold_back(s, self.markers)
            self._content(st, out, s[: len(s) - keep])
            st.buf = s[len(s) - keep:]
            return out
        self._content(st, out, s[:i])
        st.phase, st.marker, st.buf = "body", m, s[i + len(m):]
        return out

    def finish(self, state: MarkerState) -> Delta:
        if state.spilled:
            raise BodyNeeded
        out = Delta()
        st = state
        rest, st.buf = st.buf, ""
        if st.phase != "body":
            self._content(st, out, rest)
            if st.ws:
                out.content += st.ws
            st.ws = ""
            return out
        parsed = None
        try:
            parsed = self.parse(st.marker, rest)
        except Exception:  # noqa: BLE001  (bad markup never raises)
            parsed = None
        if not parsed or not names_ok(parsed):
            out.content = st.ws + st.marker + rest
            st.ws = ""
            return out
        for k, (name, args) in enumerate(parsed):
            if st.parallel or k == 0:
                out.tool_calls.append(ToolCallDelta(index=k, name=name, arguments=args))
        st.ws = ""
        return out
