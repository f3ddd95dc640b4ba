"""Google Gemma 4 family: ``--reasoning-parser gemma4``, ``--tool-parser gemma4``.

Reasoning (Gemma 4 chat template with ``enable_thinking``; vLLM ``gemma4``): the thought
channel ``<|channel>thought\\n…<channel|>`` (special tokens ``<|channel>``/``<channel|>``); the
``thought\\n`` channel label is not reasoning text and is stripped; output that does not open
the channel is content; a channel opened after content is reasoning (the text around it content:
vLLM's ``test_gemma4_reasoning[new_line]``); a ``<|tool_call>`` straight from the channel ends it;
a ``<channel|>`` with no channel open is dropped and the text around it stays content, in both
modes (vLLM's streaming answer ``test_gemma4_reasoning[invalid_simple_streaming]``; its
non-streaming twin reads the text before it as reasoning: a deviation, ``docs/parsers.md``).

Example: ``<|channel>thought\\nUser wants X.<channel|>Here is X.`` -> reasoning ``User wants X.``,
content ``Here is X.``

Tool calls (Gemma 4 template; vLLM ``gemma4``): one block per call in a non-JSON
serialization: unquoted keys, strings between ``<|"|>`` tokens, bare numbers/booleans, nested
``{}``/``[]``:

    <|tool_call>call:get_weather{location:<|"|>Tokyo<|"|>,days:3,opts:{metric:true}}<tool_call|>

-> ``get_weather`` with ``{"location": "Tokyo", "days": 3, "opts": {"metric": true}}``.

Recovery: the **bare opener** ``<|tool_call>:NAME{...}<tool_call|>`` (``call`` missing before the
colon; Gemma 4 writes it in about 0.4% of tool turns, vLLM issue 53431) is a call like the
documented form, with the same argument grammar (every value syntax), alone or next to
well-formed calls, in both modes: vLLM PR 53444 (a ``:`` transition out of the tool preamble),
bug-207. The other openers that PR mentions (``call:NAME prose`` without ``{``,
``call:NAME(args)``) are not calls here: their block stays content, verbatim, and the text
and calls after it are read as usual (that PR's escape from the name state fixes the same
swallowing in vLLM; no arguments are invented from them here). Calls go out whole when
their block closes, also with ``--tool-call-streaming incremental``.
"""
import json
from typing import Any

from worker.parsers.base import Delta, RequestContext
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedToolParser
from worker.parsers.think import ThinkFields, ThinkReasoningParser, ThinkSpec

Q = '<|"|>'
_THOUGHT = "thought\n"


class _Bad(Exception):
    pass


def _bare(v: str) -> Any:
    v = v.strip()
    if v == "true":
        return True
    if v == "false":
        return False
    if v.lower() in ("null", "none", "nil"):
        return None
    try:
        return float(v) if any(c in v for c in ".eE") else int(v)
    except ValueError:
        return v


def _value(s: str, i: int) -> tuple[Any, int]:
    if s.startswith(Q, i):
        j = s.find(Q, i + len(Q))
        if j < 0:
            raise _Bad
        return s[i + len(Q):j], j + len(Q)
    if s.startswith("{", i):
        return _object(s, i + 1)
    if s.startswith("[", i):
        return _array(s, i + 1)
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    if j == i or not s[i:j].strip():
        raise _Bad
    return _bare(s[i:j]), j


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \n\t":
        i += 1
    return i


def _object(s: str, i: int) -> tuple[dict, int]:
    out: dict = {}
    i = _skip(s, i)
    while True:
        if i >= len(s):
            raise _Bad
        if s[i] == "}":
            return out, i + 1
        j = s.find(":", i)
        if j < 0:
            raise _Bad
        key = s[i:j].strip()
        if key.startswith(Q) and key.endswith(Q) and len(key) >= 2 * len(Q):
            key = key[len(Q):-len(Q)]
        if not key or any(c in key for c in "{}[],"):
            raise _Bad
        val, i = _value(s, _skip(s, j + 1))
        out[key] = val
        i = _skip(s, i)
        if i < len(s) and s[i] == ",":
            i = _skip(s, i + 1)


