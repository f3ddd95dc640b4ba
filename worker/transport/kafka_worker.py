"""Kafka transport of derender-worker: consume engine outputs, publish OpenAI responses.

Message format
==============

Input (``--input-topic``, default ``engine-outputs``)
-----------------------------------------------------
* **key**: the request id (UTF-8). Used as the reply key and as the default correlation id.
  Messages with the same key must go to the same partition (the producer's default
  partitioner does this), because ordering is kept per partition.
* **value**: the JSON derender body, exactly what vLLM's ``/v1/chat/completions/derender``
  (``DerenderChatRequest``: ``model``, ``generate_response``, ``prompt_tokens``,
  ``prompt_token_ids``, ``chat_request``) or ``/v1/completions/derender``
  (``DerenderCompletionRequest``: ``model``, ``generate_responses[]``, ...) accepts.
* **headers** (all optional, UTF-8 values):

  ``reply-topic``
      topic to publish the reply to; default: the worker's ``--reply-topic``
      (``derender-replies``).
  ``correlation-id``
      opaque bytes echoed unchanged on the reply; default: the key, else the body's
      ``generate_response.request_id``.
  ``derender-kind``
      ``chat`` or ``completion``. When absent the body's shape decides:
      ``generate_response`` => chat, ``generate_responses`` => completion. Any other value is
      answered with a 400 error.
  ``content-type``
      ``application/json`` (informational; the value is always parsed as JSON).

Reply (``reply-topic`` header, else ``--reply-topic``)
------------------------------------------------------
* **key**: the input key; when the input had none, the request id read from the body, else the
  correlation id.
* **value**: the OpenAI response JSON (``chat.completion`` / ``text_completion``) or an OpenAI
  error object ``{"error": {"message", "type", "param", "code"}, "request_id"}``.
* **headers**: ``correlation-id`` (as above), ``content-type: application/json``,
  ``derender-status`` (``200``, ``400``, ``404`` or ``500``, HTTP-like, as ASCII digits),
  ``derender-kind`` (``chat``/``completion``; omitted when the body's kind cannot be told).

Dead letters (``--dead-letter-topic``, default ``derender-dlq``)
----------------------------------------------------------------
A message is dead-lettered, instead of answered, exactly when no useful reply can be addressed:

1. ``invalid-reply-topic``: the ``reply-topic`` header is empty, not UTF-8, longer than 249
   characters or has characters outside ``[A-Za-z0-9._-]``;
2. ``unparseable-no-reply-topic``: the value is not a JSON object (empty/null value, invalid
   UTF-8 or JSON, a JSON array/scalar) **and** there is no ``reply-topic`` header. (With the header
   the sender explicitly asked for a reply and gets a 400 error object instead.);
3. ``no-correlation-id``: no ``correlation-id`` header, no key and no readable request id;
4. ``derender-crashed``: a derender process died on this message, and again when the message
   was rerun alone in a one-process quarantine pool (poison pill);
5. ``reply-publish-failed``: the broker refused the reply (e.g. unknown topic, too large).

A dead-letter record carries the original key and value, the original headers, plus
``x-dlq-reason`` (one of the names above; for 5 followed by ``: <error>``), ``x-original-topic``,
``x-original-partition`` and ``x-original-offset`` (ASCII decimal).

Streaming
---------
A record with a ``derender-seq`` header is one chunk of a streamed request (key = request id,
value = ``DerenderChatStreamRequest``/``DerenderCompletionStreamRequest``); it is answered with
one reply whose value is a JSON array of OpenAI stream chunks and whose headers carry
``derender-seq`` and, on the stream's last reply, ``derender-stream-end: 1``. State per stream
lives in Redis (``--stream-state``, ``--redis-*``), chunks of a stream are derendered in order,
duplicates are replayed identically, gaps end the stream after ``--stream-gap-timeout``. See
``worker.transport.kafka_stream`` and the README section "Kafka message format".

Delivery guarantees
-------------------
At-least-once: offsets are committed (consumer group ``--group-id``, auto-commit off) only after
the broker acknowledged the reply or dead letter, up to the highest *contiguous* completed
offset of each partition. A partition's messages are derendered in parallel but their replies
are published in offset order. A crash can therefore repeat replies of uncommitted messages,
never lose them. SIGTERM/SIGINT stop fetching, finish and publish in-flight work (at most
``--drain-timeout`` seconds), commit, exit; a second signal gives up the drain. After a fatal
error (a reply and its dead letter both lost, a checkpoint write failed) the worker stops by
itself: the drain then waits only for work that can still finish, never for the lost records.
Error replies' ``type``: ``BadRequestError`` (400), ``NotFoundError`` (404), ``ConflictError``
(409, stream sequence errors), ``InternalServerError`` (500).
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import logging
import multiprocessing
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from worker.config import ServedModelConfig

log = logging.getLogger(__name__)

__all__ = [
    "add_run_args", "main_run", "WorkerSettings", "WorkerStats", "KafkaDerenderWorker", "JobOutcome",
    "derender_job", "ensure_topics", "HDR_REPLY_TOPIC", "HDR_CORRELATION_ID", "HDR_KIND",
    "HDR_STATUS", "HDR_CONTENT_TYPE", "HDR_DLQ_REASON", "HDR_SEQ", "HDR_STREAM_END",
]

HDR_REPLY_TOPIC = "reply-topic"
HDR_CORRELATION_ID = "correlation-id"
HDR_KIND = "derender-kind"
HDR_STATUS = "derender-status"
HDR_CONTENT_TYPE = "content-type"
HDR_DLQ_REASON = "x-dlq-reason"
HDR_SEQ = "derender-seq"  # stream chunk sequence number (see worker.transport.kafka_stream)
HDR_STREAM_END = "derender-stream-end"
JSON_CT = b"application/json"
KINDS = ("chat", "completion")
STREAM_KINDS = ("chat-stream", "completion-stream")  # also accepted on stream chunk records
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


# ------------------------------------------------------------------------------- settings ----
def _env(flag: str, default: Any = None) -> Any:
    return os.environ.get("DERENDER_" + flag.upper().replace("-", "_"), default)


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class WorkerSettings:
    """Everything the worker needs besides the models. Times are in milliseconds/seconds as named.

    ``executor``: ``process`` (a ``ProcessPoolExecutor`` of ``num_workers`` processes, each with
    its own ``DerenderService`` built once: real parallelism for the CPU-bound core) or
    ``thread`` (a thread pool sharing one service; no fork/spawn cost, but the GIL limits it to
    about one core). ``max_in_flight``: most messages fetched but not yet acknowledged, over all
    partitions (backpressure). ``security``: extra aiokafka client kwargs (SASL/TLS)."""

    bootstrap_servers: str = "localhost:9092"
    input_topic: str = "engine-outputs"
    reply_topic: str = "derender-replies"
    dead_letter_topic: str = "derender-dlq"
    group_id: str = "derender-workers"
    client_id: str = "derender-worker"
    max_in_flight: int = 64
    num_workers: int = field(default_factory=_default_workers)
    executor: str = "process"
    commit_interval_ms: int = 200
    drain_timeout_s: float = 30.0
    request_timeout_ms: int = 30000
    max_request_size: int = 8 * 1024 * 1024
    auto_offset_reset: str = "earliest"
    session_timeout_ms: int = 10000
    heartbeat_interval_ms: int = 3000
    metrics_port: int | None = None
    security: dict[str, Any] = field(default_factory=dict)
    #: streaming (records with a ``derender-seq`` header, see ``worker.transport.kafka_stream``):
    #: ``redis`` = ``worker.state.RedisSettings`` of the shared state store; None = in-process
    #: ``MemoryStateStore`` (one worker only: state is lost with the process)
    redis: Any = None
    stream_gap_timeout_s: float = 10.0
    stream_replay_window: int = 32

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerSettings:
        """Build from ``add_run_args`` flags. Raises ``ValueError`` on inconsistent TLS/SASL flags."""
        return cls(
            bootstrap_servers=args.bootstrap_servers, input_topic=args.input_topic,
            reply_topic=args.reply_topic, dead_letter_topic=args.dead_letter_topic,
            group_id=args.group_id, client_id=args.client_id, max_in_flight=args.max_in_flight,
            num_workers=args.num_threads, executor=args.executor,
            commit_interval_ms=args.commit_interval_ms, drain_timeout_s=args.drain_timeout,
            request_timeout_ms=args.request_timeout_ms, max_request_size=args.max_request_size,
            auto_offset_reset=args.auto_offset_reset, metrics_port=args.metrics_port,
            session_timeout_ms=args.session_timeout_ms, heartbeat_interval_ms=args.heartbeat_interval_ms,
            security=security_kwargs(args),
            redis=_redis_settings(args), stream_gap_timeout_s=args.stream_gap_timeout,
            stream_replay_window=args.stream_replay_window,
        )


def _redis_settings(args: argparse.Namespace) -> Any:
    if getattr(args, "stream_state", "redis") != "redis":
        return None
    from worker.state.redis_store import settings_from_args
    return settings_from_args(args)


def security_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """aiokafka client kwargs for ``--security-protocol``, ``--sasl-*`` and ``--ssl-*``.
    Raises ``ValueError`` when SASL is requested without a username/password."""
    out: dict[str, Any] = {"security_protocol": args.security_protocol}
    if args.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context
        out["ssl_context"] = create_ssl_context(
            cafile=args.ssl_cafile, certfile=args.ssl_certfile, keyfile=args.ssl_keyfile,
            password=args.ssl_password)
    if args.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        if not (args.sasl_username and args.sasl_password):
            raise ValueError(f"--security-protocol {args.security_protocol} needs --sasl-username and --sasl-password")
        out.update(sasl_mechanism=args.sasl_mechanism, sasl_plain_username=args.sasl_username,
                   sasl_plain_password=args.sasl_password)
    return out


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """Add the Kafka flags of ``derender-worker run``. Every flag also reads ``DERENDER_<FLAG>``
    from the environment (``--bootstrap-servers`` also ``KAFKA_BOOTSTRAP_SERVERS``), flags winning."""
    g = ap.add_argument_group("kafka")
    g.add_argument("--bootstrap-servers",
                   default=_env("bootstrap_servers", os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")),
                   help="comma-separated host:port list (env KAFKA_BOOTSTRAP_SERVERS)")
    g.add_argument("--input-topic", default=_env("input_topic", "engine-outputs"))
    g.add_argument("--reply-topic", default=_env("reply_topic", "derender-replies"),
                   help="where replies go when a message has no reply-topic header")
    g.add_argument("--dead-letter-topic", default=_env("dead_letter_topic", "derender-dlq"))
    g.add_argument("--group-id", default=_env("group_id", "derender-workers"))
    g.add_argument("--client-id", default=_env("client_id", "derender-worker"))
    g.add_argument("--max-in-flight", type=int, default=int(_env("max_in_flight", 64)),
                   help="most unacknowledged messages at once (backpressure)")
    g.add_argument("--num-threads", "--num-workers", dest="num_threads", type=int,
                   default=int(_env("num_threads", _default_workers())),
                   help="derender pool size (default: usable CPU cores)")
    g.add_argument("--executor", choices=["process", "thread"], default=_env("executor", "process"),
                   help="process pool (parallel, default) or thread pool (GIL-bound, cheap start)")
    g.add_argument("--commit-interval-ms", type=int, default=int(_env("commit_interval_ms", 200)))
    g.add_argument("--drain-timeout", type=float, default=float(_env("drain_timeout", 30.0)),
                   help="seconds to finish in-flight work on SIGTERM")
    g.add_argument("--request-timeout-ms", type=int, default=int(_env("request_timeout_ms", 30000)))
    g.add_argument("--max-request-size", type=int, default=int(_env("max_request_size", 8 * 1024 * 1024)),
                   help="largest reply record in bytes (the topic's max.message.bytes must allow it)")
    g.add_argument("--auto-offset-reset", choices=["earliest", "latest"],
                   default=_env("auto_offset_reset", "earliest"),
                   help="where a group without a committed offset starts: earliest (default) = the beginning "
                        "of the topic, so a new --group-id replays every record still on it; latest = only "
                        "records produced after it joined")
    g.add_argument("--session-timeout-ms", type=int, default=int(_env("session_timeout_ms", 10000)),
                   help="consumer-group session timeout (Kafka brokers require >= 6000 by default)")
    g.add_argument("--heartbeat-interval-ms", type=int, default=int(_env("heartbeat_interval_ms", 3000)))
    g.add_argument("--metrics-port", type=int, default=_env("metrics_port"),
                   help="serve Prometheus metrics on this port")
    s = ap.add_argument_group("kafka security (aiokafka)")
    s.add_argument("--security-protocol", choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
                   default=_env("security_protocol", "PLAINTEXT"))
    s.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
                   default=_env("sasl_mechanism", "PLAIN"))
    s.add_argument("--sasl-username", default=_env("sasl_username"))
    s.add_argument("--sasl-password", default=_env("sasl_password"),
                   help="prefer the env DERENDER_SASL_PASSWORD over the flag")
    s.add_argument("--ssl-cafile", default=_env("ssl_cafile"))
    s.add_argument("--ssl-certfile", default=_env("ssl_certfile"))
    s.add_argument("--ssl-keyfile", default=_env("ssl_keyfile"))
    s.add_argument("--ssl-password", default=_env("ssl_password"))
    st = ap.add_argument_group("streaming (records with a derender-seq header)")
    st.add_argument("--stream-state", choices=["redis", "memory"], default=_env("stream_state", "redis"),
                    help="where stream state lives between chunks: Redis (shared by the group, default) or "
                         "this process only (single worker, lost on restart)")
    st.add_argument("--stream-gap-timeout", type=float, default=float(_env("stream_gap_timeout", 10.0)),
                    help="seconds a chunk beyond a missing one is held before the stream ends with an error")
    st.add_argument("--stream-replay-window", type=int, default=int(_env("stream_replay_window", 32)),
                    help="replies per stream kept (memory and store) to answer redelivered chunks identically")
    from worker.state.redis_store import add_redis_args
    add_redis_args(ap)


# ------------------------------------------------------------------ derender job (executor) ----
class _Shape(msgspec.Struct):
    """Just enough of a body to tell its kind; ``Raw`` keeps msgspec from decoding the rest."""

    generate_response: msgspec.Raw = msgspec.Raw(b"")
    generate_responses: msgspec.Raw = msgspec.Raw(b"")


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


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError"}


def _error_body(message: str, status: int, request_id: str | None) -> bytes:
    from schemas import ErrorInfo, ErrorResponse
    typ = _ERROR_TYPES.get(status, "InternalServerError")
    return msgspec.json.encode(ErrorResponse(error=ErrorInfo(message=message, type=typ, code=status),
                                             request_id=request_id))


def bad_kind_message(kind: str) -> str:
    """Error message of an unknown ``derender-kind`` header value (lists every accepted value)."""
    return (f"unknown {HDR_KIND} header {kind!r}; expected 'chat' or 'completion' (stream chunk records, "
            f"which carry a {HDR_SEQ} header, also accept 'chat-stream' or 'completion-stream')")


def derender_job(service: Any, value: bytes | None, kind: str | None) -> JobOutcome:
    """Derender one message value with ``service`` (a ``DerenderService``); never raises.

    ``kind``: the ``derender-kind`` header (``chat``/``completion``/None; anything else yields a
    400 error without calling the core). An exception from the core becomes a 500 error reply
    and its traceback is returned in ``crash`` for the caller to log with message context."""
    t0 = time.perf_counter()
    body = value or b""
    try:
        shape = _shape_decoder.decode(body)
        is_object = True
        detected = "chat" if _present(shape.generate_response) else (
            "completion" if _present(shape.generate_responses) else None)
    except (msgspec.DecodeError, msgspec.ValidationError):
        is_object, detected = False, None
    if kind is not None and kind not in KINDS:
        return JobOutcome(_error_body(bad_kind_message(kind), 400, None), 400, None, None, is_object,
                          seconds=time.perf_counter() - t0)
    try:
        res = service.derender(body, kind)
        kind_used = getattr(res, "kind", None) or kind or detected
        return JobOutcome(res.body, int(res.status), res.request_id, kind_used, is_object,
                          seconds=time.perf_counter() - t0)
    except Exception as e:  # the core must not raise; answer 500 and report the traceback
        return JobOutcome(_error_body(f"internal error: {type(e).__name__}: {e}", 500, None), 500, None,
                          kind or detected, is_object, crash=traceback.format_exc(),
                          seconds=time.perf_counter() - t0)


_PROC_SERVICE: Any = None


def _proc_init(models: list[ServedModelConfig]) -> None:
    """Pool-process initializer: build this process' ``DerenderService`` once."""
    global _PROC_SERVICE
    from worker.core.service import DerenderService
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and drains
    _PROC_SERVICE = DerenderService(models)
    preload = getattr(_PROC_SERVICE, "preload", None)
    if preload is not None:
        preload()  # load tokenizers/parsers now, not on the first message


