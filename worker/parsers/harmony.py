"""Engine for the OpenAI Harmony response format (gpt-oss): the output is a sequence of messages,
each a header, ``<|message|>``, the body, then ``<|end|>``, ``<|call|>`` (a tool call) or
``<|return|>`` (end of answer). A family (``families/gptoss.py``) declares its two parsers on
:class:`HarmonyParser`; the engine holds the rest, in three layers:

* **scanners** turn the output into typed :class:`Segment` s (``LOOSE`` text outside messages,
  ``OPEN`` a completed header with its :class:`Header`, ``BODY`` message text, ``CLOSE`` the
  terminator): :func:`scan` over the decoded text (markers found as text, any vocabulary), and
  :func:`scan_ids` over the token ids on gpt-oss's own ``o200k_harmony`` vocabulary (markers only
  at their special-token ids, openai-harmony's ``StreamableParser`` rules, body bytes decoded as
  UTF-8 with an incomplete character held in the state);
* **one classifier**, :func:`classify`, maps a message's channel and recipient to a
  :class:`Route` for the parser's :class:`Role` (as vLLM's ``vllm/parser/harmony.py`` routes a
  message by channel and recipient): a message to ``functions.NAME`` is a call (on any channel:
  the recipient decides, as vLLM's streaming path), ``analysis`` is reasoning (dropped by the
  tool parser), anything else content; in text mode the reasoning parser passes a message with a
  recipient through as raw Harmony text for the tool parser, which scans the same text;
* **one apply loop**, :meth:`HarmonyParser.apply`, turns segments into a ``Delta`` by route.

Header grammar (id mode, :func:`parse_header`) is openai-harmony's ``parse_header_from_string``;
text mode reads the channel (``<|channel|>NAME``) and recipient (``to=R``) with two regular
expressions. A call's arguments are re-dumped as vLLM's ``openai`` tool parser does
(:func:`call_arguments`). State: one msgspec Struct (:class:`HarmonyState`, phases and routes
are enums), encoded with the stream state like every parser sub-state. Per-feed work is
O(delta + marker) (O(tokens) in id mode); a header is buffered up to ``MAX_HEADER`` chars /
``MAX_HEADER_TOKENS`` tokens (longer is not a header: it comes back as text), a call's body
until its terminator. Sources: openai/harmony ``docs/format.md``, ``src/encoding.rs``; vLLM
``vllm/parser/harmony.py``, ``entrypoints/openai/parser/harmony_utils.py``,
``tool_parsers/openai_tool_parser.py``.
"""
from __future__ import annotations

import codecs
import enum
import json
import re
from collections.abc import Callable
from typing import ClassVar

import msgspec

from worker.parsers.base import (
    AppendedBody,
    BodyNeeded,
    Delta,
    RequestContext,
    ToolCallDelta,
    find_first,
    hold_back,
)

__all__ = ["Header", "HarmonyParser", "HarmonyState", "Phase", "Role", "Route", "Seg", "Segment",
           "call_arguments", "call_name", "classify", "parse_header", "reads_harmony_ids", "scan", "scan_ids",
           "HARMONY_IDS", "MAX_HEADER", "MAX_HEADER_TOKENS"]

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
OPENERS = (START, CHANNEL)
BODY_STOPS = ENDS + (START,)
#: longest header text (text mode) / header tokens (id mode) waited for
MAX_HEADER = 512
MAX_HEADER_TOKENS = 128
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_CHANNEL_NAME = re.compile(r"[^\s<]*")
_ROLES = ("assistant", "user", "system", "developer", "tool")

