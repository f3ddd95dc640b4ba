"""Responses derender: engine token ids -> ``Response`` (non-streaming) or Responses streaming
events (one chunk), through the served model's detokenizer and parser stack (the chat path's
public pieces: ``IncrementalDetokenizer``, ``ParserStack``, ``chat_logprobs``). No I/O.

One parse, two views: ``derender_responses`` runs the streaming builder over the whole output
as one chunk and returns the terminal event's ``response``; the parser stack is split-
independent, so that object equals the ``response`` of a stream's terminal event for the same
tokens under any chunking (item ids, ``call_id``s, text, arguments, logprobs, usage). A stream
with logprobs steps token by token (each token's entry rides with its text); the non-streaming
view steps blocks of tokens instead and attaches each message part's entries by position at the
end (``worker.core.responses.blocks``, ``_step_blocks``): the same Response. Without logprobs the
non-streaming view builds its items straight from the one parse (``worker.core.responses.onestep``,
for tool parsers whose arguments are neither shaped nor cut by the engine rules): the same Response.

Rules (issue 14; sources in ``schemas/responses.py`` and ``events.py``): the parsers run in
their streaming form for both views (``ParserStack.initial_state(streaming=True)``: with
``--tool-call-streaming incremental`` calls stream their arguments); the final stop token (EOS
or an int ``stop_reason``) is not detokenized but counted in usage and, with logprobs, listed
in the final part; ``created_at`` is the engine's ``created``, else the caller's (the Kafka
worker: the record timestamp; batch: 0); exactly one choice (index 0) per response or chunk,
else 400; ``previous_response_id`` is a 400.
"""
from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from typing import Any

import msgspec

from schemas import GenerateTokensStreamChoice, GenerateTokensStreamResponse, Int64
from schemas.responses import (
    DerenderResponsesRequest,
    OutputMessage,
    ResponseLogprob,
    ResponseLogprobTop,
    ResponseObject,
    ResponsesRequest,
)
from worker.core.derender import (
    ModelRuntime,
    check_ids_and_logprobs,
    check_prompt_ids,
    effective_skip_special_tokens,
)
from worker.core.detokenize import IncrementalDetokenizer, detokenize_with_stop, held_stop_step, step_text
from worker.core.errors import BadRequest
from worker.core.logprobs import MAX_CONTEXT, chat_logprobs, responses_logprobs_json
from worker.core.responses import argshape, blocks, onestep
from worker.core.responses.echo import (
    DEFAULT_REQUEST,
    check_responses_request,
    parser_context,
    response_head,
    wants_logprobs,
)
from worker.core.responses.events import STATE_VERSION, EventBuilder, ResponsesStreamState
from worker.core.responses.log import MAX_PIECES_LEN, MemoryLog, PieceLog, PiecesNeeded, Reader
from worker.parsers.base import Delta
from worker.parsers.idscan import has_special

__all__ = ["StreamBody", "derender_responses", "derender_responses_chunk", "encode_state", "decode_state",
           "request_digest"]


class StreamBody(msgspec.Struct, kw_only=True):
    """A streaming Responses chunk body as the core decodes it: ``responses_request`` kept raw
    (decoded on the first chunk only; later chunks compare its digest)."""

    model: str
    generate_chunk: GenerateTokensStreamResponse
    stream: bool = True
    prompt_tokens: Int64 | None = None
    prompt_token_ids: list[Int64] | None = None
    responses_request: msgspec.Raw = msgspec.Raw(b"")


_request_decoder = msgspec.json.Decoder(ResponsesRequest)
_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(ResponsesStreamState)


def request_digest(raw: bytes) -> bytes:
    """blake2b-128 of a ``responses_request``'s raw JSON bytes (compared, never decoded, on
    later chunks)."""
    return hashlib.blake2b(raw, digest_size=16).digest()


def encode_state(state: ResponsesStreamState) -> bytes:
    """msgpack bytes of ``state`` (what the store keeps)."""
    return _state_encoder.encode(state)


