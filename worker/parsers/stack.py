"""The parser stack of one choice: reasoning parser -> tool parser, plus the request semantics
``vllm serve`` applies around them (tool_choice modes, ``parallel_tool_calls``,
``include_reasoning``). Used identically by the non-streaming path (one delta, then ``finish``)
and the streaming path (one delta per chunk, state checkpointed between chunks).

tool_choice modes (OpenAI spec; vLLM's serving code):

* ``off``: no tools in the request, ``tool_choice="none"``, or ``auto`` without a tool parser /
  ``--enable-auto-tool-choice``: tool markup stays in content (except for tool parsers with
  ``strips_markup_when_off``, run in the internal ``strip`` mode when the request declares
  tools: markup removed, calls discarded, finish_reason untouched);
* ``auto``: the tool parser extracts calls; finish_reason ``stop`` becomes ``tool_calls``;
* ``required``: calls come from the tool parser's markup, else from the content as the JSON list
  ``[{"name", "parameters"}]`` guided decoding produces; content is ``""``;
* ``named``: likewise, the content JSON being the arguments object of the named function;
  finish_reason is not rewritten.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any

import msgspec

from worker.parsers.base import (
    BodyNeeded,
    Delta,
    ReasoningParser,
    RequestContext,
    ToolCallDelta,
    ToolParser,
    surrogates_escaped,
)


class StackState(msgspec.Struct, kw_only=True):
    """State of one choice's parser stack: the two parsers' states (their own Struct types,
    see ``ParserStack.load_state``), the tool mode, and for required/named modes the content
    kept back for JSON parsing (``held``; ``held_spilled``: characters of it moved out of the
    state, ``ParserStack.spill_held``) and whether any call was emitted. Trailing fields of
    this release (docs/delivery.md, "Rolling upgrades across releases"): ``lead_ws``, the
    whitespace-only content held by ``ToolParser.defers_leading_ws``, and ``text_seen``, a
    non-whitespace content was emitted (the previous release ignores both: a stream it takes
    over at that one step loses the held whitespace); ``ws_carried``: the whitespace-only
    content of the step where the reasoning ended is held by the tool parser and goes out
    joined to the next step's text (``ParserStack._carries``; ignored by the previous release:
    the whitespace may then be its own delta)."""

    mode: str = "off"
    named: str | None = None
    include_reasoning: bool = True
    reasoning: Any = None
    tool: Any = None
    held: str = ""
    calls: int = 0
    held_spilled: int = 0
    lead_ws: str = ""
    text_seen: bool = False
    ws_carried: bool = False


def tool_call_id(request_id: str, choice_index: int, call_index: int, fmt: str = "chatcmpl-tool") -> str:
    """Deterministic tool-call id for call ``call_index`` of choice ``choice_index``: the same
    message always yields byte-identical ids. ``fmt``: ``chatcmpl-tool`` ->
    ``chatcmpl-tool-<16 hex>`` (vLLM's shape); ``alnum9`` -> 9 alphanumerics (Mistral's rule)."""
    digest = hashlib.sha256(f"{request_id}\x1f{choice_index}\x1f{call_index}".encode()).digest()
    if fmt == "alnum9":
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
        n = int.from_bytes(digest[:16], "big")
        out = []
        for _ in range(9):
            n, r = divmod(n, 62)
            out.append(alphabet[r])
        return "".join(out)
    return "chatcmpl-tool-" + digest[:8].hex()


def escape_lone_surrogates(calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """``calls`` (changed in place and returned) with every lone surrogate in a name or an
    arguments fragment written back as the JSON escape the model wrote (``base.surrogates_escaped``:
    a tool parser that decodes the call JSON and encodes it again puts a code point no UTF-8
    reply can hold). An incrementally streamed call sends the model's text, escape included."""
    for tc in calls:
        a = tc.arguments
        if a and not a.isascii():
            tc.arguments = surrogates_escaped(a)
        n = tc.name
        if n and not n.isascii():
            tc.name = surrogates_escaped(n)
    return calls


