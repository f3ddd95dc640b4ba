"""The Responses event builder: parser deltas in, output items and streaming events out.

One builder serves both views (issue 14, "one parse, two views"): the streaming path feeds it
chunk by chunk; the non-streaming path feeds it the whole output as one chunk and returns the
terminal event's ``response``. Items open lazily on the first delta of their kind, in the
order the parser emits them; an item closes when another kind starts or the output ends.

Event order per item (as the parity reference shows): ``output_item.added``,
``content_part.added`` (message, reasoning), the deltas, then ``output_text.done`` /
``reasoning_text.done`` / ``function_call_arguments.done`` (always, also without an argument
delta: R7), ``content_part.done``, ``output_item.done``; after the last item
``response.completed`` or, when the engine cut the output (``finish_reason`` ``length``),
``response.incomplete`` with ``incomplete_details.reason`` ``max_output_tokens`` and the item
open at the cut marked ``incomplete`` (R1, R2). ``sequence_number`` counts every event of the
response from 0 with no gap across chunks. No delta is empty.

Logprobs (with ``include: ["message.output_text.logprobs"]``, R3/R8): one final-form entry per
generated token of the message, in order, in the final part, ``content_part.done``,
``output_item.done``, the terminal response and ``output_text.done``. Each
``output_text.delta`` carries its tokens' entries (delta form, no ``bytes``); entries of tokens
that produced no text ride on the next message delta; a reasoning or call delta drops the ones
waiting (they were not the message's); those still waiting at the end (e.g. the stop token)
go only into the final part. Without logprobs: ``[]`` on deltas and ``.done``, null in the
done part (vLLM).
"""
from __future__ import annotations

from typing import Any

import msgspec

from schemas.responses import (
    ContentPartAddedEvent,
    ContentPartDoneEvent,
    DeltaLogprob,
    DeltaLogprobTop,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputItemAddedEvent,
    OutputItemDoneEvent,
    OutputMessage,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseLogprob,
    ResponseObject,
    ResponseUsage,
)
from worker.core.detokenize import DetokState
from worker.core.responses import argshape
from worker.core.responses.ids import call_id, item_id
from worker.core.responses.log import MemoryLog, PieceLog
from worker.parsers.base import Delta

__all__ = ["STATE_VERSION", "OpenItem", "ResponsesStreamState", "EventBuilder", "delta_form"]

#: version of ``ResponsesStreamState``; a state of another version is refused (400), never misread
STATE_VERSION = 1

#: logprob entries of text-less tokens kept in the state; more (a tool call's body held by the
#: parser, ``--tool-call-streaming whole``) are spilled to the piece log (``p`` records), so the
#: state, read and rewritten every chunk, stays bounded
PENDING_MAX = 4


class OpenItem(msgspec.Struct, kw_only=True, array_like=True):
    """The output item being generated: ``type`` (message | reasoning | function_call), its
    ``output_index``, ``id``, and for a call ``call_id``/``name``/``tool_index`` (the parser's
    call index); ``log_start``: where its records start in the piece log; ``raw`` / ``sent``:
    a call's raw argument text so far and the characters of arguments sent, kept only when
    its arguments are shaped (``worker.core.responses.argshape``, llama3_json); ``held``: a
    message's log offset from which its text is held, -1 when none (``argshape.ENGINE_PARSERS``
    with tool_choice none: sent as one delta when the message closes)."""

    type: str
    output_index: int
    id: str
    log_start: int
    call_id: str = ""
    name: str = ""
    tool_index: int = -1
    raw: str = ""
    sent: int = 0
    held: int = -1


