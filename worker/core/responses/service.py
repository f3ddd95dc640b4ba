"""Bytes in / bytes out for the Responses kinds, behind ``DerenderService``
(``derender(kind="responses")`` and ``derender_responses_stream``): decoding, the stale-chunk
check, the OpenAI error objects. No I/O: the caller stores the state and the piece log.
"""
from __future__ import annotations

import logging

import msgspec

from schemas.responses import DerenderResponsesRequest, ResponseObject
from worker.core.derender import ModelRuntime
from worker.core.errors import BadRequest, DerenderError, decode_or_400
from worker.core.responses.derender import (
    StreamBody,
    decode_state,
    derender_responses,
    derender_responses_chunk,
    encode_state,
)
from worker.core.responses.log import PiecesLost, PiecesNeeded, Reader, memory_reader

__all__ = ["body_decoder", "derender", "ResponsesStreamResult", "derender_stream", "derender_stream_packed",
           "pack_packed", "unpack_packed",
           "is_responses_stream", "PACKED_MAGIC", "PIECES_MAGIC", "KIND", "STREAM_KIND"]

log = logging.getLogger(__name__)

KIND = "responses"
STREAM_KIND = "responses-stream"

body_decoder = msgspec.json.Decoder(DerenderResponsesRequest)
_stream_decoder = msgspec.json.Decoder(StreamBody)
_encoder = msgspec.json.Encoder()


class _Rid(msgspec.Struct):
    request_id: str | None = None


class _Probe(msgspec.Struct):
    model: str | None = None
    generate_chunk: msgspec.Raw = msgspec.Raw(b"")


_probe_decoder = msgspec.json.Decoder(_Probe)
_rid_decoder = msgspec.json.Decoder(_Rid)


def derender(rt: ModelRuntime, body: DerenderResponsesRequest, created: int | None,
             ids_in_vocab: bool = False) -> ResponseObject:
    """The final Response of a decoded non-streaming body (``derender_responses``)."""
    return derender_responses(rt, body, created, ids_in_vocab=ids_in_vocab)


class ResponsesStreamResult:
    """Outcome of one Responses chunk: ``body`` (JSON list of events, or an OpenAI error
    object), ``status``, ``is_error``, ``request_id``, ``kind`` (``responses-stream``),
    ``done`` (terminal event sent: delete the state and the log), ``seq`` (the chunk's sequence
    number), ``state`` (bytes to store; None on error: keep the stored state and log),
    ``log_append`` (bytes to append to the stream's piece log before storing ``state``) and
    ``log_len`` (the log's length ``state`` records). ``needs_pieces``: ``(start, end)`` when
    the call was made without a reader and this chunk needs those persisted log bytes (nothing
    was derendered, ``body`` is empty: call again with a reader over them)."""

    __slots__ = ("body", "status", "is_error", "request_id", "kind", "done", "seq", "state", "log_append",
                 "log_len", "needs_pieces")

    def __init__(self, body: bytes, status: int = 200, request_id: str | None = None, done: bool = False,
                 seq: int | None = None, state: bytes | None = None, log_append: bytes = b"", log_len: int = 0):
        self.body, self.status, self.is_error = body, status, status != 200
        self.request_id, self.kind, self.done, self.seq = request_id, STREAM_KIND, done, seq
        self.state, self.log_append, self.log_len = state, log_append, log_len
        self.needs_pieces: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"ResponsesStreamResult(status={self.status}, request_id={self.request_id!r}, done={self.done})"


def derender_stream(runtime, body: bytes, state_bytes: bytes | None, reader: Reader | None = None,
                    seq: int | None = None, created: int | None = None) -> ResponsesStreamResult:
    """One streaming Responses chunk. ``runtime(name)``: the served model's runtime (raises
    ``ModelNotFound``); ``state_bytes``: the stored state (None for the first chunk);
    ``reader(start, end)``: the stream's stored piece log; ``seq``: the chunk's sequence number
    when the transport has one (below the state's ``next_seq``: stale, 409, nothing changes);
    ``created``: Unix seconds for the stream (first chunk). Never raises for bad input. With
    ``reader`` None a chunk that needs persisted log bytes returns ``needs_pieces`` instead of a
    reply; a reader that returns fewer bytes than recorded gives a 409 (the log was lost)."""
    request_id = None
    try:
        try:  # one typed decode: a body it takes passes the probe below with the same answers
            req = _stream_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            req = None  # the probe path: its errors, in its order
        if req is not None:
            request_id = req.generate_chunk.request_id
            model = req.model
        else:
            try:
                probe = _probe_decoder.decode(body)
                request_id = _rid_decoder.decode(probe.generate_chunk).request_id \
                    if len(probe.generate_chunk) else None
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                probe = None
            if probe is None or probe.model is None:
                raise BadRequest("a Responses chunk body needs model and generate_chunk", param="model")
            if not len(probe.generate_chunk) or bytes(probe.generate_chunk) == b"null":
                raise BadRequest("streaming body must carry generate_chunk", param="generate_chunk")
            model = probe.model
        rt = runtime(model)
        state = decode_state(rt, state_bytes) if state_bytes else None
        if seq is not None and not 0 <= seq <= 2**63 - 2:
            raise BadRequest(f"sequence number {seq} outside [0, 2**63 - 2]", param="seq")
        if seq is not None and state is not None and seq < state.next_seq:
            raise DerenderError(f"stale chunk: sequence number {seq} < next expected {state.next_seq}",
                                param="seq", status=409)
        if req is None:
            req = decode_or_400(_stream_decoder, body)
        events, state, append = derender_responses_chunk(rt, req, state, reader, created)
        if seq is not None:
            state.next_seq = seq + 1
        return ResponsesStreamResult(_encoder.encode(events), 200, request_id, state.done, state.next_seq - 1,
                                     encode_state(state), append, state.log_len)
    except PiecesNeeded as e:
        res = ResponsesStreamResult(b"", 0, request_id)
        res.needs_pieces = (e.start, e.end)
        return res
    except PiecesLost as e:
        err = DerenderError(str(e), param="stream_state", status=409)
        return ResponsesStreamResult(_encoder.encode(err.to_response(request_id)), 409, request_id)
    except DerenderError as e:
        return ResponsesStreamResult(_encoder.encode(e.to_response(request_id)), e.status, request_id)
    except Exception as e:  # a core bug: a 500 without losing the worker
        log.exception("responses derender_stream failed for request_id=%s", request_id)
        err = DerenderError(f"internal error: {type(e).__name__}: {e}", status=500)
        return ResponsesStreamResult(_encoder.encode(err.to_response(request_id)), 500, request_id)


