"""Issue 13 item 5 through the Kafka worker, a real Kafka-protocol broker and a real Redis: a
stream whose Hermes tool call grows to ~20 KB (a ~2,500-word string argument) in 1-token chunks
(also as the JSON content of a ``tool_choice: "required"`` answer, held for parsing at the end).
The Redis checkpoint's state stays under 4 KiB while the call's body goes to the stream's
append-only pieces (``{key}:pieces``, same TTL); a second worker that takes the stream over
after a rewind (fresh memory: it must read the pieces the first worker wrote from Redis to close
the call) republishes the replay window byte-identically and finishes the stream with the same
answer as the non-streaming derender; the end of the stream deletes the checkpoint and its
pieces together.
"""
from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import redis
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.harness.kafka import REDIS_URL, qwen3_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from tests.harness.kafka_streams import SEQ, assert_complete, expected_view
from worker.core.service import DerenderService
from worker.state import RedisSettings, RedisStateStore
from worker.transport.checkpoints import decode_checkpoint
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.topics import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

_WORDS = "the forecast for the coast says light rain then sun with a westerly breeze".split()


def big_call_stream(tok, rid: str, words: int, required: bool = False) -> tuple[bytes, list[bytes]]:
    """(non-streaming body, 1-token chunk bodies) of an answer whose one hermes call carries a
    ``words``-word ``unit`` argument; ``required``: ``tool_choice: "required"`` and the call
    written as the JSON list content that mode parses at the end (held for it, then spilled)."""
    arg = " ".join(_WORDS[i % len(_WORDS)] for i in range(words))
    if required:
        text = ("<think>\nA long note is needed.\n</think>\n\n"
                + json.dumps([{"name": "get_weather", "parameters": {"city": "Oslo", "unit": arg}}]))
        return qwen3_stream(tok, rid, text, "Oslo", tool_choice="required")
    text = ("<think>\nA long note is needed.\n</think>\n\nHere it is.\n<tool_call>\n"
            + json.dumps({"name": "get_weather", "arguments": {"city": "Oslo", "unit": arg}}) + "\n</tool_call>")
    return qwen3_stream(tok, rid, text, "Oslo")


@pytest.mark.parametrize("required", [False, True], ids=["hermes call", "required tool_choice"])
def test_big_call_state_stays_small_and_a_new_owner_reads_the_pieces(kafka_bootstrap, kafka_broker_kind,
                                                                     qwen3_models, redis_prefix, monkeypatch,
                                                                     required):
    reads: list[tuple[int, int]] = []
    real_read = RedisStateStore.read_pieces

    async def read_pieces(self, request_id, start, end):
        reads.append((start, end))
        return await real_read(self, request_id, start, end)

    monkeypatch.setattr(RedisStateStore, "read_pieces", read_pieces)
    tok = _tokenizer(qwen3_models)
    svc = DerenderService(qwen3_models)
    n = _names()
    rid = f"big-{uuid.uuid4().hex[:6]}"
    full, chunks = big_call_stream(tok, rid, 2500, required)
    want = expected_view(svc, full)
    assert want["tool_calls"]  # (the answer is a call in both variants)
    N = len(chunks)
    cut = N - 40  # the first worker stops inside the call, long after it spilled
    rewind = cut - 5
    rs = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=rs)
    recs = [(rid.encode(), chunks[k], [(SEQ, str(k).encode())]) for k in range(N)]
    sync = redis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}{{{rid}}}"
    seen: dict = {}

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, recs[:cut])
            await _collect(kafka_bootstrap, [n.reply], cut, timeout=120)
            for _ in range(100):  # the last checkpoint is written after the last reply's ack
                raw = sync.get(key)
                if raw is not None and int(raw[:20]) == cut - 1:
                    break
                await asyncio.sleep(0.05)
            seen["state"] = len(decode_checkpoint(raw[20:]).state)
            seen["pieces"] = sync.strlen(key + ":pieces")
            seen["pttl"] = sync.pttl(key + ":pieces")
        tp = TopicPartition(n.inp, 0)
        c = AIOKafkaConsumer(n.inp, bootstrap_servers=kafka_bootstrap, group_id=n.group, enable_auto_commit=False,
                             session_timeout_ms=settings.session_timeout_ms, heartbeat_interval_ms=500)
        await c.start()
        try:
            for _ in range(100):
                if tp in c.assignment():
                    break
                await c.getmany(timeout_ms=100, max_records=1)
            await c.commit({tp: rewind})
        finally:
            await c.stop()
        async with KafkaDerenderWorker(settings, qwen3_models) as w2:
            await w2.wait_assigned(30)
            seen["reads_before"] = len(reads)
            await _collect(kafka_bootstrap, [n.reply], cut + (cut - rewind), timeout=60)
            await _produce(kafka_bootstrap, n.inp, recs[cut:])
            got = await _collect(kafka_bootstrap, [n.reply], N + (cut - rewind), timeout=120, settle=0.5)
            for _ in range(100):  # ended: the checkpoint goes once its offsets are committed
                if not sync.exists(key, key + ":pieces"):
                    break
                await asyncio.sleep(0.1)
            seen["left"] = sync.exists(key, key + ":pieces")
        return got[n.reply], w2.stats

    replies, stats2 = asyncio.run(go())
    assert seen["state"] < 4096, seen
    assert seen["pieces"] > 8000 and 0 < seen["pttl"] <= 120_000, seen
    assert assert_complete(replies, N, want, rid) == cut - rewind
    assert stats2.stream_replayed == cut - rewind and stats2.stream_chunks == N - cut
    assert seen["left"] == 0
    # the first worker never read the pieces (it held what it wrote); the second read the first's
    assert seen["reads_before"] == 0 and reads and reads[0][0] == 0 and reads[0][1] >= seen["pieces"] - 4096, reads


