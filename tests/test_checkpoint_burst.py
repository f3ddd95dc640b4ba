"""Checkpoint writes scale with Redis: commands per stream chunk on a burst of streams opened at
once (counted by ``INFO commandstats`` on a private redis-server: scripts' inner calls included),
and the fencing rules of the batched checkpoint script on the real Redis."""
from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from tests.harness.kafka import qwen3, tokenizer
from worker.bench.redis_burst import PrivateRedis, run_burst
from worker.state.redis_store import RedisStateStore, StateWrite


def test_burst_costs_at_most_two_commands_per_chunk(kafka_bootstrap, qwen3_models):
    with PrivateRedis() as red:
        res = asyncio.run(run_burst(kafka_bootstrap, red.url, [qwen3(qwen3_models)], tokenizer(qwen3_models),
                                    streams=500, chunks=3, timeout_s=300))
    assert res.chunks == 1500
    assert res.per_chunk <= 2.0, res.calls
    # no read for a stream met at its chunk 0, one command per checkpoint write and per delete
    assert res.calls.get("getex", 0) == 0 and res.calls.get("hmget", 0) == 0, res.calls
    assert res.calls["del"] == 500, res.calls


def test_batched_commit_fencing_and_old_layout():
    async def go(url):
        client = aioredis.Redis.from_url(url)
        store = RedisStateStore(client, ttl_s=60, prefix="t:")
        try:
            # in order within one flush; the same key twice; fenced on seq
            assert await store.commit([StateWrite("a", b"s0", 0), StateWrite("a", b"s0-again", 0),
                                       StateWrite("a", b"s2", 2), StateWrite("a", b"s1", 1),
                                       StateWrite("b", None, 5)]) == [True, False, True, False, True]
            got = await store.get("a")
            assert (got.state, got.seq) == (b"s2", 2)
            assert 0 < await client.pttl(store.key("a")) <= 60_000
            assert await store.commit([StateWrite("a", None, 1)]) == [False]  # older delete refused
            assert await store.commit([StateWrite("a", None, 2), StateWrite("a", b"s3", 3)]) == [True, True]
            assert (await store.get("a")).seq == 3
            assert await store.commit([StateWrite("big", b"x", 2**63 - 2), StateWrite("big", b"y", 2**63 - 3)]) \
                == [True, False]  # exact at SEQ_MAX (compared as digits, not as Lua doubles)
            # a key of the older hash layout: read, fenced on its q, replaced by the next write
            await client.hset(store.key("old"), mapping={"s": b"hs", "q": b"7"})
            got = await store.get("old")
            assert (got.state, got.seq) == (b"hs", 7)
            assert await store.commit([StateWrite("old", b"n", 7)]) == [False]
            assert await store.commit([StateWrite("old", None, 6)]) == [False]
            assert await store.commit([StateWrite("old", b"n", 8)]) == [True]
            assert (await store.get("old")).state == b"n"
            # more writes than one script carries
            many = [StateWrite(f"m{i}", b"v", 0) for i in range(2500)]
            assert await store.commit(many) == [True] * 2500
            assert await client.dbsize() == 2503
        finally:
            await client.aclose()

    with PrivateRedis() as red:
        asyncio.run(go(red.url))
