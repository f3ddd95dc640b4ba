"""The batched checkpoint commit with piece bytes (``StateWrite.at`` / ``data`` / ``touch``,
``worker.state.pieces``): the checkpoint and a chunk's piece bytes are one fenced write, in Redis
(one EVALSHA) and in the memory store. A fenced-off write (a redelivered or stale chunk) writes
no piece byte; a chunk redone after a crash rewrites its bytes at the recorded offset instead of
appending twice; the pieces' TTL is set when asked and they are deleted with the checkpoint."""
from __future__ import annotations

import asyncio
import os
import uuid

import pytest
import redis

from worker.state import MemoryStateStore, RedisSettings, RedisStateStore, StateWrite, StoreReadError

REDIS_URL = os.environ.get("REDIS_URL") or os.environ.get("DERENDER_REDIS_URL") or "redis://127.0.0.1:6379/0"


async def _scenario(store, rid: str) -> list:
    """The same write sequence on either store; returns what a reader sees after each step."""
    seen = []
    ok = await store.commit([StateWrite(rid, b"s0", 0, 0, b"abc", touch=True)])
    seen.append((ok, await store.read_pieces(rid, 0, 3)))
    # chunk 0 redelivered (its write is fenced off): nothing appended
    ok = await store.commit([StateWrite(rid, b"s0", 0, 0, b"XYZ", touch=True)])
    seen.append((ok, await store.read_pieces(rid, 0, 3)))
    # chunks 1 and 2 in one flush; then chunk 3 writes at the offset its previous state recorded
    # (5: as a chunk redone from state 1 after a crash would): bytes past it are rewritten, and
    # a reader truncates to the 7 bytes the new state records
    ok = await store.commit([StateWrite(rid, b"s1", 1, 3, b"de"), StateWrite(rid, b"s2", 2, 5, b"LONGER")])
    seen.append((ok, await store.read_pieces(rid, 0, 11)))
    ok = await store.commit([StateWrite(rid, b"s3", 3, 5, b"fg")])
    seen.append((ok, await store.read_pieces(rid, 0, 7)))
    # a stale worker's older write: refused, no byte written
    ok = await store.commit([StateWrite(rid, b"old", 2, 5, b"zz")])
    seen.append((ok, await store.read_pieces(rid, 0, 7)))
    ok = await store.commit([StateWrite(rid, None, 3)])
    seen.append(ok)
    with pytest.raises(StoreReadError):
        await store.read_pieces(rid, 0, 1)
    return seen


WANT = [([True], b"abc"), ([False], b"abc"), ([True, True], b"abcdeLONGER"), ([True], b"abcdefg"),
        ([False], b"abcdefg"), [True]]


def test_memory_store_pieces():
    assert asyncio.run(_scenario(MemoryStateStore(), "m")) == WANT


@pytest.mark.redis
def test_redis_store_pieces_one_fenced_write():
    prefix = f"derender:test:{uuid.uuid4().hex[:10]}:"
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except redis.exceptions.ConnectionError as e:
        pytest.skip(f"no Redis answers at {REDIS_URL}: {e}")
    sync = redis.Redis.from_url(REDIS_URL)

    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=prefix, ttl_s=60))
        try:
            rid = "r"
            pk = store.key(rid) + ":pieces"
            await store.commit([StateWrite(rid, b"s0", 0, 0, b"abc", touch=True)])
            assert 0 < sync.pttl(pk) <= 60_000
            sync.persist(pk)
            await store.commit([StateWrite(rid, b"s1", 1, 3, b"d")])  # not asked: TTL untouched
            assert sync.pttl(pk) == -1
            await store.commit([StateWrite(rid, b"s2", 2, 4, b"", touch=True)])
            assert 0 < sync.pttl(pk) <= 60_000
            await store.commit([StateWrite(rid, None, 2)])
            assert not sync.exists(store.key(rid), pk)  # deleted together
            return await _scenario(store, "r2")
        finally:
            await store.close()
            keys = list(sync.scan_iter(match=prefix + "*"))
            if keys:
                sync.delete(*keys)

    assert asyncio.run(go()) == WANT


async def _lost_then_written(store, rid: str, lose) -> list:
    """Pieces lost (deleted / expired / truncated) between chunks while the checkpoint survives,
    then the next chunk writes its bytes at the offset its state recorded: the bytes before that
    offset are gone, so a reader must get ``StoreReadError`` (the "lost or expired" 409), never
    zero bytes padded in by ``SETRANGE`` (a wrong reply); a write at offset 0 starts them anew."""
    seen = []
    await store.commit([StateWrite(rid, b"s0", 0, 0, b"abc", touch=True)])
    await lose(rid)
    seen.append(await store.commit([StateWrite(rid, b"s1", 1, 3, b"de", touch=True)]))
    with pytest.raises(StoreReadError):
        await store.read_pieces(rid, 0, 5)
    with pytest.raises(StoreReadError):
        await store.read_pieces(rid, 3, 5)
    seen.append(await store.commit([StateWrite(rid, b"s2", 2, 0, b"xy", touch=True)]))
    seen.append(await store.read_pieces(rid, 0, 2))
    return seen


LOST_WANT = [[True], [True], b"xy"]


def test_memory_store_lost_pieces_not_zero_padded():
    store = MemoryStateStore()

    async def lose(rid):
        store.pieces.pop(rid, None)

    assert asyncio.run(_lost_then_written(store, "m", lose)) == LOST_WANT


def test_memory_piece_store_lost_pieces_not_zero_padded():
    from worker.state.pieces import MemoryPieceStore
    store = MemoryPieceStore()

    async def go():
        await store.commit("m", b"s0", 0, 0, b"abc")
        store.pieces["m"] = bytearray(b"a")  # truncated
        await store.commit("m", b"s1", 1, 3, b"de")
        with pytest.raises(StoreReadError):
            await store.read("m", 0, 5)

    asyncio.run(go())


@pytest.mark.redis
@pytest.mark.parametrize("how", ["delete", "truncate", "expire"])
def test_redis_store_lost_pieces_not_zero_padded(how):
    prefix = f"derender:test:{uuid.uuid4().hex[:10]}:"
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()
    except redis.exceptions.ConnectionError as e:
        pytest.skip(f"no Redis answers at {REDIS_URL}: {e}")
    sync = redis.Redis.from_url(REDIS_URL)

    async def go():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=prefix, ttl_s=60))

        async def lose(rid):
            pk = store.key(rid) + ":pieces"
            if how == "delete":
                sync.delete(pk)
            elif how == "truncate":
                sync.set(pk, b"a", keepttl=True)
            else:
                sync.pexpire(pk, 1)
                while sync.exists(pk):
                    await asyncio.sleep(0.005)
            assert sync.exists(store.key(rid))  # the checkpoint survives

        try:
            return await _lost_then_written(store, "r", lose)
        finally:
            await store.close()
            keys = list(sync.scan_iter(match=prefix + "*"))
            if keys:
                sync.delete(*keys)

    assert asyncio.run(go()) == LOST_WANT
