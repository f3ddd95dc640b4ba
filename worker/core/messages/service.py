"""Bytes in / bytes out for the Messages kinds (``messages`` / ``messages-stream``), behind
``DerenderService``: decoding, the stale-chunk check, Anthropic error objects. No I/O: the
caller stores the state and the piece log.

Errors are Anthropic's ``{"type": "error", "error": {"type", "message"}}`` (the reference's R6):
``invalid_request_error`` for 400 (and for 409, a stale or ended stream, and 413, a reply over
``--max-request-size``: the SDK's ``ErrorResponse`` has no conflict type and no
``request_too_large``, and Anthropic's "Errors" page uses ``invalid_request_error`` for 4XX
statuses it does not list), ``not_found_error`` 404, ``api_error`` 500; the HTTP status travels
beside the body (``derender-status``).
"""
from __future__ import annotations

import logging
from functools import lru_cache

import msgspec

from schemas.messages import AnthropicError, AnthropicErrorInfo, DerenderMessagesRequest
from worker.core.derender import ModelRuntime, bounded_generate_response
from worker.core.errors import BadRequest, DerenderError, decode_or_400
from worker.core.messages.derender import StreamBody, derender_messages, derender_messages_chunk
from worker.core.responses.log import PiecesLost, PiecesNeeded, Reader, memory_reader
from worker.core.responses.service import pack_packed, unpack_packed

__all__ = ["KIND", "STREAM_KIND", "PACKED_MAGIC", "PIECES_MAGIC", "error_body", "derender", "MessagesStreamResult",
           "derender_stream", "derender_stream_packed", "is_messages_body", "is_messages_stream"]

log = logging.getLogger(__name__)

KIND = "messages"
STREAM_KIND = "messages-stream"
#: first bytes of a packed Messages stream state (state + piece log in one value); 0xc1 is never
#: used by msgpack, so no chat / completion state starts with it
PACKED_MAGIC = b"\xc1MSG1"
#: first bytes of a Messages stream state whose piece log is kept apart (``worker.state.pieces``)
PIECES_MAGIC = b"\xc1MSG2"

#: HTTP status -> Anthropic error type: the types anthropic-sdk-python's ``ErrorResponse`` accepts
#: (``types/shared/error_object.py``; 2.15.0 has neither ``conflict_error`` nor ``request_too_large``
#: in that union, so 409 and 413 are ``invalid_request_error``, the status beside the body)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}

_encoder = msgspec.json.Encoder()
_body_decoder = msgspec.json.Decoder(DerenderMessagesRequest)


@lru_cache(maxsize=8)
def _bounded_decoder(vocab: int) -> msgspec.json.Decoder:
    """A ``DerenderMessagesRequest`` decoder whose output, prompt and logprob ids lie in ``[0,
    vocab)`` (``derender.bounded_generate_response``); a body it refuses is decoded unbounded."""
    resp, tid = bounded_generate_response(vocab)
    return msgspec.json.Decoder(msgspec.defstruct(
        "BoundedMessagesBody", [("generate_response", resp), ("prompt_token_ids", list[tid] | None, None)],
        bases=(DerenderMessagesRequest,), kw_only=True))
_stream_decoder = msgspec.json.Decoder(StreamBody)


def error_body(message: str, status: int) -> bytes:
    """Anthropic's error object for ``status`` (another 5xx: ``api_error``, another 4xx:
    ``invalid_request_error``) as JSON bytes."""
    typ = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return _encoder.encode(AnthropicError(error=AnthropicErrorInfo(type=typ, message=message)))


class _Rid(msgspec.Struct):
    request_id: str | None = None


class _Probe(msgspec.Struct):
    model: str | None = None
    generate_response: msgspec.Raw = msgspec.Raw(b"")
    generate_chunk: msgspec.Raw = msgspec.Raw(b"")
    messages_request: msgspec.Raw = msgspec.Raw(b"")


class _ShapeProbe(msgspec.Struct):
    messages_request: msgspec.Raw = msgspec.Raw(b"")