#: per parser stack: a ``ResponsesStreamState`` decoder whose ``parser`` is the stack's typed
#: state (``ParserStack.typed_state``: same field order, same bytes), so a state decodes typed
#: in one pass (no ``msgspec.convert`` of the parser sub-states); the last stack's kept aside
_typed_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _no_stack() -> None:
    return None


_last_typed: tuple = (_no_stack, None)


def _typed_decoder(stack) -> msgspec.msgpack.Decoder:
    """The typed state decoder of ``stack`` (``_typed_decoders``), built once per stack."""
    global _last_typed
    ref, dec = _last_typed
    if ref() is stack:
        return dec
    dec = _typed_decoders.get(stack)
    if dec is None:
        typed = msgspec.defstruct("TypedResponsesStreamState", [("parser", stack.typed_state | None, None)],
                                  bases=(ResponsesStreamState,), kw_only=True, array_like=True)
        dec = _typed_decoders[stack] = msgspec.msgpack.Decoder(typed)
    _last_typed = (weakref.ref(stack), dec)
    return dec


def decode_state(rt: ModelRuntime, data: bytes) -> ResponsesStreamState:
    """Decode ``encode_state`` bytes, parser sub-state retyped for ``rt``. Raises ``BadRequest``
    for bytes that are not a Responses state of this version. (The typed decode first; bytes it
    refuses go through the plain decoder and ``load_state``, whose errors name what they
    always named.)"""
    st = None
    if rt.stack is not None:
        try:
            ref, dec = _last_typed  # (``_typed_decoder``'s last stack, in line)
            st = (dec if ref() is rt.stack else _typed_decoder(rt.stack)).decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            st = None
    try:
        if st is None:
            st = _state_decoder.decode(data)
        if st.v != STATE_VERSION:
            raise BadRequest(f"stored Responses stream state has version {st.v}, expected {STATE_VERSION}")
        if st.parser is not None:
            st.parser = rt.stack.load_state(st.parser)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadRequest(f"stored Responses stream state is unreadable: {e}") from None
    _check_log_offsets(st)
    return st


def _check_log_offsets(st: ResponsesStreamState) -> None:
    """Bound the piece-log numbers a stored state records: ``log_len`` in [0,
    ``MAX_PIECES_LEN``] (Redis's largest string), the open item's ``log_start`` / ``held`` and
    ``pend_at`` inside it (-1: none). Raises ``BadRequest`` ("unreadable"): a state lying about
    its log is never used to read or write it."""
    n = st.log_len
    o = st.open
    if not 0 <= n <= MAX_PIECES_LEN or not -1 <= st.pend_at <= n or (
            o is not None and (not 0 <= o.log_start <= n or not -1 <= o.held <= n)):
        raise BadRequest(f"stored Responses stream state is unreadable: its piece log offsets do not lie in "
                         f"[0, {n}] (log length {n}, at most {MAX_PIECES_LEN})")


# ------------------------------------------------------------------------------ shared step ---
def _new_state(rt: ModelRuntime, req: ResponsesRequest, *, request_id: str, model: str, created: int,
               prompt_ids: list[int] | None, prompt_tokens: int | None, kv=None, ec=None,
               whole: bool = False) -> ResponsesStreamState:
    """A fresh stream state. ``whole``: the output comes in one call without logprobs (the
    non-streaming path detokenizes it in one shot: no detokenizer seed needed)."""
    ctx = parser_context(req, prompt_ids)
    stack = rt.stack
    mode = stack.tool_mode(ctx)
    skip = effective_skip_special_tokens(rt, req.skip_special_tokens, mode)
    head = response_head(rt, req, response_id=request_id, model=model, created_at=created,
                         kv_transfer_params=kv, ec_transfer_params=ec)
    want_lp = wants_logprobs(req)
    seeded = not (whole and not want_lp)
    detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=skip,
                                   prompt_token_ids=prompt_ids).state() if seeded else None
    engine = rt.config.tool_parser in argshape.ENGINE_PARSERS and stack.tool is not None
    hold = argshape.held_marker_ids(stack.tool, rt.tokenizer.token_to_id) \
        if engine and ctx.tools and ctx.tool_choice == "none" else []
    return ResponsesStreamState(
        request_id=request_id, model=model, head=head, want_lp=want_lp,
        top_logprobs=req.top_logprobs or 0, skip_special=skip, fmt=stack.id_format, detok=detok,
        parser=stack.initial_state(ctx, streaming=True, mode=mode) if rt.has_parser else None,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else len(prompt_ids or []),
        arg_shape=rt.config.tool_parser in argshape.SHAPED_PARSERS, cut_open=engine, hold_ids=hold)


