"""Counters of a Kafka worker: ``WorkerStats`` (plain, per worker; logged at stop and read by
tests) and ``PromMetrics`` (the Prometheus metrics of one worker, in its own registry, served on
``--metrics-port`` by ``worker.transport.endpoints``).

The metric names, types, labels and label values are documented in ONE table, ops/README.md
("Metrics"); ``tests/test_metrics.py`` fails when this module and the table differ. Naming follows
the Prometheus conventions (https://prometheus.io/docs/practices/naming/): ``derender_`` prefix,
``_total`` counters, base units (``_seconds``). Label values are bounded: the tuples below are
complete, anything else is folded into ``unknown``/``other`` — never a request id or free text.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from worker.buildinfo import state_formats_read, version
from worker.state.formats import CURRENT

__all__ = ["WorkerStats", "observe_many", "PromMetrics", "InstrumentedStore", "MODES", "KIND_VALUES", "OUTCOMES",
           "DLQ_REASONS",
           "STATE_OPS", "BUCKETS", "dlq_reason_label"]

MODES = ("unary", "stream")  # stream = a record with a derender-seq header
KIND_VALUES = ("chat", "completion", "responses", "messages", "unknown")  # the kind label: chat-stream counts as chat
OUTCOMES = ("ok", "error", "dead_letter", "duplicate")
#: the x-dlq-reason names of worker.transport.records (tests/test_metrics.py checks the list against it)
DLQ_REASONS = ("invalid-reply-topic", "reply-topic-not-allowed", "unparseable-no-reply-topic", "no-correlation-id",
               "derender-crashed", "reply-publish-failed", "internal-error", "unreadable-record", "reply-too-large",
               "other")
STATE_OPS = ("read", "write", "delete", "ping")
#: seconds; from a fast derender (~1 ms) to a record that waited a minute in the topic
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def observe_many(hist: Any, values: list[float]) -> None:
    """``hist.observe(v)`` for each of ``values`` (a ``Histogram`` or a labelled child of one) in
    one pass: each bucket hit and the sum incremented once. prometheus_client takes a lock and
    scans the bounds per ``observe``: most of a record's metric cost on the worker's hot path
    (docs/performance.md, issue 23 item 5). Falls back to ``observe`` per value when the
    histogram's internals (``_upper_bounds``, ``_buckets``, ``_sum``) are not the expected ones."""
    if not values:
        return
    bounds, buckets, total = (getattr(hist, "_upper_bounds", None), getattr(hist, "_buckets", None),
                              getattr(hist, "_sum", None))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            hist.observe(v)
        return
    hist._raise_if_not_observable()
    hits: dict[int, int] = {}
    for v in values:
        if v == v:  # (NaN: no bucket, as observe)
            i = bisect_left(bounds, v)  # the first bound >= v (the last one is +Inf)
            hits[i] = hits.get(i, 0) + 1
    total.inc(sum(values))
    for i, n in hits.items():
        buckets[i].inc(n)


def dlq_reason_label(reason: str | None) -> str:
    """The bounded ``reason`` label of an ``x-dlq-reason`` value: its name before ``:`` when it is
    one of ``DLQ_REASONS``, else ``other``."""
    name = (reason or "").split(":", 1)[0].strip()
    return name if name in DLQ_REASONS else "other"


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