_probe_decoder = msgspec.json.Decoder(_Probe)
_shape_decoder = msgspec.json.Decoder(_ShapeProbe)
_rid_decoder = msgspec.json.Decoder(_Rid)


def _probe(body: bytes) -> tuple[_Probe | None, str | None]:
    try:
        p = _probe_decoder.decode(body)
        g = p.generate_chunk if len(p.generate_chunk) else p.generate_response
        rid = _rid_decoder.decode(g).request_id if len(g) and bytes(g) != b"null" else None
        return p, rid
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None, None


def is_messages_stream(body: bytes, state_bytes: bytes | None, kind: str | None) -> bool:
    """Whether a chunk given to ``DerenderService.derender_stream`` belongs to a Messages stream:
    the kind header (``messages`` / ``messages-stream``), a Messages state, or (first chunk, no
    kind) a ``messages_request`` in the body."""
    if kind is not None:
        return kind.removesuffix("-stream") == KIND
    if state_bytes:
        return state_bytes[:len(PACKED_MAGIC)] in (PACKED_MAGIC, PIECES_MAGIC)
    return is_messages_body(body)


def is_messages_body(body: bytes) -> bool:
    """Whether a body without a kind header is a Messages body: a JSON object with a non-null
    ``messages_request`` (whatever its other fields hold)."""
    if b'"messages_request"' not in body:
        return False
    try:  # that field alone: a wrong type elsewhere (model, request_id) is the Messages 400's job
        raw = _shape_decoder.decode(body).messages_request
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
    return len(raw) > 0 and bytes(raw) != b"null"


#: the vocabulary size of the model of the last non-streaming body (``_typed``'s guess: one
#: typed decode when the next body is for a model of the same vocabulary); [0]: none yet
_last_vocab = [0]


def _typed(body: bytes) -> tuple[DerenderMessagesRequest | None, int]:
    """``(body, bound)``: the body in one typed decode bounded by ``_last_vocab`` (the common case: no probe
    decode), or None: the probe path then decides as before (no vocabulary yet, a
    ``generate_chunk`` key, whose request id the probe reads first, or a decode refused)."""
    v = _last_vocab[0]
    if not v or b'"generate_chunk"' in body:
        return None, 0
    try:
        return _bounded_decoder(v).decode(body), v
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None, 0


def derender(runtime, body: bytes) -> tuple[bytes, int, str | None]:
    """One non-streaming Messages body -> ``(Message JSON or error object, status, request id)``.
    ``runtime(name)``: the served model's runtime (raises ``ModelNotFound``). Never raises."""
    req, bound = _typed(body)
    if req is not None:  # same model, request id and body as the probe path reads
        p, rid = None, req.generate_response.request_id
    else:
        p, rid = _probe(body)
    try:
        if req is None and (p is None or p.model is None):
            raise BadRequest("a Messages body needs model and generate_response", param="model")
        rt: ModelRuntime = runtime(req.model if req is not None else p.model)
        vocab = rt.tokenizer.vocab_size
        in_vocab = req is not None and vocab == bound
        _last_vocab[0] = vocab
        if not in_vocab:
            try:  # ids bounded to this model's vocabulary in the decode; else the unbounded one's checks
                req, in_vocab = _bounded_decoder(vocab).decode(body), True
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                in_vocab = False
        if not in_vocab:
            req = decode_or_400(_body_decoder, body)
        return _encoder.encode(derender_messages(rt, req, ids_in_vocab=in_vocab)), 200, rid
    except DerenderError as e:
        return error_body(e.message, e.status), e.status, rid
    except Exception as e:  # a core bug: a 500 without losing the worker
        log.exception("messages derender failed for request_id=%s", rid)
        return error_body(f"internal error: {type(e).__name__}: {e}", 500), 500, rid