def _json_calls(text: str, mode: str, named: str | None) -> list[ToolCallDelta] | None:
    """Calls from guided-decoding JSON content (required: list of {name, parameters}; named:
    the arguments object). None when the text is not that JSON."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if mode == "named":
        if not isinstance(obj, dict) or named is None:
            return None
        return [ToolCallDelta(index=0, name=named, arguments=json.dumps(obj, ensure_ascii=False))]
    if not isinstance(obj, list):
        return None
    calls = []
    for i, item in enumerate(obj):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            return None  # a nameless call is not a call (``base.names_ok``)
        args = item.get("parameters", item.get("arguments", {}))
        calls.append(ToolCallDelta(index=i, name=item["name"],
                                   arguments=args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
    return calls


#: the most leading whitespace ``_defer_leading_ws`` holds in a stream state (characters)
LEAD_WS_LIMIT = 1024


def _defer_leading_ws(st: StackState, out: Delta, final: bool) -> None:
    """vLLM 0.32's parser engine (``ParserEngine._events_to_delta``,
    vllm/frontend/processing/parser/engine/parser_engine.py: ``_deferred_content``,
    ``_content_has_nonws``): until the content has a non-whitespace character, whitespace-only
    content is held and sent joined to the next content, or alone at the output's end or with
    a call's delta; past ``LEAD_WS_LIMIT`` characters it is sent (the stream state stays
    bounded). Rewrites ``out.content`` in place."""
    text = st.lead_ws + out.content
    if not text:
        return
    if not text.isspace():
        st.text_seen = True
    elif not (final or out.tool_calls or len(text) > LEAD_WS_LIMIT):
        st.lead_ws, out.content = text, ""
        return
    st.lead_ws, out.content = "", text


class ParserStack:
    """Reasoning + tool parsing for one served model (immutable: the properties read from its
    parsers are computed once; per-choice data in StackState).

    ``reasoning``/``tool``: parser instances or None; ``enable_auto_tool_choice``: vLLM's flag;
    ``tool_call_streaming``: ``whole`` or ``incremental`` (``--tool-call-streaming``: streamed
    choices of a tool parser with ``ToolParser.incremental`` emit a call's name first and its
    arguments as they arrive, ``worker.parsers.incremental``; non-streaming is unaffected)."""

    def __init__(self, reasoning: ReasoningParser | None, tool: ToolParser | None,
                 enable_auto_tool_choice: bool = False, tool_call_streaming: str = "whole"):
        self.reasoning = reasoning
        self.tool = tool
        self.enable_auto_tool_choice = enable_auto_tool_choice
        self.tool_call_streaming = tool_call_streaming

    @cached_property
    def needs_special_tokens(self) -> bool:
        """True when a parser must see special tokens in the text (skip_special_tokens off)."""
        return bool((self.reasoning and self.reasoning.needs_special_tokens)
                    or (self.tool and self.tool.needs_special_tokens))

    @cached_property
    def wants_stop_token(self) -> bool:
        """True when a parser reads the final stop token id too (the core then feeds the ids
        before vLLM's stop-token trimming; the text is unchanged): gpt-oss's Harmony parsers on
        their own vocabulary, where ``<|call|>`` both ends generation and closes a call."""
        return bool((self.reasoning and self.reasoning.wants_stop_token) or (self.tool and self.tool.wants_stop_token))

    @cached_property
    def id_format(self) -> str:
        """Tool call id shape of this model's tool parser."""
        return self.tool.id_format if self.tool else "chatcmpl-tool"

    def tool_mode(self, ctx: RequestContext) -> str:
        """``off`` | ``auto`` | ``required`` | ``named`` for this request (module docstring)."""
        if not ctx.tools or ctx.tool_choice == "none":
            return "off"
        if ctx.named_tool() is not None:
            return "named"
        if ctx.tool_choice == "required":
            return "required"
        if self.tool is not None and self.enable_auto_tool_choice:
            return "auto"
        return "off"

    def initial_state(self, ctx: RequestContext, streaming: bool = False, mode: str | None = None) -> StackState:
        """Fresh state for one choice of a request. ``streaming``: the choice is streamed (the
        stream core's states): with ``tool_call_streaming="incremental"`` the tool parser then
        streams arguments (calls from markup, in the auto / required / named modes). ``mode``:
        ``tool_mode(ctx)`` when the caller already has it (None: computed here)."""
        if mode is None:
            mode = self.tool_mode(ctx)
        tool = self.tool
        if mode == "off" and ctx.tools and tool is not None and tool.strips_markup_when_off:
            mode = "strip"
        st = StackState(
            mode=mode,
            named=ctx.named_tool(),
            include_reasoning=ctx.include_reasoning is not False,
            reasoning=self.reasoning.initial_state(ctx) if self.reasoning else None,
            tool=tool.initial_state(ctx) if (tool and mode != "off") else None,
        )
        if (streaming and self.tool_call_streaming == "incremental" and st.tool is not None
                and mode in ("auto", "required", "named") and tool.incremental):
            tool.stream_arguments(st.tool)
        return st

    def load_state(self, raw: Any) -> StackState:
        """Rebuild a StackState from its msgspec-decoded plain form (sub-states typed again).
        Raises ``msgspec.ValidationError`` for a state that does not fit this stack (a parser's
        sub-state missing or of the wrong shape: a corrupted or foreign checkpoint)."""
        st = msgspec.convert(raw, StackState) if not isinstance(raw, StackState) else raw
        if (self.reasoning is not None and st.reasoning is None) or \
                (self.tool is not None and st.mode != "off" and st.tool is None):
            raise msgspec.ValidationError("parser state missing for this parser stack")
        if self.reasoning is not None and st.reasoning is not None and not isinstance(st.reasoning, msgspec.Struct):
            st.reasoning = msgspec.convert(st.reasoning, self.state_types[0])
        if self.tool is not None and st.tool is not None and not isinstance(st.tool, msgspec.Struct):
            st.tool = msgspec.convert(st.tool, self.state_types[1])
        return st

    @cached_property
    def state_types(self) -> tuple[type | None, type | None]:
        """The Struct types of the reasoning and tool parsers' states (from their initial
        states), computed once per stack."""
        ctx = RequestContext()
        return (type(self.reasoning.initial_state(ctx)) if self.reasoning is not None else None,
                type(self.tool.initial_state(ctx)) if self.tool is not None else None)

    @cached_property
    def typed_state(self) -> type[StackState]:
        """A ``StackState`` subclass whose ``reasoning``/``tool`` fields carry this stack's
        parser state types, so a msgpack decoder restores them typed in one pass (same field
        order, same encoding as ``StackState``: the bytes do not change)."""
        r, t = self.state_types
        return msgspec.defstruct("TypedStackState", [("reasoning", (r | None) if r else Any, None),
                                                     ("tool", (t | None) if t else Any, None)],
                                 bases=(StackState,), kw_only=True)

    def _tools(self, st: StackState, content: str, token_ids: list[int], final: bool) -> Delta:
        out = self._parse_tools(st, content, token_ids, final)
        if self.tool is not None and self.tool.defers_leading_ws and not st.text_seen:
            _defer_leading_ws(st, out, final)
        return out

    def _parse_tools(self, st: StackState, content: str, token_ids: list[int], final: bool) -> Delta:
        out = Delta()
        if st.mode == "off":
            out.content = content
            return out
        if self.tool is not None:
            fed = content or (self.tool.reads_ids and token_ids)
            d = self.tool.feed(st.tool, content, token_ids) if fed else Delta()
            if final:
                d.extend(self.tool.finish(st.tool))
        else:
            d = Delta(content=content)
        if d.tool_calls:
            escape_lone_surrogates(d.tool_calls)
        if st.mode == "auto":
            st.calls += len(d.tool_calls)
            return d
        if st.mode == "strip":
            out.content = d.content
            return out
        # required / named: content is held back for JSON parsing; markup calls pass through
        st.held += d.content
        out.tool_calls = d.tool_calls
        st.calls += len(d.tool_calls)
        return out

    def feed(self, st: StackState, text: str, token_ids: list[int]) -> Delta:
        """Parse one text delta (and its token ids). Returns reasoning/content/tool-call deltas."""
        carry = self._carry and st.mode == "auto"  # (``_carries``, in line)
        reasoning = self.reasoning
        ended = carry and not reasoning.answering(st.reasoning)
        if reasoning is None:  # (``feed_reasoning`` and ``feed_answer``, in line)
            r = Delta(content=text)
        else:
            r = reasoning.feed(st.reasoning, text, token_ids)
            if not st.include_reasoning:
                r.reasoning = ""
        out = self._tools(st, r.content, token_ids, final=False)
        if carry and st.ws_carried:  # the previous step's whitespace goes out joined to this one's
            out.content_break, st.ws_carried = 0, False
        if ended and r.content.isspace() and self.reasoning.answering(st.reasoning):
            st.ws_carried = True
        out.reasoning = r.reasoning
        out.reasoning_tokens = r.reasoning_tokens
        return out

    @cached_property
    def _carry(self) -> bool:
        """The stack-level half of ``_carries`` (computed once)."""
        return self.reasoning is not None and self.tool is not None and self.tool.streams_leading_ws

    def _carries(self, st: StackState) -> bool:
        """vLLM 0.32's chat stream (``OpenAIServingChat``, reasoning + tool parser) does not send
        the content of the step where the reasoning ends: it is added to the next step's
        ``delta_text``. Applied to whitespace-only content for tool parsers with
        ``streams_leading_ws`` (held there anyway): that whitespace is not its own delta
        (``StackState.ws_carried``, ``Delta.content_break``)."""
        return (self.reasoning is not None and self.tool is not None and self.tool.streams_leading_ws
                and st.mode == "auto")

    def finish(self, st: StackState) -> Delta:
        """Flush held-back text at the end of the choice; resolves required/named JSON calls."""
        r = self.finish_reasoning(st)
        out = self.finish_answer(st, r.content)
        out.reasoning = r.reasoning
        return out

    # -- the two halves of a step, for callers that act on the answer text in between (stop
    # strings apply to the answer, not to the reasoning: worker.core.answer) ----------------
    def feed_reasoning(self, st: StackState, text: str, token_ids: list[int]) -> Delta:
        """First half of ``feed``: the reasoning parser's step. ``reasoning`` (empty when the
        request turned ``include_reasoning`` off) and ``reasoning_tokens`` are final; ``content``
        is the answer text still to be handed to ``feed_answer`` / ``finish_answer`` (the whole
        text when no reasoning parser is configured)."""
        if self.reasoning is None:
            return Delta(content=text)
        r = self.reasoning.feed(st.reasoning, text, token_ids)
        if not st.include_reasoning:
            r.reasoning = ""
        return r

    def finish_reasoning(self, st: StackState) -> Delta:
        """First half of ``finish``: flush the reasoning parser (``content``: answer text still
        to be handed to ``finish_answer``)."""
        if self.reasoning is None:
            return Delta()
        r = self.reasoning.finish(st.reasoning)
        if not st.include_reasoning:
            r.reasoning = ""
        return r

    def feed_answer(self, st: StackState, content: str, token_ids: list[int]) -> Delta:
        """Second half of ``feed``: answer text (and the step's token ids) through the tool
        parser / tool_choice mode. Returns content and tool-call deltas (no reasoning)."""
        return self._tools(st, content, token_ids, final=False)

    # -- bounded stream state (worker.core.stream, "Bounded state"): the required/named content
    # kept for JSON parsing is read only at ``finish_answer``, so all of it may leave the state
    def spill_held(self, st: StackState) -> str:
        """Remove the content held for required/named JSON parsing (``held``) from ``st`` and
        return it (the caller keeps it, in order, until ``unspill_held``); ``finish_answer``
        raises ``BodyNeeded`` while some of it is out."""
        text, st.held = st.held, ""
        st.held_spilled += len(text)
        return text

    def unspill_held(self, st: StackState, text: str) -> None:
        """Put back all the characters ``spill_held`` removed (``text``, in order). Raises
        ``ValueError`` when ``text`` is not as many characters as were removed."""
        if len(text) != st.held_spilled:
            raise ValueError(f"unspill_held: {len(text)} characters given, {st.held_spilled} were spilled")
        st.held = text + st.held
        st.held_spilled = 0

    def finish_answer(self, st: StackState, content: str = "") -> Delta:
        """Second half of ``finish``: the last answer text, then the tool parser's flush and
        the required/named JSON resolution. Raises ``BodyNeeded`` while held content is out
        of the state (``spill_held``)."""
        if st.held_spilled:
            raise BodyNeeded
        out = self._tools(st, content, [], final=True)
        if st.mode in ("required", "named"):
            held, st.held = st.held, ""
            if st.calls == 0 and held.strip():
                calls = _json_calls(held.strip(), st.mode, st.named)
                if calls is None:
                    out.content += held
                else:
                    out.tool_calls.extend(escape_lone_surrogates(calls))
                    st.calls += len(calls)
        return out
