"""Faults an operator meets, through the Kafka worker on a real broker (embedded Tansu unless
``KAFKA_BOOTSTRAP_SERVERS`` is set) and a real process pool: each fault stays with what it hit,
the worker never stops, and the valid records are answered.

Kinds: a derender pool process that dies while idle (OOM killer, ``kill -9``), found dead only
when the next batch is submitted; the same for the one-process quarantine pool."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from tests.harness.kafka import chat_body, hang_reply_topics, make_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import committed_and_end as _committed_and_end
from tests.harness.kafka import headers as _h
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from worker.core.service import DerenderService
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_REPLY_TOPIC, HDR_SEQ, HDR_STATUS
from worker.transport.topics import ensure_topics

pytestmark = pytest.mark.kafka


async def _kill_pool_processes(executor) -> None:
    """SIGKILL every process of ``executor`` (a ``ProcessPoolExecutor``) and wait until the
    executor noticed (its management thread marks it broken)."""
    for pid in list(executor._processes):
        os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        if executor._broken:
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the executor never noticed its dead process")


async def test_pool_process_dead_while_idle_is_replaced_and_no_record_pays(kafka_bootstrap, kafka_broker_kind,
                                                                           qwen3_models):
    """Kill the only pool process while nothing runs: the next record (and a stream chunk, and a
    record rerun in the quarantine pool whose process was killed too) is answered like any other,
    nothing dead-lettered, no stream ended, no worker exit (before: BrokenProcessPool escaped the
    fetch loop at the next submit and the worker exited 1 after the drain timeout)."""
    bs, n = kafka_bootstrap, _names()
    tok = _tokenizer(qwen3_models)
    model = qwen3_models[0].name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, executor="process", num_workers=1, drain_timeout_s=5.0)
    body = chat_body(tok, model, "a-0", "First answer")
    _, chunks = make_stream(tok, "s-0", 0)
    svc = DerenderService(qwen3_models)
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        await worker.wait_assigned()
        # the quarantine pool: started by a rerun, then its process dies while idle
        first = await worker.pool.quarantine(body, None, "test")
        assert first.status == 200 and first.crash is None
        await _kill_pool_processes(worker.pool._qpool)
        again = await worker.pool.quarantine(body, None, "test")
        assert again.status == 200 and again.crash is None, again
        # the main pool's process dies while idle; then a record, a stream chunk, another record
        await _kill_pool_processes(worker.pool.executor)
        records = [(b"a-0", body, []), (b"s-0", chunks[0], [(HDR_SEQ, b"0")]),
                   (b"a-1", chat_body(tok, model, "a-1", "Second answer"), [])]
        await _produce(bs, n.inp, records)
        got = await _collect(bs, [n.reply, n.dlq], len(records), timeout=60, settle=0.3)
        assert worker._fatal is None and not worker._stopping.is_set()
    assert got[n.dlq] == [], [(r.key, _h(r)) for r in got[n.dlq]]
    replies = {r.key: r for r in got[n.reply]}
    assert set(replies) == {b"a-0", b"s-0", b"a-1"}
    assert all(_h(r)[HDR_STATUS] == b"200" for r in replies.values()), [r.value[:200] for r in replies.values()]
    created = json.loads(replies[b"a-0"].value)["created"]  # the input record's timestamp (s)
    assert replies[b"a-0"].value == svc.derender(body, created=created).body
    assert b"derender-stream-end" not in dict(replies[b"s-0"].headers)  # the stream was not ended by the fault
    committed, end = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == end == {0: len(records)}


class _RawKey(str):
    """A header key whose wire bytes are not UTF-8 (what librdkafka or a raw-protocol producer can send)."""

    def encode(self, *args, **kwargs) -> bytes:
        return b"\xff\xfe-not-utf8"


async def _produce_unreadable(bs: str, topic: str, partition: int, monkeypatch) -> None:
    """One record whose header key aiokafka's consumer cannot decode (produced with aiokafka's
    pure-Python batch builder, which encodes header keys through ``str.encode``)."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.producer import message_accumulator
    from aiokafka.producer import producer as producer_module
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
    with monkeypatch.context() as m:
        m.setattr(message_accumulator, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
        m.setattr(producer_module, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
        p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False)
        await p.start()
        try:
            await p.send_and_wait(topic, b'{"a": 1}', key=b"bad", headers=[(_RawKey("x"), b"v")], partition=partition)
        finally:
            await p.stop()


def _produce_null_record(bs: str, topic: str, partition: int) -> None:
    """One record with neither key nor value (aiokafka's producer asserts against it; other
    clients send it: ``python -O`` drops the assert)."""
    import subprocess
    import sys
    code = ("import asyncio, sys\nfrom aiokafka import AIOKafkaProducer\nasync def m():\n"
            "    p = AIOKafkaProducer(bootstrap_servers=sys.argv[1]); await p.start()\n"
            "    try: await p.send_and_wait(sys.argv[2], None, key=None, partition=int(sys.argv[3]))\n"
            "    finally: await p.stop()\nasyncio.run(m())\n")
    subprocess.run([sys.executable, "-O", "-c", code, bs, topic, str(partition)], check=True, timeout=60)


async def test_unreadable_and_null_records_are_dead_lettered_and_nothing_around_them_is_lost(
        kafka_bootstrap, kafka_broker_kind, qwen3_models, monkeypatch):
    """A record whose header key is not UTF-8 (aiokafka's record parser raises in ``getmany``:
    before, the worker exited, on every restart) and a record with neither key nor value (its
    dead letter was refused by the producer: the worker exited, on every restart). Each is
    dead-lettered with its reason; every valid record of both partitions, including those the
    failed fetch had already drained, is answered once; offsets committed to the end."""
    bs, n = kafka_bootstrap, _names()
    tok = _tokenizer(qwen3_models)
    model = qwen3_models[0].name
    await ensure_topics(bs, {n.inp: 2, n.reply: 1, n.dlq: 1})

    def valid(k: str):
        return (k.encode(), chat_body(tok, model, k, f"Answer {k}"), [])

    await _produce(bs, n.inp, [(*valid(f"p1-{i}"), 1) for i in range(3)] + [(*valid("p0-0"), 0)])
    await _produce_unreadable(bs, n.inp, 0, monkeypatch)
    await _produce(bs, n.inp, [(*valid("p0-1"), 0)])
    await asyncio.to_thread(_produce_null_record, bs, n.inp, 0)
    await _produce(bs, n.inp, [(*valid("p0-2"), 0)] + [(*valid(f"p1-{i}"), 1) for i in range(3, 6)])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, drain_timeout_s=5.0)
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        got = await _collect(bs, [n.reply, n.dlq], 9 + 2, timeout=60, settle=0.5)
        assert worker._fatal is None and not worker._stopping.is_set()
    keys = sorted(r.key for r in got[n.reply])
    assert keys == sorted([f"p0-{i}".encode() for i in range(3)] + [f"p1-{i}".encode() for i in range(6)])
    assert all(_h(r)[HDR_STATUS] == b"200" for r in got[n.reply])
    dl = {int(_h(r)["x-original-offset"]): _h(r)["x-dlq-reason"] for r in got[n.dlq]}
    assert len(got[n.dlq]) == 2 and set(dl) == {1, 3}, dl
    assert dl[1].startswith(b"unreadable-record: UnicodeDecodeError"), dl
    assert dl[3] == b"unparseable-no-reply-topic"
    committed, end = await _committed_and_end(bs, n.group, n.inp, 2)
    assert committed == end == {0: 5, 1: 6}


