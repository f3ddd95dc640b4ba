"""Responses API derender (issue 14): token ids -> ``/v1/responses`` objects and streaming events.

Modules, one job each: ``ids`` (deterministic item / call ids), ``echo`` (request checks, the
parsers' context, the Response's echo fields), ``log`` (the append-only piece log of a stream:
what grows with the output), ``events`` (the event builder and the per-chunk stream state),
``derender`` (non-streaming Response and one streaming chunk). ``DerenderService``
(``worker/core/service.py``) wraps them for bytes in / bytes out.
"""
from worker.core.responses.derender import (
    StreamBody,
    decode_state,
    derender_responses,
    derender_responses_chunk,
    encode_state,
    request_digest,
)
from worker.core.responses.events import ResponsesStreamState
from worker.core.responses.log import PieceLog, memory_reader

__all__ = ["StreamBody", "ResponsesStreamState", "PieceLog", "memory_reader", "decode_state", "derender_responses",
           "derender_responses_chunk", "encode_state", "request_digest"]
