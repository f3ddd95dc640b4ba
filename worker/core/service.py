"""Entry point of the pure derender core, shared by the Kafka worker, batch mode and tests.

No I/O happens here: bytes in, bytes out. (INTERFACE STUB: being implemented.)
"""
from __future__ import annotations

from worker.config import ServedModelConfig


class DerenderResult:
    """Outcome of one derender call: ``body`` (JSON bytes of an OpenAI response or error object),
    ``is_error``, ``status`` (HTTP-like: 200, 400, 404, 500), ``request_id`` (when readable)."""

    __slots__ = ("body", "is_error", "status", "request_id")

    def __init__(self, body: bytes, status: int = 200, request_id: str | None = None):
        self.body = body
        self.status = status
        self.is_error = status != 200
        self.request_id = request_id


class DerenderService:
    """Derenders request bodies for a set of served models (routing by the body's ``model``).

    ``kind``: ``"chat"`` / ``"completion"`` (non-streaming) or None to tell by the body's shape
    (``generate_response`` -> chat, ``generate_responses`` -> completion)."""

    def __init__(self, models: list[ServedModelConfig]):
        self.models = {m.name: m for m in models}

    def derender(self, body: bytes, kind: str | None = None) -> DerenderResult:
        raise NotImplementedError
