"""OpenAI gpt-oss family (Harmony format): ``--reasoning-parser openai_gptoss``,
``--tool-parser openai``.

Format (OpenAI Harmony response format, openai/harmony; vLLM ``openai_gptoss`` /
``openai``, SGLang ``gpt-oss``): the output is a sequence of messages, each a header then
``<|message|>`` then the body, closed by ``<|end|>``, ``<|call|>`` (a tool call) or
``<|return|>`` (end of answer). The prompt ends with ``<|start|>assistant``, so the first header
is usually just ``<|channel|>analysis``; later ones repeat ``<|start|>assistant``. Channels:
``analysis`` (chain of thought), ``commentary`` (tool calls, preambles), ``final`` (the answer).
A tool call names its recipient in the header, ``to=functions.NAME``, optionally with a
``<|constrain|>json`` content type, and its body is the JSON arguments:

    <|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "SF"}<|call|>

Two scanners, one per kind of vocabulary:

* **ids** (gpt-oss's own ``o200k_harmony`` vocabulary: every marker a special token at its fixed
  id, ``<|start|>`` 200006, ``<|channel|>`` 200005, ``<|message|>`` 200008, ``<|constrain|>``
  200003, ``<|end|>`` 200007, ``<|call|>`` 200012, ``<|return|>`` 200002; see
  ``worker.core.tiktoken_vocab`` for the tokenizer, ``--tokenizer o200k_harmony``): vLLM parses
  Harmony from the token ids with openai-harmony's ``StreamableParser``, and so does
  :func:`scan_ids`, token by token: header ids until ``<|message|>`` (parsed with
  openai-harmony's header rules, :func:`parse_header`: ``<|channel|>NAME``, ``to=RECIPIENT``
  before or after the channel, ``<|constrain|>TYPE`` or a bare content type), then body bytes
  decoded as UTF-8 (an incomplete character held in the state) until a stop token
  (``<|end|>``, ``<|call|>``, ``<|return|>``). Only those ids are markup: the same strings
  written as ordinary tokens are text. The parsers read the ids only (the text delta is
  ignored), and the core hands them the final stop token vLLM trims from the text
  (``wants_stop_token``), since ``<|call|>`` both ends generation and completes a call.
* **text** (any other vocabulary, e.g. markers added to another tokenizer, or sent as text as in
  bug-023/bug-117): :func:`scan` finds the same markers in the decoded text.

Output (vLLM's serving for gpt-oss, ``harmony_utils`` + the ``openai`` tool parser and the
streaming delta extraction):

* ``openai_gptoss`` (reasoning): ``analysis`` bodies -> reasoning; ``final``, ``commentary``
  preambles and other bodies -> content, headers removed. Messages to ``functions.NAME``: in
  text mode they pass through as raw Harmony text in the content, for the tool parser; in id
  mode the tool parser reads them from the ids, so with no tool parser (or tools off) they are
  dropped, as vLLM's ``parse_chat_output`` drops them. Text outside any message is content.
* ``openai`` (tool): a message to ``functions.NAME`` (on ``commentary`` or ``analysis``: the
  recipient decides, as vLLM's streaming path) -> a call, arguments re-dumped the way vLLM does
  (``json.dumps(json.loads(body))``, ASCII-escaped; with a content type not naming json, the
  body as it is; ``{}`` for an empty body); a body that is not JSON leaves the message as
  content, verbatim (vLLM passes the raw text on as arguments; the product never emits a call
  with broken JSON). ``final``/``commentary`` bodies -> content; ``analysis`` bodies are dropped
  (they are reasoning). Text mode makes a call only on ``<|call|>``/``<|end|>``; id mode on any
  stop token, as openai-harmony closes a message on any.

Differences from vLLM, deliberate: messages are concatenated (vLLM's non-streaming path joins
several analysis or final messages with ``\n``, its streaming path does not; stream and
non-stream must agree here); vLLM's tool parser keeps only the last of final / preamble text,
here all of it stays, in order. End of output (``finish_reason: length``) mid-message: the text
so far stays reasoning or content; a call cut short is content, verbatim, never a call (vLLM
drops it from the non-streaming answer); in id mode a header cut short is dropped (it carries
no text; vLLM shows nothing for it), unless it never began like a header (no marker, no leading
``to=``: plain text, which is content). Where openai-harmony raises (a token other than
``<|start|>`` between messages, a header it rejects) the id scanner keeps the text as content;
``<|endoftext|>`` (EOS/pad) is skipped.

Per-feed work is O(delta + marker) (O(tokens) in id mode); a header is buffered up to
``MAX_HEADER`` chars / ``MAX_HEADER_TOKENS`` tokens (longer is not a header: it comes back as
text), a call's body until its terminator. ``reasoning_tokens`` are not counted for Harmony.
Source: OpenAI Harmony format (openai/harmony ``docs/format.md``, ``src/encoding.rs``
``StreamableParser``); vLLM ``entrypoints/openai/parser/harmony_utils.py``,
``tool_parsers/openai_tool_parser.py``. Tests: ``tests/test_gptoss_harmony.py`` (vectors on the
real ids, openai-harmony as the reference), ``tests/test_parser_families.py`` (text mode).

``--tool-call-streaming incremental`` does not apply to Harmony calls (text or ids): they go out
whole, when ``<|call|>`` arrives, in both settings.
"""
from __future__ import annotations

