"""The error taxonomy of derender-worker: typed errors, each mapped to an OpenAI error object with
an HTTP-like status, used by the core, the offline runners and the Kafka transport alike.

==========  ==========================  ==================================================
status      ``type`` of the error       when
==========  ==========================  ==================================================
400         ``BadRequestError``         invalid body, a limit exceeded (vLLM's validation)
404         ``NotFoundError``           the body names a model this worker does not serve
409         ``ConflictError``           stream sequence errors (stale chunk, gap timeout,
                                        unknown or already ended stream)
413         ``PayloadTooLargeError``    the reply is larger than the producer may publish
                                        (``--max-request-size``)
500         ``InternalServerError``     a bug met by a record, a derender process died
==========  ==========================  ==================================================

The type names are the OpenAI Python SDK's exception classes for those statuses (``openai``:
``BadRequestError``, ``NotFoundError``, ``ConflictError``, ``InternalServerError``); it has none
for 413, so ``PayloadTooLargeError`` follows RFC 9110's name of the status (Content/Payload Too
Large). ``code`` in the object is the status as an int, as vLLM does.
"""
from __future__ import annotations

import msgspec

from schemas import ErrorInfo, ErrorResponse

__all__ = ["ERROR_TYPES", "error_type", "error_body", "DerenderError", "BadRequest", "ModelNotFound",
           "Conflict", "ReplyTooLarge", "error_from_validation", "decode_or_400"]

#: status -> OpenAI error ``type`` (the one table; see the module docstring)
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 413: "PayloadTooLargeError",
               500: "InternalServerError"}

_encoder = msgspec.json.Encoder()


def error_type(status: int) -> str:
    """The ``type`` of an error object of ``status`` (``ERROR_TYPES``; another 5xx:
    ``InternalServerError``, another 4xx: ``BadRequestError``)."""
    typ = ERROR_TYPES.get(status)
    if typ is None:
        typ = "InternalServerError" if status >= 500 else "BadRequestError"
    return typ


class DerenderError(Exception):
    """A request the core refuses. ``status``: one of ``ERROR_TYPES`` (400 by default);
    ``param``: the offending field path when known."""

    status = 400

    def __init__(self, message: str, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status

    def to_response(self, request_id: str | None = None) -> ErrorResponse:
        """The OpenAI error object for this error (``type`` from ``error_type``, ``code`` = status)."""
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=error_type(self.status), param=self.param, code=self.status),
            request_id=request_id,
        )

    def to_body(self, request_id: str | None = None) -> bytes:
        """``to_response`` as JSON bytes."""
        return _encoder.encode(self.to_response(request_id))


class BadRequest(DerenderError):
    """400: the body is malformed or violates a limit (vLLM's validation semantics)."""

    status = 400


class ModelNotFound(DerenderError):
    """404: the body names a model this worker does not serve."""

    status = 404


class Conflict(DerenderError):
    """409 ``ConflictError``: a stream chunk out of sequence (stale, after a gap timeout, of an
    unknown or already ended stream)."""

    status = 409


class ReplyTooLarge(DerenderError):
    """413 ``PayloadTooLargeError``: the reply of ``size`` bytes (as the Kafka producer counts a
    record: key, value, headers and framing) exceeds the ``limit`` of ``--max-request-size``
    bytes; the record is dead-lettered in full and this small error is the reply."""

    status = 413

    def __init__(self, size: int, limit: int):
        super().__init__(f"reply of {size} bytes exceeds the limit of {limit} bytes (--max-request-size)")
        self.size = size
        self.limit = limit


def error_body(message: str, status: int = 400, request_id: str | None = None) -> bytes:
    """JSON bytes of the OpenAI error object ``{"error": {message, type, param: null, code},
    "request_id"}`` of ``status`` (``type``: ``error_type``)."""
    return DerenderError(message, status=status).to_body(request_id)


def error_from_validation(e: msgspec.ValidationError | msgspec.DecodeError) -> BadRequest:
    """A msgspec decode/validation failure as a 400 (message carries msgspec's JSON path)."""
    return BadRequest(f"invalid request body: {e}")


def decode_or_400(decoder, data):
    """``decoder.decode(data)`` (a msgspec JSON or msgpack ``Decoder``); a decode/validation
    failure (``error_from_validation``) or nesting deeper than the recursion limit becomes
    ``BadRequest`` (400)."""
    try:
        return decoder.decode(data)
    except RecursionError:
        raise BadRequest("invalid request body: JSON nested too deeply") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise error_from_validation(e) from None