def _entries(rt: ModelRuntime, st: ResponsesStreamState, c) -> list[ResponseLogprob] | None:
    """Final-form logprob entries of a choice's tokens (None without logprobs)."""
    if not st.want_lp or c.logprobs is None or not c.logprobs.content:
        return None
    out = []
    for e in chat_logprobs(rt.tokenizer, c.logprobs.content, st.top_logprobs, st.lp_ctx,
                           as_token_ids=rt.config.return_tokens_as_token_ids):
        out.append(ResponseLogprob(token=e.token, bytes=e.bytes or [], logprob=e.logprob,
                                   top_logprobs=[ResponseLogprobTop(token=t.token, bytes=t.bytes or [],
                                                                    logprob=t.logprob) for t in e.top_logprobs]))
    return out


def step_ids(rt: ModelRuntime, st: ResponsesStreamState, c) -> tuple[list[int], list[int], int]:
    """``(seq, text_ids, lead)`` of one chunk choice (``held_stop_step``, never ``include_stop``;
    the held id: ``ResponsesStreamState.held_stop_id``)."""
    ids = c.token_ids
    if st.held_stop_id == -1 and c.finish_reason is None and ids and ids[-1] not in rt.tokenizer.eos_token_ids:
        seq = list(ids)  # (``held_stop_step``'s plain case, in line)
        return seq, seq, 0
    seq, text_ids, lead, st.held_stop_id = held_stop_step(c.token_ids, st.held_stop_id, c.finish_reason,
                                                          c.stop_reason, rt.tokenizer.eos_token_ids)
    return seq, text_ids, lead


