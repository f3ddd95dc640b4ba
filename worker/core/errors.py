"""Typed errors of the derender core, each mapped to an OpenAI error object (HTTP-like status)."""
from __future__ import annotations

import msgspec

from schemas import ErrorInfo, ErrorResponse

_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


class DerenderError(Exception):
    """A request the core refuses. ``status``: 400 (invalid body), 404 (unknown model) or 500
    (internal); ``param``: the offending field path when known."""

    status = 400

    def __init__(self, message: str, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status

    def to_response(self, request_id: str | None = None) -> ErrorResponse:
        """The OpenAI error object for this error (``code`` = status)."""
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=_TYPES.get(self.status, "BadRequestError"),
                            param=self.param, code=self.status),
            request_id=request_id,
        )


class BadRequest(DerenderError):
    """400: the body is malformed or violates a limit (vLLM's validation semantics)."""

    status = 400


class ModelNotFound(DerenderError):
    """404: the body names a model this worker does not serve."""

    status = 404


def error_from_validation(e: msgspec.ValidationError | msgspec.DecodeError) -> BadRequest:
    """A msgspec decode/validation failure as a 400 (message carries msgspec's JSON path)."""
    return BadRequest(f"invalid request body: {e}")