def test_stream_id_is_injective():
    from worker.transport.records import stream_id
    keys = [b"req-1", b"s-\xff", b"s-\xfe", "s-\ufffd".encode(), b"hex:732dff", b"hex:", b"",
            b"\x00", "h\u00e9".encode()]
    ids = [stream_id(k) for k in keys]
    assert len(set(ids)) == len(keys), ids
    assert stream_id(b"req-1") == "req-1" and stream_id(b"s-\xff") == "hex:732dff"
    assert stream_id(b"hex:732dff") == "hex:6865783a373332646666"


async def test_binary_keys_never_share_a_stream(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """Two streams whose keys differ only in bytes that are not UTF-8 (raw binary request ids):
    before, both were named by the key decoded with replacement characters, so the second
    stream's chunks were taken as duplicates of the first's and answered with the first
    stream's replies (another request's content). Each now gets its own answers."""
    bs, n = kafka_bootstrap, _names()
    tok = _tokenizer(qwen3_models)
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    _, a = make_stream(tok, "stream-a", 0)
    _, b = make_stream(tok, "stream-b", 1)
    ka, kb = b"bin-\xff\x01", b"bin-\xfe\x01"
    records = []
    for i in range(3):
        records += [(ka, a[i], [(HDR_SEQ, str(i).encode())]), (kb, b[i], [(HDR_SEQ, str(i).encode())])]
    await _produce(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, drain_timeout_s=5.0)
    async with KafkaDerenderWorker(settings, qwen3_models):
        got = await _collect(bs, [n.reply, n.dlq], len(records), timeout=60, settle=0.3)
    assert got[n.dlq] == []
    by_key: dict = {}
    for r in got[n.reply]:
        by_key.setdefault(r.key, []).append(r)
    assert sorted(by_key) == sorted([ka, kb])
    for key, rid in ((ka, b'"stream-a"'), (kb, b'"stream-b"')):
        recs = by_key[key]
        assert [_h(r)[HDR_SEQ] for r in recs] == [b"0", b"1", b"2"]
        assert all(_h(r)[HDR_STATUS] == b"200" and rid in r.value for r in recs), [r.value[:200] for r in recs]


async def test_many_distinct_missing_reply_topics_share_one_bounded_wait(kafka_bootstrap, kafka_broker_kind,
                                                                         qwen3_models):
    """Records each naming a different legal reply topic the broker never lists (Kafka with topic
    auto-creation off; the embedded broker auto-creates, so the producer's metadata wait for
    those names is made to hang): before, each one held up its partition for
    ``reply_topic_wait_ms``; now the waits of a window share that budget, the rest are
    dead-lettered at once, and the valid records between them are answered."""
    bs, n = kafka_bootstrap, _names()
    tok = _tokenizer(qwen3_models)
    model = qwen3_models[0].name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    records = []
    for i in range(8):
        records.append((f"u-{i}".encode(), chat_body(tok, model, f"u-{i}", "x"),
                        [(HDR_REPLY_TOPIC, f"missing-{i}-{n.group}".encode())]))
        records.append((f"v-{i}".encode(), chat_body(tok, model, f"v-{i}", f"valid {i}"), []))
    await _produce(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, reply_topic_wait_ms=1000, drain_timeout_s=5.0)
    worker = KafkaDerenderWorker(settings, qwen3_models)
    await worker.start()
    waits = hang_reply_topics(worker, lambda topic: topic.startswith("missing-"))
    task = asyncio.create_task(worker.run())
    try:
        got = await _collect(bs, [n.reply, n.dlq], len(records), timeout=60, settle=0.3)
    finally:
        worker.stop()
        await task
    assert sorted(r.key for r in got[n.reply]) == [f"v-{i}".encode() for i in range(8)]
    assert sorted(r.key for r in got[n.dlq]) == [f"u-{i}".encode() for i in range(8)]
    assert all(_h(r)["x-dlq-reason"].startswith(b"reply-publish-failed: unknown topic") for r in got[n.dlq])
    assert len(waits) == 1, waits  # one name used the window's budget; the others failed at once


async def test_stream_chunk_in_a_broken_pool_is_rerun_alone_not_ended(qwen3_models):
    """A pool process dies (here: SIGKILL while it runs another job) with a stream chunk queued
    in the pool: the chunk is rerun in the quarantine process and answered (before: its stream
    was ended with a 500, though the chunk had done nothing)."""
    from concurrent.futures.process import BrokenProcessPool

    from worker.transport.jobs import proc_ping
    from worker.transport.pool import DerenderPool

    tok = _tokenizer(qwen3_models)
    _, chunks = make_stream(tok, "s-q", 0)
    pool = DerenderPool(qwen3_models, None, None, 1, "process")
    pool.make()
    await pool.warm_up()
    try:
        blocker = asyncio.get_running_loop().run_in_executor(pool.executor, proc_ping, 30.0)
        chunk = asyncio.ensure_future(pool.stream(chunks[0], None, 0, None))
        await asyncio.sleep(0.5)
        await _kill_pool_processes(pool.executor)
        out = await asyncio.wait_for(chunk, 120)
        assert out.status == 200 and out.crash is None and out.state is not None, out
        with pytest.raises(BrokenProcessPool):
            await blocker
    finally:
        pool.shutdown()


@pytest.mark.asyncio
async def test_replies_in_flight_during_a_broker_freeze_are_resent_not_dead_lettered(qwen3_models):
    """A broker frozen (SIGSTOP, e.g. a long GC or a stalled VM) past ``--request-timeout-ms``
    while replies are in flight: their deliveries time out (``KafkaTimeoutError``). Those replies
    used to be dead-lettered (``reply-publish-failed``) though the broker came back, so their
    requesters never heard back; they are now sent again (``publisher.BROKER_TIMEOUT_ERRORS``,
    for up to ``--broker-outage-deadline``): every record gets its 200 reply, no dead letter."""
    from worker.transport.broker import TansuBroker
    tok = _tokenizer(qwen3_models)
    n = _names()
    recs = [(f"f{i}".encode(), chat_body(tok, "qwen3", f"f{i}", f"Answer number {i} is here."), []) for i in range(1500)]
    with TansuBroker() as broker:
        bs = broker.bootstrap_servers
        await ensure_topics(bs, {n.inp: 2, n.reply: 1, n.dlq: 1})
        await _produce(bs, n.inp, recs)
        settings = _settings(bs, "tansu", input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                             group_id=n.group, request_timeout_ms=1500, broker_outage_deadline_s=120.0,
                             max_in_flight=256)
        async with KafkaDerenderWorker(settings, qwen3_models):
            seen = 0
            while seen < 50:  # replies are flowing: the next ones are in flight when the broker freezes
                seen = len((await _collect(bs, [n.reply], 50, timeout=0.2))[n.reply])
            broker.proc.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(4.0)  # > request_timeout_ms: in-flight deliveries time out
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            keys = {k for k, _, _ in recs}
            # a resent reply may be a duplicate (its first delivery landed but its ack timed out),
            # so wait for every key (or a dead letter), not for a record count
            got = await _collect(bs, [n.reply, n.dlq], len(recs), timeout=90, settle=1.0,
                                 until=lambda g: bool(g[n.dlq]) or {r.key for r in g[n.reply]} >= keys)
    assert [dict(r.headers).get("x-dlq-reason") for r in got[n.dlq]] == []
    assert {r.key for r in got[n.reply]} == {k for k, _, _ in recs}
    assert all(_h(r)[HDR_STATUS] == b"200" for r in got[n.reply])


@pytest.mark.asyncio
@pytest.mark.parametrize("resume", ["during-drain", "after-exit"])
async def test_a_stop_during_a_broker_freeze_leaves_unacked_replies_uncommitted_not_dead_lettered(
        qwen3_models, caplog, resume):
    """SIGTERM (``stop()``, what ``main_run``'s handler calls) while the broker is frozen past
    ``--request-timeout-ms`` and replies are being sent again (``publisher.settle``). Those replies
    used to be dead-lettered at the stop (``reply-publish-failed: KafkaTimeoutError``), and the
    dead letter landed once the broker resumed: a good record reported as bad and committed. At
    a stop they are now sent again while the drain lasts and never dead-lettered for it.
    ``during-drain``: the broker resumes within ``--drain-timeout``, the stopping worker gets
    them acknowledged; ``after-exit``: the drain (2 s) ends first, their offsets are not
    committed, and a second worker of the group answers them. Either way every key gets its 200
    reply (duplicates byte-identical), no dead letter, and the stop takes at most
    ``--drain-timeout`` + 5 s (docs/delivery.md, Shutdown)."""
    import logging
    import time

    from worker.transport.broker import TansuBroker
    caplog.set_level(logging.INFO, logger="worker.transport.publisher")
    tok = _tokenizer(qwen3_models)
    n = _names()
    recs = [(f"s{i}".encode(), chat_body(tok, "qwen3", f"s{i}", f"Reply number {i} is here."), []) for i in range(1500)]
    keys = {k for k, _, _ in recs}

    def retries() -> int:
        return sum("sending it again" in r.getMessage() for r in caplog.records)

    drain_s = 20.0 if resume == "during-drain" else 2.0
    with TansuBroker() as broker:
        bs = broker.bootstrap_servers
        await ensure_topics(bs, {n.inp: 2, n.reply: 1, n.dlq: 1})
        await _produce(bs, n.inp, recs)
        opts = dict(input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq, group_id=n.group,
                    request_timeout_ms=1500, broker_outage_deadline_s=120.0, max_in_flight=256)
        first = KafkaDerenderWorker(_settings(bs, "tansu", drain_timeout_s=drain_s, **opts), qwen3_models)
        await first.start()
        run = asyncio.create_task(first.run())
        frozen = False
        try:
            while first.stats.processed < 50:  # replies are flowing: the next ones are in flight at the freeze
                await asyncio.sleep(0.01)
            broker.proc.send_signal(signal.SIGSTOP)
            frozen = True
            # past request_timeout_ms deliveries time out and settle() sends them again: stop then
            t_frozen = time.monotonic()
            while not retries() and time.monotonic() < t_frozen + 30:
                await asyncio.sleep(0.2)
            retries_before_stop = retries()
            t_stop = time.monotonic()
            first.stop()
            if resume == "during-drain":
                await asyncio.sleep(1.0)
                broker.proc.send_signal(signal.SIGCONT)
                frozen = False
            await asyncio.wait_for(asyncio.shield(run), drain_s + 30)
            stop_s = time.monotonic() - t_stop
        finally:
            if frozen:
                broker.proc.send_signal(signal.SIGCONT)
            if not run.done():
                first.stop()
                first.stop()
                await asyncio.gather(run, return_exceptions=True)
        assert retries_before_stop > 0, "no reply was being sent again when the worker was stopped"
        assert stop_s <= drain_s + 5.0, f"stop took {stop_s:.1f}s (--drain-timeout {drain_s}s)"
        assert first.stats.dead_lettered == 0, first.stats
        committed, end = await _committed_and_end(bs, n.group, n.inp, 2)
        if resume == "after-exit":  # the unacknowledged replies' offsets were not committed
            assert sum(committed[p] or 0 for p in end) < sum(end.values()), (committed, end)
        async with KafkaDerenderWorker(_settings(bs, "tansu", **opts), qwen3_models):
            got = await _collect(bs, [n.reply, n.dlq], len(recs), timeout=120, settle=1.0,
                                 until=lambda g: bool(g[n.dlq]) or {r.key for r in g[n.reply]} >= keys)
    assert [dict(r.headers).get("x-dlq-reason") for r in got[n.dlq]] == []
    assert {r.key for r in got[n.reply]} == keys
    assert all(_h(r)[HDR_STATUS] == b"200" for r in got[n.reply])
    by_key: dict[bytes, set] = {}
    for r in got[n.reply]:
        by_key.setdefault(r.key, set()).add(r.value)
    assert all(len(v) == 1 for v in by_key.values()), "non-identical duplicates"