# ------------------------------------------------------- the stream kind on the chat stream API ---
#: first bytes of a packed Responses stream state (0xc1 is never used by msgpack, so no chat /
#: completion state starts with it)
PACKED_MAGIC = b"\xc1RSP1"
#: first bytes of a Responses stream state whose piece log is kept apart (``worker.state.pieces``:
#: ``DerenderService.derender_stream(pieces=True)``): magic + ``encode_state`` bytes
PIECES_MAGIC = b"\xc1RSP2"


class _ReqProbe(msgspec.Struct):
    responses_request: msgspec.Raw = msgspec.Raw(b"")


_req_probe = msgspec.json.Decoder(_ReqProbe)
_packed_decoder = msgspec.msgpack.Decoder(tuple[bytes, bytes])
_packed_encoder = msgspec.msgpack.Encoder()


def is_responses_stream(body: bytes, state_bytes: bytes | None, kind: str | None) -> bool:
    """Whether a chunk given to ``DerenderService.derender_stream`` belongs to a Responses stream:
    the kind header (``responses`` / ``responses-stream``), a packed Responses state, or (first
    chunk, no kind) a ``responses_request`` in the body."""
    if kind is not None:
        return kind.removesuffix("-stream") == KIND
    if state_bytes:
        return state_bytes[:len(PACKED_MAGIC)] in (PACKED_MAGIC, PIECES_MAGIC)
    if b'"responses_request"' not in body:
        return False
    try:
        raw = bytes(_req_probe.decode(body).responses_request)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
    return bool(raw) and raw != b"null"


def derender_stream_packed(runtime, body: bytes, packed: bytes | None, seq: int | None = None,
                           created: int | None = None) -> tuple[ResponsesStreamResult, bytes | None]:
    """A Responses chunk for a caller that keeps one opaque state value per stream (the Kafka
    transport's checkpoint): that value packs the per-chunk state and the piece log together
    (``PACKED_MAGIC`` + msgpack ``[state, log]``). Interim: with it the stored value grows with
    the output; a transport that stores the log apart (``worker.state.pieces``) calls
    ``derender_stream`` with a reader instead. Returns ``(result, new packed value or None on
    error)``; never raises for bad input."""
    try:
        state, log = unpack_packed(packed, PACKED_MAGIC, "Responses")
    except BadRequest as err:
        return ResponsesStreamResult(_encoder.encode(err.to_response(None)), 400), None
    res = derender_stream(runtime, body, state, memory_reader(log), seq, created)
    if res.state is None:
        return res, None
    return res, pack_packed(PACKED_MAGIC, res.state, log, res.log_append, res.log_len)


def unpack_packed(packed: bytes | None, magic: bytes, api: str) -> tuple[bytes | None, bytes]:
    """``(state, piece log)`` of a packed stream value (``magic`` + msgpack ``[state, log]``;
    ``(None, b"")`` for none). Raises ``BadRequest`` ("stored <api> stream state is
    unreadable") for another magic or bytes that are not that pair."""
    if not packed:
        return None, b""
    try:
        if packed[:len(magic)] != magic:
            raise ValueError(f"not a {api} stream state")
        state, log = _packed_decoder.decode(packed[len(magic):])
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadRequest(f"stored {api} stream state is unreadable: {e}") from None
    return state, log


def pack_packed(magic: bytes, state: bytes, log: bytes, log_append: bytes, log_len: int) -> bytes:
    """The packed value after a chunk: ``magic`` + msgpack ``[state, log + log_append]``, the
    log cut at ``log_len`` bytes."""
    return magic + _packed_encoder.encode((state, (log + log_append)[:log_len]))