import codecs
import json
import re

import msgspec

from worker.parsers.base import (
    Delta,
    ReasoningParser,
    RequestContext,
    ToolCallDelta,
    ToolParser,
    find_first,
    hold_back,
)
from worker.parsers.registry import register_reasoning, register_tool

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
OPENERS = (START, CHANNEL)
BODY_STOPS = ENDS + (START,)
MAX_HEADER = 512
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")


class HarmonyState(msgspec.Struct, kw_only=True, array_like=True):
    """Scanner position (``phase``: text|header|body, ``buf``: held-back text or the raw header),
    the open message (``header``, ``channel``, ``recipient``, ``mode`` chosen by the parser,
    ``body``: a buffered call body) and ``calls`` emitted / ``parallel``."""

    phase: str = "text"
    buf: str = ""
    header: str = ""
    channel: str = ""
    recipient: str = ""
    mode: str = ""
    body: str = ""
    calls: int = 0
    parallel: bool = True


def scan(st: HarmonyState, text: str, final: bool) -> list[tuple[str, str]]:
    """Advance the scanner over ``text``; returns events ``(kind, text)``: ``loose`` (text
    outside messages), ``open`` (a completed header, see ``open_message``),
    ``body`` (message text), ``close`` (terminator, ``""`` when closed by a new ``<|start|>``
    or the end of output). ``final`` flushes held-back text."""
    ev: list[tuple[str, str]] = []
    s, st.buf = st.buf + text, ""
    while s:
        if st.phase == "text":
            i, m = find_first(s, OPENERS)
            if i < 0:
                keep = 0 if final else hold_back(s, OPENERS)
                if len(s) > keep:
                    ev.append(("loose", s[: len(s) - keep]))
                st.buf = s[len(s) - keep:]
                return ev
            if i:
                ev.append(("loose", s[:i]))
            st.phase, s = "header", s[i:]
            continue
        if st.phase == "header":
            j = s.find(MESSAGE)
            if j < 0:
                if len(s) > MAX_HEADER or final:
                    # not a header after all: give the opener back as text, rescan the rest
                    st.phase = "text"
                    opener = START if s.startswith(START) else CHANNEL
                    ev.append(("loose", opener))
                    s = s[len(opener):]
                    continue
                st.buf = s
                return ev
            st.phase = "body"
            ev.append(("open", s[:j]))
            s = s[j + len(MESSAGE):]
            continue
        # body
        i, m = find_first(s, BODY_STOPS)
        if i < 0:
            keep = 0 if final else hold_back(s, BODY_STOPS)
            if len(s) > keep:
                ev.append(("body", s[: len(s) - keep]))
            st.buf = s[len(s) - keep:]
            if final:
                st.phase = "text"
                ev.append(("close", ""))
            return ev
        if i:
            ev.append(("body", s[:i]))
        st.phase = "text"
        if m == START:
            ev.append(("close", ""))
            s = s[i:]
        else:
            ev.append(("close", m))
            s = s[i + len(m):]
    if final and st.phase == "body":
        st.phase = "text"
        ev.append(("close", ""))
    return ev