class ResponsesStreamState(msgspec.Struct, kw_only=True, array_like=True):
    """Per-request Responses stream state, read and rewritten every chunk; bounded by the
    detokenizer window, the parser's buffers and the request's echo (never by the output: that
    goes to the piece log). ``head``: the Response's echo fields (``response.created``'s
    object); ``seq_no``: next event ``sequence_number``; ``next_seq``: next chunk sequence
    number (a lower one is stale); ``log_len``: the piece log's length after the last chunk;
    ``req_digest``: blake2b of the first chunk's raw ``responses_request``; ``pending_lp``:
    logprob entries of tokens that produced no text yet (a few partial-UTF-8 tokens; at most
    ``PENDING_MAX``, earlier ones spilled to the piece log from offset ``pend_at``, -1: none);
    ``arg_shape``: call arguments follow vLLM's llama3_json delta rule
    (``worker.core.responses.argshape``); ``cut_open``: a call cut by the end of the output
    keeps its arguments as streamed, ``hold_ids``: call-marker token ids from which message
    text is held, ``holding``: one was seen (``argshape.ENGINE_PARSERS``)."""

    v: int = STATE_VERSION
    request_id: str = ""
    model: str = ""
    head: ResponseObject | None = None
    want_lp: bool = False
    top_logprobs: int = 0
    skip_special: bool = True
    spaces: bool = True
    fmt: str = "chatcmpl-tool"
    detok: DetokState | None = None
    parser: Any = None
    lp_ctx: list[int] = msgspec.field(default_factory=list)
    seq_no: int = 0
    next_seq: int = 0
    n_items: int = 0
    n_calls: int = 0
    open: OpenItem | None = None
    pending_lp: list[ResponseLogprob] = msgspec.field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    log_len: int = 0
    req_digest: bytes = b""
    done: bool = False
    arg_shape: bool = False
    cut_open: bool = False
    hold_ids: list[int] = msgspec.field(default_factory=list)
    holding: bool = False
    pend_at: int = -1
    #: an EOS id that ended a chunk without ``finish_reason``, not yet detokenized (-1: none):
    #: the next chunk starts with it (``worker.core.responses.derender.step_ids``)
    held_stop_id: int = -1


def delta_form(entries: list[ResponseLogprob]) -> list[DeltaLogprob]:
    """Final-form logprob entries in the delta form (no ``bytes``)."""
    return [DeltaLogprob(token=e.token, logprob=e.logprob,
                         top_logprobs=[DeltaLogprobTop(token=t.token, logprob=t.logprob) for t in e.top_logprobs])
            for e in entries]