class MessagesStreamResult:
    """Outcome of one Messages chunk: ``body`` (JSON list of events, or an error object),
    ``status``, ``is_error``, ``request_id``, ``kind`` (``messages-stream``), ``done`` (the
    stream ended: delete the state and the log), ``state`` (bytes to store; None on error: keep
    the stored ones), ``log_append`` / ``log_len`` (bytes to append to the piece log, its length
    ``state`` records); ``needs_pieces``: ``(start, end)`` when called without a reader and the
    chunk needs those persisted log bytes (nothing derendered)."""

    __slots__ = ("body", "status", "is_error", "request_id", "kind", "done", "state", "log_append", "log_len",
                 "needs_pieces")

    def __init__(self, body: bytes, status: int = 200, request_id: str | None = None, done: bool = False,
                 state: bytes | None = None, log_append: bytes = b"", log_len: int = 0):
        self.body, self.status, self.is_error = body, status, status != 200
        self.request_id, self.kind, self.done = request_id, STREAM_KIND, done
        self.state, self.log_append, self.log_len = state, log_append, log_len
        self.needs_pieces: tuple[int, int] | None = None


def derender_stream(runtime, body: bytes, state_bytes: bytes | None, reader: Reader | None = None,
                    seq: int | None = None) -> MessagesStreamResult:
    """One streaming Messages chunk. ``state_bytes``: the stored state (None for the first
    chunk); ``reader(start, end)``: the stream's stored piece log; ``seq``: the chunk's sequence
    number when the transport has one (stale: 409). Never raises for bad input; a reader
    returning fewer bytes than recorded gives a 409 (the log was lost)."""
    try:  # one typed decode: a body it takes passes the probe below with the same answers
        req = _stream_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        req = None  # the probe path: its errors, in its order
    if req is not None:
        p, rid = None, req.generate_chunk.request_id
    else:
        p, rid = _probe(body)
    try:
        if req is not None:
            rt = runtime(req.model)
        else:
            if p is None or p.model is None:
                raise BadRequest("a Messages chunk body needs model and generate_chunk", param="model")
            if not len(p.generate_chunk) or bytes(p.generate_chunk) == b"null":
                raise BadRequest("streaming body must carry generate_chunk", param="generate_chunk")
            rt = runtime(p.model)
            req = decode_or_400(_stream_decoder, body)
        if seq is not None and not 0 <= seq <= 2**63 - 2:
            raise BadRequest(f"sequence number {seq} outside [0, 2**63 - 2]", param="seq")
        events, state, done, append, log_len = derender_messages_chunk(rt, req, state_bytes, reader, seq)
        return MessagesStreamResult(_encoder.encode(events), 200, rid, done, state, append, log_len)
    except PiecesNeeded as e:
        res = MessagesStreamResult(b"", 0, rid)
        res.needs_pieces = (e.start, e.end)
        return res
    except PiecesLost as e:
        return MessagesStreamResult(error_body(str(e), 409), 409, rid)
    except DerenderError as e:
        return MessagesStreamResult(error_body(e.message, e.status), e.status, rid)
    except Exception as e:  # a core bug: a 500 without losing the worker
        log.exception("messages derender_stream failed for request_id=%s", rid)
        return MessagesStreamResult(error_body(f"internal error: {type(e).__name__}: {e}", 500), 500, rid)


def derender_stream_packed(runtime, body: bytes, packed: bytes | None) -> tuple[MessagesStreamResult, bytes | None]:
    """A Messages chunk for a caller that keeps one opaque value per stream: ``PACKED_MAGIC`` +
    msgpack ``[state, piece log]``. Returns ``(result, new packed value or None on error)``;
    never raises for bad input."""
    try:
        state, plog = unpack_packed(packed, PACKED_MAGIC, "Messages")
    except BadRequest as e:
        return MessagesStreamResult(error_body(e.message, 400), 400), None
    res = derender_stream(runtime, body, state, memory_reader(plog))
    if res.state is None:
        return res, None
    return res, pack_packed(PACKED_MAGIC, res.state, plog, res.log_append, res.log_len)
