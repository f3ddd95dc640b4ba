"""Derender jobs: the functions that run in the derender pool (process or thread), and their
small picklable results (``JobOutcome`` for a whole request, ``StreamOutcome`` for a stream
chunk). Every job function returns an outcome and never raises for a record's content; the
``proc_*`` functions run in pool processes with the ``DerenderService`` built by ``proc_init``."""
from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any

import msgspec

from worker.config import ServedModelConfig
from worker.core.errors import error_body
from worker.core.service import DerenderService, error_body_for, record_api
from worker.logs import setup_logging_from_env
from worker.transport.lifetime import guard_pool_process
from worker.transport.records import KINDS, STREAM_KINDS, bad_kind_message

__all__ = ["JobOutcome", "StreamOutcome", "derender_job", "derender_stream_job", "error_body", "body_request_id"]


class _Shape(msgspec.Struct):
    """Just enough of a body to tell its kind; ``Raw`` keeps msgspec from decoding the rest."""

    generate_response: msgspec.Raw = msgspec.Raw(b"")
    generate_responses: msgspec.Raw = msgspec.Raw(b"")
    responses_request: msgspec.Raw = msgspec.Raw(b"")  # issue 14: a Responses body
    messages_request: msgspec.Raw = msgspec.Raw(b"")  # issue 26: a Messages body


def _present(raw: msgspec.Raw) -> bool:
    return len(raw) > 0 and bytes(raw) != b"null"


_shape_decoder = msgspec.json.Decoder(_Shape)


class JobOutcome(msgspec.Struct, array_like=True):
    """Result of one derender job, sent back from a pool process (hence small and picklable).

    ``body``: reply JSON bytes; ``status``: 200/400/404/500; ``request_id``: read by the core or
    None; ``kind``: the kind used/detected, or None; ``is_object``: the value is a JSON object;
    ``crash``: traceback text when the core raised (the reply is then a 500 error); ``seconds``:
    derender wall time."""

    body: bytes
    status: int
    request_id: str | None
    kind: str | None
    is_object: bool
    crash: str | None = None
    seconds: float = 0.0


def _crash_outcome(e: BaseException, kind: str | None, is_object: bool, t0: float, body: bytes = b"") -> JobOutcome:
    """The 500 of a job that raised (the error object of the record's API: ``record_api``)."""
    return JobOutcome(error_body_for(record_api(kind, body), f"internal error: {type(e).__name__}: {e}", 500),
                      500, None, kind, is_object, crash=traceback.format_exc(), seconds=time.perf_counter() - t0)


def derender_job(service: Any, value: bytes | None, kind: str | None, created: int | None = None) -> JobOutcome:
    """Derender one message value with ``service`` (a ``DerenderService``); never raises.

    ``kind``: the ``derender-kind`` header (``chat``/``completion``/None; anything else yields a
    400 error without calling the core). ``created``: the record's timestamp in seconds, the
    response's ``created`` when the engine's body has none. Any exception (from the core or while
    probing the value: ``RecursionError``, ``MemoryError``, ``OverflowError``, ...) becomes a 500
    error reply for this value only, its traceback returned in ``crash`` for the caller to log with
    message context."""
    t0 = time.perf_counter()
    body = value or b""
    is_object, detected = is_object_value(body), None
    try:
        return _derender_job(service, body, kind, t0, created)
    except Exception as e:
        return _crash_outcome(e, kind or detected, is_object, t0, body)


def _derender_job(service: Any, body: bytes, kind: str | None, t0: float,
                  created: int | None) -> JobOutcome:
    try:
        shape = _shape_decoder.decode(body)
        is_object = True
        detected = ("responses" if _present(shape.responses_request) else
                    "messages" if _present(shape.messages_request) else "chat") if _present(
            shape.generate_response) else ("completion" if _present(shape.generate_responses) else None)
    except (msgspec.DecodeError, msgspec.ValidationError):
        is_object, detected = False, None
    except RecursionError:  # nested deeper than the decoder allows: the core answers 400
        is_object, detected = is_object_value(body), None
    if kind is not None and kind not in KINDS:
        return JobOutcome(error_body_for(detected, bad_kind_message(kind), 400), 400, None, None, is_object,
                          seconds=time.perf_counter() - t0)
    try:
        res = service.derender(body, kind, created=created)
        kind_used = getattr(res, "kind", None) or kind or detected
        return JobOutcome(res.body, int(res.status), res.request_id, kind_used, is_object,
                          seconds=time.perf_counter() - t0)
    except Exception as e:  # the core must not raise; answer 500 and report the traceback
        return _crash_outcome(e, kind or detected, is_object, t0, body)


_PROC_SERVICE: Any = None


def proc_init(models: list[ServedModelConfig]) -> None:
    """Pool-process initializer: end with the main process (``lifetime.guard_pool_process``),
    then build this process' ``DerenderService`` once."""
    global _PROC_SERVICE
    guard_pool_process()
    setup_logging_from_env()  # the CLI's --log-level/--log-format, exported to the environment
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and drains
    _PROC_SERVICE = DerenderService(models)
    preload = getattr(_PROC_SERVICE, "preload", None)
    if preload is not None:
        preload()  # load tokenizers/parsers now, not on the first message


def proc_job(value: bytes | None, kind: str | None, created: int | None = None) -> JobOutcome:
    return derender_job(_PROC_SERVICE, value, kind, created)


def proc_stream_job(value: bytes | None, state: bytes | None, seq: int, kind: str | None,
                    created: int | None = None, pieces: tuple[int, bytes] | None = None,
                    settings: bytes | None = None):
    """One stream chunk in a pool process: ``(value, state, seq, kind, created, pieces, settings)
    -> StreamOutcome`` (``derender_stream_job``; the settings cache is this process')."""
    return derender_stream_job(_PROC_SERVICE, value, state, seq, kind, created, pieces, settings)


