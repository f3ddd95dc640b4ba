"""The per-partition pipeline of non-streaming records: each partition has a *sequencer* (takes
its jobs in offset order, awaits each derender, hands the planned reply to the publisher in that
order) and an *acker* (awaits the deliveries in that order, then the record is finished:
committable). Commit order of a non-streaming record: derender -> produce reply (or dead letter)
-> broker ack -> finished (then ``commits.OffsetCommitter`` commits up to the lowest unfinished).
Both work per executor call: a sequencer queue item is one call's records of the partition, and
so is an acker queue item (``AckItem``: their deliveries in offset order, taken up by the acker as
they come); permits and metrics are given back and counted once per item (docs/performance.md,
issue 23 item 5).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from worker.tracing import Tracer, kafka_span_attrs, trace_headers
from worker.transport.deadletter import DeadLetterError
from worker.transport.health import HealthState
from worker.transport.jobs import JobOutcome
from worker.transport.metrics import PromMetrics, WorkerStats, dlq_reason_label, observe_many
from worker.transport.planning import ReplyPlanner
from worker.transport.pool import DerenderPool
from worker.transport.publisher import ReplyPublisher
from worker.transport.records import Outgoing, kind_header, log_fields, record_created

log = logging.getLogger(__name__)

__all__ = ["UnaryPipeline", "AckItem"]


class AckItem(list):
    """An acker queue item: one executor call's deliveries of a partition, in offset order (a
    list of ``(job, plan, outcome, delivery)``), handed to the acker with its first delivery
    and filled while the sequencer publishes the rest, ``complete`` once it has. So a reply
    acked is finished (committable) even while a later record of the same call waits (a reply
    topic lookup, a 413's dead letter, a dead letter retried until acked), as when each record
    was an item of its own; in the common case the sequencer fills the item before the acker
    runs, and nothing waits."""

    complete = False  # (class defaults: no per-item ``__init__`` call on the hot path)
    waiter: asyncio.Future | None = None

    def wake(self) -> None:
        """An entry was added or the item completed: the acker waiting for it goes on."""
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def more(self) -> None:
        """Wait until an entry is added or the item completes."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class UnaryPipeline:
    """Runs the sequencer and acker of each partition (``sequencer(st)``/``acker(st)`` tasks; a
    partition state has ``jobs``/``acks`` queues, ``failed``, ``finish(offset)``). ``pool``:
    derenders; ``planner``/``publisher``: the reply; ``permits()``: the worker's
    ``--max-in-flight`` permits (``permits.Permits``: one per record, an acker item's given back together);
    ``fatal(err)``: stop the worker; ``count(...)`` is also the stream path's record counter."""

    def __init__(self, pool: DerenderPool, planner: ReplyPlanner, publisher: ReplyPublisher, tracer: Tracer,
                 stats: WorkerStats, metrics: PromMetrics, health: HealthState, *,
                 permits: Callable[[], Any], fatal: Callable[[BaseException], None]):
        self.pool = pool
        self.planner = planner
        self.publisher = publisher
        self.tracer = tracer
        self.stats = stats
        self.metrics = metrics
        self.health = health
        self.permits = permits
        self.fatal = fatal

    async def outcome(self, job: Any, spans: bool | None = None) -> JobOutcome:
        """Await a job's derender: outcome ``job.index`` of its executor call ``job.call`` (see
        ``DerenderPool.outcome``: pool crashes, quarantine). ``spans``: ``tracer.enabled`` when
        the caller read it already (None: read it here)."""
        if not (self.tracer.enabled if spans is None else spans):  # no span to make (the usual case)
            try:
                return (await job.call)[job.index]
            except Exception:  # a pool failure: pool.outcome awaits it again, reruns or quarantines the record
                pass
        msg = job.msg
        with self.tracer.span("derender.derender", trace_headers(msg.headers), **kafka_span_attrs(msg)):
            return await self.pool.outcome(job.call, job.index, msg.value, kind_header(msg),
                                           f"{msg.topic}[{msg.partition}]@{msg.offset}", record_created(msg))

    async def sequencer(self, st: Any) -> None:
        """Take the partition's jobs in offset order (a queue item: the list of one executor call's
        records of this partition), await each derender, hand its record to the producer (in
        order) and pass the item's deliveries to the acker as one ``AckItem``, in the same order
        (handed over with its first delivery, complete once the last one is in)."""
        while True:
            jobs = await st.jobs.get()
            acks = AckItem()  # (job, plan, outcome, delivery) in offset order
            handed = False
            seconds: list[float] = []
            try:
                spans = self.tracer.enabled  # (read once per executor call's records)
                for job in jobs:
                    msg = job.msg
                    try:
                        out = await self.outcome(job, spans)
                        if out.crash and out.crash != "derender-crashed":
                            self.stats.crashes += 1
                            log.error("derender raised on %s[%d]@%d key=%r:\n%s", msg.topic, msg.partition,
                                      msg.offset, msg.key[:256] if msg.key else msg.key,  # (a key can be MBs)
                                      out.crash, extra=log_fields(msg, out.request_id))
                        seconds.append(out.seconds)
                        plan, delivery = await self.publisher.publish(st, msg, self.planner.safe_plan(msg, out),
                                                                      out.request_id, spans=spans, note=False)
                        acks.append((job, plan, out, delivery))
                    except Exception as e:
                        log.exception("cannot publish result of %s[%d]@%d", msg.topic, msg.partition, msg.offset,
                                      extra=log_fields(msg))
                        fut = asyncio.get_running_loop().create_future()
                        fut.set_exception(e)
                        acks.append((job, None, None, fut))
                    if handed:
                        if acks.waiter is not None:
                            acks.wake()
                    else:  # the acker starts on the call's first delivery (``AckItem``)
                        st.acks.put_nowait(acks)
                        handed = True
            finally:
                acks.complete = True
                acks.wake()
                if acks:
                    try:  # (the broker-loss check; deliveries done already count too: ``note_acks``)
                        sent = [(plan.topic, d) for _, plan, _, d in acks if plan is not None]
                        if sent:
                            self.publisher.note_acks(sent)
                    except Exception as e:  # a bug: stop, but the item still goes to the acker
                        log.exception("noting %d deliveries for the broker-loss check failed", len(acks))
                        self.fatal(e)
                    if not handed:
                        st.acks.put_nowait(acks)
                observe_many(self.metrics.processing_unary, seconds)
                st.jobs.task_done()

    async def acker(self, st: Any) -> None:
        """Await deliveries in offset order (a queue item: one executor call's, as the sequencer
        listed them); advance the partition's committable offset; give the item's permits back
        and count its records once the item is done."""
        while True:
            entries = await st.acks.get()
            finished: list[tuple[Outgoing, JobOutcome | None, Any]] = []
            taken = 0
            try:
                while True:
                    if taken == len(entries):
                        if getattr(entries, "complete", True):
                            break
                        await entries.more()  # (the sequencer still publishes the call's later records)
                        continue
                    job, plan, out, delivery = entries[taken]
                    msg = job.msg
                    taken += 1
                    try:
                        if plan is None:  # publishing raised: a bug, or a dead letter given up
                            await delivery
                        if not (delivery.done() and not delivery.cancelled() and delivery.exception() is None):
                            plan = await self.publisher.settle(st, msg, plan, delivery,
                                                               out.request_id if out else None)
                        finished.append((plan, out, msg))
                        if not st.failed:
                            st.finish(msg.offset)
                    except DeadLetterError as e:  # revoked / drain given up while retrying: redelivered later
                        st.failed = True  # never commit past an undelivered message
                        log.warning("%s; %s[%d]@%d left uncommitted", e, msg.topic, msg.partition, msg.offset,
                                    extra=log_fields(msg))
                    except Exception as e:
                        st.failed = True  # never commit past an undelivered message
                        log.exception("delivery of %s[%d]@%d failed; stopping (it will be redelivered)", msg.topic,
                                      msg.partition, msg.offset, extra=log_fields(msg))
                        self.fatal(e)
            finally:
                self.permits().release(taken)
                st.permits -= taken  # (what a revoke's teardown gives back: ``consumer._on_revoked``)
                if finished:
                    try:
                        self.count_many(finished)
                    except Exception as e:  # a bug: stop, as for a record that cannot be delivered
                        log.exception("counting %d finished records failed", len(finished))
                        self.fatal(e)
                st.acks.task_done()

    def dead_letter_beside_reply(self, reason: str) -> None:
        """A record got a 413 reply and its dead letter (``publisher`` rule 2): count the dead
        letter (``derender_dead_letters_total{reason}``); the record's outcome is its reply."""
        self.stats.dead_lettered += 1
        self.metrics.dead_letters.labels(dlq_reason_label(reason)).inc()

    def count_many(self, rows: list[tuple[Outgoing, Any, Any]]) -> None:
        """``count(plan, out, msg)`` of non-streaming records for each row, with one metrics
        update per counter and histogram bucket (``PromMetrics.finished_many``)."""
        self.health.progress()  # (``/livez``: a fetch loop waiting for capacity still advances)
        stats = self.stats
        stats.processed += len(rows)
        for plan, out, _msg in rows:
            if plan.dlq_reason is not None:
                stats.dead_lettered += 1
            elif out.status == 200:
                stats.replied_ok += 1
            else:
                stats.errors += 1
        self.metrics.finished_many("unary", [(out.kind, plan.dlq_reason, out.status, getattr(msg, "timestamp", None))
                                             for plan, out, msg in rows])

    def count(self, plan: Outgoing, out: JobOutcome, msg, mode: str = "unary") -> None:
        """A record finished (its reply or dead letter acked): stats and metrics. ``out``: needs
        ``status`` and ``kind``; ``mode``: ``unary`` or ``stream``."""
        self.health.progress()  # (``/livez``: a fetch loop waiting for capacity still advances)
        self.stats.processed += 1
        if plan.is_dead_letter:
            self.stats.dead_lettered += 1
        elif out.status == 200:
            self.stats.replied_ok += 1
        else:
            self.stats.errors += 1
        self.metrics.finished(mode, out.kind, plan.dlq_reason, out.status, getattr(msg, "timestamp", None))