def _array(s: str, i: int) -> tuple[list, int]:
    out: list = []
    i = _skip(s, i)
    while True:
        if i >= len(s):
            raise _Bad
        if s[i] == "]":
            return out, i + 1
        val, i = _value(s, i)
        out.append(val)
        i = _skip(s, i)
        if i < len(s) and s[i] == ",":
            i = _skip(s, i + 1)


def parse_gemma4_call(body: str) -> list[tuple[str, str]] | None:
    """``call:NAME{args}`` (or the bare opener ``:NAME{args}``, module docstring) ->
    ``[(NAME, arguments JSON)]``; None when malformed."""
    head = "call:" if body.startswith("call:") else ":" if body.startswith(":") else ""
    if not head:
        return None
    b = body.find("{")
    name = body[len(head):b].strip() if b > 0 else ""
    if not name or any(c.isspace() for c in name):
        return None
    try:
        args, end = _object(body, b + 1)
    except (_Bad, RecursionError):
        return None
    if body[end:].strip():
        return None
    return [(name, json.dumps(args, ensure_ascii=False))]


class Gemma4ThinkState(ThinkFields, kw_only=True, array_like=True):
    """``ThinkState``'s fields plus the held start of the reasoning (``rbuf``) until the
    ``thought\\n`` label is seen or ruled out (``rdone``); ``ThinkState``'s later fields come
    last (release e8f2be2's layout first: ``ThinkFields``)."""

    rbuf: str = ""
    rdone: bool = False
    closed: bool = False
    held_len: int = 0
    held_in: bool = False


@register_reasoning("gemma4", "Google Gemma 4 (thinking enabled)",
                    "<|channel>thought\\n…<channel|>, label stripped; no channel = content")
class Gemma4ReasoningParser(ThinkReasoningParser):
    needs_special_tokens = True
    spec = ThinkSpec(start=("<|channel>",), end=("<channel|>",), default_reasoning=False,
                     turn_token="<|turn>", implicit_end=("<|tool_call>",), start_anywhere=True,
                     drop_stray_end=True)

    def initial_state(self, ctx: RequestContext) -> Gemma4ThinkState:
        b = super().initial_state(ctx)
        return Gemma4ThinkState(mode=b.mode, buf=b.buf, tok_reasoning=b.tok_reasoning)

    def _label(self, st: Gemma4ThinkState, text: str, final: bool) -> str:
        if st.rdone:
            return text
        s, st.rbuf = st.rbuf + text, ""
        if s.startswith(_THOUGHT):
            st.rdone = True
            return s[len(_THOUGHT):]
        if _THOUGHT.startswith(s) and not final:
            st.rbuf = s
            return ""
        st.rdone = True
        return s

    def feed(self, state: Gemma4ThinkState, text: str, token_ids: list[int]) -> Delta:
        d = super().feed(state, text, token_ids)
        if d.reasoning or state.rbuf:
            d.reasoning = self._label(state, d.reasoning, final=state.mode == "content")
        return d

    def finish(self, state: Gemma4ThinkState) -> Delta:
        d = super().finish(state)
        if d.reasoning or state.rbuf:
            d.reasoning = self._label(state, d.reasoning, final=True)
        return d


@register_tool("gemma4", "Google Gemma 4", '<|tool_call>call:name{key:<|"|>str<|"|>,n:1}<tool_call|>',
               "the opener without `call` (`<|tool_call>:name{…}`, vLLM PR 53444)")
class Gemma4ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<|tool_call>",)
    ends = ("<tool_call|>",)
    strip_before_call = True  # vLLM's TestExtractToolCalls::test_text_before_tool_call
    parse_body = staticmethod(parse_gemma4_call)
