"""The consume / derender / produce / commit loop of the Kafka worker (``KafkaDerenderWorker``).

Record format: ``worker.transport.records``; streams (records with a ``derender-seq`` header):
``worker.transport.streams``; the pool: ``worker.transport.pool``.

Delivery guarantees
-------------------
At-least-once: offsets are committed (consumer group ``--group-id``, auto-commit off) only after
the broker acknowledged the reply or dead letter (and, for a stream chunk, after its checkpoint
was written), up to the oldest unfinished offset of each partition. Order is kept per key, not
per partition: a partition's non-streaming replies are published in offset order, stream chunks
in order per stream, and replies of other keys may overtake a stream chunk that waits (for its
state, for a missing chunk). A crash can therefore repeat replies of uncommitted messages, never
lose them; a partition is paused while ``--max-in-flight`` records past its oldest unfinished
active one are read, which bounds those repeats (stream chunks waiting for the state store or
behind a gap have bounds of their own: ``worker.transport.pauses``). SIGTERM/SIGINT stop fetching, finish and publish in-flight work (at most
``--drain-timeout`` seconds), commit, exit; a second signal gives up the drain. After a fatal
error (a reply and its dead letter both lost, a checkpoint write failed) the worker stops by
itself: the drain then waits only for work that can still finish, never for the lost records.
Error replies' ``type``: ``worker.core.errors`` (400, 404, 409, 413, 500).

Collaborators (one job each; ``worker/transport/AGENTS.md``): ``publisher.ReplyPublisher`` (the
only sender), ``planning.ReplyPlanner``, ``unary.UnaryPipeline`` (non-streaming pipeline per
partition), ``streams.StreamRouter`` (through a ``context.StreamContext``) with its
``checkpoints.CheckpointWriter``, ``commits.OffsetCommitter``, ``pauses.PartitionPauses``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from worker.config import ServedModelConfig
from worker.state.memory_store import MemoryStateStore
from worker.tracing import Tracer
from worker.transport.broker_watch import BrokerWatch
from worker.transport.commits import OffsetCommitter
from worker.transport.context import StreamContext
from worker.transport.endpoints import DependencyProbe, Endpoints
from worker.transport.health import HealthState
from worker.transport.jobs import JobOutcome
from worker.transport.metrics import PromMetrics, WorkerStats
from worker.transport.outage import DependencyOutage, OutageClock
from worker.transport.pauses import PartitionPauses
from worker.transport.permits import Permits
from worker.transport.planning import ReplyPlanner
from worker.transport.pool import DerenderPool
from worker.transport.publisher import UNKNOWN_TOPIC_MEMORY_S, ReplyPublisher, producer_config
from worker.transport.records import HDR_SEQ, header, kind_header, record_created
from worker.transport.settings import WorkerSettings, redact_url
from worker.transport.stream_memory import StreamMemory
from worker.transport.streams import StreamRouter
from worker.transport.unary import UnaryPipeline
from worker.transport.unreadable import UNREADABLE_ERRORS, UnreadableRecord, isolate_unreadable

log = logging.getLogger(__name__)

__all__ = ["KafkaDerenderWorker", "UNKNOWN_TOPIC_MEMORY_S", "state_store_outage_clock", "FINAL_STEPS_S"]

#: seconds the steps after the drain (final commit, closing the consumer and the producer) may
#: take together: a broker that is gone or frozen must not hold the exit (``run``)
FINAL_STEPS_S = 3.0



def _retrieved(call: asyncio.Future) -> None:
    """Done-callback of an executor call: mark its exception retrieved (records revoked before
    their sequencer awaited the call would otherwise leave asyncio's "never retrieved" log line)."""
    if not call.cancelled():
        call.exception()


class _Job:
    """One non-streaming record in its partition's sequencer queue: ``msg`` (aiokafka
    ``ConsumerRecord``), ``call`` (the future of the executor call that derenders it, -> a list of
    ``JobOutcome``; set when the call is submitted) and ``index`` (its outcome's place in that list)."""

    __slots__ = ("msg", "call", "index")

    def __init__(self, msg: Any, call: asyncio.Future | None = None, index: int = 0):
        self.msg = msg
        self.call = call
        self.index = index


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
    store_wait: set = field(default_factory=set)  # the stream records among them waiting only for the state store
    gap_wait: set = field(default_factory=set)  # the stream records among them held behind a gap (``pauses``)
    gap_floor: int = 1 << 62  # at most the oldest offset in gap_wait (``pauses.PartitionPauses.window``)
    active: set = field(default_factory=set)  # inflight - store_wait - gap_wait (the in-flight window's records)
    hi: int | None = None  # highest fetched offset + 1
    permits: int = 0  # ``--max-in-flight`` permits its non-streaming records hold (the acker gives them back)
    streams: dict = field(default_factory=dict)  # request id -> streams._Stream
    sacks: Any = None  # stream acker queue

    def wait_store(self, offsets) -> None:
        """Records ``offsets`` now wait only for the state store (a stream load, a checkpoint
        write): out of the in-flight window, into the ``state-store`` bound (``pauses``)."""
        for off in offsets:
            if off in self.inflight:
                self.store_wait.add(off)
                self.active.discard(off)
                self.gap_wait.discard(off)

    def store_done(self, offsets) -> None:
        """Records ``offsets`` no longer wait for the state store (loaded: they run again)."""
        for off in offsets:
            if off in self.store_wait:
                self.store_wait.discard(off)
                self.active.add(off)

    def wait_gap(self, offset: int) -> None:
        """Stream record ``offset`` is held behind a gap (its stream waits for a missing chunk,
        or for chunk 0 of an unknown stream): out of the in-flight window, into the
        ``stream-gap`` bound (``pauses``); the commit stays behind it."""
        if offset in self.inflight:
            self.gap_wait.add(offset)
            self.gap_floor = min(self.gap_floor, offset)
            self.active.discard(offset)
            self.store_wait.discard(offset)

    def gap_done(self, offset: int) -> None:
        """Held stream record ``offset`` runs again (its gap closed, or the gap's 409 answers it)."""
        if offset in self.gap_wait:
            self.gap_wait.discard(offset)
            self.active.add(offset)

    def abandon(self, offset: int) -> None:
        """A held stream record is given up (revoke/stop/failed step): never committed (it stays
        in ``inflight``), out of the stream, state-store and gap counts."""
        self.stream_inflight.discard(offset)
        self.store_wait.discard(offset)
        self.gap_wait.discard(offset)

    def finish(self, offset: int) -> None:
        """Record ``offset`` is finished (reply acked [+ checkpoint written]): committable."""
        self.inflight.discard(offset)
        self.stream_inflight.discard(offset)
        self.store_wait.discard(offset)
        self.gap_wait.discard(offset)
        self.active.discard(offset)

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
        self.worker.health.clear_reason("consumer-group")  # a member now (with or without partitions)
        log.info("assigned partitions: %s", sorted((tp.topic, tp.partition) for tp in assigned))


def state_store_outage_clock(settings: WorkerSettings, health: HealthState | None = None) -> OutageClock:
    """The ``OutageClock`` of the stream state store (``--state-store-outage-deadline``, not-ready
    reason ``state-store``, give-up line naming the Redis URL and what to do)."""
    what = f"stream state store {redact_url(settings.redis.url)}" if settings.redis is not None else "stream state"
    return OutageClock(what, "state-store", settings.state_store_outage_deadline_s, health,
                       hint="start Redis there, give a reachable one with --redis-url (env DERENDER_REDIS_URL), or "
                            "use --stream-state memory if this worker never receives stream chunks (records with a "
                            f"{HDR_SEQ} header)")


def _client_kwargs(s: WorkerSettings) -> dict[str, Any]:
    """The aiokafka client settings the producer and the consumer share."""
    return dict(bootstrap_servers=s.bootstrap_servers, client_id=s.client_id,
                request_timeout_ms=s.request_timeout_ms, **s.security)


class KafkaDerenderWorker:
    """One consumer-group member: fetch, derender off the event loop, publish replies in
    partition order, commit after acknowledgement (record format: ``worker.transport.records``).

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
        self.pool = DerenderPool(models, service, executor, settings.num_workers, settings.executor)
        self.health = HealthState()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._parts: dict[TopicPartition, _Partition] = {}
        self._sem: Permits | None = None  # --max-in-flight
        self._stopping: asyncio.Event | None = None
        self._fatal: BaseException | None = None
        #: called once when stopping starts: with the fatal error, or None for ``stop()``
        self.on_stopping: Any = None
        self._task: asyncio.Task | None = None
        self._prom = PromMetrics()  # this worker's registry (served with --metrics-port)
        self._prom.ready.set_function(lambda: 1.0 if self.health.ready else 0.0)
        self.pool.on_restart = self._prom.pool_restarts.inc
        self.endpoints: Endpoints | None = None  # /livez /readyz /metrics when settings.metrics_port is set
        self._probe: DependencyProbe | None = None
        self._assigned = asyncio.Event()
        self._router: StreamRouter | None = None  # created by start()
        self._stop_requested = False
        self._hurry: asyncio.Event | None = None  # a second stop(): give up the drain
        self._tracer = Tracer()  # OpenTelemetry spans when the [otel] extra is installed, else no-ops
        self._committer = OffsetCommitter(self._parts, self.stats, self._on_committed)
        self._pauses = PartitionPauses(settings.max_in_flight)  # by reason: window, dead letter, state store
        self.publisher = ReplyPublisher(settings, self.health, self._pauses, self._tracer,
                                        on_dead_letter=lambda reason: self._unary.dead_letter_beside_reply(reason))
        self.planner = ReplyPlanner(settings)
        self._unary = UnaryPipeline(self.pool, self.planner, self.publisher, self._tracer, self.stats, self._prom,
                                    self.health, permits=lambda: self._sem, fatal=self._set_fatal)
        self.store_outage = state_store_outage_clock(settings, self.health)

    def _stream_fatal(self, e: BaseException) -> None:
        """A fatal error (a dependency given up, a reply and its dead letter lost): stop."""
        if isinstance(e, DependencyOutage) and self._fatal is None:
            log.error("%s", e)  # the one line; main_run exits 2 without repeating it
        self._set_fatal(e)

    def _set_fatal(self, e: BaseException) -> None:
        """Record the first fatal error, start stopping and tell ``on_stopping`` (``main_run``'s
        exit backstop: the process ends within ``--drain-timeout`` whatever blocks)."""
        first = self._fatal is None
        self._fatal = self._fatal or e
        if self._stopping is not None:
            self._stopping.set()
        if first and self.on_stopping is not None:
            self.on_stopping(self._fatal)

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve the health/metrics port (``--metrics-port``), create the pool, producer and
        consumer and join the group. Raises ``EndpointError`` when the port cannot be served (nothing
        else started yet), ``KafkaError`` when the broker is unreachable, ``BrokenProcessPool`` when
        the derender processes cannot start."""
        self.serve_endpoints()
        try:
            await self._start()
        except BaseException as e:
            (log.info if isinstance(e, DependencyOutage) else log.error)(
                "worker start failed; releasing what was started")
            await self._close()
            raise

    def serve_endpoints(self) -> None:
        """Serve ``--metrics-port`` now, on the running loop (idempotent; ``run.main_run`` calls it
        before its start-up waits). Raises ``EndpointError`` when the port cannot be served."""
        if self.settings.metrics_port is not None and self.endpoints is None:
            endpoints = Endpoints(self.health, self._prom.registry, int(self.settings.metrics_port), host=self.settings.metrics_host)
            endpoints.start()
            self.endpoints = endpoints

    async def _start(self) -> None:
        s = self.settings
        self._sem = Permits(max(1, s.max_in_flight))
        self._stopping = asyncio.Event()
        self._hurry = asyncio.Event()
        self.health.set_reason("consumer-group", f"not a member of group {s.group_id} yet")
        if s.redis is not None:  # checked before the (slow) pool start; waited for (not ready meanwhile)
            from worker.state import StoreConnectError
            from worker.state.redis_store import RedisStateStore
            store = self._prom.wrap_store(RedisStateStore.from_settings(s.redis))
            try:
                await self.store_outage.retry(store.ping, (StoreConnectError,))  # DependencyOutage: gave up
            except BaseException:
                await store.close()
                raise
            log.info("stream state in Redis %s (prefix %r, ttl %.0fs)", redact_url(s.redis.url), s.redis.prefix,
                     s.redis.ttl_s)
        else:
            store = MemoryStateStore(s.idle_timeout_s, s.max_live_streams)
        self.health.set_reason("warming-up", f"starting the derender pool ({s.num_workers} {s.executor} workers) and loading the tokenizers")
        try:
            self.pool.make()
            await self.pool.warm_up()
        except BaseException:
            await store.close()
            raise
        self.health.clear_reason("warming-up")
        memory = StreamMemory(s.idle_timeout_s, s.max_live_streams, self.health,
                              self._prom.live_streams)
        ctx = StreamContext(publisher=self.publisher, planner=self.planner, submit=self.pool.stream,
                            finished=_Partition.finish, abandoned=_Partition.abandon, fatal=self._stream_fatal,
                            count=self._unary.count, stats=self.stats, metrics=self._prom)
        self._router = StreamRouter(ctx, store, s.stream_gap_timeout_s, s.stream_replay_window,
                                    outage=self.store_outage, memory=memory)
        self._router.start()
        self._producer = AIOKafkaProducer(**_client_kwargs(s), **producer_config(s))
        await self._producer.start()
        self.publisher.producer = self._producer
        self.publisher.stopping = self._stopping
        self._consumer = AIOKafkaConsumer(
            **_client_kwargs(s), group_id=s.group_id, enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset, session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms, max_poll_records=s.max_in_flight,
            fetch_max_wait_ms=s.fetch_max_wait_ms)
        self._pauses.consumer = self._consumer
        self._committer.consumer = self._consumer
        self._consumer.subscribe([s.input_topic], listener=_Rebalance(self))
        await self._consumer.start()
        # the broker's reachability (and lost topics/offsets) is the broker watchdog's reason
        # ``broker``; Redis is pinged here too so that an outage shows while no stream needs it
        checks = {}
        if s.redis is not None:
            checks["state-store"] = store.ping
        self._probe = DependencyProbe(self.health, checks)
        self._probe.start()
        self.health.mark_started()
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
            if self.on_stopping is not None:
                self.on_stopping(None)
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
        s = self.settings
        watch = BrokerWatch(self._consumer, s.input_topic, self._committer.committed_hw,
                            OutageClock(f"Kafka broker {s.bootstrap_servers}", "broker", s.broker_outage_deadline_s,
                                        self.health, hint="check the broker (a restarted broker without its data "
                                        "needs its topics recreated; offsets are gone)"),
                            self._stream_fatal, period_s=min(2.0, max(0.2, s.broker_outage_deadline_s / 10)),
                            on_lost=self._committer.block)
        self.publisher.on_broker_lost = watch.lose  # acked offsets handed out again (ack_offsets.py)
        watch_task = asyncio.create_task(watch.run(), name="derender-broker-watch")
        try:
            await self._fetch_loop()
        except Exception as e:
            log.exception("fetch loop failed")
            self._set_fatal(e)
        finally:
            self._stopping.set()
            self.health.mark_stopping()
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
            watch_task.cancel()
            await asyncio.gather(commit_task, watch_task, return_exceptions=True)
            until = time.monotonic() + FINAL_STEPS_S
            try:  # bounded: a broker that lost the group (or is gone) must not hold the exit
                await asyncio.wait_for(self._committer.commit(), FINAL_STEPS_S / 2)
            except asyncio.TimeoutError:
                log.error("final offset commit did not finish within %.1fs; uncommitted messages will be "
                          "redelivered", FINAL_STEPS_S / 2)
            await self._close(until)
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

    async def _close(self, until: float | None = None) -> None:
        """Release everything started; closing the Kafka clients waits until ``until``
        (``time.monotonic()``) at most (default: ``FINAL_STEPS_S`` from now)."""
        until = time.monotonic() + FINAL_STEPS_S if until is None else until
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
        if self._probe is not None:
            await self._probe.close()
        for client in (self._consumer, self._producer):
            if client is not None:
                try:  # bounded: leaving the group / flushing to a broker that is gone can hang
                    await asyncio.wait_for(client.stop(), max(0.1, until - time.monotonic()))
                except asyncio.TimeoutError:
                    log.error("closing %s did not finish in time (%.1fs after the drain at most); going on",
                              type(client).__name__, FINAL_STEPS_S)
                except Exception:
                    log.exception("closing %s failed", type(client).__name__)
        self.pool.shutdown()
        if self.endpoints is not None:
            await self.endpoints.close()

    # -- fetching ------------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        while not self._stopping.is_set():
            self.health.progress()  # the run loop advanced (``/livez``)
            fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=500, max_records=self.settings.max_in_flight))
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not fetch.done():
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)
                break
            try:
                batches = fetch.result()
            except UNREADABLE_ERRORS:  # a record the client cannot read: find it, skip it, dead-letter it
                batches = await isolate_unreadable(
                    consumer, {tp: st.hi for tp, st in self._parts.items() if st.hi is not None},
                    self.settings.max_in_flight, self.settings.auto_offset_reset)
            total = sum(len(m) for m in batches.values())
            chunk_size = self.pool.chunk_size(total)
            chunk: list[_Job] = []  # records of the next executor call
            queued: list[tuple[_Partition, _Job]] = []  # jobs for the sequencers, in fetch order
            streamed: list[tuple[_Partition, Any]] = []
            stopped = False
            permits = self._sem
            unary = 0  # non-streaming records taken (``derender_received_total``, counted once per fetch)
            for tp, msgs in batches.items():
                if stopped:
                    break
                for msg in msgs:
                    if not permits.take():
                        if queued:
                            self._flush(chunk, queued)  # never hold unsubmitted work while waiting for capacity
                            chunk, queued = [], []
                        if not await permits.acquire_unless(self._stopping):
                            stopped = True  # stopping while waiting for capacity: the rest is refetched later
                            break
                    st = self._parts.get(tp)
                    if st is None:
                        if tp not in consumer.assignment():
                            permits.release()
                            continue  # revoked meanwhile: the new owner refetches it
                        st = self._open_partition(tp)
                    if st.closed:
                        permits.release()
                        continue
                    st.inflight.add(msg.offset)
                    st.active.add(msg.offset)
                    st.hi = max(st.hi or 0, msg.offset + 1)
                    if st.stream_inflight or st.store_wait or st.gap_wait:  # (else no bound can be reached)
                        self._pauses.window(st)
                    if msg.headers and self._header(msg, HDR_SEQ) is not None:  # a stream chunk
                        self._prom.received_stream.inc()
                        st.stream_inflight.add(msg.offset)
                        permits.release()  # bounded by the partition window, not by permits
                        streamed.append((st, msg))
                        continue
                    unary += 1
                    st.permits += 1
                    if isinstance(msg, UnreadableRecord):  # nothing to derender: dead-lettered by _plan
                        done = asyncio.get_running_loop().create_future()
                        done.set_result([JobOutcome(b"", 500, None, None, False)])
                        queued.append((st, _Job(msg, done)))
                        continue
                    job = _Job(msg, None, len(chunk))
                    chunk.append(job)
                    queued.append((st, job))
                    if len(chunk) >= chunk_size:
                        self._flush(chunk, queued)
                        chunk, queued = [], []
            if queued:
                self._flush(chunk, queued)
            if unary:
                self._prom.received_unary.inc(unary)
            if streamed:
                self._dispatch_streams(streamed)

    def _dispatch_streams(self, items: list[tuple[_Partition, Any]]) -> None:
        """Hand a poll's stream records to the router, per partition, in order (never waits: the
        router loads unknown streams from the store in the background)."""
        by_part: dict[int, list] = {}
        for st, msg in items:
            by_part.setdefault(id(st), [st, []])[1].append(msg)
        for st, msgs in by_part.values():
            if st.closed or self._parts.get(st.tp) is not st:
                for m in msgs:
                    st.abandon(m.offset)
                continue
            self._router.intake(st, msgs)

    def _flush(self, chunk: list[_Job], queued: list[tuple[_Partition, _Job]]) -> None:
        """Submit ``chunk`` as one executor call (its future is every job's ``call``), then hand
        ``queued`` (``chunk`` and the records with nothing to derender, in fetch order) to their
        partitions' sequencers: one queue item per partition, a list of jobs in offset order."""
        if chunk:
            call = self.pool.submit_batch([(j.msg.value, self._kind_header(j.msg) if j.msg.headers else None,
                                            record_created(j.msg)) for j in chunk])
            call.add_done_callback(_retrieved)  # a failure is every job's (each awaits it): never "not retrieved"
            for j in chunk:
                j.call = call
        by_part: dict[int, tuple[_Partition, list[_Job]]] = {}
        for st, job in queued:
            entry = by_part.get(id(st))
            if entry is None:
                by_part[id(st)] = (st, [job])
            else:
                entry[1].append(job)
        for st, jobs in by_part.values():
            st.jobs.put_nowait(jobs)

    _header = staticmethod(header)
    _kind_header = staticmethod(kind_header)

    def _open_partition(self, tp: TopicPartition) -> _Partition:
        st = _Partition(tp, asyncio.Queue(), asyncio.Queue())
        st.tasks = [asyncio.create_task(self._unary.sequencer(st), name=f"derender-seq-{tp.topic}-{tp.partition}"),
                    asyncio.create_task(self._unary.acker(st), name=f"derender-ack-{tp.topic}-{tp.partition}")]
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
        await self._committer.commit()
        for tp in revoked:
            self._pauses.forget(tp)
            st = self._parts.pop(tp)
            if self._router is not None:
                self._router.drop_partition(st)  # in-memory stream states of the partition
            for t in st.tasks:
                t.cancel()
            await asyncio.gather(*st.tasks, return_exceptions=True)
            if st.permits > 0:  # records the drain did not finish (timed out): their permits back
                self._sem.release(st.permits)
                st.permits = 0

    async def _drain(self, st: _Partition) -> None:
        await st.jobs.join()
        await st.acks.join()
        if self._router is not None and st.sacks is not None:
            await self._router.drain(st)

    async def _drain_all(self) -> None:
        await asyncio.gather(*(self._drain(st) for st in list(self._parts.values())))

    # -- per-partition pipeline ----------------------------------------------------------------

    # -- commits -------------------------------------------------------------------------------
    def _on_committed(self, st: _Partition, offset: int) -> None:
        if self._router is not None:
            self._router.on_committed(st, offset)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.commit_interval_ms / 1000)
            self._pauses.resume_windows(self._parts)
            await self._committer.commit()
            self._prom.observe_consumer(self._consumer, self._parts, self.settings.input_topic)
