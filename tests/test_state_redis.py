"""RedisStateStore against a real Redis (``REDIS_URL``, else redis://127.0.0.1:6379/0); skipped
with the reason when none answers. Keys use a unique prefix and are removed afterwards."""
from __future__ import annotations

import asyncio
import json
import os
import uuid

import pytest

from worker.state import (
    RedisSettings,
    RedisStateStore,
    StaleStateError,
    StateWrite,
    StoreConnectError,
)

URL = os.environ.get("REDIS_URL") or os.environ.get("DERENDER_REDIS_URL") or "redis://127.0.0.1:6379/0"


def _run(coro):
    return asyncio.run(coro)


async def _store(ttl_s: float = 60.0) -> RedisStateStore:
    prefix = f"derender:test:{uuid.uuid4().hex}:"
    store = RedisStateStore.from_settings(RedisSettings(url=URL, ttl_s=ttl_s, prefix=prefix, timeout_s=2.0))
    try:
        await store.ping()
    except StoreConnectError as e:
        await store.close()
        pytest.skip(f"no Redis answers at {URL}: {e}")
    return store


async def _cleanup(store: RedisStateStore) -> None:
    keys = [k async for k in store.client.scan_iter(match=store.prefix + "*")]
    if keys:
        await store.client.delete(*keys)
    await store.close()


def test_roundtrip_ttl_delete():
    async def go():
        store = await _store(ttl_s=30)
        try:
            assert await store.get("r1") is None
            assert await store.put("r1", b"\x00state-1", 0)
            got = await store.get("r1")
            assert got.state == b"\x00state-1" and got.seq == 0
            ttl = await store.client.pttl(store.key("r1"))
            assert 0 < ttl <= 30_000
            # TTL refreshed on read and on write
            await store.client.pexpire(store.key("r1"), 5_000)
            await store.get("r1")
            assert await store.client.pttl(store.key("r1")) > 5_000
            await store.client.pexpire(store.key("r1"), 5_000)
            assert await store.put("r1", b"state-2", 1)
            assert await store.client.pttl(store.key("r1")) > 5_000
            assert (await store.get("r1")).state == b"state-2"
            # batched reads / writes, delete at end of stream
            res = await store.commit([StateWrite("r2", b"a", 0), StateWrite("r3", b"b", 0),
                                      StateWrite("r1", None, 2)])
            assert res == [True, True, True]
            many = await store.get_many(["r1", "r2", "r3"])
            assert many["r1"] is None and many["r2"].state == b"a" and many["r3"].state == b"b"
            assert await store.delete("r2")
            assert await store.get("r2") is None
        finally:
            await _cleanup(store)

    _run(go())


def test_fencing_rejects_stale_seq():
    async def go():
        store = await _store()
        try:
            assert await store.put("f", b"s5", 5)
            assert not await store.put("f", b"old", 4)        # older
            assert not await store.put("f", b"dup", 5)        # same seq again
            with pytest.raises(StaleStateError):
                await store.put("f", b"old", 3, raise_on_stale=True)
            assert (await store.get("f")).state == b"s5"
            assert await store.put("f", b"s9", 9)             # gaps are fine (e.g. Kafka offsets)
            res = await store.commit([StateWrite("f", b"x", 7), StateWrite("f", b"s10", 10)])
            assert res == [False, True]
            assert not await store.delete("f", seq=9)         # a stale worker cannot delete
            assert (await store.get("f")).seq == 10
            assert await store.delete("f", seq=10)
            assert await store.get("f") is None
        finally:
            await _cleanup(store)

    _run(go())


def test_unreachable_redis_is_typed():
    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url="redis://127.0.0.1:1/0", timeout_s=0.5))
        try:
            with pytest.raises(StoreConnectError):
                await store.ping()
            with pytest.raises(StoreConnectError):
                await store.get("x")
            with pytest.raises(StoreConnectError):
                await store.commit([StateWrite("x", b"s", 1)])
        finally:
            await store.close()

    _run(go())


def test_stream_through_store():
    """A corpus stream derendered chunk by chunk with the state kept in Redis."""
    from tests.parity import corpus, service
    from tests.parity_tools import compare as compare_mod
    from tests.parity_tools import to_requests

    case = next(c for c in corpus() if c["id"] == "qwen3-tool-single-stream1-v0")

    async def go():
        store = await _store()
        try:
            chunks = []
            rid = None
            for seq, b in enumerate(to_requests.stream_bodies(case)):
                rid = b["generate_chunk"]["request_id"]
                stored = await store.get(rid)
                res, new_state = service().derender_stream(json.dumps(b).encode(),
                                                           stored.state if stored else None, seq=seq)
                assert not res.is_error, res.body
                chunks.extend(json.loads(res.body))
                ok = await store.commit([StateWrite(rid, None if res.done else new_state, res.seq)])
                assert ok == [True]
            assert await store.get(rid) is None            # deleted at the end
            ok, _, why = compare_mod.compare_stream(case, chunks)
            assert ok, why
            # replaying a chunk with an old seq against a newer state is refused (409)
            b = to_requests.stream_bodies(case)[0]
            res1, st1 = service().derender_stream(json.dumps(b).encode(), None, seq=5)
            res2, st2 = service().derender_stream(json.dumps(b).encode(), st1, seq=3)
            assert res2.status == 409 and st2 is None
        finally:
            await _cleanup(store)

    _run(go())