def _proc_job(value: bytes | None, kind: str | None) -> JobOutcome:
    return derender_job(_PROC_SERVICE, value, kind)


def _proc_stream_job(value: bytes | None, state: bytes | None, seq: int, kind: str | None):
    """One stream chunk in a pool process: ``(value, state, seq, kind) -> StreamOutcome``."""
    from worker.transport.kafka_stream import derender_stream_job
    return derender_stream_job(_PROC_SERVICE, value, state, seq, kind)


def _proc_jobs(items: list[tuple[bytes | None, str | None]]) -> list[JobOutcome]:
    """Several ``(value, kind)`` jobs in one pool call (one pickling round trip)."""
    return [derender_job(_PROC_SERVICE, v, k) for v, k in items]


def _proc_ping(delay: float = 0.0) -> int:
    time.sleep(delay)
    return os.getpid()


# ------------------------------------------------------------------------------ metrics ----
class WorkerStats:
    """Counters of one worker: ``processed`` (messages finished: replied or dead-lettered, offset
    committable), ``replied_ok`` (200 replies), ``errors`` (error replies, status != 200),
    ``dead_lettered``, ``crashes`` (core exceptions), ``commits``."""

    def __init__(self) -> None:
        self.processed = 0
        self.replied_ok = 0
        self.errors = 0
        self.dead_lettered = 0
        self.crashes = 0
        self.commits = 0
        self.stream_chunks = 0  # stream chunks derendered
        self.stream_replayed = 0  # duplicates answered from the replay window
        self.stream_skipped = 0  # duplicates older than the window (already acked), not answered
        self.stream_gaps = 0  # streams ended by a gap timeout (or never-seen first chunk)
        self.state_writes = 0  # batched checkpoint pipelines

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))

    def __repr__(self) -> str:
        return f"WorkerStats({self.as_dict()})"