class PromMetrics:
    """The Prometheus metrics of one worker, in its own ``CollectorRegistry`` (``.registry``), with
    the client library's process, platform and GC collectors. Every bounded label set exists from
    the start at 0 (a rate over a missing series is no rate). Methods are called on the event loop;
    the registry is read by the HTTP thread (prometheus_client metrics are thread safe)."""

    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series (process-wide switch of the client library)
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.received = Counter("derender_records_received", "Input records fetched", ["mode"], registry=r)
        self.processed = Counter("derender_records_processed",
                                 "Input records finished (reply or dead letter acked, offset committable)",
                                 ["mode", "kind", "outcome"], registry=r)
        self.dead_letters = Counter("derender_dead_letters", "Dead letters acked, by x-dlq-reason name",
                                    ["reason"], registry=r)
        self.processing = Histogram("derender_processing_seconds",
                                    "Derender wall time of one record in the pool (a stream record: one chunk)",
                                    ["mode"], buckets=BUCKETS, registry=r)
        self.end_to_end = Histogram("derender_end_to_end_seconds",
                                    "Input record timestamp to the broker's ack of its reply or dead letter",
                                    ["mode"], buckets=BUCKETS, registry=r)
        self.lag = Gauge("derender_consumer_lag",
                         "Records behind on an input partition held by this worker (high watermark - committed)",
                         ["topic", "partition"], registry=r)
        self.in_flight = Gauge("derender_records_in_flight", "Records fetched and not finished", registry=r)
        self.live_streams = Gauge("derender_live_streams", "Streams in progress whose state this worker holds",
                                  registry=r)
        self.assigned = Gauge("derender_assigned_partitions", "Input partitions held", registry=r)
        self.ready = Gauge("derender_ready", "1 when /readyz answers 200, else 0", registry=r)
        self.state_ops = Counter("derender_state_operations", "Stream state store calls", ["op", "outcome"],
                                 registry=r)
        self.state_seconds = Histogram("derender_state_operation_seconds", "Stream state store call latency",
                                       ["op"], buckets=BUCKETS, registry=r)
        self.pool_restarts = Counter("derender_pool_restarts", "Derender pool rebuilt after a process died",
                                     registry=r)
        self.build_info = Gauge("derender_build_info", "1, labelled with this build's version and stream-state formats",
                                ["version", "state_format", "state_formats_read"], registry=r)
        self.build_info.labels(version(), str(CURRENT), state_formats_read()).set(1)
        for m in MODES:
            self.received.labels(m)
            self.processing.labels(m)
            self.end_to_end.labels(m)
            for k in KIND_VALUES:
                for o in OUTCOMES:
                    self.processed.labels(m, k, o)
        for reason in DLQ_REASONS:
            self.dead_letters.labels(reason)
        for op in STATE_OPS:
            self.state_seconds.labels(op)
            for o in ("ok", "error"):
                self.state_ops.labels(op, o)
        self._lag_series: set[tuple[str, str]] = set()
        # label children looked up once (prometheus_client's labels() takes a lock and builds a key)
        self._processed = {(m, k, o): self.processed.labels(m, k, o)
                           for m in MODES for k in KIND_VALUES for o in OUTCOMES}
        self._e2e = {m: self.end_to_end.labels(m) for m in MODES}
        self.received_unary, self.received_stream = self.received.labels("unary"), self.received.labels("stream")
        self.processing_unary = self.processing.labels("unary")
        self.processing_stream = self.processing.labels("stream")

    # -- per record ----------------------------------------------------------------------------
    def finished(self, mode: str, kind: str | None, dlq_reason: str | None, status: int | None,
                 timestamp_ms: int | None, *, duplicate: bool = False) -> None:
        """One input record finished. ``dlq_reason``: the ``x-dlq-reason`` when it was
        dead-lettered, else None; ``status``: the reply's HTTP-like status; ``timestamp_ms``: the
        input record's Kafka timestamp (ms since the epoch; None or < 0 = unknown: no end-to-end
        sample); ``duplicate``: a stream duplicate skipped without a reply."""
        if duplicate:
            outcome = "duplicate"
        elif dlq_reason is not None:
            outcome = "dead_letter"
            self.dead_letters.labels(dlq_reason_label(dlq_reason)).inc()
        else:
            outcome = "ok" if status == 200 else "error"
        kind = kind.removesuffix("-stream") if isinstance(kind, str) else "unknown"
        self._processed[mode, kind if kind in KIND_VALUES else "unknown", outcome].inc()
        if timestamp_ms is not None and timestamp_ms >= 0:
            self._e2e[mode].observe(max(0.0, time.time() - timestamp_ms / 1000.0))

    def finished_many(self, mode: str, rows: list[tuple[str | None, str | None, int | None, int | None]]) -> None:
        """``finished(mode, kind, dlq_reason, status, timestamp_ms)`` for each row of ``rows``
        (records finished together: one executor call's records of a partition), with each
        counter and histogram bucket incremented once (``observe_many``)."""
        now = time.time()
        counts: dict[tuple[str, str, str], int] = {}
        ages: list[float] = []
        for kind, dlq_reason, status, timestamp_ms in rows:
            if dlq_reason is not None:
                outcome = "dead_letter"
                self.dead_letters.labels(dlq_reason_label(dlq_reason)).inc()
            else:
                outcome = "ok" if status == 200 else "error"
            kind = kind.removesuffix("-stream") if isinstance(kind, str) else "unknown"
            key = (mode, kind if kind in KIND_VALUES else "unknown", outcome)
            counts[key] = counts.get(key, 0) + 1
            if timestamp_ms is not None and timestamp_ms >= 0:
                ages.append(max(0.0, now - timestamp_ms / 1000.0))
        for key, n in counts.items():
            self._processed[key].inc(n)
        observe_many(self._e2e[mode], ages)

    # -- sampled by the worker (commit loop) ---------------------------------------------------
    def observe_consumer(self, consumer: Any, parts: dict, topic: str) -> None:
        """Set the gauges read from the consumer's state (the live-streams gauge is set by
        ``worker.transport.stream_memory.StreamMemory``). ``consumer``: the AIOKafkaConsumer; ``parts``: TopicPartition
        -> the worker's partition state (``committed``, ``committable``, ``inflight``, ``streams``). Lag of a held partition = its high watermark (from the last
        fetch) minus the offset committed by this worker (before the first commit: the next offset
        to commit); a held partition the worker fetched nothing from is caught up (0). Series of
        partitions no longer held are removed."""
        assignment = consumer.assignment()
        self.assigned.set(len(assignment))
        seen = set()
        for tp in assignment:
            if tp.topic != topic:
                continue
            hw = consumer.highwater(tp)
            if hw is None:
                continue
            st = parts.get(tp)
            base = None if st is None else (st.committed if st.committed is not None else st.committable)
            lag = 0 if base is None else max(0, hw - base)
            key = (tp.topic, str(tp.partition))
            self.lag.labels(*key).set(lag)
            seen.add(key)
        for key in self._lag_series - seen:
            self.lag.remove(*key)
        self._lag_series = seen
        self.in_flight.set(sum(len(st.inflight) for st in parts.values()))

    def wrap_store(self, store: Any) -> InstrumentedStore:
        """``store`` with every call counted and timed (``derender_state_operation*``)."""
        return InstrumentedStore(store, self)


