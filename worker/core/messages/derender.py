"""Messages derender: engine token ids -> a ``Message`` (non-streaming) or Messages stream events
(one chunk), through the served model's detokenizer, parser stack and the shared event builder
(``worker.core.responses.events.EventBuilder``, translated by ``events.translate``). No I/O.

One parse, two views (R3): ``derender_messages`` runs the stream over the whole output as one
chunk and returns what ``events.accumulate`` of its events gives (``events.message_of`` of the
builder's items, without building the events, except under shaped arguments): what
anthropic-sdk-python builds from the stream, and, the parser stack being split-independent, what
any chunking of the same tokens streams. A non-streaming output that ``onestep.message`` takes
(qwen3 / hermes, no stop strings, added tokens in the shape where the stream's steps equal one)
is parsed as chat parses it, in one step without the builder: the same Message.

Rules (issue 26; the reference's facts, ``tests/data/parity/messages_public.jsonl``): the
parsers run in their streaming form for both views; the final stop token (EOS or an int
``stop_reason``) is not detokenized but counted in ``output_tokens``; ``stop_sequences`` apply to
the answer (``worker.core.answer.step_answer``: the last ``max(len) - 1`` characters held back
until the finish, the text cut where the stop string starts), and ``stop_reason`` is
``stop_sequence`` with the engine's matched string; exactly one choice (index 0), else 400.
"""
from __future__ import annotations

import re
import weakref

import msgspec

from schemas import GenerateTokensStreamChoice, GenerateTokensStreamResponse, Int64
from schemas.messages import DerenderMessagesRequest, Message, MessagesRequest
from schemas.responses import FunctionCallArgumentsDelta, ResponseObject, ResponsesRequest
from worker.core.answer import step_answer
from worker.core.derender import (
    ModelRuntime,
    check_prompt_ids,
    effective_skip_special_tokens,
)
from worker.core.detokenize import IncrementalDetokenizer, detokenize_with_stop, step_text
from worker.core.errors import BadRequest, Conflict
from worker.core.messages import bare_array, onestep, rules
from worker.core.messages.bare_array import ArrayScan
from worker.core.messages.events import Outcome, accumulate, message_of, translate
from worker.core.messages.request import DEFAULT_REQUEST, check_messages_request, parser_context, stop_strings
from worker.core.responses import argshape
from worker.core.responses.derender import (
    check_next_chunk,
    check_prompt,
    check_tokens,
    first_chunk_request,
    request_digest,
    step_ids,
    stream_request,
)
from worker.core.responses.derender import decode_state as decode_rs
from worker.core.responses.derender import encode_state as encode_rs
from worker.core.responses.echo import response_head
from worker.core.responses.events import EventBuilder, ResponsesStreamState
from worker.core.responses.log import MemoryLog, PieceLog, PiecesNeeded, Reader
from worker.parsers.base import Delta
from worker.parsers.idscan import SMALL, has_special, id_text, runs_pattern

__all__ = ["STATE_VERSION", "MessagesStreamState", "StreamBody", "derender_messages", "derender_messages_chunk",
           "encode_state", "decode_state"]

#: version of ``MessagesStreamState`` (its first item; the builder's state inside carries its
#: own, ``worker.core.responses.events.STATE_VERSION``): a state of another version is refused
#: (400), never misread. Bumped whenever either layout changes.
STATE_VERSION = 1

#: the builder's echo head: a Message echoes nothing, so one fixed minimal head
_HEAD_REQUEST = ResponsesRequest()


class MessagesStreamState(msgspec.Struct, kw_only=True, array_like=True):
    """Per-request Messages stream state, read and rewritten every chunk: ``v`` (version),
    ``rs`` (the event builder's ``ResponsesStreamState``, msgpack: the detokenizer window, the
    parser buffers, the open block; what grows goes to the piece log), ``stop`` (the request's
    stop strings), ``held`` (answer text, or Mistral's bare array text, held back for them), ``matched`` (the stop string that
    matched, if any), ``calls`` (the request's tool mode is on: the non-streaming view steps
    token by token), ``plain_pending`` (``rules.plain_text_first`` not decided yet),
    ``tag_hold`` / ``tag_held`` (``rules.tag_hold`` applies / its held text), ``scan``
    (Mistral's bare call array under a required / named ``tool_choice``: ``bare_array``)."""

    v: int = STATE_VERSION
    rs: bytes = b""
    stop: list[str] = msgspec.field(default_factory=list)
    held: str = ""
    matched: str | None = None
    calls: bool = False
    plain_pending: bool = False
    tag_hold: bool = False
    tag_held: str = ""
    scan: ArrayScan | None = None


