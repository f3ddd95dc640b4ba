"""The embedded broker's lost records (docs/kafka.md, "Embedded broker limits";
ops/repro/tansu_restart_loss.py): after Tansu restarts empty while clients stay connected, a
consumer keeps a position past the new log's end (no OFFSET_OUT_OF_RANGE) and produce
acknowledgements hand offsets out again. The worker's defences, with the real embedded broker:
``BrokerWatch.position_problem`` (input log shorter than the position), ``ReplyPublisher``'s
``AckOffsets`` (acknowledged offsets going backwards), both latching a loss that stops offset
commits; and ``TansuBroker.stop`` ending the broker cleanly with a client still connected."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from worker.tracing import Tracer
from worker.transport.ack_offsets import AckOffsets
from worker.transport.broker import TansuBroker, free_port, wait_for_port
from worker.transport.broker_watch import BrokerWatch
from worker.transport.commits import OffsetCommitter
from worker.transport.health import HealthState
from worker.transport.metrics import WorkerStats
from worker.transport.outage import OutageClock
from worker.transport.pauses import PartitionPauses
from worker.transport.publisher import BROKER_TIMEOUT_ERRORS, TRANSIENT_ERRORS, ReplyPublisher
from worker.transport.records import Outgoing

pytestmark = pytest.mark.kafka


async def _create(bs: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bs)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


def _restart(broker: TansuBroker) -> TansuBroker:
    """The same port, nothing kept (in-memory storage)."""
    broker.stop()
    return TansuBroker(port=broker.port).start()


def test_ack_offsets_report_an_offset_handed_out_again():
    acks = AckOffsets(max_partitions=2)
    assert [acks.note("r", 0, o) for o in (0, 1, 5)] == [None, None, None]
    assert acks.note("r", 1, 0) is None  # another partition
    assert acks.note("r", 0, -1) is None  # no offset given
    why = acks.note("r", 0, 5)
    assert why is not None and "offset 5 on r[0] after offset 5" in why
    assert acks.note("r", 0, 6) is None  # tracked from the new offset on
    assert "offset 0 on r[0] after offset 6" in acks.note("r", 0, 0)
    acks.note("other", 0, 9)  # a third partition: the least recently used one (r[1]) is forgotten
    assert acks.note("r", 0, 0) is not None  # r[0] is still known
    assert acks.note("r", 1, 0) is None


def test_ack_offsets_note_late_raises_the_high_without_reporting():
    """An acknowledgement seen out of order reports nothing, but the offsets it was acked at
    count for the next ones noted in order."""
    acks = AckOffsets()
    acks.note_late("r", 0, 4)
    assert acks.note("r", 0, 5) is None
    acks.note_late("r", 0, 2)  # below what is known: nothing changes, nothing reported
    assert "offset 5 on r[0] after offset 5" in acks.note("r", 0, 5)
    acks.note_late("r", 1, 3)
    assert "offset 0 on r[1] after offset 3" in acks.note("r", 1, 0)


def test_stop_with_a_client_connected_ends_the_broker_itself():
    """SIGTERM made Tansu wait 5 s for connected clients (every stop took 5 s, then a kill);
    ``stop`` asks with SIGINT, which it obeys at once: status 0, not killed."""
    async def main() -> int:
        broker = TansuBroker().start()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=False)
        await producer.start()
        try:
            await producer.send_and_wait("stop-probe", b"x")
            proc = broker.proc
            broker.stop(timeout=3.0)  # below Tansu's 5 s SIGTERM wait: a SIGTERM stop would be a kill
            return proc.returncode
        finally:
            await producer.stop()
    assert asyncio.run(main()) == 0


def test_watch_latches_an_input_log_shorter_than_the_position_and_commits_stop():
    """A consumer connected across an empty restart keeps its position (10 per partition): the
    re-created topic's first records would be skipped. The watch sees the log end below the
    position, latches the loss and blocks the committer."""
    async def main() -> tuple[str | None, str | None, list]:
        broker = TansuBroker(port=free_port()).start()
        consumer = producer = None
        try:
            bs = broker.bootstrap_servers
            await _create(bs, "in", 2)
            producer = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False, acks="all")
            await producer.start()
            for i in range(20):
                await producer.send_and_wait("in", b"%d" % i, partition=i % 2)
            consumer = AIOKafkaConsumer(bootstrap_servers=bs, auto_offset_reset="earliest", enable_auto_commit=False)
            await consumer.start()
            tps = [TopicPartition("in", 0), TopicPartition("in", 1)]
            consumer.assign(tps)
            n = 0
            for _ in range(50):
                n += sum(map(len, (await consumer.getmany(timeout_ms=200)).values()))
                if n == 20:
                    break
            assert n == 20
            committer = OffsetCommitter({}, WorkerStats())
            clock = OutageClock("Kafka broker", "broker", 60.0, HealthState())
            watch = BrokerWatch(consumer, "in", {}, clock, on_fatal=lambda e: None, on_lost=committer.block)
            before = await watch.position_problem()
            broker = _restart(broker)
            await _create(bs, "in", 2)
            await producer.send_and_wait("in", b"new", partition=0)
            problem = None
            for _ in range(100):  # fetch responses from the new broker update the high watermark
                await consumer.getmany(timeout_ms=100)
                problem = await watch.position_problem()
                if problem is not None:
                    break
            assert before is None
            watch.lose(problem)
            return problem, committer.blocked, [await watch.problem()]
        finally:
            for client in (consumer, producer):
                if client is not None:
                    await client.stop()
            broker.stop()
    problem, blocked, latched = asyncio.run(main())
    assert problem is not None and "ends at offset" in problem and "below this worker's position 10" in problem
    assert blocked == problem and latched == [problem]


def test_publisher_reports_offsets_handed_out_again_after_an_empty_restart(caplog):
    """Tansu acknowledges records to a topic that no longer exists (after an empty restart), at
    offsets it hands out again: the publisher's acknowledgement check reports it."""
    async def main() -> list[str]:
        broker = TansuBroker(port=free_port()).start()
        producer = None
        try:
            await _create(broker.bootstrap_servers, "replies", 1)
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=False, acks="all")
            await producer.start()
            pub = ReplyPublisher(None, HealthState(), PartitionPauses(8), Tracer())
            pub.producer = producer
            lost: list[str] = []
            pub.on_broker_lost = lost.append
            out = Outgoing("replies", b"k", b"v", [])
            for _ in range(3):
                await (await pub.send(out))
            assert lost == []
            broker = _restart(broker)
            md = await (await pub.send(out))  # the producer's cached metadata still names the topic
            await asyncio.sleep(0)  # the done-callback runs on the next loop turn
            assert md.offset == 0
            return lost
        finally:
            if producer is not None:
                await producer.stop()
            broker.stop()
    with caplog.at_level(logging.ERROR):
        lost = asyncio.run(main())
    assert len(lost) == 1 and "offset 0 on replies[0] after offset 2" in lost[0]