def proc_jobs(items: list[tuple[bytes | None, str | None, int | None]]) -> list[JobOutcome]:
    """Several ``(value, kind, created)`` jobs in one pool call (one pickling round trip). Each
    job's outcome is its own: ``derender_job`` never raises, so one value's failure (of any type)
    is a 500 for that value and never fails its neighbours in the call."""
    return [derender_job(_PROC_SERVICE, v, k, c) for v, k, c in items]


def proc_ping(delay: float = 0.0) -> int:
    time.sleep(delay)
    return os.getpid()



class StreamOutcome(msgspec.Struct, array_like=True):
    """Result of one stream chunk derender (small, picklable): reply ``body`` (JSON list of
    chunks or error object), ``status``, ``done`` (request complete), ``kind``, new ``state``
    (None on error), ``is_object`` (the value was a JSON object), ``crash`` (traceback); the
    stream's append-only pieces (``worker.state.pieces``): ``append`` (bytes to write with
    ``state`` at offset ``pieces_len - len(append)``), ``pieces_len`` (their length ``state``
    records) and ``needs_pieces`` (``(start, end)``: nothing was derendered, run the chunk again
    with those stored bytes)."""

    body: bytes
    status: int
    done: bool
    kind: str | None
    state: bytes | None
    is_object: bool = True
    crash: str | None = None
    seconds: float = 0.0
    append: bytes = b""
    pieces_len: int = 0
    needs_pieces: tuple[int, int] | None = None
    settings: bytes = b""
    needs_settings: bool = False


def is_object_value(value: bytes) -> bool:
    """Whether ``value`` looks like a JSON object (first non-blank byte ``{``)."""
    v = value.lstrip()[:1]
    return v == b"{"


class _RidProbe(msgspec.Struct):
    request_id: str | None = None


class _ChunkProbe(msgspec.Struct):
    generate_chunk: _RidProbe | None = None


_chunk_probe_decoder = msgspec.json.Decoder(_ChunkProbe)


def body_request_id(value: bytes | None) -> str | None:
    """``generate_chunk.request_id`` of a stream chunk body, or None when it cannot be read."""
    try:
        gc = _chunk_probe_decoder.decode(value or b"").generate_chunk
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return gc.request_id if gc is not None and gc.request_id else None


def derender_stream_job(service: Any, value: bytes | None, state: bytes | None, seq: int,
                        kind: str | None, created: int | None = None,
                        pieces: tuple[int, bytes] | None = None, settings: bytes | None = None) -> StreamOutcome:
    """Derender one chunk with ``service.derender_stream(pieces=True, settings_aside=True)``
    (``settings``: the stream's stored write-once settings, when the caller has them at hand or
    an earlier outcome's ``needs_settings`` asked for them); never raises (a core
    exception becomes a 500 reply with its traceback in ``crash``). ``kind``: the
    ``derender-kind`` header (``chat``, ``completion``, ``chat-stream``, ``completion-stream``,
    ``responses``, ``responses-stream``, ``messages``, ``messages-stream`` or None; anything else is answered with a 400 error
    without calling the core). ``created``: the chunk record's timestamp in seconds (used by the
    core on the stream's first chunk only). ``pieces``: ``(start, bytes)``, the stream's stored
    piece bytes from offset ``start`` that an earlier outcome's ``needs_pieces`` asked for."""
    t0 = time.perf_counter()
    body = value or b""
    try:
        return _derender_stream_job(service, body, state, seq, kind, t0, created, pieces, settings)
    except Exception as e:
        return StreamOutcome(error_body_for(record_api(kind, body, state), f"internal error: {type(e).__name__}: {e}",
                                            500), 500, False, None, None, is_object_value(body),
                             crash=traceback.format_exc(), seconds=time.perf_counter() - t0)


def _piece_reader(pieces: tuple[int, bytes] | None):
    """A ``reader(start, end)`` over ``(offset, bytes)`` (None: no reader)."""
    if pieces is None:
        return None
    base, data = pieces
    return lambda start, end: data[max(start - base, 0):max(end - base, 0)] if start >= base else b""


def _derender_stream_job(service: Any, body: bytes, state: bytes | None, seq: int, kind: str | None,
                         t0: float, created: int | None, pieces: tuple[int, bytes] | None = None,
                         settings: bytes | None = None) -> StreamOutcome:
    if kind is not None and kind not in KINDS and kind not in STREAM_KINDS:
        return StreamOutcome(error_body_for(record_api(None, body, state), bad_kind_message(kind), 400,
                                            body_request_id(body)), 400, False, None, None,
                             is_object_value(body), seconds=time.perf_counter() - t0)
    try:
        res, new_state = service.derender_stream(body, state, seq=seq, kind=kind, created=created, pieces=True,
                                                 reader=_piece_reader(pieces), settings_aside=True, settings=settings)
        return StreamOutcome(res.body, int(res.status), bool(getattr(res, "done", False)),
                             getattr(res, "kind", None), new_state if res.status == 200 else None,
                             is_object_value(body), seconds=time.perf_counter() - t0, append=res.append,
                             pieces_len=res.pieces_len, needs_pieces=res.needs_pieces,
                             settings=getattr(res, "settings", b""), needs_settings=getattr(res, "needs_settings", False))
    except Exception as e:
        return StreamOutcome(error_body_for(record_api(kind, body, state), f"internal error: {type(e).__name__}: {e}",
                                            500), 500, False, None, None, is_object_value(body),
                             crash=traceback.format_exc(), seconds=time.perf_counter() - t0)