class StreamBody(msgspec.Struct, kw_only=True):
    """A streaming Messages chunk body as the core decodes it: ``messages_request`` kept raw
    (decoded on the first chunk only; later chunks compare its digest)."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    messages_request: msgspec.Raw = msgspec.Raw(b"")


_request_decoder = msgspec.json.Decoder(MessagesRequest)
_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(MessagesStreamState)


def encode_state(ms: MessagesStreamState, rs: ResponsesStreamState) -> bytes:
    """msgpack bytes of the stream state (``rs`` packed into ``ms.rs``)."""
    ms.rs = encode_rs(rs)
    return _state_encoder.encode(ms)


def decode_state(rt: ModelRuntime, data: bytes) -> tuple[MessagesStreamState, ResponsesStreamState]:
    """Decode ``encode_state`` bytes. Raises ``BadRequest`` for bytes that are not a Messages
    state of this version (or whose builder state is unreadable)."""
    try:
        ms = _state_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadRequest(f"stored Messages stream state is unreadable: {e}") from None
    if ms.v != STATE_VERSION:
        raise BadRequest(f"stored Messages stream state has version {ms.v}, expected {STATE_VERSION}")
    return ms, decode_rs(rt, ms.rs)


#: runtime -> its builder head (``response_head`` of ``_HEAD_REQUEST``, empty id and model), built once
_HEADS: weakref.WeakKeyDictionary[ModelRuntime, ResponseObject] = weakref.WeakKeyDictionary()


def _head(rt: ModelRuntime, request_id: str, model: str) -> ResponseObject:
    """``response_head(rt, _HEAD_REQUEST, ...)`` for ``request_id`` / ``model``: the runtime's
    fixed head with those two fields replaced (heads are never mutated)."""
    try:
        h = _HEADS[rt]
    except KeyError:
        h = _HEADS[rt] = response_head(rt, _HEAD_REQUEST, response_id="", model="", created_at=0)
    except TypeError:  # not weak-referenceable
        return response_head(rt, _HEAD_REQUEST, response_id=request_id, model=model, created_at=0)
    return msgspec.structs.replace(h, id=request_id, model=model)


def _new_state(rt: ModelRuntime, req: MessagesRequest, *, request_id: str, model: str,
               prompt_ids: list[int] | None, prompt_tokens: int | None,
               whole: bool = False) -> tuple[MessagesStreamState, ResponsesStreamState]:
    """A fresh stream state. ``whole``: the output comes in one call (no detokenizer seed)."""
    ctx = parser_context(req, prompt_ids)
    stack = rt.stack
    mode = stack.tool_mode(ctx)
    skip = effective_skip_special_tokens(rt, True, mode)
    stop = stop_strings(req)
    detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=skip,
                                   prompt_token_ids=prompt_ids).state() if not (whole and not stop) else None
    engine = rt.config.tool_parser in argshape.ENGINE_PARSERS and stack.tool is not None
    hold = argshape.held_marker_ids(stack.tool, rt.tokenizer.token_to_id) \
        if engine and ctx.tools and ctx.tool_choice == "none" else []
    head = _head(rt, request_id, model)
    rs = ResponsesStreamState(
        request_id=request_id, model=model, head=head, skip_special=skip, fmt=stack.id_format, detok=detok,
        parser=stack.initial_state(ctx, streaming=True, mode=mode) if rt.has_parser else None,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else len(prompt_ids or []),
        arg_shape=rt.config.tool_parser in argshape.SHAPED_PARSERS, cut_open=engine, hold_ids=hold)
    tp = rt.config.tool_parser
    ms = MessagesStreamState(
        stop=stop, calls=mode != "off",
        plain_pending=tp in rules.PLAIN_TEXT_PARSERS and mode == "auto",
        tag_hold=rt.config.reasoning_parser == "qwen3" and ctx.thinking_disabled(),
        scan=ArrayScan() if tp == "mistral" and mode in ("required", "named") else None)
    return ms, rs


def _rules(rt: ModelRuntime, ms: MessagesStreamState, st: ResponsesStreamState, d: Delta) -> Delta:
    """The Messages-stream rules on one parser delta (``worker.core.messages.rules``)."""
    tp = rt.config.tool_parser
    if st.n_calls and tp in rules.TEXT_DROPPED_AFTER_CALL:
        d.content = ""
    if st.n_calls and tp in rules.TEXT_HELD_AFTER_CALL:
        st.holding = True
        if d.content and st.open is not None and st.open.type == "function_call":
            d.content = d.content.removeprefix("\n")
    if ms.tag_hold:
        ms.tag_held = rules.tag_hold(ms.tag_held, d, False)
    return d


def _array_stop(ms: MessagesStreamState, text: str, final: bool) -> str:
    """The request's stop strings on Mistral's bare array (``ms.scan``): the text to scan, cut
    where the first stop string starts (``ms.matched`` set; nothing scanned after it), its last
    ``max(len) - 1`` characters held in ``ms.held`` until the next text or the finish (the
    answer's hold-back rule, ``worker.core.answer``)."""
    buf = ms.held + text
    hits = [(buf.find(s), s) for s in ms.stop if s in buf]
    if hits:
        at, ms.matched = min(hits)
        ms.held = ""
        return buf[:at]
    keep = 0 if final else min(len(buf), max(map(len, ms.stop)) - 1)
    ms.held = buf[len(buf) - keep:]
    return buf[:len(buf) - keep]


def _plain_first(ms: MessagesStreamState, st: ResponsesStreamState, text: str) -> None:
    """``rules.plain_text_first``: turn the tool parser off for an output of plain text."""
    plain = rules.plain_text_first(text)
    if plain is None:
        return
    ms.plain_pending = False
    if plain and st.parser is not None:
        st.parser.mode, st.parser.tool = "off", None


def _merge_final_arguments(st: ResponsesStreamState, b: EventBuilder, n0: int) -> None:
    """``rules`` ``merge_final_arguments``: the open shaped call's rest goes into the last
    step's argument delta (events from ``n0``), or nowhere when that step sent none."""
    o = st.open
    if not st.arg_shape or o is None or o.type != "function_call":
        return
    st.arg_shape = False  # the builder's close adds no rest of its own
    sent = b.log.open_item(o.log_start)[0]
    rest = argshape.final_rest(o.raw, sent)
    last = [e for e in b.events[n0:] if isinstance(e, FunctionCallArgumentsDelta) and e.item_id == o.id]
    if rest and last:
        last[-1].delta += rest
        b.log.append_text(rest)


#: tokenizer -> ``idscan.runs_pattern`` of its added ids (None: too many runs), built once
_ADDED: weakref.WeakKeyDictionary[object, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def _added_pattern(tok) -> re.Pattern[str] | None:
    try:
        return _ADDED[tok]
    except KeyError:
        p = _ADDED[tok] = runs_pattern(tok.added_token_ids)
        return p
    except TypeError:  # not weak-referenceable: the per-id scan
        return None


def _segments(rt: ModelRuntime, ids: list[int]) -> list[tuple[int, list[int]]]:
    """``(start, ids)`` of the steps the non-streaming view feeds when calls are possible: the
    output cut after each added token (call and reasoning markers are added tokens: text after a
    call then comes in its own step, as in any stream; the rest of vLLM's rules, but llama3_json's,
    are split-independent), but the reasoning's end marker (vLLM's chat stream carries the
    whitespace after it in the same step: ``ParserStack._carries``). At least one (possibly
    empty) segment."""
    tok = rt.tokenizer
    ends = rt.stack.reasoning.end_ids if rt.stack.reasoning is not None else frozenset()
    p = _added_pattern(tok) if len(ids) > SMALL else None
    s = id_text(ids, keep=False) if p is not None else None
    if s is not None:  # C-level: one search over the ids as text (``worker.parsers.idscan``)
        cuts = [m.start() + 1 for m in p.finditer(s, 0, len(ids) - 1) if ids[m.start()] not in ends]
    else:
        added = tok.added_token_ids
        cuts = [i + 1 for i, t in enumerate(ids[:-1]) if t in added and t not in ends]
    return [(a, ids[a:z]) for a, z in zip([0] + cuts, cuts + [len(ids)])]


def _lead_merged(rt: ModelRuntime, ms: MessagesStreamState, st: ResponsesStreamState,
                 segs: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """``segs`` with a first segment that is the reasoning start marker alone merged into the
    next (one step fewer): nothing precedes the marker, so the merged step's delta orders as the
    two steps do (reasoning before content before calls; the parsers are split-independent).
    Not under the rules that read a step's first text or hold ids (``plain_pending``,
    ``tag_hold``, ``hold_ids``)."""
    r = rt.stack.reasoning
    if len(segs) < 2 or len(segs[0][1]) != 1 or r is None or ms.plain_pending or ms.tag_hold or st.hold_ids:
        return segs
    t = segs[0][1][0]
    if t not in r.start_ids or t in r.end_ids:
        return segs
    return [(0, segs[0][1] + segs[1][1])] + segs[2:]


def _chunk_steps(rt: ModelRuntime, ms: MessagesStreamState, c) -> list:
    """One chunk choice as the parser steps the stream takes: with the tool mode on, the
    chunk cut after each added token (``_segments``, the non-streaming view's cut), the finish
    on the last piece only; else the chunk itself. A parser step is one ``Delta`` that cannot
    order content against calls: a chunk carrying a call's end and the text after it (merged
    engine steps) would open the text block before the call (rule R3: the stream accumulates
    to the non-streaming Message)."""
    ids = c.token_ids or []
    if not ms.calls or len(ids) < 2:
        return [c]
    segs = _segments(rt, ids)
    if len(segs) == 1:
        return [c]
    last = len(segs) - 1
    return [msgspec.structs.replace(c, token_ids=seg, **({} if k == last else {"finish_reason": None,
                                                                               "stop_reason": None}))
            for k, (_, seg) in enumerate(segs)]


def _stepped(rt: ModelRuntime, req: MessagesRequest, prompt_ids: list[int] | None) -> bool:
    """Whether the non-streaming view steps token by token: the request's tool mode is on."""
    return rt.stack.tool_mode(parser_context(req, prompt_ids)) != "off"


def _finish_parsers(rt: ModelRuntime, ms: MessagesStreamState, st: ResponsesStreamState, b: EventBuilder) -> None:
    """The parsers' flush at the end of the output (a call the parser engine's output ended in
    keeps its arguments as streamed: ``argshape.cut_call_rest``)."""
    d = rt.stack.finish(st.parser)
    o = st.open
    if st.cut_open and d.tool_calls and o is not None and o.type == "function_call":
        d.tool_calls = argshape.cut_call_rest(d.tool_calls, o.tool_index)
    b.feed(_rules(rt, ms, st, d), None)


def _step(rt: ModelRuntime, ms: MessagesStreamState, st: ResponsesStreamState, b: EventBuilder, c,
          prompt_ids: list[int] | None = None) -> str | None:
    """Feed one choice's tokens (``c``: a chunk choice) to the builder; at the finish, close the
    builder and return the engine's ``finish_reason`` (None before). ``prompt_ids``
    (non-streaming, no stop strings): detokenize the whole output in one shot."""
    ids = list(c.token_ids or [])
    final = c.finish_reason is not None
    seq, text_ids, lead = step_ids(rt, st, c)
    stack = rt.stack
    special = rt.tokenizer.special_ids if st.skip_special else None
    stop_ids = seq[len(text_ids):] if stack.wants_stop_token and final else []
    if st.hold_ids and not st.holding and not set(st.hold_ids).isdisjoint(text_ids + stop_ids):
        st.holding = True  # argshape.ENGINE_PARSERS, tool_choice none: text held from here
    flushed = False
    n0 = len(b.events)
    if ms.stop and ms.matched is None and ms.scan is None:  # stop strings: per-token stepping on the answer
        detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=st.skip_special, state=st.detok)
        d, _used, matched, ms.held = step_answer(
            stack if st.parser is not None else None, st.parser, detok, text_ids,
            frozenset(special) if special is not None else None, ms.stop, False, 0, st.completion_tokens - lead,
            ms.held, final, stop_ids)
        st.detok = detok.state()
        flushed = final or matched is not None  # step_answer flushed the parsers
        if matched is not None:
            ms.matched = matched
        st.reasoning_tokens += d.reasoning_tokens
        b.feed(_rules(rt, ms, st, d), None)
    elif ms.matched is None:
        pids = text_ids + stop_ids
        if special is not None and has_special(rt.tokenizer, pids):  # C-level test first (chat's rule)
            pids = [t for t in pids if t not in special]
        if prompt_ids is not None:
            text = detokenize_with_stop(rt.tokenizer, text_ids, (), skip_special_tokens=st.skip_special,
                                        prompt_token_ids=prompt_ids)[0] if text_ids else ""
        else:
            text = ""
            if text_ids:
                text, st.detok = step_text(rt.tokenizer, st.detok, text_ids, st.skip_special)
        if ms.plain_pending:
            _plain_first(ms, st, text)
        if ms.scan is not None:
            d = bare_array.scan(ms.scan, _array_stop(ms, text, final) if ms.stop else text)
        elif st.parser is None:
            d = Delta(content=text)
        else:
            d = stack.feed(st.parser, text, pids) if (text or pids) else Delta()
        st.reasoning_tokens += d.reasoning_tokens
        b.feed(_rules(rt, ms, st, d), None)
    st.completion_tokens += len(ids)
    if not final:
        return None
    if ms.scan is not None:
        b.feed(bare_array.finish(ms.scan), None)
    elif st.parser is not None and not flushed and ms.matched is None:
        _finish_parsers(rt, ms, st, b)
    if ms.tag_held:
        b.feed(Delta(content=ms.tag_held), None)
        ms.tag_held = ""
    _merge_final_arguments(st, b, n0)
    st.detok = None
    st.parser = None
    b.finish(c.finish_reason)
    return c.finish_reason


def _outcome(ms: MessagesStreamState, st: ResponsesStreamState, c) -> Outcome:
    engine_stop = c.stop_reason if c.finish_reason == "stop" and isinstance(c.stop_reason, str) else None
    return Outcome(finish_reason=c.finish_reason, stop_sequence=engine_stop or ms.matched,
                   tool_use=st.n_calls > 0, input_tokens=st.prompt_tokens, output_tokens=st.completion_tokens)


def _one_choice(choices: list, where: str) -> None:
    if len(choices) > 1:
        raise BadRequest(f"{where} has {len(choices)} choices; a Messages derender takes exactly one (a Message "
                         "has one output)", param=where)
    if choices and choices[0].index != 0:
        raise BadRequest(f"choice index {choices[0].index} in {where}: a Message's output is choice 0", param=where)


# ----------------------------------------------------------------------------- non-streaming ---
def derender_messages(rt: ModelRuntime, body: DerenderMessagesRequest, ids_in_vocab: bool = False) -> Message:
    """Derender a non-streaming Messages body: the ``Message`` (module docstring).
    ``ids_in_vocab``: the decode bounded every id to the vocabulary (those scans are skipped).
    Raises ``BadRequest`` for an invalid body (``check_messages_request``, one choice, ids)."""
    if body.stream:
        raise BadRequest("stream=true is not valid on a non-streaming derender body (use generate_chunk)",
                         param="stream")
    gr = body.generate_response
    if not gr.choices:
        raise BadRequest("generate_response.choices must hold exactly one choice", param="generate_response.choices")
    _one_choice(gr.choices, "generate_response.choices")
    check_messages_request(rt, body.messages_request, body.prompt_tokens)
    check_prompt(rt, body, ids_in_vocab)
    if not ids_in_vocab:
        check_prompt_ids(rt, gr.prompt_token_ids, "generate_response.prompt_token_ids")
    c = gr.choices[0]
    check_tokens(rt, c, 0, "choice 0", in_vocab=ids_in_vocab)
    req = body.messages_request or DEFAULT_REQUEST
    pids = body.prompt_token_ids if body.prompt_token_ids is not None else gr.prompt_token_ids
    one = onestep.message(rt, req, gr.request_id or "", body.model, pids, body.prompt_tokens, c)
    if one is not None:  # chat's one step (``onestep``: the same Message for the outputs it takes)
        return one
    per_token = rt.config.tool_parser in argshape.SHAPED_PARSERS and _stepped(rt, req, pids)
    ms, st = _new_state(rt, req, request_id=gr.request_id or "", model=body.model, prompt_ids=pids,
                        prompt_tokens=body.prompt_tokens, whole=not per_token)
    # events only where they are edited after the builder (``_merge_final_arguments``, shaped
    # arguments); else a quiet builder over a memory log and the Message from its items
    events = st.arg_shape
    b = EventBuilder(st, PieceLog(None, 0)) if events else EventBuilder(st, MemoryLog(), quiet=True, item_ids=False)
    b.start()
    ids = list(c.token_ids or [])
    fin = {"finish_reason": c.finish_reason or "stop", "stop_reason": c.stop_reason}
    if per_token:  # llama3_json: its argument rule is per engine step (the 1-token stream's parse)
        for t in ids[:-1]:
            _step(rt, ms, st, b, GenerateTokensStreamChoice(index=0, token_ids=[t]))
        chunk = GenerateTokensStreamChoice(index=0, token_ids=ids[-1:], **fin)
        _step(rt, ms, st, b, chunk)
    else:  # the stream's parse, one step per segment (each detokenized in one shot, in context)
        segs = _lead_merged(rt, ms, st, _segments(rt, ids)) if ms.calls else [(0, ids)]
        for k, (start, seg) in enumerate(segs):
            last = k == len(segs) - 1
            chunk = GenerateTokensStreamChoice(index=0, token_ids=seg, **(fin if last else {}))
            _step(rt, ms, st, b, chunk, (pids or []) + ids[:start] if start else (pids or []))
    outcome = _outcome(ms, st, chunk)
    if not events:
        return message_of(b.log.items(), st.request_id, st.model, st.fmt, outcome)
    return accumulate(translate(b.events, st.request_id, st.model, st.fmt, st.prompt_tokens, outcome))


# --------------------------------------------------------------------------------- streaming ---
def derender_messages_chunk(rt: ModelRuntime, body: StreamBody, state: bytes | None, reader: Reader | None = None,
                            seq: int | None = None) -> tuple[list, bytes, bool, bytes, int]:
    """Derender one streaming Messages chunk. ``state``: the stored state bytes (None on the
    first chunk: then ``messages_request`` is required when a parser is configured);
    ``reader(start, end)``: the stream's persisted piece log (None: raise ``PiecesNeeded``
    when this chunk needs some of it); ``seq``: the chunk's sequence number when the transport has
    one (below the state's next expected one: stale, 409 ``Conflict``, nothing changes).

    Returns ``(events, state bytes, done, log_append, log_len)``. Raises ``BadRequest`` before any
    change (a chunk after the end, a request whose digest differs from the stored one, a model
    or request id change, more than one choice, bad ids)."""
    if body.stream is False:
        raise BadRequest("stream=false on a streaming chunk body (generate_chunk)", param="stream")
    gc = body.generate_chunk
    raw = stream_request(body, "messages_request")
    _one_choice(gc.choices, "generate_chunk.choices")
    check_prompt(rt, body)
    if state is None:
        req, pids = first_chunk_request(rt, body, raw, "messages_request", _request_decoder,
                                        check_messages_request)
        prior = 0
        ms = st = None
    else:
        ms, st = decode_state(rt, state)
        if seq is not None and seq < st.next_seq:
            raise Conflict(f"stale chunk: sequence number {seq} < next expected {st.next_seq}", param="seq")
        check_next_chunk(st, body, raw, "messages_request", "Messages")
        prior = st.completion_tokens
    for c in gc.choices:
        check_tokens(rt, c, prior, "choice 0", stream=True)
    log = PieceLog(reader, st.log_len if st is not None else 0)
    if reader is None and log.base_len and any(c.finish_reason is not None for c in gc.choices):
        raise PiecesNeeded(0, log.base_len)
    if ms is None or st is None:
        ms, st = _new_state(rt, req or DEFAULT_REQUEST, request_id=gc.request_id or "", model=body.model,
                            prompt_ids=pids, prompt_tokens=body.prompt_tokens)
        st.req_digest = request_digest(raw) if raw else b""
        b = EventBuilder(st, log)
        b.start()
    else:
        b = EventBuilder(st, log)
    outcome = None
    for c in gc.choices:
        for sub in _chunk_steps(rt, ms, c):
            if _step(rt, ms, st, b, sub) is not None:
                outcome = _outcome(ms, st, sub)
    st.next_seq = seq + 1 if seq is not None else st.next_seq + 1
    st.log_len = len(log)
    events = translate(b.events, st.request_id, st.model, st.fmt, st.prompt_tokens, outcome)
    return events, encode_state(ms, st), st.done, bytes(log.new), st.log_len
