"""Per-call work of the non-streaming pipeline (issue 23 item 5): the ``--max-in-flight``
permits (``Permits``), histograms observed in bulk giving the samples one ``observe`` per value
gives, and the acker finishing one executor call's records as one item: each record in offset
order, a failed delivery never finished, every permit of the item given back, every record
counted."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Histogram

from worker import tracing
from worker.transport.jobs import JobOutcome
from worker.transport.metrics import BUCKETS, PromMetrics, WorkerStats, observe_many
from worker.transport.permits import Permits
from worker.transport.records import Outgoing
from worker.transport.unary import UnaryPipeline


def _samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}


def _histograms(values: list[float], bulk_parts: list[list[float]]) -> tuple[dict, dict]:
    one, bulk = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("x_seconds", "x", ["mode"], buckets=BUCKETS, registry=one).labels("unary")
    h2 = Histogram("x_seconds", "x", ["mode"], buckets=BUCKETS, registry=bulk).labels("unary")
    for v in values:
        h1.observe(v)
    for part in bulk_parts:
        observe_many(h2, part)
    return _samples(one), _samples(bulk)


def test_observe_many_gives_the_samples_of_one_observe_per_value():
    values = [0.0, 0.0005, 0.001, 0.0011, 0.005, 0.02, 0.02, 0.3, 2.5, 7.0, 61.0, 1e9, -1.0]
    values += [i / 997 for i in range(300)]
    a, b = _histograms(values, [values[:7], [], values[7:]])
    assert a.keys() == b.keys() and len(a) == len(BUCKETS) + 3  # (+Inf, _count, _sum)
    for k in a:
        if k[0].endswith("_sum"):
            assert b[k] == pytest.approx(a[k], rel=1e-12)  # (the same sum, added in another order)
        else:
            assert a[k] == b[k], k
    a, b = _histograms([0.5, float("nan")], [[0.5, float("nan")]])  # NaN: in the sum, in no bucket
    assert {k: v for k, v in a.items() if not k[0].endswith("_sum")} == {
        k: v for k, v in b.items() if not k[0].endswith("_sum")}
    assert [str(v) for k, v in a.items() if k[0].endswith("_sum")] == ["nan"] == [
        str(v) for k, v in b.items() if k[0].endswith("_sum")]


def test_observe_many_falls_back_to_observe_without_the_expected_internals():
    seen: list[float] = []
    observe_many(SimpleNamespace(observe=seen.append), [0.5, 0.25])
    assert seen == [0.5, 0.25]


def test_finished_many_counts_as_finished_per_record():
    rows = [("chat", None, 200, None), ("chat", None, 400, None), ("messages", "reply-too-large: big", None, None),
            ("chat-stream", None, 200, None), (None, None, 500, None), ("weird", None, 200, None),
            ("completion", "derender-crashed", None, None)]
    one, bulk = PromMetrics(), PromMetrics()
    for r in rows:
        one.finished("unary", *r)
    bulk.finished_many("unary", rows)
    skip = ("process_", "python_gc", "python_info", "derender_ready")
    a = {k: v for k, v in _samples(one.registry).items() if not k[0].startswith(skip)}
    b = {k: v for k, v in _samples(bulk.registry).items() if not k[0].startswith(skip)}
    assert a == b
    assert a[("derender_records_processed_total", (("kind", "chat"), ("mode", "unary"), ("outcome", "ok")))] == 2


async def test_permits_take_release_and_wait():
    p = Permits(2)
    assert p.take() and p.take() and not p.take() and p.locked()
    waiter = asyncio.ensure_future(p.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    p.release(2)  # two back: the waiter takes one, one stays free
    assert await asyncio.wait_for(waiter, 1) is True
    assert p.free == 1 and p.take() and not p.take()
    cancelled = asyncio.ensure_future(p.acquire())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    p.release()
    assert p.free == 1  # a cancelled wait took none


async def test_acquire_unless_takes_a_permit_or_none_when_the_stop_comes_first():
    p, stopping = Permits(1), asyncio.Event()
    assert await p.acquire_unless(stopping) is True and p.free == 0
    waiting = asyncio.ensure_future(p.acquire_unless(stopping))
    await asyncio.sleep(0)
    p.release()
    assert await asyncio.wait_for(waiting, 1) is True and p.free == 0
    stopped = asyncio.ensure_future(p.acquire_unless(stopping))
    await asyncio.sleep(0)
    stopping.set()
    assert await asyncio.wait_for(stopped, 1) is False
    p.release()
    assert p.free == 1  # the stopped wait kept none


async def test_a_waiter_woken_then_cancelled_passes_the_permit_on():
    p = Permits(1)
    assert p.take()
    first, second = asyncio.ensure_future(p.acquire()), asyncio.ensure_future(p.acquire())
    await asyncio.sleep(0)
    p.release()  # wakes the first
    first.cancel()  # ... cancelled before it ran
    assert await asyncio.wait_for(second, 1) is True
    await asyncio.gather(first, return_exceptions=True)
    assert p.free == 0


async def test_the_acker_finishes_one_calls_records_in_order_and_gives_every_permit_back():
    """An acker item of three records, the second of which failed to publish: the first is
    finished, the second is not (and nothing after it, ``failed``), the worker is stopped; all
    three permits come back at once; the two acked records are counted."""
    loop = asyncio.get_running_loop()
    permits = Permits(3)
    for _ in range(3):
        assert permits.take()
    fatal: list[BaseException] = []
    stats, metrics = WorkerStats(), PromMetrics()
    settled: list[int] = []

    class Publisher:
        async def settle(self, st, msg, plan, delivery, request_id=None):
            await delivery
            settled.append(msg.offset)
            return plan

    finished: list[int] = []
    st = SimpleNamespace(acks=asyncio.Queue(), failed=False, finish=finished.append, permits=3)
    health = SimpleNamespace(progress=lambda: None)
    tracer = tracing.Tracer()
    tracer._tracer = None
    unary = UnaryPipeline(None, None, Publisher(), tracer, stats, metrics, health,
                          permits=lambda: permits, fatal=fatal.append)
    deliveries = [loop.create_future() for _ in range(3)]
    entries = []
    for off, d in enumerate(deliveries):
        msg = SimpleNamespace(topic="in", partition=0, offset=off, key=None, headers=[], timestamp=-1)
        job = SimpleNamespace(msg=msg)
        out = JobOutcome(b"{}", 200, None, "chat", True)
        plan = Outgoing("replies", b"k", b"{}", [])
        entries.append((job, None, None, d) if off == 1 else (job, plan, out, d))
    st.acks.put_nowait(entries)
    task = asyncio.create_task(unary.acker(st))
    try:
        await asyncio.sleep(0)
        assert permits.free == 0 and finished == []  # nothing acked yet
        deliveries[2].set_result(None)  # acked out of order: still finished after the earlier ones
        deliveries[0].set_result(None)
        deliveries[1].set_exception(RuntimeError("publishing failed"))
        await asyncio.wait_for(st.acks.join(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert finished == [0] and st.failed and len(fatal) == 1
    assert permits.free == 3 and st.permits == 0
    assert stats.processed == 2 and stats.replied_ok == 2
    assert settled == [0]  # the third was done already: no settle needed


async def test_the_sequencer_hands_a_calls_deliveries_to_the_broker_loss_check_in_send_order():
    """One executor call's three records, each published with ``note=False``: their deliveries
    go to ``note_acks`` together, in send order, with their topics; the acker gets them as one item."""
    from worker.transport.consumer import _Job

    loop = asyncio.get_running_loop()
    deliveries = [loop.create_future() for _ in range(3)]
    notes: list[bool] = []
    noted: list[list] = []

    class Publisher:
        async def publish(self, st, msg, plan, request_id, spans=None, note=True):
            notes.append(note)
            return plan, deliveries[msg.offset]

        def note_acks(self, sent):
            noted.append(sent)

    tracer = tracing.Tracer()
    tracer._tracer = None
    planner = SimpleNamespace(safe_plan=lambda msg, out: Outgoing(f"replies-{msg.offset % 2}", b"k", out.body, []))
    unary = UnaryPipeline(None, planner, Publisher(), tracer, WorkerStats(), PromMetrics(), None,
                          permits=lambda: None, fatal=lambda e: None)
    call = loop.create_future()
    call.set_result([JobOutcome(b"{}", 200, None, "chat", True) for _ in range(3)])
    msgs = [SimpleNamespace(topic="in", partition=0, offset=o, key=None, headers=[]) for o in range(3)]
    st = SimpleNamespace(jobs=asyncio.Queue(), acks=asyncio.Queue())
    st.jobs.put_nowait([_Job(m, call, i) for i, m in enumerate(msgs)])
    task = asyncio.create_task(unary.sequencer(st))
    try:
        await asyncio.wait_for(st.jobs.join(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert notes == [False, False, False]
    assert noted == [[("replies-0", deliveries[0]), ("replies-1", deliveries[1]), ("replies-0", deliveries[2])]]
    assert [e[3] for e in st.acks.get_nowait()] == deliveries


async def test_note_acks_checks_the_last_reply_of_a_one_partition_topic_and_every_other_one():
    """``note_acks``: to a topic of one partition only the last pending delivery is checked (an
    earlier one acknowledged after it at a lower offset raises nothing); to a topic of several
    partitions each pending one is (an offset going backwards there is reported); a delivery done
    already only raises its partition's highest known offset (``AckOffsets.note_late``)."""
    from worker.transport.health import HealthState
    from worker.transport.pauses import PartitionPauses
    from worker.transport.publisher import ReplyPublisher
    from worker.transport.settings import WorkerSettings

    loop = asyncio.get_running_loop()
    pub = ReplyPublisher(WorkerSettings(), HealthState(), PartitionPauses(8), tracing.Tracer())
    parts = {"one": {0}, "many": {0, 1, 2}}
    pub.producer = SimpleNamespace(client=SimpleNamespace(cluster=SimpleNamespace(
        partitions_for_topic=lambda t: parts.get(t))))
    lost: list[str] = []
    pub.on_broker_lost = lost.append
    a, b, c, d, done = (loop.create_future() for _ in range(5))
    done.set_result(SimpleNamespace(topic="one", partition=0, offset=1))
    pub.note_acks([("one", a), ("many", c), ("one", b), ("many", d), ("one", done)])
    b.set_result(SimpleNamespace(topic="one", partition=0, offset=11))
    c.set_result(SimpleNamespace(topic="many", partition=0, offset=5))
    await asyncio.sleep(0)
    a.set_result(SimpleNamespace(topic="one", partition=0, offset=10))  # not checked: b stands for it
    d.set_result(SimpleNamespace(topic="many", partition=0, offset=4))  # checked: backwards
    await asyncio.sleep(0)
    assert len(lost) == 1 and "offset 4 on many[0] after offset 5" in lost[0]