class _Prom:
    """Process-wide Prometheus metrics, created on first use (default registry)."""

    _inst: _Prom | None = None

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram
        self.messages = Counter("derender_messages_total", "Messages finished, by outcome", ["outcome"])
        self.latency = Histogram("derender_seconds", "Derender wall time per message (seconds)")

    @classmethod
    def get(cls) -> _Prom:
        if cls._inst is None:
            cls._inst = cls()
        return cls._inst


# ------------------------------------------------------------------------------- worker ----
@dataclass
class _Job:
    msg: Any  # aiokafka ConsumerRecord
    future: asyncio.Future  # -> JobOutcome


@dataclass
class _Partition:
    tp: TopicPartition
    jobs: asyncio.Queue
    acks: asyncio.Queue
    tasks: list = field(default_factory=list)
    committable: int | None = None  # next offset to commit: lowest unfinished, else highest fetched + 1
    committed: int | None = None
    closed: bool = False
    failed: bool = False
    inflight: set = field(default_factory=set)  # fetched offsets not finished (reply acked [+ state])
    stream_inflight: set = field(default_factory=set)  # the stream records among them
    hi: int | None = None  # highest fetched offset + 1
    streams: dict = field(default_factory=dict)  # request id -> kafka_stream._Stream
    sacks: Any = None  # stream acker queue

    def update_committable(self) -> int | None:
        if self.hi is not None:
            self.committable = min(self.inflight) if self.inflight else self.hi
        return self.committable


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: KafkaDerenderWorker):
        self.worker = worker

    async def on_partitions_revoked(self, revoked):
        await self.worker._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned):
        self.worker._assigned.set()
        log.info("assigned partitions: %s", sorted((tp.topic, tp.partition) for tp in assigned))


