"""Stream-chunk lines in batch mode: derendered in input order in the parent process, with the
stream state kept in memory per request id (``DerenderService.derender_stream``; a request's
state is dropped when every choice of it has finished), with its append-only pieces
(``derender_stream(pieces=True)``: an open tool call's body leaves the per-chunk state).

A record that is one streaming chunk body (``generate_chunk``) yields the JSON list of the
OpenAI chunks it produced (possibly ``[]``; a request's last chunk carries ``usage``), or an
error object. Chunks of one request must come in order; requests may interleave; chat vs
completion is told by ``completion_request`` on a request's first chunk (chat otherwise).
A record holding a JSON *array* of chunk bodies is one whole streamed request (the parity
suite's ``to_requests.py --stream`` format): it yields the JSON array of all its OpenAI chunks
(an error object in the array where a chunk was refused; ``stream_state`` in the bodies is
ignored: the state is kept here). Other records pass through to the worker processes.

Responses streams (issue 14): a chunk body whose request's first chunk carried
``responses_request`` (or an OpenAI Batch line with ``url`` ``/v1/responses``) yields the JSON
list of the Responses events it produced, the stream state and its piece log (what grows with
the output, ``worker.core.responses.log``) kept in memory per request id; a stream-list record
of Responses chunks yields the JSON array of all its events. Anthropic Messages streams (issue
26: ``messages_request`` on the first chunk, or an OpenAI Batch line with ``url``
``/v1/messages``) are kept the same way and yield JSON lists of Messages events.
"""
from __future__ import annotations

import msgspec

from worker.core.responses import memory_reader
from worker.core.service import DerenderService, error_body, error_body_for
from worker.offline.formats import kind_of_item


class _ChunkProbe(msgspec.Struct):
    generate_chunk: msgspec.Raw = msgspec.Raw()
    request_id: str | None = None


class _ResponsesProbe(msgspec.Struct):
    responses_request: msgspec.Raw = msgspec.Raw()


class _MessagesProbe(msgspec.Struct):
    messages_request: msgspec.Raw = msgspec.Raw()


_PROBES = {"responses": (msgspec.json.Decoder(_ResponsesProbe), b'"responses_request"'),
           "messages": (msgspec.json.Decoder(_MessagesProbe), b'"messages_request"')}


