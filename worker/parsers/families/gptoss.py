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

Parsers (both built on ``HarmonyScanner`` below; all markers are special tokens):

* ``openai_gptoss`` (reasoning): ``analysis`` bodies -> reasoning; ``final`` and other bodies
  -> content with their headers removed; messages addressed to a recipient (tool calls) pass
  through as raw Harmony text in the content, for the tool parser. Text outside any message
  (no Harmony markup) is content.
* ``openai`` (tool): a message to ``functions.NAME`` -> a call, arguments re-dumped the way
  vLLM does (``json.dumps(json.loads(body))``, ASCII-escaped; a body that is not JSON makes the
  message content, verbatim); ``final``/``commentary`` bodies -> content; ``analysis`` bodies
  are dropped (reasoning, seen only when no reasoning parser runs). vLLM keeps only one of
  final / commentary-preamble text (final preferred); here both stay, in order.

Per-feed work is O(delta + marker); a header is buffered up to ``MAX_HEADER`` chars (longer is
not a header: it comes back as text), a call's body until its terminator.
``reasoning_tokens`` are not counted for Harmony (the channel of a token is only known from the
text).
"""
from __future__ import annotations

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


class _HarmonyScanning:
    """Shared by both Harmony parsers: feed/finish run the message scanner and hand its events to
    the parser's ``_apply``; the markers are special tokens the parsers must see."""

    needs_special_tokens = True

    def __init__(self, tok):
        self.tok = tok

    def _apply(self, st: HarmonyState, events: list[tuple[str, str]]) -> Delta:
        raise NotImplementedError

    def feed(self, state: HarmonyState, text: str, token_ids: list[int]) -> Delta:
        return self._apply(state, scan(state, text, final=False))

    def finish(self, state: HarmonyState) -> Delta:
        return self._apply(state, scan(state, "", final=True))


@register_reasoning("openai_gptoss", "OpenAI gpt-oss-20b / gpt-oss-120b",
                    "Harmony: <|channel|>analysis<|message|>…<|end|> = reasoning, final channel = content")
class GptOssReasoningParser(_HarmonyScanning, ReasoningParser):
    """Harmony channels -> reasoning/content; tool-call messages stay raw in the content."""

    def initial_state(self, ctx: RequestContext) -> HarmonyState:
        return HarmonyState()

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


@register_tool("openai", "OpenAI gpt-oss-20b / gpt-oss-120b",
               "Harmony: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>")
class GptOssToolParser(_HarmonyScanning, ToolParser):
    """Harmony tool calls (module docstring)."""

    def initial_state(self, ctx: RequestContext) -> HarmonyState:
        return HarmonyState(parallel=ctx.parallel_tool_calls is not False)

    def _apply(self, st: HarmonyState, events: list[tuple[str, str]]) -> Delta:
        out = Delta()
        for kind, t in events:
            if kind == "loose":
                out.content += t
            elif kind == "open":
                open_message(st, t)
                if st.recipient.startswith("functions.") and len(st.recipient) > len("functions."):
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
                    elif st.parallel or st.calls == 0:
                        out.tool_calls.append(ToolCallDelta(index=st.calls, name=st.recipient[len("functions."):],
                                                            arguments=args))
                        st.calls += 1
                st.mode = ""
        return out
