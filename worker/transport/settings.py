"""Settings and CLI flags of ``derender-worker run`` (``WorkerSettings``, ``add_run_args``) and the
aiokafka security kwargs (``DERENDER_<FLAG>`` environment defaults: ``worker.flags.apply_env``)."""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Any

from aiokafka.helpers import create_ssl_context

from worker.flags import add_bootstrap_servers_arg
from worker.secretfiles import secret
from worker.state.redis_store import add_redis_args, settings_from_args
from worker.tlsfiles import check_tls_files
from worker.transport.deadletter import DEFAULT_MAX_BYTES, MIN_MAX_BYTES
from worker.transport.records import reply_topic_problem

__all__ = ["WorkerSettings", "add_run_args", "security_kwargs", "env_default", "redact_url"]


def env_default(flag: str, default: Any = None) -> Any:
    """``DERENDER_<FLAG>`` (upper case, ``-`` -> ``_``) from the environment, else ``default``.
    Kept for callers that still read it; new flags take a plain default instead, since
    ``worker.flags.apply_env`` reads ``DERENDER_<FLAG>`` for every flag and reports a malformed
    value in one line (a conversion here, e.g. ``int(env_default(...))``, fails while the parser
    is built, before ``--help``)."""
    return os.environ.get("DERENDER_" + flag.upper().replace("-", "_"), default)


def _positive_int(text: str) -> int:
    """A flag value that must be an integer >= 1. Raises ``ValueError``."""
    v = int(text)
    if v < 1:
        raise ValueError("must be >= 1")
    return v


def _positive_float(text: str) -> float:
    """A flag value that must be a finite number > 0 (seconds: gap/idle timeouts, outage
    deadlines; ``inf`` would disarm the bound it sets). Raises ``ValueError``."""
    v = float(text)
    if not 0 < v < float("inf"):
        raise ValueError("must be a finite number > 0")
    return v


def _drain_seconds(text: str) -> float:
    """``--drain-timeout``: a finite number of seconds >= 0. Raises ``ValueError`` for ``nan``,
    ``inf`` or a negative value: the exit backstop (``run.ExitBackstop``) and the drain are bounded
    by it, and an infinite one would let a stop request never end the process (issue 17)."""
    v = float(text)
    if not 0 <= v < float("inf"):
        raise ValueError("must be a finite number of seconds >= 0")
    return v