def _is_api_chunk(line: bytes, api: str) -> bool:
    """True for a chunk body tagged ``api`` or carrying that API's non-null ``<api>_request``."""
    if kind_of_item(line) == api:
        return True
    decoder, field = _PROBES[api]
    if field not in line:
        return False
    try:
        raw = bytes(getattr(decoder.decode(line), f"{api}_request"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return bool(raw) and raw != b"null"


def is_responses_chunk(line: bytes) -> bool:
    """True for a chunk body tagged ``responses`` or carrying a ``responses_request``."""
    return _is_api_chunk(line, "responses")


def is_messages_chunk(line: bytes) -> bool:
    """True for a chunk body tagged ``messages`` or carrying a ``messages_request`` (issue 26)."""
    return _is_api_chunk(line, "messages")


class ResponsesStreams:
    """In-memory Responses streams of a run: request id -> (state bytes, piece log). ``messages``:
    the same for Anthropic Messages streams (issue 26: the same state / piece-log contract)."""

    def __init__(self, service: DerenderService, messages: bool = False):
        self.service = service
        self.messages = messages
        self.streams: dict[str, tuple[bytes, bytearray]] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self.streams

    def chunk(self, rid: str, item: bytes) -> tuple[bytes, int]:
        """Derender one chunk of stream ``rid``: (JSON list of events or error object, status)."""
        state, log = self.streams.get(rid, (None, bytearray()))
        derender = self.service.derender_messages_stream if self.messages else self.service.derender_responses_stream
        res = derender(item, state, memory_reader(log))
        if res.state is not None:
            log += res.log_append
            del log[res.log_len:]  # the state's recorded length wins (a replayed append reads the same)
            if res.done:
                self.streams.pop(rid, None)
            else:
                self.streams[rid] = (res.state, log)
        return res.body, res.status


class SideValues:
    """What a chat/completion stream keeps in memory beside its per-chunk state in batch mode, as
    the state stores keep it: ``log``, its append-only pieces (written at the recorded offset),
    and ``settings``, its write-once settings (``derender_stream(settings_aside=True)``: stored
    once, from its first chunk; ``b""`` before)."""

    __slots__ = ("log", "settings")

    def __init__(self) -> None:
        self.log = bytearray()
        self.settings = b""


def chat_chunk(service: DerenderService, item: bytes, state: bytes | None, side: SideValues):
    """One chat/completion chunk with the stream's side values in memory (``side``: the state
    stores' rules, so the state read and rewritten per chunk stays small for a tool call of any
    size and holds no request settings): ``(result, new state or None)``. The service's settings
    cache normally has the settings; on a miss they are given from ``side``."""
    res, new_state = service.derender_stream(item, state, pieces=True, reader=memory_reader(side.log),
                                             settings_aside=True)
    if res.needs_settings:
        res, new_state = service.derender_stream(item, state, pieces=True, reader=memory_reader(side.log),
                                                 settings_aside=True, settings=side.settings)
    if new_state is not None:
        side.log[res.pieces_len - len(res.append):] = res.append
        if res.settings:
            side.settings = res.settings
    return res, new_state


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
    messages = bool(bodies) and is_messages_chunk(bytes(bodies[0]))  # a Messages stream (issue 26)
    if bodies and (messages or is_responses_chunk(bytes(bodies[0]))):  # a Responses stream (issue 14)
        streams = ResponsesStreams(service, messages)
        for raw in bodies:
            body, st = streams.chunk("", bytes(raw))
            body = bytes(body).strip()
            if st != 200:  # an error reply ends the stream: the later bodies are not derendered
                parts.append(body)
                return b"[" + b",".join(parts) + b"]", st
            if body != b"[]":
                parts.append(body[1:-1])
        return b"[" + b",".join(parts) + b"]", status
    side = SideValues()
    for raw in bodies:
        res, new_state = chat_chunk(service, bytes(raw), state, side)
        if res.is_error:  # an error reply ends the stream (as the Kafka worker's): the rest is not derendered
            parts.append(res.body)
            return b"[" + b",".join(parts) + b"]", res.status
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
        self.logs: dict[str, SideValues] = {}  # request id -> its pieces and settings (chat/completion streams)
        self.responses = ResponsesStreams(service)
        self.messages = ResponsesStreams(service, messages=True)
        #: request ids whose stream an error reply ended -> its API (later chunks: the ended-stream
        #: 409 in that API's error object, as the Kafka worker answers them; never derendered on top
        #: of the state before the refused chunk)
        self.ended: dict[str, str | None] = {}

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
        if rid in self.ended:
            why = f"stream {rid!r} already ended with an error reply; chunk ignored"
            return error_body_for(self.ended[rid], why, 409, rid), 409
        if rid in self.messages or (rid not in self.states and rid not in self.responses
                                    and is_messages_chunk(item)):  # issue 26
            body, status = self.messages.chunk(rid, item)
            if status != 200 and rid:
                self.messages.streams.pop(rid, None)
                self.ended[rid] = "messages"
            return body, status
        if rid in self.responses or (rid not in self.states and is_responses_chunk(item)):
            body, status = self.responses.chunk(rid, item)
            if status != 200 and rid:
                self.responses.streams.pop(rid, None)
                self.ended[rid] = "responses"
            return body, status
        side = self.logs.get(rid)
        if side is None:
            side = self.logs[rid] = SideValues()
        res, new_state = chat_chunk(self.service, item, self.states.get(rid), side)
        if res.is_error and rid:  # an error reply ends the stream (as the Kafka worker's)
            self.states.pop(rid, None)
            self.logs.pop(rid, None)
            self.ended[rid] = None
            return res.body, res.status
        if new_state is not None:
            if res.done:
                self.states.pop(rid, None)
                self.logs.pop(rid, None)
            else:
                self.states[rid] = new_state
        elif rid not in self.states:
            self.logs.pop(rid, None)
        return res.body, res.status


__all__ = ["StreamLines", "stream_list", "stream_request_id", "is_messages_chunk"]