def test_a_delivery_without_metadata_is_not_checked():
    from worker.transport.health import HealthState
    from worker.transport.pauses import PartitionPauses
    from worker.transport.publisher import ReplyPublisher
    from worker.transport.settings import WorkerSettings

    pub = ReplyPublisher(WorkerSettings(), HealthState(), PartitionPauses(8), tracing.Tracer())
    lost: list[str] = []
    pub.on_broker_lost = lost.append
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        fut.set_result(None)
        pub._acked(fut)
        for off in (5, 3):
            fut = loop.create_future()
            fut.set_result(SimpleNamespace(topic="replies", partition=0, offset=off))
            pub._acked(fut)
    finally:
        loop.close()
    assert len(lost) == 1 and "offset 3 on replies[0] after offset 5" in lost[0]


async def test_the_sequencer_notes_a_calls_deliveries_done_already_and_the_acker_starts_on_the_first():
    """A call's first reply is acked while the sequencer still waits on the second record's
    publishing (a reply topic lookup, a 413's dead letter): the acker finishes the first record
    meanwhile (``AckItem``: handed over with the first delivery), and the done delivery still goes
    to ``note_acks`` with the rest (the broker-loss check counts its offset: ``note_late``)."""
    from worker.transport.consumer import _Job

    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    release = asyncio.Event()
    noted: list[list] = []

    class Publisher:
        async def publish(self, st, msg, plan, request_id, spans=None, note=True):
            if msg.offset == 1:
                await release.wait()  # the second record's publishing waits
            return plan, (first, second)[msg.offset]

        def note_acks(self, sent):
            noted.append(sent)

        async def settle(self, st, msg, plan, delivery, request_id=None):
            await delivery
            return plan

    tracer = tracing.Tracer()
    tracer._tracer = None
    planner = SimpleNamespace(safe_plan=lambda msg, out: Outgoing("replies", b"k", out.body, []))
    permits = Permits(2)
    assert permits.take() and permits.take()
    finished: list[int] = []
    unary = UnaryPipeline(None, planner, Publisher(), tracer, WorkerStats(), PromMetrics(),
                          SimpleNamespace(progress=lambda: None), permits=lambda: permits, fatal=lambda e: None)
    call = loop.create_future()
    call.set_result([JobOutcome(b"{}", 200, None, "chat", True) for _ in range(2)])
    msgs = [SimpleNamespace(topic="in", partition=0, offset=o, key=None, headers=[], timestamp=-1) for o in range(2)]
    st = SimpleNamespace(jobs=asyncio.Queue(), acks=asyncio.Queue(), failed=False, finish=finished.append, permits=2)
    st.jobs.put_nowait([_Job(m, call, i) for i, m in enumerate(msgs)])
    tasks = [asyncio.create_task(unary.sequencer(st)), asyncio.create_task(unary.acker(st))]
    try:
        first.set_result(SimpleNamespace(topic="replies", partition=0, offset=0))
        for _ in range(100):  # (loop turns) the first record is finished while the second is still being published
            if finished:
                break
            await asyncio.sleep(0)
        assert finished == [0] and noted == [] and permits.free == 0
        release.set()
        await asyncio.wait_for(st.jobs.join(), 5)
        second.set_result(SimpleNamespace(topic="replies", partition=0, offset=1))
        await asyncio.wait_for(st.acks.join(), 5)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert finished == [0, 1] and permits.free == 2 and st.permits == 0
    assert noted == [[("replies", first), ("replies", second)]]


