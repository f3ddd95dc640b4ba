"""Outage and memory bounds of the Kafka worker, unit level: ``OutageClock`` (wait, report, give
up), the memory state store's TTL / LRU cap, and ``StreamMemory`` (idle eviction, cap,
live-streams count) on real ``StreamRouter`` stream objects. End to end (worker
subprocesses, real Redis outages, broker restarts, 6,000 abandoned streams): ``tests/test_chaos.py``."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from worker.state import StateWrite, StoreConnectError
from worker.state.memory_store import MemoryStateStore
from worker.state.redis_store import StoredState
from worker.transport.health import HealthState
from worker.transport.outage import DependencyOutage, OutageClock
from worker.transport.stream_memory import StreamMemory
from worker.transport.stream_registry import _Stream


async def test_outage_clock_waits_reports_and_recovers():
    health = HealthState()
    health.mark_started()
    clock = OutageClock("stream state store X", "state-store", 5.0, health, backoff_s=(0.01, 0.02))
    calls = []

    async def flaky():
        calls.append(time.monotonic())
        if len(calls) < 4:
            assert not health.ready or len(calls) == 1
            raise StoreConnectError("refused")
        return "ok"

    assert await clock.retry(flaky, (StoreConnectError,)) == "ok"
    assert len(calls) == 4 and clock.outages == 1 and not clock.is_down
    assert health.ready and health.reasons == []


async def test_outage_clock_gives_up_with_one_line_after_the_deadline():
    health = HealthState()
    health.mark_started()
    clock = OutageClock("stream state store redis://h:1/0", "state-store", 0.2, health, hint="start Redis",
                        backoff_s=(0.05, 0.05))

    async def down():
        raise StoreConnectError("Connection refused")

    t0 = time.monotonic()
    with pytest.raises(DependencyOutage) as ei:
        await clock.retry(down, (StoreConnectError,))
    assert 0.2 <= time.monotonic() - t0 < 2.0
    msg = str(ei.value)
    assert "redis://h:1/0" in msg and "Connection refused" in msg and "start Redis" in msg and "\n" not in msg
    assert not health.ready and health.has_reason("state-store")


async def test_outage_clock_lets_other_errors_through():
    clock = OutageClock("x", "x", 10.0)

    async def bug():
        raise ValueError("not an outage")

    with pytest.raises(ValueError):
        await clock.retry(bug, (StoreConnectError,))
    assert not clock.is_down


async def test_memory_store_expires_idle_entries_and_caps_lru():
    store = MemoryStateStore(ttl_s=0.2, max_entries=3)
    assert await store.commit([StateWrite(f"r{i}", b"s", 0) for i in range(3)]) == [True] * 3
    await store.get_many(["r0"])  # r0 becomes the most recently used
    await store.commit([StateWrite("r3", b"s", 0)])  # over the cap: r1 (least recently used) goes
    assert set(store.data) == {"r0", "r2", "r3"}
    assert await store.commit([StateWrite("r0", b"old", 0)]) == [False]  # still fenced on seq
    time.sleep(0.25)
    assert (await store.get_many(["r0", "r2"])) == {"r0": None, "r2": None}
    assert not store.data and not store._used  # nothing kept of expired entries
    assert await store.commit([StateWrite("r2", b"s", 5)]) == [True]  # a new stream under the same id


def _router(*partitions):
    return SimpleNamespace(parts={id(p): p for p in partitions}, store=SimpleNamespace())  # no expire()


def test_stream_memory_evicts_idle_streams_only_when_nothing_waits():
    health = HealthState()
    mem = StreamMemory(idle_timeout_s=10.0, max_live=100, health=health)
    p = SimpleNamespace(streams={})
    now = time.monotonic()
    for rid in ("idle", "busy", "queued", "held", "writing", "loading", "fresh"):
        p.streams[rid] = _Stream(rid, last_used=now - 60)
    p.streams["fresh"].last_used = now
    p.streams["busy"].task = object()
    p.streams["queued"].queue.append(object())
    p.streams["held"].held[3] = object()
    p.streams["writing"].pending_writes = 1
    p.streams["loading"].loading = True
    router = _router(p)
    assert mem.publish(router) == 7 and health.live_streams == 7
    assert mem.sweep(router, now) == 1
    assert sorted(p.streams) == ["busy", "fresh", "held", "loading", "queued", "writing"]
    assert mem.publish(router) == 6 and health.live_streams == 6


def test_stream_memory_cap_evicts_least_recently_used():
    mem = StreamMemory(idle_timeout_s=900.0, max_live=3)
    a, b = SimpleNamespace(streams={}), SimpleNamespace(streams={})
    now = time.monotonic()
    for i in range(3):
        a.streams[f"a{i}"] = _Stream(f"a{i}", last_used=now - 10 + 2 * i)
        b.streams[f"b{i}"] = _Stream(f"b{i}", last_used=now - 9 + 2 * i)
    b.streams["b0"].task = object()  # running: never evicted
    router = _router(a, b)
    assert mem.enforce_cap(router) == 3
    assert sorted([*a.streams, *b.streams]) == ["a2", "b0", "b2"]


async def test_stream_memory_run_publishes_until_cancelled():
    health = HealthState()
    mem = StreamMemory(idle_timeout_s=0.05, max_live=10, health=health)
    p = SimpleNamespace(streams={"r": _Stream("r")})
    router = _router(p)
    task = asyncio.create_task(mem.run(router))
    await asyncio.sleep(0.01)
    health.set_live_streams(1)
    for _ in range(100):
        await asyncio.sleep(0.02)
        if health.live_streams == 0:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert health.live_streams == 0 and not p.streams


async def test_memory_mode_eviction_drops_the_store_entry_too():
    """Memory mode: an evicted stream's state is gone from the in-process store at once (its own
    TTL clock started later, at the state's write); with a store without ``forget`` (Redis) the
    eviction touches nothing but memory."""
    store = MemoryStateStore(ttl_s=900.0, max_entries=100)
    assert await store.commit([StateWrite(r, b"s", 0) for r in ("idle", "fresh", "c0", "c1")]) == [True] * 4
    now = time.monotonic()
    p = SimpleNamespace(streams={"idle": _Stream("idle", last_used=now - 60), "fresh": _Stream("fresh", last_used=now)})
    router = SimpleNamespace(parts={1: p}, store=store)
    assert StreamMemory(idle_timeout_s=10.0, max_live=100).sweep(router, now) == 1
    assert (await store.get_many(["idle", "fresh"])) == {"idle": None, "fresh": StoredState(b"s", 0)}
    q = SimpleNamespace(streams={"c0": _Stream("c0", last_used=now - 5), "c1": _Stream("c1", last_used=now)})
    router = SimpleNamespace(parts={1: q}, store=store)
    assert StreamMemory(idle_timeout_s=900.0, max_live=1).enforce_cap(router) == 1
    assert set(store.data) == {"fresh", "c1"}
    assert StreamMemory(idle_timeout_s=10.0, max_live=100).sweep(_router(
        SimpleNamespace(streams={"x": _Stream("x", last_used=now - 60)})), now) == 1