class KafkaDerenderWorker:
    """One consumer-group member: fetch, derender off the event loop, publish replies in
    partition order, commit after acknowledgement (see the module docstring for the format).

    ``models``: served models; a process pool builds a ``DerenderService`` from them in each
    process. ``service``: an object with ``derender(body, kind) -> DerenderResult`` to use instead
    (forces the thread executor; for tests and embedding). ``executor``: an existing
    ``concurrent.futures.Executor`` to run ``derender_job`` in (not shut down by the worker).

    Use ``await worker.run()`` (returns when stopped; raises the fatal error if one occurred) and
    ``worker.stop()`` from a signal handler or another task; or ``async with worker:`` which
    runs it in a background task."""

    def __init__(self, settings: WorkerSettings, models: list[ServedModelConfig] | None = None, *,
                 service: Any = None, executor: cf.Executor | None = None):
        if models is None and service is None:
            raise ValueError("give models or a service")
        self.settings = settings
        self.models = models
        self.stats = WorkerStats()
        self._service = service
        self._executor = executor
        self._own_executor = executor is None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._parts: dict[TopicPartition, _Partition] = {}
        self._sem: asyncio.Semaphore | None = None
        self._stopping: asyncio.Event | None = None
        self._fatal: BaseException | None = None
        self._task: asyncio.Task | None = None
        self._prom = _Prom.get() if settings.metrics_port is not None else None
        self._assigned = asyncio.Event()
        self._job_fn: Callable[..., JobOutcome] | None = None
        self._jobs_fn: Callable[..., list[JobOutcome]] | None = None
        self._qpool: cf.ProcessPoolExecutor | None = None  # quarantine for crash retries
        self._qlock: asyncio.Lock | None = None
        self._stream_fn: Callable[..., Any] | None = None
        self._router: Any = None  # kafka_stream.StreamRouter, created by start()
        self._stop_requested = False
        self._hurry: asyncio.Event | None = None  # a second stop(): give up the drain

    # -- executor ------------------------------------------------------------------------------
    def _make_executor(self) -> None:
        self._make_executor_inner()
        if self._job_fn is _proc_job:
            self._stream_fn = _proc_stream_job
        else:
            from worker.transport.kafka_stream import derender_stream_job
            svc = self._service
            self._stream_fn = lambda v, s, q, k: derender_stream_job(svc, v, s, q, k)
        if self._job_fn is _proc_job:
            self._jobs_fn = _proc_jobs
        else:
            fn = self._job_fn
            self._jobs_fn = lambda items: [fn(v, k) for v, k in items]

    def _make_executor_inner(self) -> None:
        s = self.settings
        if self._executor is not None:
            self._job_fn = (lambda v, k: derender_job(self._service, v, k)) if self._service else _proc_job
            return
        if self._service is not None or s.executor == "thread":
            if self._service is None:
                from worker.core.service import DerenderService
                self._service = DerenderService(self.models)
            self._executor = cf.ThreadPoolExecutor(max_workers=s.num_workers, thread_name_prefix="derender")
            svc = self._service
            self._job_fn = lambda v, k: derender_job(svc, v, k)
            return
        method = "forkserver" if sys.platform.startswith("linux") else "spawn"
        self._executor = cf.ProcessPoolExecutor(max_workers=s.num_workers,
                                                mp_context=multiprocessing.get_context(method),
                                                initializer=_proc_init, initargs=(self.models,))
        self._job_fn = _proc_job

    async def _warm_up(self) -> None:
        """Load the models now (so configuration errors surface at startup, not on the first
        message): ``preload()`` the thread-mode service, or start every pool process (each
        preloads in its initializer). Raises what ``preload`` raises (``ValueError`` on a bad
        model config) or ``BrokenProcessPool`` when the pool initializer fails."""
        preload = getattr(self._service, "preload", None)
        if preload is not None and not isinstance(self._executor, cf.ProcessPoolExecutor):
            t0 = time.perf_counter()
            await asyncio.get_running_loop().run_in_executor(self._executor, preload)
            log.info("models loaded in %.2fs", time.perf_counter() - t0)
        if isinstance(self._executor, cf.ProcessPoolExecutor):
            # ping until every process answered (each one preloads in its initializer first)
            loop = asyncio.get_running_loop()
            t0 = time.perf_counter()
            n = self.settings.num_workers
            pids: set[int] = set()
            while len(pids) < n and time.perf_counter() - t0 < 300:
                pids.update(await asyncio.gather(*(loop.run_in_executor(self._executor, _proc_ping, 0.05)
                                                   for _ in range(n))))
            log.info("derender pool ready: %d processes in %.2fs", len(pids), time.perf_counter() - t0)

    def _submit(self, value: bytes | None, kind: str | None) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._executor, self._job_fn, value, kind)

    async def _stream_submit(self, value, state, seq, kind):
        """Derender one stream chunk in the pool (state travels both ways) -> ``StreamOutcome``."""
        from worker.transport.kafka_stream import StreamOutcome
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._stream_fn, value, state,
                                                                    seq, kind)
        except BrokenProcessPool:
            log.error("derender process died on a stream chunk (seq %s); ending that stream with a 500", seq)
            if isinstance(self._executor, cf.ProcessPoolExecutor) and getattr(self._executor, "_broken", False):
                self._restart_pool()
            return StreamOutcome(_error_body("internal error: derender process died", 500, None), 500, False,
                                 None, None, crash="derender process died")
        except Exception as e:
            return StreamOutcome(_error_body(f"internal error: {type(e).__name__}: {e}", 500, None), 500, False,
                                 None, None, crash=repr(e))

    def _stream_done(self, st: _Partition, offset: int) -> None:
        """A stream record is finished (reply acked, checkpoint written): committable."""
        st.inflight.discard(offset)
        if offset in st.stream_inflight:
            st.stream_inflight.discard(offset)
            self._sem.release()

    def _stream_abandon(self, st: _Partition, offset: int) -> None:
        """A held stream record is given up (revoke/stop): not committed, capacity released."""
        if offset in st.stream_inflight:
            st.stream_inflight.discard(offset)
            self._sem.release()

    def _stream_fatal(self, e: BaseException) -> None:
        self._fatal = self._fatal or e
        if self._stopping is not None:
            self._stopping.set()

    def _restart_pool(self) -> None:
        log.error("derender process pool broke; starting a new one")
        old = self._executor
        self._executor = None
        self._make_executor()
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)

    # -- lifecycle -----------------------------------------------------------------------------
    def _client_kwargs(self) -> dict[str, Any]:
        s = self.settings
        return dict(bootstrap_servers=s.bootstrap_servers, client_id=s.client_id,
                    request_timeout_ms=s.request_timeout_ms, **s.security)

    async def start(self) -> None:
        """Create the pool, producer and consumer and join the group. Raises ``KafkaError`` when
        the broker is unreachable, ``BrokenProcessPool`` when the derender processes cannot start."""
        try:
            await self._start()
        except BaseException:
            log.error("worker start failed; releasing what was started")
            await self._close()
            raise

    async def _start(self) -> None:
        s = self.settings
        self._sem = asyncio.Semaphore(max(1, s.max_in_flight))
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        if s.metrics_port is not None:
            from prometheus_client import start_http_server
            start_http_server(int(s.metrics_port))
            log.info("metrics on :%s/metrics", s.metrics_port)
        from worker.transport.kafka_stream import MemoryStateStore, StreamRouter
        if s.redis is not None:  # checked before the (slow) pool start
            from worker.state.redis_store import RedisStateStore
            store = RedisStateStore.from_settings(s.redis)
            try:
                await store.ping()  # StoreConnectError: no stream state store
            except BaseException:
                await store.close()
                raise
            log.info("stream state in Redis %s (prefix %r, ttl %.0fs)", redact_url(s.redis.url), s.redis.prefix,
                     s.redis.ttl_s)
        else:
            store = MemoryStateStore()
        try:
            self._make_executor()
            await self._warm_up()
        except BaseException:
            await store.close()
            raise
        self._router = StreamRouter(self, store, s.stream_gap_timeout_s, s.stream_replay_window)
        self._router.start()
        self._producer = AIOKafkaProducer(**self._client_kwargs(), acks="all", enable_idempotence=False,
                                          linger_ms=2, max_request_size=s.max_request_size)
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            **self._client_kwargs(), group_id=s.group_id, enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset, session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms, max_poll_records=s.max_in_flight)
        self._consumer.subscribe([s.input_topic], listener=_Rebalance(self))
        await self._consumer.start()
        log.info("worker consuming %s (group %s) on %s; replies -> %s, dead letters -> %s",
                 s.input_topic, s.group_id, s.bootstrap_servers, s.reply_topic, s.dead_letter_topic)

    async def wait_assigned(self, timeout: float = 30.0) -> None:
        """Wait until the group gave this worker its first assignment (possibly empty).
        ``timeout`` in seconds; raises ``asyncio.TimeoutError``."""
        await asyncio.wait_for(self._assigned.wait(), timeout)

    def stop(self) -> None:
        """Ask the worker to drain and stop (safe from signal handlers). Every request is logged,
        also when the worker is already stopping after a fatal error; a second request gives up
        the drain (what is not acknowledged yet is not committed and will be redelivered)."""
        if self._stopping is None:
            return
        if not self._stop_requested:
            self._stop_requested = True
            if self._fatal is not None:
                log.info("stop requested: already stopping after a fatal error (%s: %s); finishing what can "
                         "still finish (at most %.1fs; stop again to give up now)", type(self._fatal).__name__,
                         self._fatal, self.settings.drain_timeout_s)
            else:
                log.info("stop requested: draining in-flight work (at most %.1fs; stop again to give up now)",
                         self.settings.drain_timeout_s)
            self._stopping.set()
        elif self._hurry is not None and not self._hurry.is_set():
            log.warning("second stop request: giving up the drain; unacknowledged messages will be redelivered")
            self._hurry.set()

    async def run(self) -> None:
        """Start (unless started), consume until ``stop()``, drain, commit, close.
        Raises the fatal error (e.g. a reply and its dead letter both failed) after cleanup."""
        if self._consumer is None:
            await self.start()
        commit_task = asyncio.create_task(self._commit_loop(), name="derender-commit")
        try:
            await self._fetch_loop()
        except Exception as e:
            log.exception("fetch loop failed")
            self._fatal = self._fatal or e
        finally:
            self._stopping.set()
            drain = asyncio.ensure_future(self._drain_all())
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait({drain, hurry}, timeout=self.settings.drain_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
            if not drain.done():
                drain.cancel()
                if self._hurry.is_set():
                    log.warning("drain given up on request; uncommitted messages will be redelivered")
                else:
                    log.error("drain did not finish within %.1fs; uncommitted messages will be redelivered",
                              self.settings.drain_timeout_s)
            await asyncio.gather(drain, hurry, return_exceptions=True)
            commit_task.cancel()
            await asyncio.gather(commit_task, return_exceptions=True)
            await self._commit()
            await self._close()
            log.info("worker stopped: %s", self.stats)
        if self._fatal is not None:
            raise self._fatal

    async def __aenter__(self) -> KafkaDerenderWorker:
        await self.start()
        self._task = asyncio.create_task(self.run(), name="derender-worker")
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()
        if self._task is not None:
            await self._task

    async def _close(self) -> None:
        for p in list(self._parts.values()):
            if self._router is not None:
                self._router.drop_partition(p)
            for t in p.tasks:
                t.cancel()
            await asyncio.gather(*p.tasks, return_exceptions=True)
        self._parts.clear()
        if self._router is not None:
            await self._router.close()
            self._router = None
        for client in (self._consumer, self._producer):
            if client is not None:
                try:
                    await client.stop()
                except Exception:
                    log.exception("closing %s failed", type(client).__name__)
        if self._qpool is not None:
            self._qpool.shutdown(wait=True, cancel_futures=True)
            self._qpool = None
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    # -- fetching ------------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        while not self._stopping.is_set():
            fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=500, max_records=self.settings.max_in_flight))
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not fetch.done():
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)
                break
            batches = fetch.result()
            total = sum(len(m) for m in batches.values())
            chunk_size = self._chunk_size(total)
            chunk: list[tuple[Any, asyncio.Future]] = []
            streamed: list[tuple[_Partition, Any]] = []
            for tp, msgs in batches.items():
                for msg in msgs:
                    if self._sem.locked() and chunk:
                        self._flush(chunk)  # never hold unsubmitted work while waiting for capacity
                        chunk = []
                    if self._sem.locked() and streamed:
                        await self._dispatch_streams(streamed)
                        streamed = []
                    await self._sem.acquire()
                    st = self._parts.get(tp)
                    if st is None:
                        if tp not in consumer.assignment():
                            self._sem.release()
                            continue  # revoked meanwhile: the new owner refetches it
                        st = self._open_partition(tp)
                    if st.closed:
                        self._sem.release()
                        continue
                    st.inflight.add(msg.offset)
                    st.hi = max(st.hi or 0, msg.offset + 1)
                    if self._header(msg, HDR_SEQ) is not None:  # a stream chunk
                        st.stream_inflight.add(msg.offset)
                        streamed.append((st, msg))
                        continue
                    placeholder = asyncio.get_running_loop().create_future()
                    chunk.append((msg, placeholder))
                    st.jobs.put_nowait(_Job(msg, placeholder))
                    if len(chunk) >= chunk_size:
                        self._flush(chunk)
                        chunk = []
            if chunk:
                self._flush(chunk)
            if streamed:
                await self._dispatch_streams(streamed)

    async def _dispatch_streams(self, items: list[tuple[_Partition, Any]]) -> None:
        """Load the unknown streams of a poll from the store (one read per partition), then hand
        each record to its stream. Raises ``StateStoreError`` when the store cannot be read."""
        by_part: dict[int, list] = {}
        for st, msg in items:
            by_part.setdefault(id(st), [st, []])[1].append(msg)
        for st, msgs in by_part.values():
            if st.closed or self._parts.get(st.tp) is not st:
                for m in msgs:
                    self._stream_abandon(st, m.offset)
                continue
            await self._router.load(st, msgs)
            if st.closed or self._parts.get(st.tp) is not st:  # revoked while reading the store
                for m in msgs:
                    self._stream_abandon(st, m.offset)
                continue
            for m in msgs:
                self._router.dispatch(st, m)

    def _chunk_size(self, total: int) -> int:
        """Messages per executor call: 1 for threads; for processes, enough to split a fetched
        batch of ``total`` messages evenly over the pool, at most 16 (amortizes pickling/IPC)."""
        if not isinstance(self._executor, cf.ProcessPoolExecutor):
            return 1
        n = self.settings.num_workers
        return max(1, min(16, -(-total // n)))

    def _flush(self, chunk: list[tuple[Any, asyncio.Future]]) -> None:
        """Submit ``chunk`` (message, placeholder future) as one executor call; resolve each
        placeholder with its ``JobOutcome`` (or the call's exception) when it returns."""
        items = [(msg.value, self._kind_header(msg)) for msg, _ in chunk]
        futs = [f for _, f in chunk]
        call = asyncio.get_running_loop().run_in_executor(self._executor, self._jobs_fn, items)

        def done(c: asyncio.Future) -> None:
            if c.cancelled():
                for f in futs:
                    if not f.done():
                        f.cancel()
                return
            exc = c.exception()
            for i, f in enumerate(futs):
                if f.done():
                    continue
                if exc is not None:
                    f.set_exception(exc)
                else:
                    f.set_result(c.result()[i])

        call.add_done_callback(done)

    @staticmethod
    def _header(msg, name: str) -> bytes | None:
        for k, v in msg.headers or ():
            if k == name:
                return v
        return None

    def _kind_header(self, msg) -> str | None:
        raw = self._header(msg, HDR_KIND)
        if raw is None:
            return None
        return raw.decode("utf-8", "replace").strip().lower()

    def _open_partition(self, tp: TopicPartition) -> _Partition:
        st = _Partition(tp, asyncio.Queue(), asyncio.Queue())
        st.tasks = [asyncio.create_task(self._sequencer(st), name=f"derender-seq-{tp.topic}-{tp.partition}"),
                    asyncio.create_task(self._acker(st), name=f"derender-ack-{tp.topic}-{tp.partition}")]
        if self._router is not None:
            self._router.open_partition(st)
        self._parts[tp] = st
        return st

    async def _on_revoked(self, revoked) -> None:
        """Rebalance: finish and commit the revoked partitions' in-flight work before giving them up."""
        revoked = [tp for tp in revoked if tp in self._parts]
        if not revoked:
            return
        log.info("revoking partitions %s: draining", sorted((tp.topic, tp.partition) for tp in revoked))
        for tp in revoked:
            self._parts[tp].closed = True
        try:
            await asyncio.wait_for(asyncio.gather(*(self._drain(self._parts[tp]) for tp in revoked)),
                                   self.settings.drain_timeout_s)
        except asyncio.TimeoutError:
            log.error("revoke drain timed out; uncommitted messages will be redelivered")
        await self._commit()
        for tp in revoked:
            st = self._parts.pop(tp)
            if self._router is not None:
                self._router.drop_partition(st)  # in-memory stream states of the partition
            for t in st.tasks:
                t.cancel()
            await asyncio.gather(*st.tasks, return_exceptions=True)

    async def _drain(self, st: _Partition) -> None:
        await st.jobs.join()
        await st.acks.join()
        if self._router is not None and st.sacks is not None:
            await self._router.drain(st)

    async def _drain_all(self) -> None:
        await asyncio.gather(*(self._drain(st) for st in list(self._parts.values())))

    # -- per-partition pipeline ----------------------------------------------------------------
    async def _outcome(self, job: _Job) -> JobOutcome:
        """Await a job's derender. When a pool process died (``BrokenProcessPool``: segfault, OOM
        kill...), restart the pool and rerun this message alone in a one-process quarantine
        pool, one message at a time, so only the message that kills it again is dead-lettered
        (``derender-crashed``) and messages that merely shared the broken pool are answered."""
        msg = job.msg
        try:
            return await job.future
        except BrokenProcessPool:
            log.error("derender process died while %s[%d]@%d was in the pool; retrying it in quarantine",
                      msg.topic, msg.partition, msg.offset)
            if isinstance(self._executor, cf.ProcessPoolExecutor) and getattr(self._executor, "_broken", False):
                self._restart_pool()
            return await self._quarantine(msg)
        except Exception as e:
            log.exception("derender job failed on %s[%d]@%d", msg.topic, msg.partition, msg.offset)
            return JobOutcome(_error_body(f"internal error: {type(e).__name__}: {e}", 500, None), 500,
                              None, None, False, crash=repr(e))

    async def _quarantine(self, msg) -> JobOutcome:
        """Derender ``msg`` alone in a dedicated one-process pool (serialized by a lock). A crash
        there convicts this message: returns an outcome with ``crash="derender-crashed"``."""
        if self.models is None:  # no models to build a quarantine service from
            return JobOutcome(b"", 500, None, None, False, crash="derender-crashed")
        if self._qlock is None:
            self._qlock = asyncio.Lock()
        async with self._qlock:
            if self._qpool is None:
                method = "forkserver" if sys.platform.startswith("linux") else "spawn"
                self._qpool = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context(method),
                                                     initializer=_proc_init, initargs=(self.models,))
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self._qpool, _proc_job, msg.value, self._kind_header(msg))
            except BrokenProcessPool:
                log.error("derender process died again on %s[%d]@%d: poison message", msg.topic, msg.partition,
                          msg.offset)
                self._qpool.shutdown(wait=False, cancel_futures=True)
                self._qpool = None
                return JobOutcome(b"", 500, None, None, False, crash="derender-crashed")

    def _plan(self, msg, out: JobOutcome) -> tuple[str, bytes | None, bytes | None, list, str | None]:
        """Decide where a finished message goes: ``(topic, key, value, headers, dlq_reason)``;
        ``dlq_reason`` is None for a reply (see the module docstring's dead-letter rules)."""
        reply_hdr = self._header(msg, HDR_REPLY_TOPIC)
        corr = self._header(msg, HDR_CORRELATION_ID)
        if out.crash == "derender-crashed":
            return self._dlq(msg, "derender-crashed")
        reply_topic = self.settings.reply_topic
        if reply_hdr is not None:
            try:
                reply_topic = reply_hdr.decode("utf-8")
            except UnicodeDecodeError:
                return self._dlq(msg, "invalid-reply-topic")
            if not _TOPIC_RE.match(reply_topic):
                return self._dlq(msg, "invalid-reply-topic")
        elif not out.is_object:
            return self._dlq(msg, "unparseable-no-reply-topic")
        rid = out.request_id.encode("utf-8") if out.request_id else None
        if corr is None:
            corr = msg.key or rid
        if corr is None:
            return self._dlq(msg, "no-correlation-id")
        key = msg.key or rid or corr
        headers = [(HDR_CORRELATION_ID, corr), (HDR_CONTENT_TYPE, JSON_CT),
                   (HDR_STATUS, str(out.status).encode())]
        if out.kind:
            headers.append((HDR_KIND, out.kind.encode()))
        return reply_topic, key, out.body, headers, None

    def _dlq(self, msg, reason: str) -> tuple[str, bytes | None, bytes | None, list, str]:
        headers = [(k, v) for k, v in (msg.headers or ()) if not k.startswith("x-dlq-") and not k.startswith("x-original-")]
        headers += [(HDR_DLQ_REASON, reason.encode("utf-8", "replace")),
                    ("x-original-topic", msg.topic.encode()),
                    ("x-original-partition", str(msg.partition).encode()),
                    ("x-original-offset", str(msg.offset).encode())]
        return self.settings.dead_letter_topic, msg.key, msg.value, headers, reason

    async def _sequencer(self, st: _Partition) -> None:
        """Take the partition's jobs in offset order, await each derender, hand its record to the
        producer (in order) and pass the delivery future to the acker."""
        while True:
            job = await st.jobs.get()
            try:
                out = await self._outcome(job)
                msg = job.msg
                if out.crash and out.crash != "derender-crashed":
                    self.stats.crashes += 1
                    log.error("derender raised on %s[%d]@%d key=%r:\n%s", msg.topic, msg.partition, msg.offset,
                              msg.key, out.crash)
                if self._prom is not None:
                    self._prom.latency.observe(out.seconds)
                plan = self._plan(msg, out)
                if plan[4] is not None:
                    log.warning("dead-lettering %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, plan[4])
                try:
                    delivery = await self._send(plan)
                except KafkaError as e:  # e.g. metadata timeout: the reply topic does not exist
                    if plan[4] is not None:
                        raise
                    refused = plan[0]
                    plan = self._dlq(msg, f"reply-publish-failed: {type(e).__name__}: {e}")
                    log.warning("dead-lettering %s[%d]@%d: %s (reply topic %s)", msg.topic, msg.partition,
                                msg.offset, plan[4], refused)
                    delivery = await self._send(plan)
                st.acks.put_nowait((job, plan, out, delivery))
            except Exception as e:
                log.exception("cannot publish result of %s[%d]@%d", job.msg.topic, job.msg.partition, job.msg.offset)
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(e)
                st.acks.put_nowait((job, None, None, fut))
            finally:
                st.jobs.task_done()

    async def _send(self, plan) -> asyncio.Future:
        topic, key, value, headers, _ = plan
        return await self._producer.send(topic, value=value, key=key, headers=headers)

    async def _acker(self, st: _Partition) -> None:
        """Await deliveries in offset order; advance the partition's committable offset."""
        while True:
            job, plan, out, delivery = await st.acks.get()
            msg = job.msg
            try:
                try:
                    await delivery
                except KafkaError as e:
                    if plan is None or plan[4] is not None:
                        raise
                    refused = plan[0]
                    plan = self._dlq(msg, f"reply-publish-failed: {type(e).__name__}: {e}")
                    log.warning("dead-lettering %s[%d]@%d: %s (reply topic %s)", msg.topic, msg.partition,
                                msg.offset, plan[4], refused)
                    await (await self._send(plan))
                self._count(plan, out)
                if not st.failed:
                    st.inflight.discard(msg.offset)
            except Exception as e:
                st.failed = True  # never commit past an undelivered message
                log.exception("delivery of %s[%d]@%d failed; stopping (it will be redelivered)", msg.topic,
                              msg.partition, msg.offset)
                self._fatal = self._fatal or e
                if self._stopping is not None:
                    self._stopping.set()
            finally:
                self._sem.release()
                st.acks.task_done()

    def _count(self, plan, out: JobOutcome) -> None:
        self.stats.processed += 1
        if plan[4] is not None:
            self.stats.dead_lettered += 1
            outcome = "dead_lettered"
        elif out.status == 200:
            self.stats.replied_ok += 1
            outcome = "ok"
        else:
            self.stats.errors += 1
            outcome = f"error_{out.status}"
        if self._prom is not None:
            self._prom.messages.labels(outcome).inc()

    # -- commits -------------------------------------------------------------------------------
    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.commit_interval_ms / 1000)
            await self._commit()

    async def _commit(self) -> None:
        """Commit every partition's committable offset that moved. Commit failures (rebalance in
        progress, broker away) are logged; the offsets stay pending and are retried next time."""
        if self._consumer is None:
            return
        offsets = {tp: st.update_committable() for tp, st in self._parts.items()}
        offsets = {tp: o for tp, o in offsets.items() if o is not None and o != self._parts[tp].committed}
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except Exception as e:
            from worker.transport.kafka_stream import OffsetCommitError
            err = OffsetCommitError(f"offset commit of {({f'{t.topic}[{t.partition}]': o for t, o in offsets.items()})} "
                                    f"failed: {type(e).__name__}: {e}")
            log.warning("%s", err)
            return
        self.stats.commits += 1
        for tp, off in offsets.items():
            if tp in self._parts:
                self._parts[tp].committed = off
                if self._router is not None:
                    self._router.on_committed(self._parts[tp], off)


# -------------------------------------------------------------------------------- helpers ----
async def ensure_topics(bootstrap_servers: str, topics: dict[str, int], **client_kwargs: Any) -> None:
    """Create ``topics`` (name -> partition count, replication 1) where missing. Existing topics
    are left alone. Raises ``KafkaError`` on other broker errors."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(t, n, 1) for t, n in topics.items() if t not in existing]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo (``scheme://user:password@host``) masked."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@/]*@", r"\1:***@", str(url))


async def check_state_store(redis_settings: Any) -> None:
    """Ping the Redis stream state store once. Raises ``StoreConnectError`` when it is unreachable."""
    from worker.state.redis_store import RedisStateStore
    store = RedisStateStore.from_settings(redis_settings)
    try:
        await store.ping()
    finally:
        await store.close()


async def _run_until_signal(worker: KafkaDerenderWorker) -> None:
    loop = asyncio.get_running_loop()
    await worker.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()


def main_run(args: argparse.Namespace) -> int:
    """``derender-worker run``: build the models from the flags, run the worker until
    SIGTERM/SIGINT. Returns 0 after a clean drain, 2 on bad configuration, 1 on a fatal error."""
    from worker.config import models_from_args
    try:
        models = models_from_args(args)
        settings = WorkerSettings.from_args(args)
    except (ValueError, OSError) as e:
        log.error("bad configuration: %s", e)
        return 2
    if settings.redis is not None:  # before the derender pool is built (seconds to minutes)
        from worker.state import StateStoreError
        try:
            asyncio.run(check_state_store(settings.redis))
        except (StateStoreError, ValueError, OSError) as e:
            log.error("stream state store unreachable at %s (%s): start Redis there, give a reachable one with "
                      "--redis-url (env DERENDER_REDIS_URL), or use --stream-state memory if this worker never "
                      "receives stream chunks (records with a %s header)", redact_url(settings.redis.url), e,
                      HDR_SEQ)
            return 2
    worker = KafkaDerenderWorker(settings, models)
    try:
        asyncio.run(_run_until_signal(worker))
    except Exception:
        log.exception("worker failed")
        return 1
    return 0


def _main(argv: list[str] | None = None) -> int:
    """``python -m worker.transport.kafka_worker`` = ``derender-worker run`` without the other
    subcommands (no imports beyond the core)."""
    from worker.config import add_model_args
    ap = argparse.ArgumentParser(prog="python -m worker.transport.kafka_worker", description="derender Kafka worker")
    ap.add_argument("--log-level", default=_env("log_level", "INFO"))
    add_model_args(ap)
    add_run_args(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return main_run(args)


if __name__ == "__main__":
    sys.exit(_main())