def _step(rt: ModelRuntime, st: ResponsesStreamState, b: EventBuilder, c,
          prompt_ids: list[int] | None = None) -> ResponseObject | None:
    """Feed one choice's tokens (``c``: a generate choice or chunk choice) to the builder;
    returns the final Response when ``c`` finishes the output. ``prompt_ids`` (non-streaming
    only: the whole output in one call): detokenize it in one shot
    (``detokenize_with_stop``: equal to stepping, no per-token loop) instead of from the state."""
    ids = list(c.token_ids or [])
    final = c.finish_reason is not None
    seq, text_ids, lead = step_ids(rt, st, c)
    stack = rt.stack
    special = rt.tokenizer.special_ids if st.skip_special else None
    stop_ids = seq[len(text_ids):] if stack.wants_stop_token and final else []
    entries = _entries(rt, st, c)
    whole = entries is None and prompt_ids is not None
    detok = None if whole or entries is None else IncrementalDetokenizer(
        rt.tokenizer, skip_special_tokens=st.skip_special, state=st.detok)

    def parse(text: str, pids: list[int]) -> Delta:
        if st.hold_ids and not st.holding and not set(st.hold_ids).isdisjoint(pids):
            st.holding = True  # argshape.ENGINE_PARSERS, tool_choice none: text held from here
        if special is not None and has_special(rt.tokenizer, pids):  # C-level test first (chat's rule)
            pids = [t for t in pids if t not in special]
        if st.parser is None:
            return Delta(content=text)
        return stack.feed(st.parser, text, pids) if (text or pids) else Delta()

    if whole:  # the whole output at once (non-streaming)
        text = detokenize_with_stop(rt.tokenizer, text_ids, (), skip_special_tokens=st.skip_special,
                                    prompt_token_ids=prompt_ids)[0] if text_ids else ""
        d = parse(text, text_ids + stop_ids)
        st.reasoning_tokens += d.reasoning_tokens
        b.feed(d, None)
    elif entries is None:  # one step per chunk
        text = ""
        if text_ids:
            text, st.detok = step_text(rt.tokenizer, st.detok, text_ids, st.skip_special)
        d = parse(text, text_ids + stop_ids)
        st.reasoning_tokens += d.reasoning_tokens
        b.feed(d, None)
    else:  # one step per token: each token's entry rides with the text it produced
        for j, t in enumerate(text_ids):  # (a held id's entry went with its own chunk)
            d = parse(detok.add([t]), [t])
            st.reasoning_tokens += d.reasoning_tokens
            b.feed(d, entries[j - lead:j - lead + 1] if j >= lead else None)
        if stop_ids:
            d = parse("", stop_ids)
            st.reasoning_tokens += d.reasoning_tokens
            b.feed(d, None)
        if len(text_ids) < len(seq):  # the stop token's (or held id's) entry: final part only
            b.feed(Delta(), entries[max(len(text_ids) - lead, 0):])
    if detok is not None:
        st.detok = detok.state()
    if ids:  # (token ids are ints: the context is the last ``MAX_CONTEXT`` of them; ``next_context``)
        st.lp_ctx = ((st.lp_ctx or []) + ids[-MAX_CONTEXT:])[-MAX_CONTEXT:]
    st.completion_tokens += len(ids)
    if not final:
        return None
    if st.parser is not None:
        d = stack.finish(st.parser)
        o = st.open
        if st.cut_open and d.tool_calls and o is not None and o.type == "function_call":
            d.tool_calls = argshape.cut_call_rest(d.tool_calls, o.tool_index)
        st.reasoning_tokens += d.reasoning_tokens
        b.feed(d, None)
    st.detok = None
    st.parser = None
    st.lp_ctx = []
    return b.finish(c.finish_reason)


def check_tokens(rt: ModelRuntime, c, prior: int, where: str, stream: bool = False, in_vocab: bool = False) -> None:
    """A choice's ids within the vocabulary and ``max_model_len`` (with the ``prior`` ids of
    the stream), logprobs matching them (``in_vocab``: the decode bounded the ids,
    ``check_ids_and_logprobs``). Null ``token_ids``: 400, except in a stream chunk (no new ids,
    as chat streams take it)."""
    ids = c.token_ids
    if ids is None:
        if stream:
            return
        raise BadRequest(f"{where} has null token_ids", param=f"{where}.token_ids")
    cfg = rt.config
    if cfg.max_model_len is not None and prior + len(ids) > cfg.max_model_len:
        raise BadRequest(f"{where}: {prior + len(ids)} output tokens exceed max_model_len ({cfg.max_model_len}).",
                         param=f"{where}.token_ids")
    if c.logprobs is None and (in_vocab or (ids and min(ids) >= 0 and max(ids) < rt.tokenizer.vocab_size)):
        return  # (a plain chunk, or ids the decode bounded: what check_ids_and_logprobs checks, in line)
    check_ids_and_logprobs(rt, ids, c.logprobs, where, in_vocab=in_vocab)


def _one_choice(choices: list, where: str) -> None:
    if len(choices) > 1:
        raise BadRequest(f"{where} has {len(choices)} choices; a Responses derender takes exactly one (the "
                         "Responses API has one output)", param=where)
    if choices and choices[0].index != 0:
        raise BadRequest(f"choice index {choices[0].index} in {where}: a Responses output is choice 0", param=where)