def test_broker_command_warns_of_its_limits_and_stops_on_sigterm():
    """``derender-worker broker`` prints the limits at start; SIGTERM ends it with status 0."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "broker", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port("127.0.0.1", port, 20, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Embedded broker limits" in err and "restart them too" in err


def _after_restart(prepare) -> list[str]:
    """Against a real broker: ``prepare(pub, out)`` sends (``note=False``) and hands deliveries
    to ``note_acks`` as the sequencer does; then the broker restarts empty and one reply is sent
    the ordinary way (as ``settle`` sends again): what the acknowledgement check reported."""
    async def main() -> list[str]:
        broker = TansuBroker(port=free_port()).start()
        producer = None
        try:
            await _create(broker.bootstrap_servers, "replies", 1)
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=False, acks="all",
                                       request_timeout_ms=5000)  # (a request the restart cut is resent sooner)
            await producer.start()
            pub = ReplyPublisher(None, HealthState(), PartitionPauses(8), Tracer())
            pub.producer = producer
            lost: list[str] = []
            pub.on_broker_lost = lost.append
            out = Outgoing("replies", b"k", b"v", [])
            await prepare(pub, out)
            assert lost == []
            broker = _restart(broker)
            for _ in range(50):  # sent again while the restarted broker settles (as ``settle`` does)
                try:
                    md = await (await pub.send(out))  # the producer's cached metadata still names the topic
                    break
                except (*TRANSIENT_ERRORS, *BROKER_TIMEOUT_ERRORS):
                    await asyncio.sleep(0.2)
            await asyncio.sleep(0)  # the done-callback runs on the next loop turn
            assert md.offset == 0
            return lost
        finally:
            if producer is not None:
                await producer.stop()
            broker.stop()
    return asyncio.run(main())


def test_replies_acked_before_their_call_was_noted_still_count(caplog):
    """A call's replies acked while the sequencer still sent the call's later records (a 413's
    dead letter, a reply topic being looked up) are done when ``note_acks`` gets them: their
    offsets still count, so an empty broker handing them out again is reported."""
    async def prepare(pub: ReplyPublisher, out: Outgoing) -> None:
        sent = [await pub.send(out, note=False) for _ in range(3)]
        await asyncio.gather(*sent)  # acked (offsets 0..2) before the call's deliveries are noted
        pub.note_acks([("replies", d) for d in sent])
    with caplog.at_level(logging.ERROR):
        lost = _after_restart(prepare)
    assert len(lost) == 1 and "offset 0 on replies[0] after offset 2" in lost[0]


def test_a_calls_acked_replies_count_when_its_last_reply_fails(caplog):
    """To a one-partition reply topic only a call's last delivery is watched; when that one fails
    (the broker went away with its batch in flight) the call's earlier replies, acked, still
    count: the empty broker's offsets handed out again are reported."""
    from aiokafka.errors import KafkaTimeoutError

    async def prepare(pub: ReplyPublisher, out: Outgoing) -> None:
        sent = [await pub.send(out, note=False) for _ in range(2)]
        last = asyncio.get_running_loop().create_future()  # the call's last reply, in flight
        pub.note_acks([("replies", d) for d in sent] + [("replies", last)])
        await asyncio.gather(*sent)  # acked at offsets 0 and 1
        last.set_exception(KafkaTimeoutError())  # its batch expired: the broker did not answer
        await asyncio.sleep(0)  # (its done-callbacks)
    with caplog.at_level(logging.ERROR):
        lost = _after_restart(prepare)
    assert len(lost) == 1 and "offset 0 on replies[0] after offset 1" in lost[0]