async def test_a_delivery_done_before_it_is_noted_never_reports_a_loss_of_its_own():
    """Two replies to one reply partition acked by the same produce response: ``y`` (noted when
    sent, its done-callback queued) at offset 10, then ``x`` at 11, which a sequencer hands to
    ``note_acks`` before the loop ran ``y``'s callback. ``x`` counts after ``y``: no loss is
    reported (the broker lost nothing); a later offset at or below 11 is."""
    from worker.transport.health import HealthState
    from worker.transport.pauses import PartitionPauses
    from worker.transport.publisher import ReplyPublisher
    from worker.transport.settings import WorkerSettings

    loop = asyncio.get_running_loop()
    pub = ReplyPublisher(WorkerSettings(), HealthState(), PartitionPauses(8), tracing.Tracer())
    pub.producer = SimpleNamespace(client=SimpleNamespace(cluster=SimpleNamespace(
        partitions_for_topic=lambda t: {0, 1})))
    lost: list[str] = []
    pub.on_broker_lost = lost.append
    y, x = loop.create_future(), loop.create_future()
    y.add_done_callback(pub._acked)  # (as ``send`` with ``note=True``)
    y.set_result(SimpleNamespace(topic="replies", partition=0, offset=10))
    x.set_result(SimpleNamespace(topic="replies", partition=0, offset=11))
    pub.note_acks([("replies", x)])  # before the loop ran y's callback
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert lost == []
    z = loop.create_future()
    pub.note_acks([("replies", z)])
    z.set_result(SimpleNamespace(topic="replies", partition=0, offset=11))
    await asyncio.sleep(0)
    assert len(lost) == 1 and "offset 11 on replies[0] after offset 11" in lost[0]