_positive_int.__name__ = "int"
_drain_seconds.__name__ = "float"
_positive_float.__name__ = "float"


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
    about one core). ``max_in_flight``: most non-streaming messages fetched but not yet
    acknowledged, over all partitions (backpressure); also the most records of one partition fetched
    beyond its oldest unfinished one (the partition is paused until that one finishes), which bounds
    the replies a crash can repeat. ``security``: extra aiokafka client kwargs (SASL/TLS)."""

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
    #: longest a fetch waits at the broker for new records (Kafka ``fetch.max.wait.ms``): the
    #: added latency of a record arriving on an idle partition, on brokers that hold fetches
    fetch_max_wait_ms: int = 500
    metrics_port: int | None = None
    #: address the health/metrics port binds (``--metrics-host``): all interfaces by default, as
    #: a container's probes and Prometheus need; ``127.0.0.1`` keeps it on the host
    metrics_host: str = "0.0.0.0"
    security: dict[str, Any] = field(default_factory=dict)
    #: streaming (records with a ``derender-seq`` header, see ``worker.transport.streams``):
    #: ``redis`` = ``worker.state.RedisSettings`` of the shared state store; None = in-process
    #: ``MemoryStateStore`` (one worker only: state is lost with the process)
    redis: Any = None
    stream_gap_timeout_s: float = 10.0
    stream_replay_window: int = 32
    #: largest dead-letter record (key + value + headers, bytes); see ``worker.transport.deadletter``
    dead_letter_max_bytes: int = DEFAULT_MAX_BYTES
    #: regular expression a ``reply-topic`` header must match in full (``re.fullmatch``); None = any
    #: legal, non-internal topic name (see ``records.reply_topic_problem``)
    allowed_reply_topics: str | None = None
    #: how long a reply waits for the metadata of a reply topic the producer does not know yet
    #: before it is dead-lettered as unknown (the answer is remembered ``UNKNOWN_TOPIC_MEMORY_S``)
    reply_topic_wait_ms: int = 2000
    #: streams held in memory: evicted after ``stream_idle_timeout_s`` without a chunk (None = the
    #: Redis key TTL, ``redis.ttl_s``, else 900 s) and, least recently used first, beyond
    #: ``max_live_streams``; in memory mode the evicted state is gone (later chunks: 409)
    stream_idle_timeout_s: float | None = None
    max_live_streams: int = 20000
    #: outages (``worker.transport.outage``): seconds the state store / the broker may be
    #: unavailable (or the broker without the data it had) before the worker exits with status 2
    state_store_outage_deadline_s: float = 300.0
    broker_outage_deadline_s: float = 300.0

    @property
    def idle_timeout_s(self) -> float:
        """Idle eviction time of in-memory streams (seconds): the flag, else the Redis TTL, else 900."""
        if self.stream_idle_timeout_s is not None:
            return float(self.stream_idle_timeout_s)
        return float(getattr(self.redis, "ttl_s", 900.0) or 900.0)

    def __post_init__(self) -> None:
        """Check the reliability settings. Raises ``ValueError`` (a bad regular expression, a
        dead-letter limit below ``MIN_MAX_BYTES`` or above ``max_request_size``, an illegal or
        internal input, reply or dead-letter topic name)."""
        for flag, name in (("--input-topic", self.input_topic), ("--reply-topic", self.reply_topic),
                           ("--dead-letter-topic", self.dead_letter_topic)):
            if reply_topic_problem(name) is not None:
                raise ValueError(f"{flag} {name!r} is not a legal, non-internal Kafka topic name")
        if not MIN_MAX_BYTES <= self.dead_letter_max_bytes <= self.max_request_size:
            raise ValueError(f"--dead-letter-max-bytes {self.dead_letter_max_bytes} must be between {MIN_MAX_BYTES} "
                             f"and --max-request-size ({self.max_request_size})")
        self.allowed_reply_topics_re = None
        if self.allowed_reply_topics:
            try:
                self.allowed_reply_topics_re = re.compile(self.allowed_reply_topics)
            except re.error as e:
                raise ValueError(f"--allowed-reply-topics {self.allowed_reply_topics!r}: {e}") from None

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
            auto_offset_reset=args.auto_offset_reset, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
            session_timeout_ms=args.session_timeout_ms, heartbeat_interval_ms=args.heartbeat_interval_ms,
            fetch_max_wait_ms=args.fetch_max_wait_ms,
            security=security_kwargs(args),
            redis=_redis_settings(args), stream_gap_timeout_s=args.stream_gap_timeout,
            stream_replay_window=args.stream_replay_window,
            dead_letter_max_bytes=args.dead_letter_max_bytes, allowed_reply_topics=args.allowed_reply_topics or None,
            reply_topic_wait_ms=args.reply_topic_wait_ms, stream_idle_timeout_s=args.stream_idle_timeout,
            max_live_streams=args.max_live_streams,
            state_store_outage_deadline_s=args.state_store_outage_deadline,
            broker_outage_deadline_s=args.broker_outage_deadline,
        )


def _redis_settings(args: argparse.Namespace) -> Any:
    if getattr(args, "stream_state", "redis") != "redis":
        return None
    return settings_from_args(args)


def security_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """aiokafka client kwargs for ``--security-protocol``, ``--sasl-*`` and ``--ssl-*`` (a
    password from its flag or its ``-file`` flag: ``worker.secretfiles.secret``). Raises
    ``ValueError`` when SASL is requested without a username/password, or naming the flag and the
    file when an ``--ssl-*`` or password file cannot be loaded."""
    out: dict[str, Any] = {"security_protocol": args.security_protocol}
    if args.security_protocol in ("SSL", "SASL_SSL"):
        ssl_password = secret("--ssl-password", args.ssl_password, getattr(args, "ssl_password_file", None))
        check_tls_files(args.ssl_cafile, args.ssl_certfile, args.ssl_keyfile, ssl_password,
                        flags=("--ssl-cafile", "--ssl-certfile", "--ssl-keyfile"))
        out["ssl_context"] = create_ssl_context(
            cafile=args.ssl_cafile, certfile=args.ssl_certfile, keyfile=args.ssl_keyfile,
            password=ssl_password)
    if args.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        sasl_password = secret("--sasl-password", args.sasl_password, getattr(args, "sasl_password_file", None))
        if not (args.sasl_username and sasl_password):
            raise ValueError(f"--security-protocol {args.security_protocol} needs --sasl-username and "
                             f"--sasl-password-file (or --sasl-password)")
        out.update(sasl_mechanism=args.sasl_mechanism, sasl_plain_username=args.sasl_username,
                   sasl_plain_password=sasl_password)
    return out


_HIDDEN = "prefer --{0}-password-file or the env DERENDER_{1}_PASSWORD, which are not"
_FILE_HELP = "file holding the %s (one trailing line break ignored), e.g. a mounted Kubernetes Secret; read once at start"


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """Add the Kafka flags of ``derender-worker run``. Every flag also reads ``DERENDER_<FLAG>``
    from the environment through ``worker.flags.apply_env`` (``--bootstrap-servers`` also
    ``KAFKA_BOOTSTRAP_SERVERS``), flags winning; defaults here are plain values, so a malformed
    variable is reported in one line instead of failing while the parser is built."""
    g = ap.add_argument_group("kafka")
    add_bootstrap_servers_arg(g, "localhost:9092", "comma-separated host:port list")
    g.add_argument("--input-topic", default="engine-outputs")
    g.add_argument("--reply-topic", default="derender-replies",
                   help="where replies go when a message has no reply-topic header")
    g.add_argument("--dead-letter-topic", default="derender-dlq")
    g.add_argument("--dead-letter-max-bytes", type=_positive_int, default=DEFAULT_MAX_BYTES,
                   help="largest dead-letter record in bytes (key + value + headers; default 512 KiB): keep it below "
                        "the dead-letter topic's max.message.bytes (Kafka default 1 MiB); larger originals are "
                        "truncated, marked x-dlq-truncated and identified by x-original-value-sha256")
    g.add_argument("--allowed-reply-topics", default=None, metavar="REGEX",
                   help="reply-topic headers must match this regular expression in full (default: any legal "
                        "topic name not starting with '__'); others are dead-lettered (reply-topic-not-allowed)")
    g.add_argument("--reply-topic-wait-ms", type=_positive_int, default=2000,
                   help="how long a reply waits for an unknown reply topic to appear before it is dead-lettered "
                        "(reply-publish-failed); the answer is remembered for a while, so a missing topic "
                        "never blocks a partition for long")
    g.add_argument("--group-id", default="derender-workers")
    g.add_argument("--client-id", default="derender-worker")
    g.add_argument("--max-in-flight", type=_positive_int, default=64,
                   help="most unacknowledged messages at once (backpressure), and most records of one "
                        "partition read past its oldest unfinished one (bounds the replies a crash repeats)")
    g.add_argument("--num-threads", "--num-workers", dest="num_threads",
                   type=_positive_int, default=_default_workers(),
                   help="derender pool size (default: usable CPU cores)")
    g.add_argument("--executor", choices=["process", "thread"], default="process",
                   help="process pool (parallel, default) or thread pool (GIL-bound, cheap start)")
    g.add_argument("--commit-interval-ms", type=_positive_int, default=200)
    g.add_argument("--drain-timeout", type=_drain_seconds, default=30.0,
                   help="seconds to finish in-flight work on SIGTERM")
    g.add_argument("--request-timeout-ms", type=_positive_int, default=30000)
    g.add_argument("--max-request-size", type=_positive_int, default=8 * 1024 * 1024,
                   help="largest reply record in bytes (the topic's max.message.bytes must allow it)")
    g.add_argument("--auto-offset-reset", choices=["earliest", "latest"],
                   default="earliest",
                   help="where a group without a committed offset starts: earliest (default) = the beginning "
                        "of the topic, so a new --group-id replays every record still on it; latest = only "
                        "records produced after it joined")
    g.add_argument("--session-timeout-ms", type=_positive_int, default=10000,
                   help="consumer-group session timeout (Kafka brokers require >= 6000 by default)")
    g.add_argument("--heartbeat-interval-ms", type=_positive_int, default=3000)
    g.add_argument("--fetch-max-wait-ms", type=_positive_int, default=500,
                   help="longest a fetch waits at the broker for new records (Kafka fetch.max.wait.ms): "
                        "lower = less latency at low load, more fetch requests")
    g.add_argument("--metrics-port", type=int, default=None,
                   help="serve /livez, /readyz and /metrics (Prometheus) on this port (ops/README.md)")
    g.add_argument("--metrics-host", default="0.0.0.0",
                   help="address the --metrics-port server binds (default 0.0.0.0: every interface; "
                        "127.0.0.1: this host only)")
    s = ap.add_argument_group("kafka security (aiokafka)")
    s.add_argument("--security-protocol", choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
                   default="PLAINTEXT")
    s.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
                   default="PLAIN")
    s.add_argument("--sasl-username", default=None)
    s.add_argument("--sasl-password", default=None,
                   help=f"visible to every user of this host (ps, /proc/PID/cmdline): {_HIDDEN.format('sasl', 'SASL')}")
    s.add_argument("--sasl-password-file", default=None, metavar="PATH", help=_FILE_HELP % "SASL password")
    s.add_argument("--ssl-cafile", default=None)
    s.add_argument("--ssl-certfile", default=None)
    s.add_argument("--ssl-keyfile", default=None)
    s.add_argument("--ssl-password", default=None,
                   help=f"password of --ssl-keyfile; visible to every user of this host: {_HIDDEN.format('ssl', 'SSL')}")
    s.add_argument("--ssl-password-file", default=None, metavar="PATH", help=_FILE_HELP % "--ssl-keyfile password")
    st = ap.add_argument_group("streaming (records with a derender-seq header)")
    st.add_argument("--stream-state", choices=["redis", "memory"], default="redis",
                    help="where stream state lives between chunks: Redis (shared by the group, default) or "
                         "this process only (single worker, lost on restart)")
    st.add_argument("--stream-gap-timeout", type=_positive_float, default=10.0,
                    help="seconds a chunk beyond a missing one is held before the stream ends with an error")
    st.add_argument("--stream-replay-window", type=_positive_int, default=32,
                    help="replies per stream kept (memory and store) to answer redelivered chunks identically")
    st.add_argument("--stream-idle-timeout", type=_positive_float, default=None,
                    help="seconds without a chunk after which a stream's in-memory state is evicted "
                         "(default: --redis-state-ttl; with --stream-state memory the state is then gone)")
    st.add_argument("--max-live-streams", type=_positive_int, default=20000,
                    help="most streams held in memory; beyond it the least recently used idle ones are evicted")
    o = ap.add_argument_group("outages (not ready meanwhile; exit status 2 after the deadline)")
    o.add_argument("--state-store-outage-deadline", type=_positive_float, default=300.0,
                   help="seconds streams wait for an unreachable state store (Redis), at startup too, "
                        "before the worker exits; non-streaming records are answered meanwhile")
    o.add_argument("--broker-outage-deadline", type=_positive_float, default=300.0,
                   help="seconds the broker may stay unreachable, or without the data this worker already "
                        "read from it (a broker restarted without its data), before the worker exits")
    add_redis_args(ap)



def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo (``scheme://user:password@host``) masked."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@/]*@", r"\1:***@", str(url))