def stream_request(body, field: str) -> bytes:
    """The raw request JSON a stream chunk body carries in ``field`` (``responses_request``,
    ``messages_request``); ``b""`` when absent or null."""
    raw = bytes(getattr(body, field))
    return b"" if raw == b"null" else raw


def first_chunk_request(rt: ModelRuntime, body, raw: bytes, field: str, decoder: msgspec.json.Decoder,
                        check: Callable[[ModelRuntime, Any, int | None], None]) -> tuple[Any, list[int] | None]:
    """A stream's first chunk: ``raw`` (``stream_request``) decoded by ``decoder`` (None when
    empty) and checked by ``check(rt, request, body.prompt_tokens)``, and the prompt ids (the
    body's, else the chunk's). Raises ``BadRequest`` (``invalid <field>: ...``, or ``check``'s)."""
    req = None
    if raw:
        try:
            req = decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise BadRequest(f"invalid {field}: {e}", param=field) from None
    check(rt, req, body.prompt_tokens)
    pids = body.prompt_token_ids if body.prompt_token_ids is not None else body.generate_chunk.prompt_token_ids
    return req, pids


def check_next_chunk(st: ResponsesStreamState, body, raw: bytes, field: str, api: str) -> None:
    """A later chunk of the stream ``st`` (``api``: ``Responses`` / ``Messages``): not after the
    end, the same model and request id, and ``raw`` (``stream_request``, when given) of the
    stored digest. Raises ``BadRequest``."""
    gc = body.generate_chunk
    if st.done:
        raise BadRequest(f"the {api} stream already ended; no chunk may follow its finish_reason",
                         param="generate_chunk")
    if st.model != body.model:
        raise BadRequest(f"model changed mid-stream ({st.model!r} -> {body.model!r})", param="model")
    if (gc.request_id or "") != st.request_id:
        raise BadRequest(f"request_id {gc.request_id!r} does not match the stream's {st.request_id!r}",
                         param="generate_chunk.request_id")
    if raw and request_digest(raw) != st.req_digest:
        raise BadRequest(f"{field} differs from the one the stream started with", param=field)


def check_prompt(rt: ModelRuntime, body, in_vocab: bool = False) -> None:
    """``prompt_tokens`` equal to the length of ``prompt_token_ids`` when both are given, and the
    prompt ids within the vocabulary unless ``in_vocab`` (the decode bounded them) (400
    ``BadRequest`` naming the field otherwise)."""
    if body.prompt_token_ids is not None and body.prompt_tokens is not None \
            and body.prompt_tokens != len(body.prompt_token_ids):
        raise BadRequest(f"prompt_tokens ({body.prompt_tokens}) != len(prompt_token_ids) "
                         f"({len(body.prompt_token_ids)})", param="prompt_tokens")
    if not in_vocab:
        check_prompt_ids(rt, body.prompt_token_ids, "prompt_token_ids")