class InstrumentedStore:
    """A stream state store (``RedisStateStore``/``MemoryStateStore`` API) whose calls are counted
    (``derender_state_operations_total{op, outcome}``) and timed
    (``derender_state_operation_seconds{op}``). ``commit`` of deletions only counts as ``delete``,
    other commits as ``write``. Exceptions pass through unchanged (counted as ``error``)."""

    def __init__(self, store: Any, metrics: PromMetrics):
        self.inner = store
        self._m = metrics

    async def _call(self, op: str, coro: Any) -> Any:
        t0 = time.perf_counter()
        try:
            res = await coro
        except BaseException:
            self._m.state_ops.labels(op, "error").inc()
            raise
        finally:
            self._m.state_seconds.labels(op).observe(time.perf_counter() - t0)
        self._m.state_ops.labels(op, "ok").inc()
        return res

    async def ping(self) -> None:
        return await self._call("ping", self.inner.ping())

    async def get(self, request_id: str) -> Any:
        return await self._call("read", self.inner.get(request_id))

    async def get_many(self, request_ids: list[str]) -> dict:
        return await self._call("read", self.inner.get_many(request_ids))

    async def put(self, request_id: str, state: bytes, seq: int, **kw: Any) -> bool:
        return await self._call("write", self.inner.put(request_id, state, seq, **kw))

    async def delete(self, request_id: str, seq: int | None = None) -> bool:
        return await self._call("delete", self.inner.delete(request_id, seq))

    async def commit(self, writes: list) -> list[bool]:
        op = "delete" if writes and all(w.state is None for w in writes) else "write"
        return await self._call(op, self.inner.commit(writes))

    async def commit_codes(self, writes: list) -> list[int]:
        op = "delete" if writes and all(w.state is None for w in writes) else "write"
        return await self._call(op, self.inner.commit_codes(writes))

    async def read_settings(self, request_id: str) -> bytes | None:
        return await self._call("read", self.inner.read_settings(request_id))

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else (e.g. MemoryStateStore.data) unchanged
        return getattr(self.inner, name)