def test_pieces_lost_between_owners_end_the_stream_with_the_409(kafka_bootstrap, kafka_broker_kind,
                                                                 qwen3_models, redis_prefix):
    """The pieces key is deleted (as by an eviction or an operator) after the first worker
    stopped inside the spilled call, while the checkpoint survives. A second worker loads the
    checkpoint, goes on writing piece bytes at the recorded offsets (which must not zero-pad the
    lost start back in), and at the call's close cannot read the start: the stream ends with the
    409 "lost or expired", never a reply with the lost bytes (NULs) in the arguments."""
    tok = _tokenizer(qwen3_models)
    n = _names()
    rid = f"lost-{uuid.uuid4().hex[:6]}"
    _, chunks = big_call_stream(tok, rid, 1200)
    N = len(chunks)
    cut = N - 400  # (the second worker spills more of the call: writes past the lost bytes)
    rs = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=rs)
    recs = [(rid.encode(), chunks[k], [(SEQ, str(k).encode())]) for k in range(N)]
    sync = redis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}{{{rid}}}"

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, qwen3_models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, recs[:cut])
            await _collect(kafka_bootstrap, [n.reply], cut, timeout=120)
            for _ in range(100):
                raw = sync.get(key)
                if raw is not None and int(raw[:20]) == cut - 1:
                    break
                await asyncio.sleep(0.05)
        assert sync.strlen(key + ":pieces") > 4000
        sync.delete(key + ":pieces")
        async with KafkaDerenderWorker(settings, qwen3_models) as w2:
            await w2.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, recs[cut:])

            def ended(got):
                return any(dict(r.headers).get("derender-stream-end") == b"1" for r in got[n.reply])
            got = await _collect(kafka_bootstrap, [n.reply], 0, timeout=120, settle=0.5, until=ended)
        return got[n.reply]

    replies = asyncio.run(go())
    ends = [i for i, r in enumerate(replies) if dict(r.headers).get("derender-stream-end") == b"1"]
    first = replies[ends[0]]  # (chunks after it get the ended-stream 409, each marked as an end too)
    h = dict(first.headers)
    assert h["derender-status"] == b"409", (h, first.value[:300])
    assert b"lost or expired" in first.value, first.value[:300]
    assert int(h["derender-seq"]) >= cut
    for r in replies:  # no reply carries a lost byte
        assert b"\\u0000" not in r.value
    assert all(dict(r.headers)["derender-status"] == b"200" for r in replies[:ends[0]])
    assert all(dict(r.headers)["derender-status"] == b"409" for r in replies[ends[0]:])