# ----------------------------------------------------------------------------- non-streaming ---
def derender_responses(rt: ModelRuntime, body: DerenderResponsesRequest, created: int | None = None,
                       ids_in_vocab: bool = False, one_step: bool = True) -> ResponseObject:
    """Derender a non-streaming Responses body: the final ``Response``. ``created``: Unix
    seconds used when the engine response has no ``created`` (None = 0). ``ids_in_vocab``: the
    body's decode bounded every output, prompt and logprob id to the vocabulary
    (``service._bounded_body_decoders``): those scans are skipped. Raises ``BadRequest`` for an
    invalid body (module docstring; ``check_responses_request``). ``one_step`` False: always
    the event builder (``onestep.response``, taken without logprobs, gives the same Response)."""
    if body.stream:
        raise BadRequest("stream=true is not valid on a non-streaming derender body (use generate_chunk)",
                         param="stream")
    gr = body.generate_response
    if not gr.choices:
        raise BadRequest("generate_response.choices must hold exactly one choice", param="generate_response.choices")
    _one_choice(gr.choices, "generate_response.choices")
    check_responses_request(rt, body.responses_request, body.prompt_tokens)
    check_prompt(rt, body, ids_in_vocab)
    if not ids_in_vocab:
        check_prompt_ids(rt, gr.prompt_token_ids, "generate_response.prompt_token_ids")
    c = gr.choices[0]
    check_tokens(rt, c, 0, "choice 0", in_vocab=ids_in_vocab)
    req = body.responses_request or DEFAULT_REQUEST
    pids = body.prompt_token_ids if body.prompt_token_ids is not None else gr.prompt_token_ids
    created_at = gr.created if gr.created is not None else (created or 0)
    if one_step:
        resp = onestep.response(rt, req, request_id=gr.request_id or "", model=body.model, created=created_at,
                                prompt_ids=pids, prompt_tokens=body.prompt_tokens, kv=gr.kv_transfer_params,
                                ec=gr.ec_transfer_params, c=c)
        if resp is not None:
            return resp
    st = _new_state(rt, req, request_id=gr.request_id or "", model=body.model,
                    created=created_at, prompt_ids=pids, prompt_tokens=body.prompt_tokens,
                    kv=gr.kv_transfer_params, ec=gr.ec_transfer_params, whole=True)
    b = EventBuilder(st, MemoryLog(), quiet=True)  # only the final Response is kept, never persisted
    b.start()
    chunk = GenerateTokensStreamChoice(index=0, token_ids=c.token_ids, finish_reason=c.finish_reason or "stop",
                                       stop_reason=c.stop_reason, logprobs=c.logprobs)
    if st.want_lp and c.logprobs is not None and c.logprobs.content:
        resp = _step_blocks(rt, st, b, chunk, pids or [])
        if resp is not None:
            return resp
    resp = _step(rt, st, b, chunk, pids or [])
    assert resp is not None
    return resp


def _step_blocks(rt: ModelRuntime, st: ResponsesStreamState, b: EventBuilder, c,
                 prompt_ids: list[int]) -> ResponseObject | None:
    """``_step`` of a whole output with logprobs (non-streaming; ``c`` finishes it), its
    parser steps taken in blocks (``blocks.plan``) instead of token by token, and each message
    part's logprobs built from its tokens' positions at the end (``_message_logprobs``): the
    same Response. None, with ``st`` as it was, when the blocks fall back (``blocks.Fallback``:
    then ``_step``)."""
    held = st.held_stop_id
    seq, text_ids, _ = step_ids(rt, st, c)
    stack = rt.stack
    stop_ids = seq[len(text_ids):] if stack.wants_stop_token else []
    texts = blocks.texts(rt.tokenizer, st.skip_special, text_ids, st.detok, prompt_ids)
    holding = st.holding
    try:
        feeds, fin, ps = blocks.plan(rt, st, text_ids, texts, stop_ids, len(seq), blocks.stepped(rt, st))
    except blocks.Fallback:
        st.held_stop_id, st.holding = held, holding
        return None
    st.parser = ps
    for d, positions in feeds:
        st.reasoning_tokens += d.reasoning_tokens
        b.feed(d, positions)
    if fin is not None:  # (``_step``'s final flush)
        o = st.open
        if st.cut_open and fin.tool_calls and o is not None and o.type == "function_call":
            fin.tool_calls = argshape.cut_call_rest(fin.tool_calls, o.tool_index)
        st.reasoning_tokens += fin.reasoning_tokens
        b.feed(fin, None)
    st.completion_tokens += len(seq)
    st.detok = None
    st.parser = None
    st.lp_ctx = []
    resp = b.finish(c.finish_reason)
    entries = c.logprobs.content
    for item in resp.output:
        if type(item) is OutputMessage:
            part = item.content[0]
            part.logprobs = msgspec.Raw(_message_logprobs(rt, st, entries, part.logprobs))
    return resp


