"""Declarative engine for tool calls written as JSON at the end of the output, optionally after
a start marker (Mistral ``[TOOL_CALLS][...]``, Llama 3 ``{"name", "parameters"}; ...``): the
calls run to the end of the output, so the body is buffered and parsed once, at ``finish``.

A subclass sets:

* ``markers``: start markers; text before the first one is content (streamed, a possible
  split marker held back); the text after it is the body;
* ``hold_all``: no marker is required: the whole output is held and parsed at the end (a
  complete call drops the text around it; otherwise it is all content) — Llama 3;
* ``parse_body(text)``: ``[(name, arguments JSON)]`` or None when the text is not calls;
  (or ``parse_calls(text)``: ``(calls, content)`` when text around the calls is kept as
  content, e.g. Llama 3's prose after the call);
* ``malformed_content(body)``: the content a body that does not parse becomes.

Per ``feed`` work is O(delta + marker length): text is appended, never re-scanned; the parse
is one pass at the end. Bad JSON never raises: it is content. With
``parallel_tool_calls=false`` only the first call is returned.

``--tool-call-streaming incremental`` (streamed choices; ``worker.parsers.incremental``): a
family with a ``stream_spec`` (``JsonArgs``: the call heads of its body) sends each call's name
once its head matched at the start of the body, then the arguments' raw JSON text as it
arrives; at ``finish`` the calls are settled against the parse above (calls the stream did not
start go out whole; text kept beside the calls stays content). A body whose calls started
streaming never comes back as content (cut off: the raw argument text that went out).
"""
from __future__ import annotations

import json
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
    surrogates_escaped,
)
from worker.parsers.incremental import ArgStream, JsonArgs, advance, settle


class JsonTailState(msgspec.Struct, kw_only=True, array_like=True):
    """``in_body``: the start marker was seen (or ``hold_all``); ``buf``: held-back text (a
    possible split marker before the body, the body after it); ``parallel``: the request's
    ``parallel_tool_calls``."""

    in_body: bool = False
    buf: str = ""
    parallel: bool = True
    #: incremental streaming: calls started, streamer state (None: whole)
    calls: int = 0
    inc: ArgStream | None = None
    #: characters at the start of the body moved out of the state (``spill``: to the stream's
    #: append-only pieces, ``worker.core.stream``); ``buf`` and ``inc``'s offsets count from
    #: what is left
    spilled: int = 0


def call_of(obj: Any) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of a ``{"name", "arguments"|"parameters"}`` object, else None.
    Object arguments are serialized with ``json.dumps(ensure_ascii=False)``; string arguments
    must be JSON text and are kept as written."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        return obj["name"], args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


class JsonTailToolParser(AppendedBody, ToolParser):
    """Engine for marker-then-JSON tool calls (module docstring).

    Bounded stream state (``worker.core.stream``, "Bounded state"): the body is only appended
    to until ``finish``, and the incremental streamer reads it from its offsets on, so all of it
    but what the streamer has not passed (``inc.pos`` / ``inc.vs``; nothing once it is ``off``
    or in ``whole`` mode) may leave the state (``spill_point``); ``finish`` raises
    ``BodyNeeded`` while some of it is out."""

    markers: ClassVar[tuple[str, ...]] = ()
    hold_all: ClassVar[bool] = False
    #: incremental streaming: the call heads of the body (None: calls go out whole)
    stream_spec: ClassVar[JsonArgs | None] = None

    def __init__(self, tok):
        self.tok = tok
        self.spec = type(self).stream_spec

    @property
    def incremental(self) -> bool:  # type: ignore[override]
        """The family streams arguments incrementally (it has a ``stream_spec``)."""
        return self.spec is not None

    def stream_arguments(self, state: JsonTailState) -> None:
        state.inc = ArgStream()

    def stream_name(self, st: JsonTailState, raw: str) -> str | None:
        """A call's name from its head's ``name`` group: a JSON string's inside (escapes
        decoded; a lone surrogate kept as its escape: ``base.surrogates_escaped``), non-empty as
        ``call_of`` requires; None otherwise."""
        try:
            v = json.loads('"' + raw + '"')
        except ValueError:
            return None
        return surrogates_escaped(v) if isinstance(v, str) and v else None

    # -- bounded stream state (AppendedBody's spill / unspill over ``buf``) ------------------
    def body_held(self, st: JsonTailState) -> int:
        """Characters of the body held (0 before the start marker)."""
        return len(st.buf) if st.in_body else 0

    def spill_point(self, st: JsonTailState) -> int:
        """The whole body in ``whole`` mode or once the streamer is ``off``; else the body
        before the streamer's offsets (``inc.pos``: the head match / JSON lexer; ``inc.vs``:
        argument text held back by ``JsonArgs.hold_ws``)."""
        if not st.in_body:
            return 0
        a = st.inc
        if a is None or a.phase == "off":
            return len(st.buf)
        return max(0, min(a.pos, a.vs, len(st.buf)))

    def shift_body(self, st: JsonTailState, k: int) -> None:
        """Move the streamer's offsets into the body by ``-k``."""
        a = st.inc
        if a is not None:
            a.pos -= k
            a.scan -= k
            a.vs -= k

    # -- family hooks -------------------------------------------------------------------------
    def parse_body(self, body: str) -> list[tuple[str, str]] | None:
        raise NotImplementedError

    def malformed_content(self, body: str) -> str:
        return body

    def parse_calls(self, body: str) -> tuple[list[tuple[str, str]] | None, str]:
        """``(calls, content kept beside them)``; by default the calls are the whole body."""
        return self.parse_body(body), ""

    # -- machine ------------------------------------------------------------------------------
    def initial_state(self, ctx: RequestContext) -> JsonTailState:
        return JsonTailState(in_body=self.hold_all, parallel=ctx.parallel_tool_calls is not False)

    def feed(self, state: JsonTailState, text: str, token_ids: list[int]) -> Delta:
        out = Delta()
        if state.in_body:
            state.buf += text
            if state.inc is not None:
                advance(self, state, out, state.buf, len(state.buf))
            return out
        s = state.buf + text
        i, m = find_first(s, self.markers)
        if i < 0:
            keep = hold_back(s, self.markers)
            out.content = s[: len(s) - keep]
            state.buf = s[len(s) - keep:]
            return out
        out.content = s[:i]
        state.in_body, state.buf = True, s[i + len(m):]
        if state.inc is not None:
            advance(self, state, out, state.buf, len(state.buf))
        return out

    def finish(self, state: JsonTailState) -> Delta:
        if state.spilled:
            raise BodyNeeded
        out = Delta()
        body, state.buf = state.buf, ""
        if not state.in_body:
            out.content = body
            return out
        try:
            calls, rest = self.parse_calls(body)
        except Exception:  # noqa: BLE001 - bad markup never raises
            calls, rest = None, ""
        if not names_ok(calls):  # a nameless call is malformed markup
            calls = None
        if state.inc is not None and state.inc.n:  # calls started streaming: settle them
            advance(self, state, out, body, len(body))
            settle(self, state, out, calls)
            out.content = rest if calls else ""
            return out
        if not calls:
            out.content = self.malformed_content(body)
            return out
        out.content = rest
        if not state.parallel:
            calls = calls[:1]
        out.tool_calls = [ToolCallDelta(index=i, name=n, arguments=a) for i, (n, a) in enumerate(calls)]
        return out