#: o200k_harmony ids of the Harmony markers (tiktoken's ``o200k_harmony`` / openai-harmony)
HARMONY_IDS = {"<|return|>": 200002, "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006,
               "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012}
START_ID, MESSAGE_ID, ENDOFTEXT_ID = 200006, 200008, 199999
STOP_IDS = {200002: "<|return|>", 200007: "<|end|>", 200012: "<|call|>"}  # openai-harmony stop_tokens()
_MARKER_IDS = frozenset(HARMONY_IDS.values())


class Phase(enum.IntEnum):
    """Where the scanner is: outside a message, reading a header, reading a body."""

    TEXT = 0
    HEADER = 1
    BODY = 2


class Seg(enum.IntEnum):
    """Kind of a :class:`Segment`."""

    LOOSE = 0  #: text outside any message (content)
    OPEN = 1  #: a header completed (``Segment.header``)
    BODY = 2  #: message text
    CLOSE = 3  #: the message ended: ``Segment.text`` is its stop marker, ``""`` when closed by
    #: a new ``<|start|>`` (text mode) or by the end of the output


class Role(enum.IntEnum):
    """Which of the family's two parsers applies the segments."""

    REASONING = 0
    TOOL = 1


class Route(enum.IntEnum):
    """Where a message's body goes (:func:`classify`)."""

    NONE = 0  #: no message open
    REASONING = 1
    CONTENT = 2
    CALL = 3  #: a tool call: its body is buffered by the tool parser, ignored by the reasoning parser
    RAW = 4  #: text mode, reasoning parser: the message passes through as Harmony text (header,
    #: ``<|message|>``, body, terminator) for the tool parser
    DROP = 5  #: the tool parser's view of reasoning


#: enum members as module constants: the scanners and the apply loop run per delta (an enum
#: class attribute lookup costs several times a global one)
_TEXT, _HEADER, _BODY = Phase.TEXT, Phase.HEADER, Phase.BODY
_LOOSE, _OPEN, _SBODY, _CLOSE = Seg.LOOSE, Seg.OPEN, Seg.BODY, Seg.CLOSE
_R_NONE, _R_REASONING, _R_CONTENT, _R_CALL, _R_RAW, _R_DROP = (
    Route.NONE, Route.REASONING, Route.CONTENT, Route.CALL, Route.RAW, Route.DROP)


class Header(msgspec.Struct, frozen=True, array_like=True):
    """A parsed message header: ``raw`` text (id mode: with the ``<|start|>`` that opened it),
    ``channel``, ``recipient`` (``functions.NAME`` for a call) and content type ``ctype`` (id
    mode only; ``<|constrain|>json`` -> ``"<|constrain|>json"``)."""

    raw: str
    channel: str = ""
    recipient: str = ""
    ctype: str = ""


class Segment(msgspec.Struct, frozen=True):
    """One scanner output: ``kind``, its ``text`` (``LOOSE``/``BODY`` text, ``CLOSE`` stop
    marker) and, for ``OPEN``, the ``header``."""

    kind: Seg
    text: str = ""
    header: Header | None = None


class HarmonyState(msgspec.Struct, kw_only=True, array_like=True):
    """Per-choice state. Scanner: ``phase``, ``buf`` (text mode: held-back text or the raw
    header so far), id mode: ``hdr`` (header ids so far), ``opener`` (``<|start|>``, or ``""``
    for the first message, whose role the prompt gave), ``pend`` (bytes of an incomplete UTF-8
    character). Open message: ``header``, ``route``, ``body`` (a call's buffered body). Tool
    parser: ``calls`` emitted, ``parallel`` (``parallel_tool_calls``)."""

    phase: Phase = _TEXT
    buf: str = ""
    hdr: list[int] = msgspec.field(default_factory=list)
    opener: str = ""
    pend: bytes = b""
    header: Header | None = None
    route: Route = _R_NONE
    body: str = ""
    calls: int = 0
    parallel: bool = True
    #: characters at the start of ``body`` moved out of the state (``spill``: to the stream's
    #: append-only pieces, ``worker.core.stream``)
    spilled: int = 0


# ----------------------------------------------------------------------------- text mode ---
def text_header(raw: str) -> Header:
    """Channel and recipient of a header found in the text (content type not read)."""
    cm = _CHANNEL.search(raw)
    rm = _RECIPIENT.search(raw)
    return Header(raw, cm.group(1) if cm else "", rm.group(1) if rm else "")


def scan(st: HarmonyState, text: str, final: bool) -> list[Segment]:
    """Advance the text scanner over ``text``. A header starts at ``<|start|>`` or
    ``<|channel|>`` and ends at ``<|message|>`` (one not ended within ``MAX_HEADER`` chars, or
    by the end of the output, gives its opener back as text); a body ends at a terminator or a
    new ``<|start|>``. ``final`` flushes held-back text and closes an open body."""
    out: list[Segment] = []
    s, st.buf = st.buf + text, ""
    while s:
        if st.phase == _TEXT:
            i, _ = find_first(s, OPENERS)
            if i < 0:
                keep = 0 if final else hold_back(s, OPENERS)
                if len(s) > keep:
                    out.append(Segment(_LOOSE, s[: len(s) - keep]))
                st.buf = s[len(s) - keep:]
                return out
            if i:
                out.append(Segment(_LOOSE, s[:i]))
            st.phase, s = _HEADER, s[i:]
            continue
        if st.phase == _HEADER:
            j = s.find(MESSAGE)
            if j < 0:
                if len(s) > MAX_HEADER or final:
                    # not a header after all: give the opener back as text, rescan the rest
                    st.phase = _TEXT
                    opener = START if s.startswith(START) else CHANNEL
                    out.append(Segment(_LOOSE, opener))
                    s = s[len(opener):]
                    continue
                st.buf = s
                return out
            st.phase = _BODY
            out.append(Segment(_OPEN, header=text_header(s[:j])))
            s = s[j + len(MESSAGE):]
            continue
        i, m = find_first(s, BODY_STOPS)
        if i < 0:
            keep = 0 if final else hold_back(s, BODY_STOPS)
            if len(s) > keep:
                out.append(Segment(_SBODY, s[: len(s) - keep]))
            st.buf = s[len(s) - keep:]
            if final:
                st.phase = _TEXT
                out.append(Segment(_CLOSE))
            return out
        if i:
            out.append(Segment(_SBODY, s[:i]))
        st.phase = _TEXT
        if m == START:
            out.append(Segment(_CLOSE))
            s = s[i:]
        else:
            out.append(Segment(_CLOSE, m or ""))
            s = s[i + len(m or ""):]
    if final and st.phase == _BODY:
        st.phase = _TEXT
        out.append(Segment(_CLOSE))
    return out


# ------------------------------------------------------------------------------- id mode ---
def reads_harmony_ids(tok) -> bool:
    """True when ``tok`` is gpt-oss's vocabulary: every Harmony marker a special token at its
    o200k_harmony id, and the tokens' bytes known (byte-level BPE). Then the parsers read the
    token ids, as vLLM does; otherwise (markers added to another vocabulary, or sent as text)
    they scan the text."""
    if tok is None or not hasattr(tok, "token_bytes"):
        return False
    special = getattr(tok, "special_ids", frozenset())
    for m, i in HARMONY_IDS.items():
        if tok.token_to_id(m) != i or i not in special:
            return False
    return tok.token_bytes(MESSAGE_ID) == MESSAGE.encode()


def _utf8(st: HarmonyState, data: bytes, final: bool) -> str:
    """Decode ``st.pend + data``; an incomplete trailing character stays in ``st.pend`` unless
    ``final`` (then U+FFFD, as openai-harmony's lossy flush)."""
    buf = st.pend + data if st.pend else data
    if final:
        st.pend = b""
        return buf.decode("utf-8", "replace")
    try:
        text = buf.decode("utf-8")
        st.pend = b""
        return text
    except UnicodeDecodeError:
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        text = dec.decode(buf, False)
        st.pend = dec.getstate()[0]
        return text


def parse_header(text: str, role_known: bool) -> Header | None:
    """A Harmony header by openai-harmony's rules (``parse_header_from_string``):
    ``<|channel|>NAME`` cut out; ``<|constrain|>`` split off; the role first (when not given by
    the prompt, ``role_known`` False); then the last part is ``to=R`` (recipient), a lone
    unconstrained word (recipient), or the content type with an optional recipient before it.
    ``raw`` is ``text``. None when openai-harmony would reject the header (empty channel,
    unknown role, parts left over)."""
    raw, channel = text, ""
    i = text.find(CHANNEL)
    if i >= 0:
        rest = text[i + len(CHANNEL):]
        channel = _CHANNEL_NAME.match(rest).group(0)  # type: ignore[union-attr]  # matches ""
        if not channel:
            return None
        text = text[:i] + rest[len(channel):]
    text = text.strip()
    if CONSTRAIN in text:
        text = text.replace(CONSTRAIN, " " + CONSTRAIN).strip()
    parts = text.split()
    role = "assistant"
    if not role_known:
        if not parts:
            return None
        if parts[0] in _ROLES:
            role = parts[0]
        elif len(parts) > 1 or parts[0].startswith("to="):
            parts.pop(0)
            role = "tool"
        else:
            return None
    if parts and parts[0] == role:
        parts.pop(0)
    recipient = ctype = ""
    if parts:
        n = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif n == 1 and not last.startswith(CONSTRAIN):
            recipient = last
        else:
            ctype = last
            if parts:
                r = parts.pop()
                recipient = r[3:] if r.startswith("to=") else r
    if parts:
        return None
    return Header(raw, channel, recipient, ctype)


def scan_ids(st: HarmonyState, ids: list[int], final: bool, tb: Callable[[int], bytes]) -> list[Segment]:
    """The id scanner (openai-harmony's ``StreamableParser`` over ``ids``, role ``assistant``;
    ``st`` starts in ``Phase.HEADER``): segments as :func:`scan`; a header openai-harmony
    rejects comes back as ``LOOSE`` text, its body too; ``CLOSE`` carries the stop marker, or
    ``""`` at the end of output. Tokens outside a message (openai-harmony raises there) are
    ``LOOSE`` text; ``<|endoftext|>`` (an EOS/pad id, not text) is skipped everywhere.
    ``tb``: id -> bytes."""
    out: list[Segment] = []
    run: list[bytes] = []  # bytes of the current body / loose run, decoded once per run

    def flush(final_run: bool) -> None:
        kind = _SBODY if st.phase == _BODY else _LOOSE
        text = _utf8(st, b"".join(run), final_run) if (run or final_run) else ""
        run.clear()
        if text:
            out.append(Segment(kind, text))

    for t in ids:
        if st.phase == _HEADER:
            if t == MESSAGE_ID:
                head = _utf8(st, b"".join(tb(i) for i in st.hdr), True)
                st.hdr = []
                header = parse_header(head, role_known=not st.opener)
                if header is None:
                    out.append(Segment(_LOOSE, st.opener + head + MESSAGE))
                    st.phase = _TEXT
                    continue
                st.phase = _BODY
                out.append(Segment(_OPEN, header=Header(st.opener + head, header.channel, header.recipient,
                                                           header.ctype)))
            elif t in STOP_IDS or len(st.hdr) >= MAX_HEADER_TOKENS:
                # never a header: its text (and the stop marker) as it came
                data = b"".join(tb(i) for i in st.hdr) + tb(t)
                st.hdr = []
                out.append(Segment(_LOOSE, st.opener + _utf8(st, data, t in STOP_IDS)))
                st.phase = _TEXT
            else:
                st.hdr.append(t)
        elif t in STOP_IDS and st.phase == _BODY:
            flush(True)
            out.append(Segment(_CLOSE, STOP_IDS[t]))
            st.phase = _TEXT
        elif t == START_ID and st.phase == _TEXT:
            flush(True)
            st.phase, st.opener, st.hdr = _HEADER, START, []
        elif t != ENDOFTEXT_ID:
            run.append(tb(t))
    if run:
        flush(False)
    if final:
        if st.phase == _BODY:
            # cut by the end of output: an incomplete character is not text yet (openai-harmony's
            # current_content and vLLM's detokenizer leave it out)
            st.pend = b""
            out.append(Segment(_CLOSE))
        elif st.phase == _HEADER:
            # cut by the end of output: dropped once it has begun like a header (a marker, or
            # the recipient ``to=`` first; vLLM shows nothing for it); plain text that never
            # became a header is content
            if st.hdr and not st.opener and not any(i in _MARKER_IDS for i in st.hdr):
                head = _utf8(st, b"".join(tb(i) for i in st.hdr), True)
                if not head.lstrip().startswith("to="):
                    out.append(Segment(_LOOSE, head))
            st.hdr = []
        else:
            flush(True)
        st.phase = _TEXT
    return out


# --------------------------------------------------------------------- classify / apply ---
def call_name(recipient: str) -> str | None:
    """The function a message calls (recipient ``functions.NAME``), else None."""
    p = "functions."
    return recipient[len(p):] if recipient.startswith(p) and len(recipient) > len(p) else None


def classify(header: Header, role: Role, text_mode: bool) -> Route:
    """The route of a message for parser ``role``, from its channel and recipient (module
    docstring): a call to ``functions.NAME`` -> ``CALL`` (text mode, reasoning parser: ``RAW``,
    as any message with a recipient there); ``analysis`` -> ``REASONING`` (tool parser:
    ``DROP``); else ``CONTENT``."""
    if role == Role.REASONING and text_mode and header.recipient:
        return _R_RAW
    if call_name(header.recipient) is not None:
        return _R_CALL
    if header.channel == "analysis":
        return _R_REASONING if role == Role.REASONING else _R_DROP
    return _R_CONTENT


def call_arguments(body: str, ctype: str) -> str | None:
    """A call's arguments as vLLM's ``openai`` tool parser returns them: the body's JSON
    re-dumped with ``json.dumps`` defaults (ASCII-escaped) when the content type is absent or
    names json, else the body as it is (when it is JSON); ``{}`` for an empty body. None when
    the body is not JSON (vLLM would pass the raw text on; here the message stays content,
    never a call with broken JSON)."""
    if not body.strip():
        return "{}"
    try:
        args = json.dumps(json.loads(body))
    except ValueError:
        return None
    return args if not ctype or "json" in ctype else body


class HarmonyParser(AppendedBody):
    """Engine base of a Harmony parser (mixed with ``ReasoningParser`` or ``ToolParser``): a
    family sets ``role``. ``feed``/``finish`` run the id scanner on gpt-oss's own vocabulary
    (:func:`reads_harmony_ids`) or the text scanner elsewhere and hand the segments to
    :meth:`apply`. In id mode the parser reads only the ids (``reads_ids``: the stack feeds it
    every step's ids) and wants the final stop token (``wants_stop_token``: ``<|call|>`` /
    ``<|return|>`` end gpt-oss's generation and decide whether a call is whole). The markers
    are special tokens the parsers must see (``needs_special_tokens``).

    Bounded stream state (tool role; ``worker.core.stream``, "Bounded state"): an open call's
    ``body`` is only appended to until its message closes, so all of it may leave the state
    (``spill_point``); closing the call raises ``BodyNeeded`` while some of it is out."""

    body_field: ClassVar[str] = "body"

    role: ClassVar[Role] = Role.REASONING
    needs_special_tokens = True
    #: stop markers that complete a call (text mode: ``<|call|>``/``<|end|>``; id mode: any
    #: stop token, as openai-harmony closes a message on any)
    TEXT_CALL_STOPS: ClassVar[tuple[str, ...]] = ("<|call|>", "<|end|>")

    def __init__(self, tok):
        self.tok = tok
        self.reads_ids = self.wants_stop_token = reads_harmony_ids(tok)
        self._tb = tok.token_bytes if self.reads_ids else None

    def initial_state(self, ctx: RequestContext) -> HarmonyState:
        return HarmonyState(phase=_HEADER if self.reads_ids else _TEXT,
                            parallel=ctx.parallel_tool_calls is not False)

    def feed(self, state: HarmonyState, text: str, token_ids: list[int]) -> Delta:
        if self.reads_ids:
            return self.apply(state, scan_ids(state, token_ids, False, self._tb))  # type: ignore[arg-type]
        return self.apply(state, scan(state, text, final=False))

    def finish(self, state: HarmonyState) -> Delta:
        if self.reads_ids:
            return self.apply(state, scan_ids(state, [], True, self._tb))  # type: ignore[arg-type]
        return self.apply(state, scan(state, "", final=True))

    def body_held(self, st: HarmonyState) -> int:
        """Characters of the open call's body held (0 outside a call)."""
        return len(st.body)

    def spill_point(self, st: HarmonyState) -> int:
        """The whole body: no step reads it before the call's message closes."""
        return len(st.body)

    def _completes_call(self, stop: str) -> bool:
        return bool(stop) if self.reads_ids else stop in self.TEXT_CALL_STOPS

    def apply(self, st: HarmonyState, segments: list[Segment]) -> Delta:
        """The one apply loop: segments -> reasoning / content / calls by each message's
        route (:func:`classify`). A call whose body is not JSON, or that the output cut off,
        comes back as content, verbatim (header, ``<|message|>``, body, terminator)."""
        out = Delta()
        tool = self.role == Role.TOOL
        for seg in segments:
            kind, t = seg.kind, seg.text
            if kind == _LOOSE:
                out.content += t
            elif kind == _OPEN:
                st.header = seg.header
                st.route = classify(seg.header, self.role, not self.reads_ids)  # type: ignore[arg-type]
                st.body = ""
                if st.route == _R_RAW:
                    out.content += seg.header.raw + MESSAGE  # type: ignore[union-attr]
            elif kind == _SBODY:
                r = st.route
                if r == _R_REASONING:
                    out.reasoning += t
                elif r in (_R_CONTENT, _R_RAW):
                    out.content += t
                elif r == _R_CALL and tool:
                    st.body += t
            else:  # CLOSE
                if st.route == _R_RAW:
                    out.content += t
                elif st.route == _R_CALL and tool:
                    self._close_call(st, out, t)
                st.route, st.header = _R_NONE, None
        return out

    def _close_call(self, st: HarmonyState, out: Delta, stop: str) -> None:
        if st.spilled:
            raise BodyNeeded
        header = st.header or Header("")
        body, st.body = st.body, ""
        args = call_arguments(body, header.ctype) if self._completes_call(stop) else None
        if args is None:
            out.content += header.raw + MESSAGE + body + stop
        elif st.parallel or st.calls == 0:
            out.tool_calls.append(ToolCallDelta(index=st.calls, name=call_name(header.recipient), arguments=args))
            st.calls += 1