class EventBuilder:
    """Turns one chunk's parser deltas into events, appending what grows to ``log``.
    ``state`` is advanced in place; ``events`` collects the chunk's events in order."""

    __slots__ = ("st", "log", "events", "quiet", "item_ids")

    def __init__(self, state: ResponsesStreamState, log: PieceLog | MemoryLog, quiet: bool = False,
                 item_ids: bool = True):
        """``quiet``: build no events (``events`` stays empty; the non-streaming view needs only
        the Response ``finish`` returns: the same items, text and logprobs; ``log`` then a
        ``MemoryLog``); ``item_ids`` False: items get ``""`` ids (a view that shows none: the
        non-streaming Message)."""
        self.st = state
        self.log = log
        self.events: list[Any] = []
        self.quiet = quiet
        self.item_ids = item_ids

    def _seq(self) -> int:
        n = self.st.seq_no
        self.st.seq_no = n + 1
        return n

    # ------------------------------------------------------------------------ lifecycle ---
    def start(self) -> None:
        """``response.created`` and ``response.in_progress`` (first chunk only)."""
        head = self.st.head
        if self.quiet:
            return
        self.events.append(ResponseCreatedEvent(response=head, sequence_number=self._seq()))
        self.events.append(ResponseInProgressEvent(response=head, sequence_number=self._seq()))

    def finish(self, finish_reason: str | None) -> ResponseObject:
        """Close the open item and emit the terminal event; returns the final Response."""
        st = self.st
        incomplete = finish_reason == "length"
        if st.open is not None:
            if st.open.held >= 0:
                self._flush_held()
            if st.open.type == "message":
                self.log.append_logprobs(self._take_pending())
            self._drop_pending()
            self._close("incomplete" if incomplete else "completed")
        usage = ResponseUsage(
            input_tokens=st.prompt_tokens, input_tokens_details=InputTokensDetails(),
            output_tokens=st.completion_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=st.reasoning_tokens),
            total_tokens=st.prompt_tokens + st.completion_tokens)
        resp = msgspec.structs.replace(
            st.head, output=self.log.items(), status="incomplete" if incomplete else "completed",
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
            usage=usage)
        if not self.quiet:
            ev = ResponseIncompleteEvent if incomplete else ResponseCompletedEvent
            self.events.append(ev(response=resp, sequence_number=self._seq()))
        st.done = True
        return resp

    # ---------------------------------------------------------------------------- items ---
    def _open(self, typ: str, **call: Any) -> None:
        st = self.st
        idx = st.n_items
        st.n_items += 1
        iid = item_id(st.request_id, idx, typ) if self.item_ids else ""
        st.open = OpenItem(type=typ, output_index=idx, id=iid, log_start=len(self.log), **call)
        if self.quiet:
            return
        if typ == "message":
            item: Any = OutputMessage(id=iid)
            part: Any = OutputText(logprobs=[])
        elif typ == "reasoning":
            item, part = ReasoningItem(id=iid), ReasoningText()
        else:
            item, part = FunctionCallItem(id=iid, call_id=call["call_id"], name=call["name"]), None
        self.events.append(OutputItemAddedEvent(item=item, output_index=idx, sequence_number=self._seq()))
        if part is not None:
            self.events.append(ContentPartAddedEvent(content_index=0, item_id=iid, output_index=idx, part=part,
                                                     sequence_number=self._seq()))

    def _take_pending(self) -> list[ResponseLogprob]:
        """The waiting logprob entries (spilled ones first), now consumed."""
        st = self.st
        lp = (self.log.pending(st.pend_at) + st.pending_lp) if st.pend_at >= 0 else st.pending_lp
        st.pending_lp, st.pend_at = [], -1
        return lp

    def _drop_pending(self) -> None:
        """Forget the waiting entries (they were not the message's): no log read."""
        self.st.pending_lp, self.st.pend_at = [], -1

    def _flush_held(self) -> None:
        """The open message's held text (``OpenItem.held`` on) as one delta, with its tokens'
        logprob entries."""
        o = self.st.open
        if o is None or o.held < 0:
            return
        if self.quiet:  # (the held text is in the item already; only a delta would carry it)
            o.held = -1
            return
        text, entries = self.log.open_item(o.held)
        o.held = -1
        if text and not self.quiet:
            self.events.append(OutputTextDelta(content_index=0, delta=text, item_id=o.id, logprobs=delta_form(entries),
                                               output_index=o.output_index, sequence_number=self._seq()))

    def _close(self, status: str) -> None:
        st = self.st
        it = st.open
        assert it is not None
        if it.held >= 0:
            self._flush_held()
        text, entries = self.log.open_item(it.log_start)
        idx, iid = it.output_index, it.id
        loud = not self.quiet  # a quiet builder builds the closed item only
        ev = self.events
        if it.type == "function_call" and st.arg_shape:
            rest = argshape.final_rest(it.raw, text)
            if rest:
                self.log.append_text(rest)
                if loud:
                    ev.append(FunctionCallArgumentsDelta(delta=rest, item_id=iid, output_index=idx,
                                                         sequence_number=self._seq()))
                text += rest
        if it.type == "message":
            part = OutputText(text=text, logprobs=entries if st.want_lp else None)
            if loud:
                ev.append(OutputTextDone(content_index=0, item_id=iid, logprobs=entries, output_index=idx, text=text,
                                         sequence_number=self._seq()))
                ev.append(ContentPartDoneEvent(content_index=0, item_id=iid, output_index=idx, part=part,
                                               sequence_number=self._seq()))
            item: Any = OutputMessage(id=iid, content=[part], status=status)
        elif it.type == "reasoning":
            part = ReasoningText(text=text)
            if loud:
                ev.append(ReasoningTextDone(content_index=0, item_id=iid, output_index=idx, text=text,
                                            sequence_number=self._seq()))
                ev.append(ContentPartDoneEvent(content_index=0, item_id=iid, output_index=idx, part=part,
                                               sequence_number=self._seq()))
            item = ReasoningItem(id=iid, content=[part], status=status)
        else:
            if loud:
                ev.append(FunctionCallArgumentsDone(arguments=text, item_id=iid, output_index=idx, name=it.name,
                                                    sequence_number=self._seq()))
            item = FunctionCallItem(id=iid, call_id=it.call_id, name=it.name, arguments=text, status=status)
        if loud:
            ev.append(OutputItemDoneEvent(item=item, output_index=idx, sequence_number=self._seq()))
        self.log.append_item(item)
        st.open = None

    def _ensure(self, typ: str) -> None:
        if self.st.open is None or self.st.open.type != typ:
            if self.st.open is not None:
                self._close("completed")
            self._open(typ)

    # --------------------------------------------------------------------------- deltas ---
    def feed(self, d: Delta, entries: list[ResponseLogprob] | None) -> None:
        """One parser step's delta (reasoning, then content, then call fragments) plus the
        final-form logprob entries of the tokens that produced it (None without logprobs)."""
        st = self.st
        if entries:
            st.pending_lp.extend(entries)
        calls = d.tool_calls
        o = st.open
        if calls and (d.reasoning or d.content) and o is not None and o.type == "function_call":
            # a merged step: the open call's end came before the step's text (one Delta has no
            # order of its own); those fragments first, else the text would split the call
            k = 0
            while k < len(calls) and calls[k].name is None and calls[k].index == o.tool_index:
                k += 1
            self._calls(calls[:k])
            calls = calls[k:]
        if d.reasoning:
            o = st.open
            if o is None or o.type != "reasoning":  # (``_ensure``'s test, in line)
                self._ensure("reasoning")
                o = st.open
            st.pending_lp, st.pend_at = [], -1  # (``_drop_pending``, in line)
            self.log.append_text(d.reasoning)
            if not self.quiet:
                n = st.seq_no  # (``_seq``, in line)
                st.seq_no = n + 1
                self.events.append(ReasoningTextDelta(content_index=0, delta=d.reasoning, item_id=o.id,
                                                      output_index=o.output_index, sequence_number=n))
        if d.content:
            o = st.open
            if o is None or o.type != "message":  # (``_ensure``'s test, in line)
                self._ensure("message")
                o = st.open
            if st.pend_at == -1:  # (``_take_pending`` without spilled entries, in line)
                lp, st.pending_lp = st.pending_lp, []
            else:
                lp = self._take_pending()
            if st.holding and o.held < 0:
                o.held = len(self.log)
            self.log.append_text(d.content)
            self.log.append_logprobs(lp)
            if o.held < 0 and not self.quiet:
                # ``Delta.content_break``: the held text is its own delta, with the entries
                # that waited with it (the log records the step's text as one piece)
                k = d.content_break if 0 < d.content_break < len(d.content) and not d.reasoning else 0
                n = len(lp) - len(entries or []) if k else 0
                for text, part in ((d.content[:k], lp[:n]), (d.content[k:], lp[n:])) if k else ((d.content, lp),):
                    self.events.append(OutputTextDelta(content_index=0, delta=text, item_id=o.id,
                                                       logprobs=delta_form(part), output_index=o.output_index,
                                                       sequence_number=self._seq()))
        if calls:
            self._calls(calls)
        if len(st.pending_lp) > PENDING_MAX:  # spill: the state stays bounded (PENDING_MAX)
            if st.pend_at < 0:
                st.pend_at = len(self.log)
            self.log.append_pending(st.pending_lp)
            st.pending_lp = []

    def _calls(self, tool_calls: list) -> None:
        """Call fragments of one step: a named one (or another index) opens a call item."""
        st = self.st
        for tc in tool_calls:
            o = st.open
            if tc.name is not None or o is None or o.type != "function_call" or o.tool_index != tc.index:
                if o is not None:
                    self._close("completed")
                cid = call_id(st.request_id, st.n_calls, st.fmt)
                st.n_calls += 1
                self._open("function_call", call_id=cid, name=tc.name or "", tool_index=tc.index)
                o = st.open
            self._drop_pending()
            args = tc.arguments
            if args and st.arg_shape:
                prev = o.raw
                o.raw = prev + args
                args = argshape.step(prev, o.raw, o.sent)
                o.sent += len(args)
            if args:
                self.log.append_text(args)
                if self.quiet:
                    continue
                self.events.append(FunctionCallArgumentsDelta(delta=args, item_id=o.id,
                                                              output_index=o.output_index,
                                                              sequence_number=self._seq()))
