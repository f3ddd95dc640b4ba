"""Chunked streaming through the Kafka worker (``worker.transport.streams``), with a real
Kafka-protocol broker (``kafka_bootstrap``) and a real Redis (``REDIS_URL``, else
redis://127.0.0.1:6379/0; skipped with the reason when none answers).

Streams are parsed Qwen3 answers (``<think>`` reasoning + a hermes ``<tool_call>``) tokenized with
the real tokenizer (``tests/data/tokenizers/qwen3``, served model ``qwen3``), sent as 1-token
chunks; the joined reply deltas must equal the non-streaming answer for the same tokens.

* ``test_stream_end_to_end``: parity, duplicate chunks replayed byte-identically, a gap times out
  into a 409 error chunk, an unknown stream (chunk 5 first) gets one, the Redis key has a TTL while
  the stream is live and is deleted after the end.
* ``test_redelivery_after_restart``: a second worker instance, after the group's offsets were
  rewound, answers redelivered chunks from the Redis replay window (identical bytes) and
  continues the stream from the Redis state.
* ``test_failover_two_processes``: two ``derender-worker run`` processes, 50 concurrent streams
  over 8 partitions, SIGKILL of one mid-way: every stream completes, no chunk missing, duplicates
  identical.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.harness.kafka import REDIS_URL, make_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import headers as _h
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from tests.harness.kafka_streams import END, SEQ, assert_complete, by_seq, expected_view
from worker.core.service import DerenderService
from worker.state import RedisSettings, RedisStateStore
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_STATUS
from worker.transport.topics import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

REPO = Path(__file__).resolve().parent.parent
# --------------------------------------------------------------------------------------- tests ---
def test_stream_end_to_end(kafka_bootstrap, kafka_broker_kind, qwen3_models, redis_prefix):
    tok = _tokenizer(qwen3_models)
    svc = DerenderService(qwen3_models)
    n = _names()
    u = uuid.uuid4().hex[:6]
    rid_ok, rid_gap, rid_unk = f"ok-{u}", f"gap-{u}", f"unk-{u}"
    full, chunks = make_stream(tok, rid_ok, 0)
    want = expected_view(svc, full)
    _, gchunks = make_stream(tok, rid_gap, 1)
    _, uchunks = make_stream(tok, rid_unk, 2)
    N = len(chunks)
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis, stream_gap_timeout_s=1.5)

    def rec(rid, body, seq):
        return (rid.encode(), body, [(SEQ, str(seq).encode())])

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 2, n.reply: 1, n.dlq: 1})
        store = RedisStateStore.from_settings(redis)
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            # first 10 chunks, plus the gap and unknown streams
            t_gap = time.monotonic()
            await _produce(kafka_bootstrap, n.inp, [rec(rid_ok, chunks[k], k) for k in range(10)]
                           + [rec(rid_gap, gchunks[k], k) for k in (0, 1, 2, 4)]
                           + [rec(rid_unk, uchunks[5], 5)])
            got = await _collect(kafka_bootstrap, [n.reply], 10 + 5, timeout=30)
            # live stream: key with a TTL, seq of the last written checkpoint
            key = store.key(rid_ok)
            for _ in range(100):
                got = await store.get(rid_ok)
                q = got.seq if got is not None else None
                if q == 9:
                    break
                await asyncio.sleep(0.05)
            assert q == 9
            assert 0 < await store.client.pttl(key) <= 120_000
            # the rest, a duplicate of seq 3 after seq 6 (in the replay window), a duplicate of the last
            rest = [rec(rid_ok, chunks[k], k) for k in range(10, N)]
            await _produce(kafka_bootstrap, n.inp, rest[:1] + [rec(rid_ok, chunks[3], 3)] + rest[1:]
                           + [rec(rid_ok, chunks[-1], N - 1)])
            got = await _collect(kafka_bootstrap, [n.reply], N + 2 + 5, timeout=30, settle=0.5)
            # end of stream: the key is deleted once the offsets past it are committed
            for _ in range(100):
                if not await store.client.exists(key):
                    break
                await asyncio.sleep(0.05)
            assert not await store.client.exists(key)
            gap_elapsed = time.monotonic() - t_gap
        await store.close()
        return got[n.reply], w.stats, gap_elapsed

    replies, stats, gap_elapsed = asyncio.run(go())
    per = defaultdict(list)
    for r in replies:
        per[r.key.decode()].append(r)
    dups = assert_complete(per[rid_ok], N, want, rid_ok)
    assert dups == 2 and stats.stream_replayed == 2
    # gap: 0, 1, 2 answered, then one 409 error chunk on seq 4 that ends the stream
    g = by_seq(per[rid_gap])
    assert sorted(g) == [0, 1, 2, 4] and all(len(v) == 1 for v in g.values())
    err = g[4][0]
    assert _h(err)[HDR_STATUS] == b"409" and _h(err)[END] == b"1"
    assert "missing" in json.loads(err.value)["error"]["message"]
    assert json.loads(err.value)["error"]["type"] == "ConflictError" and json.loads(err.value)["error"]["code"] == 409
    assert gap_elapsed >= 1.5
    # unknown stream: chunk 5 first -> one 409 error chunk
    (unk,) = per[rid_unk]
    assert _h(unk)[SEQ] == b"5" and _h(unk)[HDR_STATUS] == b"409" and _h(unk)[END] == b"1"
    assert "unknown stream" in json.loads(unk.value)["error"]["message"]
    assert "state was lost or expired" in json.loads(unk.value)["error"]["message"]
    assert json.loads(unk.value)["error"]["type"] == "ConflictError"
    assert stats.stream_gaps == 2 and stats.crashes == 0


def test_redelivery_after_restart(kafka_bootstrap, kafka_broker_kind, qwen3_models, redis_prefix):
    """Worker 1 answers chunks 0..11 and stops; the group's offset is rewound to 7 (as after a
    crash before the commit); worker 2 (fresh memory) re-publishes 7..11 from the Redis replay
    window, identical bytes, then continues the stream from the Redis state."""
    tok = _tokenizer(qwen3_models)
    svc = DerenderService(qwen3_models)
    n = _names()
    rid = f"re-{uuid.uuid4().hex[:6]}"
    full, chunks = make_stream(tok, rid, 3)
    want = expected_view(svc, full)
    N = len(chunks)
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis)
    recs = [(rid.encode(), chunks[k], [(SEQ, str(k).encode())]) for k in range(N)]

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, recs[:12])
            await _collect(kafka_bootstrap, [n.reply], 12, timeout=30)
        tp = TopicPartition(n.inp, 0)
        # rewind as a group member (brokers like Tansu refuse commits from non-members)
        c = AIOKafkaConsumer(n.inp, bootstrap_servers=kafka_bootstrap, group_id=n.group, enable_auto_commit=False,
                             session_timeout_ms=settings.session_timeout_ms, heartbeat_interval_ms=500)
        await c.start()
        try:
            assert await c.committed(tp) == 12
            for _ in range(100):
                if tp in c.assignment():
                    break
                await c.getmany(timeout_ms=100, max_records=1)
            await c.commit({tp: 7})
            assert await c.committed(tp) == 7
        finally:
            await c.stop()
        async with KafkaDerenderWorker(settings, qwen3_models) as w2:
            await w2.wait_assigned(30)
            await _collect(kafka_bootstrap, [n.reply], 17, timeout=30)
            await _produce(kafka_bootstrap, n.inp, recs[12:])
            got = await _collect(kafka_bootstrap, [n.reply], N + 5, timeout=30, settle=0.5)
        return got[n.reply], w2.stats

    replies, stats2 = asyncio.run(go())
    assert assert_complete(replies, N, want, rid) == 5
    assert stats2.stream_replayed == 5 and stats2.stream_chunks == N - 12


# ----------------------------------------------------------------------------------- failover ---
class _Proc:
    """A ``derender-worker run`` subprocess (own process group) whose stderr lines are kept."""

    def __init__(self, name: str, args: list[str]):
        self.name = name
        self.lines: list[str] = []
        self.p = subprocess.Popen([sys.executable, "-m", "worker.cli", "--log-level", "INFO", "run", *args],
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line.rstrip())

    def assignments(self) -> list[str]:
        return [x for x in self.lines if "assigned partitions:" in x]

    def owns_partitions(self) -> bool:
        a = self.assignments()
        return bool(a) and "[]" not in a[-1].split("assigned partitions:")[-1]

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            os.killpg(self.p.pid, sig)  # the worker and its pool children (its own session)

    def stop(self):
        if self.p.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
                self.p.wait(5)


@pytest.mark.slow
def test_failover_two_processes(kafka_bootstrap, kafka_broker_kind, qwen3_models, redis_prefix):
    tok = _tokenizer(qwen3_models)
    svc = DerenderService(qwen3_models)
    n = _names()
    u = uuid.uuid4().hex[:6]
    streams = {}
    for i in range(50):
        rid = f"fo-{u}-{i}"
        full, chunks = make_stream(tok, rid, i)
        streams[rid] = (expected_view(svc, full), chunks)
    parts = 8
    from aiokafka.partitioner import murmur2  # the default partitioner hash
    used = {(murmur2(r.encode()) & 0x7FFFFFFF) % parts for r in streams}
    assert len(used) >= 4
    session = 2000 if kafka_broker_kind == "tansu" else 6000
    args = ["--config", str(REPO / "tests" / "data" / "models.json"), "--bootstrap-servers", kafka_bootstrap,
            "--input-topic", n.inp, "--reply-topic", n.reply, "--dead-letter-topic", n.dlq, "--group-id", n.group,
            "--executor", "process", "--num-threads", "2", "--commit-interval-ms", "100",
            "--session-timeout-ms", str(session), "--heartbeat-interval-ms", "300",
            "--redis-url", REDIS_URL, "--redis-key-prefix", redis_prefix, "--redis-state-ttl", "300",
            "--stream-gap-timeout", "60"]
    asyncio.run(ensure_topics(kafka_bootstrap, {n.inp: parts, n.reply: 1, n.dlq: 1}))
    a = _Proc("A", args)
    b = None
    try:
        deadline = time.monotonic() + 60
        while not a.owns_partitions():
            assert a.p.poll() is None and time.monotonic() < deadline, "\n".join(a.lines[-30:])
            time.sleep(0.1)
        b = _Proc("B", args)
        while not (b.owns_partitions() and len(a.assignments()) >= 2 and a.owns_partitions()):
            assert b.p.poll() is None and time.monotonic() < deadline, "\n".join(b.lines[-30:])
            time.sleep(0.1)
        total = sum(len(c) for _, c in streams.values())
        t0 = time.monotonic()
        victim = a

        async def produce():
            p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False, linger_ms=5)
            await p.start()
            sent = 0
            try:
                width = max(len(c) for _, c in streams.values())
                for k in range(width):
                    for rid, (_, chunks) in streams.items():
                        if k < len(chunks):
                            await p.send(n.inp, chunks[k], key=rid.encode(), headers=[(SEQ, str(k).encode())])
                            sent += 1
                    await p.flush()
                    if sent >= total * 0.4 and victim.p.poll() is None:
                        victim.kill()  # SIGKILL mid-stream: no drain, no commit
                    await asyncio.sleep(0.05)
            finally:
                await p.stop()

        asyncio.run(produce())
        t_produced = time.monotonic() - t0
        # until every (stream, seq) is answered: the kill repeats replies, which must not end the wait early
        got = asyncio.run(_collect(kafka_bootstrap, [n.reply], total, timeout=120, settle=1.0, until=lambda g: len(
            {(r.key, dict(r.headers).get(SEQ)) for r in g[n.reply]}) >= total))[n.reply]
        t_done = time.monotonic() - t0
        per = defaultdict(list)
        for r in got:
            per[r.key.decode()].append(r)
        dups = 0
        for rid, (want, chunks) in streams.items():
            dups += assert_complete(per[rid], len(chunks), want, rid)
        assert b.p.poll() is None, "survivor died:\n" + "\n".join(b.lines[-30:])
        # B took over streams the victim had started: it loaded them from Redis and continued
        resumed = [x for x in b.lines if "resumed from the store" in x]
        assert resumed, "no stream was taken over from the killed worker"
        print(f"\nfailover: {len(streams)} streams, {total} chunks, {len(got)} replies ({dups} identical "
              f"duplicates); produced in {t_produced:.1f}s, all answered after {t_done:.1f}s; "
              f"{len(resumed)} streams resumed by B from Redis; "
              f"B assignments: {b.assignments()[-1].split('assigned partitions:')[-1]}")
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.stop()


def test_too_large_reply_mid_stream_ends_the_stream_with_413(kafka_bootstrap, kafka_broker_kind, qwen3_models,
                                                             redis_prefix):
    """Issue 17, fault 2: a chunk whose reply is larger than ``--max-request-size`` is answered
    with a small 413 ``PayloadTooLargeError`` reply that ends the stream (``derender-stream-end``),
    its record is dead-lettered in full (``reply-too-large``); a later chunk gets the
    ended-stream 409 and a duplicate of the big chunk the identical 413; the offsets commit."""
    import hashlib
    import re

    from tests.harness.kafka import committed_and_end as _committed_and_end

    tok = _tokenizer(qwen3_models)
    n = _names()
    rid = f"big-{uuid.uuid4().hex[:6]}"
    _, chunks = make_stream(tok, rid, 0)
    word = tok.encode(" word", add_special_tokens=False).ids
    big = json.loads(chunks[1])
    big["generate_chunk"]["choices"][0]["token_ids"] = word * 3000  # a reply of ~15 KB of " word"
    chunks[1] = json.dumps(big).encode()
    limit = 8192
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis, max_request_size=limit,
                         dead_letter_max_bytes=4096)

    def rec(body, seq):
        return (rid.encode(), body, [(SEQ, str(seq).encode())])

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, [rec(chunks[0], 0), rec(chunks[1], 1), rec(chunks[2], 2),
                                                    rec(chunks[1], 1)])
            got = await _collect(kafka_bootstrap, [n.reply, n.dlq], 5, timeout=30, settle=0.5)
            for _ in range(100):
                committed, end = await _committed_and_end(kafka_bootstrap, n.group, n.inp, 1)
                if committed == end:
                    break
                await asyncio.sleep(0.1)
        return got, committed, end, w.stats

    got, committed, end, stats = asyncio.run(go())
    assert committed == end == {0: 4}
    replies = got[n.reply]
    assert [int(_h(r)[SEQ]) for r in replies] == [0, 1, 2, 1]
    assert _h(replies[0])[HDR_STATUS] == b"200" and END not in _h(replies[0])
    small = replies[1]
    err = json.loads(small.value)["error"]
    msg = r"reply of (\d+) bytes exceeds the limit of 8192 bytes \(--max-request-size\)"
    assert _h(small)[HDR_STATUS] == b"413" and _h(small)[END] == b"1" and _h(small)["correlation-id"] == rid.encode()
    assert err["type"] == "PayloadTooLargeError" and err["code"] == 413 and re.fullmatch(msg, err["message"])
    assert json.loads(small.value)["request_id"] == rid
    later = replies[2]
    assert _h(later)[HDR_STATUS] == b"409" and "already ended" in json.loads(later.value)["error"]["message"]
    dup = replies[3]
    assert dup.value == small.value and [(k, v) for k, v in dup.headers if k in (SEQ, END, HDR_STATUS)] == \
        [(k, v) for k, v in small.headers if k in (SEQ, END, HDR_STATUS)]
    (dl,) = got[n.dlq]
    reason = _h(dl)["x-dlq-reason"].decode()
    assert re.fullmatch("reply-too-large: " + msg, reason), reason
    assert _h(dl)["x-original-offset"] == b"1"
    assert _h(dl)["x-original-value-sha256"].decode() == hashlib.sha256(chunks[1]).hexdigest()
    assert stats.dead_lettered == 1 and stats.crashes == 0


def test_a_stream_ended_by_a_413_answers_later_chunks_alike_on_a_new_owner(kafka_bootstrap, kafka_broker_kind,
                                                                          qwen3_models, redis_prefix):
    """A stream ended by an error reply (here the 413 of a too-big chunk) keeps its stored
    tombstone after its offsets are committed (``stream_registry.keeps_tombstone``): its client
    may still send chunks, and a new owner of the partition answers them with the same
    "already ended" 409 as the first owner did. Its tombstone used to be deleted once committed,
    so the new owner took the stream for unknown and answered "lost or expired" (chaos
    ``reply-too-big`` after a kill -9: non-identical duplicates)."""
    from tests.harness.kafka import committed_and_end as _committed_and_end

    tok = _tokenizer(qwen3_models)
    n = _names()
    rid = f"big-{uuid.uuid4().hex[:6]}"
    _, chunks = make_stream(tok, rid, 0)
    word = tok.encode(" word", add_special_tokens=False).ids
    big = json.loads(chunks[1])
    big["generate_chunk"]["choices"][0]["token_ids"] = word * 3000  # a reply of ~15 KB of " word"
    chunks[1] = json.dumps(big).encode()
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis, max_request_size=8192,
                         dead_letter_max_bytes=4096, stream_gap_timeout_s=1.0)

    def rec(seq):
        return (rid.encode(), chunks[seq], [(SEQ, str(seq).encode())])

    async def owner(records, want: int) -> list:
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, records)
            got = await _collect(kafka_bootstrap, [n.reply], want, timeout=30)
            for _ in range(100):  # every offset committed: the first owner deletes what it may
                committed, end = await _committed_and_end(kafka_bootstrap, n.group, n.inp, 1)
                if committed == end:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # (the deletes after the commit)
        assert committed == end, (committed, end)
        return got[n.reply]

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        first = await owner([rec(0), rec(1), rec(2)], 3)
        second = await owner([rec(3)], 4)  # a new worker: the stream is not in its memory
        return first, second

    first, second = asyncio.run(go())
    assert [(int(_h(r)[SEQ]), _h(r)[HDR_STATUS]) for r in first] == [(0, b"200"), (1, b"413"), (2, b"409")]
    late = second[-1]
    assert (int(_h(late)[SEQ]), _h(late)[HDR_STATUS], _h(late)[END]) == (3, b"409", b"1")
    msg = json.loads(late.value)["error"]["message"]
    assert msg == f"stream {rid!r} already ended (last {SEQ} 1); chunk {SEQ} 3 ignored", msg
    assert late.value == first[2].value.replace(f"{SEQ} 2 ignored".encode(), f"{SEQ} 3 ignored".encode())


def test_chunk_arriving_after_a_gap_ended_its_stream_is_answered(kafka_bootstrap, kafka_broker_kind, qwen3_models,
                                                                 redis_prefix, caplog):
    """Issue 17, fault 4: the missing chunk of a stream that a gap timeout ended arrives late: it
    gets the ended-stream 409 (naming the gap), not silence, and the log says so (not "duplicate
    ... its reply was acked"); a second copy of it gets the identical 409."""
    import logging
    caplog.set_level(logging.INFO, logger="worker.transport")
    tok = _tokenizer(qwen3_models)
    n = _names()
    rid = f"late-{uuid.uuid4().hex[:6]}"
    _, chunks = make_stream(tok, rid, 3)
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis, stream_gap_timeout_s=1.0)

    def rec(seq):
        return (rid.encode(), chunks[seq], [(SEQ, str(seq).encode())])

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, [rec(0), rec(1), rec(3)])
            await _collect(kafka_bootstrap, [n.reply], 3, timeout=30)  # 0, 1, then the gap's 409 on 3
            await _produce(kafka_bootstrap, n.inp, [rec(2), rec(2)])
            got = await _collect(kafka_bootstrap, [n.reply, n.dlq], 5, timeout=30, settle=0.5)
        return got

    got = asyncio.run(go())
    assert got[n.dlq] == []
    replies = got[n.reply]
    assert [(int(_h(r)[SEQ]), _h(r)[HDR_STATUS]) for r in replies] == \
        [(0, b"200"), (1, b"200"), (3, b"409"), (2, b"409"), (2, b"409")]
    late = json.loads(replies[3].value)["error"]
    assert late["type"] == "ConflictError" and "already ended" in late["message"], late
    assert f"ended after {SEQ} 2 was missing" in late["message"], late
    assert replies[4].value == replies[3].value and _h(replies[3])[END] == b"1"
    assert "answered 409" in caplog.text and "its reply was acked" not in caplog.text