def _harmony_args(body: str) -> str | None:
    """Arguments as vLLM's ``openai`` parser returns them: the body's JSON re-dumped with
    ``json.dumps`` defaults (ASCII-escaped); ``{}`` for an empty body; None when not JSON (vLLM
    would pass the raw text on; here the message stays content, never a call with broken JSON)."""
    if not body.strip():
        return "{}"
    try:
        return json.dumps(json.loads(body))
    except ValueError:
        return None


def open_message(st: HarmonyState, header: str) -> None:
    """Record the message whose ``header`` just completed (channel and recipient)."""
    cm = _CHANNEL.search(header)
    rm = _RECIPIENT.search(header)
    st.header = header
    st.channel = cm.group(1) if cm else ""
    st.recipient = rm.group(1) if rm else ""


# ------------------------------------------------------------------------------ id mode ---
#: o200k_harmony ids of the Harmony markers (tiktoken's ``o200k_harmony`` / openai-harmony)
HARMONY_IDS = {"<|return|>": 200002, "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006,
               "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012}
START_ID, MESSAGE_ID, ENDOFTEXT_ID = 200006, 200008, 199999
STOP_IDS = {200002: "<|return|>", 200007: "<|end|>", 200012: "<|call|>"}  # openai-harmony stop_tokens()
MAX_HEADER_TOKENS = 128
_ROLES = ("assistant", "user", "system", "developer", "tool")
CONSTRAIN = "<|constrain|>"


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


class HarmonyIdState(HarmonyState, kw_only=True, array_like=True):
    """``HarmonyState`` plus the id scanner's: ``hdr`` header ids so far, ``opener`` the text
    that opened it (``<|start|>`` or ``""`` for the first message, whose role the prompt gave),
    ``pend`` UTF-8 bytes of an incomplete character, ``ctype`` the content type."""

    phase: str = "header"
    hdr: list[int] = msgspec.field(default_factory=list)
    opener: str = ""
    pend: bytes = b""
    ctype: str = ""


def _utf8(st: HarmonyIdState, data: bytes, final: bool) -> str:
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


def parse_header(text: str, role_known: bool) -> tuple[str, str, str] | None:
    """(channel, recipient, content_type) of a Harmony header, by openai-harmony's rules
    (``parse_header_from_string``): ``<|channel|>NAME`` cut out; ``<|constrain|>`` split off;
    the role first (when not given by the prompt); then the last part is ``to=R`` (recipient),
    a lone unconstrained word (recipient), or the content type with an optional recipient
    before it. None when openai-harmony would reject the header (empty channel, unknown role,
    parts left over)."""
    channel = ""
    i = text.find(CHANNEL)
    if i >= 0:
        rest = text[i + len(CHANNEL):]
        m = re.match(r"[^\s<]*", rest)
        channel = m.group(0)
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
    return channel, recipient, ctype


def scan_ids(st: HarmonyIdState, ids: list[int], final: bool, tb) -> list[tuple[str, str]]:
    """The id scanner (openai-harmony's ``StreamableParser`` over ``ids``, role ``assistant``):
    same events as :func:`scan`, but ``open`` carries the raw header text, channel, recipient and
    content type joined by U+001F (see :func:`open_parsed`; a header openai-harmony rejects comes
    back as ``loose`` text, its body too); ``close`` carries the stop marker, or ``""`` at the
    end of output.
    Tokens outside a message (openai-harmony raises there) are ``loose`` text. ``<|endoftext|>``
    (an EOS/pad id, not text) is skipped everywhere. ``tb``: id -> bytes."""
    ev: list[tuple[str, str]] = []
    run: list[bytes] = []  # bytes of the current body / loose run, decoded once per run

    def flush(final_run: bool) -> None:
        kind = "body" if st.phase == "body" else "loose"
        text = _utf8(st, b"".join(run), final_run) if (run or final_run) else ""
        run.clear()
        if text:
            ev.append((kind, text))

    for t in ids:
        if st.phase == "header":
            if t == MESSAGE_ID:
                head = _utf8(st, b"".join(tb(i) for i in st.hdr), True)
                st.hdr = []
                parsed = parse_header(head, role_known=not st.opener)
                if parsed is None:
                    ev.append(("loose", st.opener + head + MESSAGE))
                    st.phase = "text"
                    continue
                st.phase = "body"
                ev.append(("open", "\x1f".join((st.opener + head, *parsed))))
            elif t in STOP_IDS or len(st.hdr) >= MAX_HEADER_TOKENS:
                # never a header: its text (and the stop marker) as it came
                data = b"".join(tb(i) for i in st.hdr) + tb(t)
                st.hdr = []
                ev.append(("loose", st.opener + _utf8(st, data, t in STOP_IDS)))
                st.phase = "text"
            else:
                st.hdr.append(t)
        elif t in STOP_IDS and st.phase == "body":
            flush(True)
            ev.append(("close", STOP_IDS[t]))
            st.phase = "text"
        elif t == START_ID and st.phase == "text":
            flush(True)
            st.phase, st.opener, st.hdr = "header", START, []
        elif t != ENDOFTEXT_ID:
            run.append(tb(t))
    if run:
        flush(False)
    if final:
        if st.phase == "body":
            # cut by the end of output: an incomplete character is not text yet (openai-harmony's
            # current_content and vLLM's detokenizer leave it out)
            st.pend = b""
            ev.append(("close", ""))
        elif st.phase == "header":
            # cut by the end of output: dropped once it has begun like a header (a marker, or
            # the recipient ``to=`` first; vLLM shows nothing for it); plain text that never
            # became a header is content
            if st.hdr and not st.opener and not any(i in HARMONY_IDS.values() for i in st.hdr):
                head = _utf8(st, b"".join(tb(i) for i in st.hdr), True)
                if not head.lstrip().startswith("to="):
                    ev.append(("loose", head))
            st.hdr = []
        else:
            flush(True)
        st.phase = "text"
    return ev


def open_parsed(st: HarmonyIdState, payload: str) -> None:
    """Record the message of an id-scanner ``open`` event (header, channel, recipient, type)."""
    st.header, st.channel, st.recipient, st.ctype = payload.split("\x1f")


def _call_name(st: HarmonyState) -> str | None:
    """The function a message calls (recipient ``functions.NAME``), else None."""
    r = st.recipient
    return r[len("functions."):] if r.startswith("functions.") and len(r) > len("functions.") else None


def _id_call_args(body: str, ctype: str) -> str | None:
    """vLLM ``openai`` tool parser's arguments for a call body: re-dumped JSON when the content
    type is absent or names json (else the body as it is, when it is JSON); None when the body
    is not JSON (the message then stays content, never a call with broken JSON)."""
    args = _harmony_args(body)
    if args is None or not ctype or "json" in ctype:
        return args
    return body if body.strip() else args


class _HarmonyScanning:
    """Shared by both Harmony parsers: feed/finish run the message scanner (the id scanner on
    gpt-oss's own vocabulary, see :func:`reads_harmony_ids`, else the text scanner) and hand its
    events to the parser's ``_apply`` / ``_apply_ids``; the markers are special tokens the
    parsers must see. In id mode the parser reads only the ids (``reads_ids``: the stack feeds
    it every step's ids, text or not) and wants the final stop token (``wants_stop_token``:
    ``<|call|>``/``<|return|>`` end gpt-oss's generation, and decide whether a call is whole)."""

    needs_special_tokens = True

    def __init__(self, tok):
        self.tok = tok
        self.reads_ids = self.wants_stop_token = reads_harmony_ids(tok)
        self._tb = tok.token_bytes if self.reads_ids else None

    def _state(self, **kw) -> HarmonyState:
        return HarmonyIdState(**kw) if self.reads_ids else HarmonyState(**kw)

    def _apply(self, st: HarmonyState, events: list[tuple[str, str]]) -> Delta:
        raise NotImplementedError

    def _apply_ids(self, st: HarmonyIdState, events: list[tuple[str, str]]) -> Delta:
        raise NotImplementedError

    def feed(self, state: HarmonyState, text: str, token_ids: list[int]) -> Delta:
        if self.reads_ids:
            return self._apply_ids(state, scan_ids(state, token_ids, False, self._tb))
        return self._apply(state, scan(state, text, final=False))

    def finish(self, state: HarmonyState) -> Delta:
        if self.reads_ids:
            return self._apply_ids(state, scan_ids(state, [], True, self._tb))
        return self._apply(state, scan(state, "", final=True))


@register_reasoning("openai_gptoss", "OpenAI gpt-oss-20b / gpt-oss-120b",
                    "Harmony: <|channel|>analysis<|message|>…<|end|> = reasoning, final channel = content")
class GptOssReasoningParser(_HarmonyScanning, ReasoningParser):
    """Harmony channels -> reasoning/content (module docstring for both modes)."""

    def initial_state(self, ctx: RequestContext) -> HarmonyState:
        return self._state()

    def _apply(self, st: HarmonyState, events: list[tuple[str, str]]) -> Delta:
        out = Delta()
        for kind, t in events:
            if kind == "loose":
                out.content += t
            elif kind == "open":
                open_message(st, t)
                if st.recipient:
                    st.mode = "raw"
                    out.content += t + MESSAGE
                else:
                    st.mode = "reasoning" if st.channel == "analysis" else "content"
            elif kind == "body":
                if st.mode == "reasoning":
                    out.reasoning += t
                else:
                    out.content += t
            elif kind == "close":
                if st.mode == "raw":
                    out.content += t
                st.mode = ""
        return out

    def _apply_ids(self, st: HarmonyIdState, events: list[tuple[str, str]]) -> Delta:
        out = Delta()
        for kind, t in events:
            if kind == "loose":
                out.content += t
            elif kind == "open":
                open_parsed(st, t)
                if _call_name(st) is not None:
                    st.mode = "call"  # read from the ids by the tool parser; dropped without one
                else:
                    st.mode = "reasoning" if st.channel == "analysis" else "content"
            elif kind == "body":
                if st.mode == "reasoning":
                    out.reasoning += t
                elif st.mode == "content":
                    out.content += t
            elif kind == "close":
                st.mode = ""
        return out


@register_tool("openai", "OpenAI gpt-oss-20b / gpt-oss-120b",
               "Harmony: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>")
class GptOssToolParser(_HarmonyScanning, ToolParser):
    """Harmony tool calls (module docstring for both modes)."""

    def initial_state(self, ctx: RequestContext) -> HarmonyState:
        return self._state(parallel=ctx.parallel_tool_calls is not False)

    def _emit(self, st: HarmonyState, out: Delta, name: str, args: str) -> None:
        if st.parallel or st.calls == 0:
            out.tool_calls.append(ToolCallDelta(index=st.calls, name=name, arguments=args))
            st.calls += 1

    def _apply(self, st: HarmonyState, events: list[tuple[str, str]]) -> Delta:
        out = Delta()
        for kind, t in events:
            if kind == "loose":
                out.content += t
            elif kind == "open":
                open_message(st, t)
                if _call_name(st) is not None:
                    st.mode, st.body = "call", ""
                elif st.channel == "analysis":
                    st.mode = "drop"
                else:
                    st.mode = "content"
            elif kind == "body":
                if st.mode == "call":
                    st.body += t
                elif st.mode == "content":
                    out.content += t
            elif kind == "close":
                if st.mode == "call":
                    body, st.body = st.body, ""
                    args = _harmony_args(body)
                    if args is None or t not in ("<|call|>", "<|end|>"):
                        out.content += st.header + MESSAGE + body + t
                    else:
                        self._emit(st, out, _call_name(st) or "", args)
                st.mode = ""
        return out

    def _apply_ids(self, st: HarmonyIdState, events: list[tuple[str, str]]) -> Delta:
        out = Delta()
        for kind, t in events:
            if kind == "loose":
                out.content += t
            elif kind == "open":
                open_parsed(st, t)
                if _call_name(st) is not None:
                    st.mode, st.body = "call", ""
                else:
                    st.mode = "drop" if st.channel == "analysis" else "content"
            elif kind == "body":
                if st.mode == "call":
                    st.body += t
                elif st.mode == "content":
                    out.content += t
            elif kind == "close":
                if st.mode == "call":
                    body, st.body = st.body, ""
                    args = _id_call_args(body, st.ctype) if t else None
                    if args is None:
                        out.content += st.header + MESSAGE + body + t
                    else:
                        self._emit(st, out, _call_name(st) or "", args)
                st.mode = ""
        return out