def _message_logprobs(rt: ModelRuntime, st: ResponsesStreamState, entries: list, positions: list[int]) -> bytes:
    """The JSON of a message part's logprob entries: those of the output positions
    ``positions`` (ascending; one run in practice), each token string repaired from the up
    to 4 sampled ids before it (``responses_logprobs_json``, what ``_entries`` gives)."""
    if not positions:
        return b"[]"
    runs = [(positions[0], positions[-1] + 1)] if positions[-1] - positions[0] + 1 == len(positions) else \
        _runs(positions)
    out = []
    for a, z in runs:
        ctx = [e.token_id for e in entries[max(0, a - MAX_CONTEXT):a]]
        out.append(responses_logprobs_json(rt.tokenizer, entries[a:z], st.top_logprobs, ctx,
                                           as_token_ids=rt.config.return_tokens_as_token_ids)[1:-1])
    return b"[" + b",".join(out) + b"]"


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` runs of consecutive ``positions``."""
    out = []
    a = p0 = positions[0]
    for p in positions[1:]:
        if p != p0 + 1:
            out.append((a, p0 + 1))
            a = p
        p0 = p
    out.append((a, p0 + 1))
    return out


# --------------------------------------------------------------------------------- streaming ---
def derender_responses_chunk(rt: ModelRuntime, body: StreamBody, state: ResponsesStreamState | None,
                             reader: Reader | None = None, created: int | None = None
                             ) -> tuple[list, ResponsesStreamState, bytes]:
    """Derender one streaming Responses chunk. ``state``: None on the first chunk (then
    ``responses_request`` is required when a parser is configured); ``reader(start, end)``:
    bytes of the stream's piece log persisted so far (``state.log_len`` of them; None: raise
    ``PiecesNeeded(start, end)`` if this chunk needs some, i.e. when an item whose records were
    persisted closes, or the whole log when the chunk ends the output); ``created``: Unix seconds for the whole stream, read on the first chunk.

    Returns ``(events, state, log_append)``: the chunk's events (possibly none), the advanced
    state (``done`` after the terminal event) and the bytes to append to the piece log
    (``state.log_len`` = old length + ``len(log_append)``). Raises ``BadRequest`` before any
    change (a chunk after the end, a request whose digest differs from the stored one, a model
    or request id change, more than one choice, bad ids or logprobs)."""
    if body.stream is False:
        raise BadRequest("stream=false on a streaming chunk body (generate_chunk)", param="stream")
    gc = body.generate_chunk
    raw = stream_request(body, "responses_request")
    _one_choice(gc.choices, "generate_chunk.choices")
    check_prompt(rt, body)
    if state is None:
        req, pids = first_chunk_request(rt, body, raw, "responses_request", _request_decoder,
                                        check_responses_request)
        prior = 0
    else:
        check_next_chunk(state, body, raw, "responses_request", "Responses")
        prior = state.completion_tokens
    for c in gc.choices:
        check_tokens(rt, c, prior, "choice 0", stream=True)
    log = PieceLog(reader, state.log_len if state is not None else 0)
    if reader is None and log.base_len and any(c.finish_reason is not None for c in gc.choices):
        raise PiecesNeeded(0, log.base_len)  # the terminal event lists every item: the whole log
    if state is None:
        state = _new_state(rt, req or DEFAULT_REQUEST, request_id=gc.request_id or "", model=body.model,
                           created=created or 0, prompt_ids=pids, prompt_tokens=body.prompt_tokens)
        state.req_digest = request_digest(raw) if raw else b""
        try:  # the echoed fields travel in the msgpack state: 64-bit integers only
            _state_encoder.encode(state.head)
        except OverflowError:
            raise BadRequest("a number in responses_request is outside the 64-bit range a stream state can hold",
                             param="responses_request") from None
        b = EventBuilder(state, log)
        b.start()
    else:
        b = EventBuilder(state, log)
    for c in gc.choices:
        _step(rt, state, b, c)
    state.next_seq += 1
    state.log_len = len(log)
    return b.events, state, bytes(log.new)
