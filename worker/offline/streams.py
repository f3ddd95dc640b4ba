"""Stream-chunk lines in batch mode: derendered in input order in the parent process, with the
stream state kept in memory per request id (``DerenderService.derender_stream``; a request's
state is dropped when every choice of it has finished).

A record that is one streaming chunk body (``generate_chunk``) yields the JSON list of the
OpenAI chunks it produced (possibly ``[]``; a request's last chunk carries ``usage``), or an
error object. Chunks of one request must come in order; requests may interleave; chat vs
completion is told by ``completion_request`` on a request's first chunk (chat otherwise).
A record holding a JSON *array* of chunk bodies is one whole streamed request (the parity
suite's ``to_requests.py --stream`` format): it yields the JSON array of all its OpenAI chunks
(an error object in the array where a chunk was refused; ``stream_state`` in the bodies is
ignored: the state is kept here). Other records pass through to the worker processes.
"""
from __future__ import annotations

import msgspec

from worker.core.service import DerenderService, error_body


class _ChunkProbe(msgspec.Struct):
    generate_chunk: msgspec.Raw = msgspec.Raw()
    request_id: str | None = None


class _ChunkRid(msgspec.Struct):
    request_id: str | None = None


_chunk_probe = msgspec.json.Decoder(_ChunkProbe)
_chunk_rid = msgspec.json.Decoder(_ChunkRid)
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def stream_request_id(line: bytes) -> str | None:
    """The request id of a streaming chunk body, "" when it has none, None for other bodies."""
    if b'"generate_chunk"' not in line:
        return None
    try:
        p = _chunk_probe.decode(line)
        raw = bytes(p.generate_chunk)
        if not raw or raw == b"null":
            return None
        return _chunk_rid.decode(raw).request_id or ""
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def stream_list(service: DerenderService, line: bytes) -> tuple[bytes, int]:
    """A JSON array of one request's chunk bodies -> (JSON array of all its OpenAI chunks, status:
    200, or the first error's status). A line that is not such an array (not JSON, ``[]``, an
    element that is not an object, e.g. ``[1,2,3]``) -> (one OpenAI error object, 400)."""
    try:
        bodies = _raw_list.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return error_body(f"invalid stream list line: {e}", 400), 400
    if not bodies:
        return error_body("invalid stream list line: empty array (expected the streaming chunk bodies "
                          "of one request)", 400), 400
    for i, raw in enumerate(bodies):
        if bytes(raw).lstrip()[:1] != b"{":
            return error_body(f"invalid stream list line: element {i} is not a JSON object (expected the "
                              "streaming chunk bodies of one request)", 400), 400
    parts: list[bytes] = []
    state: bytes | None = None
    status = 200
    for raw in bodies:
        res, new_state = service.derender_stream(bytes(raw), state)
        if res.is_error:
            status = status if status != 200 else res.status
            parts.append(res.body)
        else:
            body = bytes(res.body).strip()
            if body != b"[]":
                parts.append(body[1:-1])
        if new_state is not None:
            state = new_state
    return b"[" + b",".join(parts) + b"]", status


class StreamLines:
    """Per-run stream state (request id -> state bytes) and the routing of one record."""

    def __init__(self, service: DerenderService):
        self.service = service
        self.states: dict[str, bytes] = {}

    def route(self, item: bytes | tuple[bytes, int]) -> bytes | tuple[bytes, int]:
        """A finished result ``(body, status)`` for blank, stream-chunk and stream-list records
        and ready results; the body itself (to derender in a worker) otherwise."""
        if isinstance(item, tuple):
            return item
        if not item:
            return error_body("empty input line", 400), 400
        if item[:1] == b"[":
            return stream_list(self.service, item)
        rid = stream_request_id(item)
        if rid is None:
            return item
        return self._chunk(rid, item)

    def replay(self, item: bytes | tuple[bytes, int]) -> None:
        """A record of a part an earlier run completed (``--resume``): only stream-chunk records
        are derendered (output dropped), so requests spanning into later parts keep their state."""
        if isinstance(item, bytes) and item and item[:1] != b"[":
            rid = stream_request_id(item)
            if rid is not None:
                self._chunk(rid, item)

    def _chunk(self, rid: str, item: bytes) -> tuple[bytes, int]:
        res, new_state = self.service.derender_stream(item, self.states.get(rid))
        if new_state is not None:
            if res.done:
                self.states.pop(rid, None)
            else:
                self.states[rid] = new_state
        return res.body, res.status


__all__ = ["StreamLines", "stream_list", "stream_request_id"]
