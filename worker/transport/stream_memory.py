"""Bounded memory for the streams a worker holds (``StreamRouter``): idle eviction, a count cap,
and the live-streams gauge.

* **Idle eviction.** A stream that got no chunk for ``idle_timeout_s`` seconds (default: the Redis
  key TTL, ``--redis-state-ttl``, so memory and store forget a stream together) and has nothing
  running, queued, held (gap) or waiting to be written is dropped from memory. With Redis its
  checkpoint stays in the store until the TTL removes it: a later chunk reloads it. With
  ``--stream-state memory`` the in-process store's entry goes with it (``MemoryStateStore.forget``:
  the store's own clock starts at the state's write, up to a processing lag after the chunk's
  arrival, so leaving the entry to its TTL would let a chunk just after the eviction continue).
* **Cap.** Beyond ``max_live`` streams in memory, the least recently used evictable ones are
  dropped at once (memory mode: their state is gone, the store's entry too).
* **Nothing is kept of an evicted stream** (not even its request id: a few surviving small
  objects per stream would pin the allocator's arenas and keep the memory in the RSS). A later
  chunk of a stream whose state is gone everywhere is an unknown stream: after the gap timeout it
  gets the 409 saying its state was lost or expired.
* **Gauge.** After each sweep (every ``period_s``, at most 1 s) the number of streams in memory
  goes to ``HealthState.set_live_streams`` and, with ``--metrics-port``, to the Prometheus gauge
  ``derender_live_streams``.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["StreamMemory"]


def _malloc_trim() -> None:
    """Give free heap memory back to the OS (glibc ``malloc_trim(0)``; nothing elsewhere): after
    thousands of streams were evicted their memory is free but would stay in the process' RSS."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim): nothing to do
        return


def _evictable(s: Any) -> bool:
    return (s.task is None and not s.queue and not s.held and not s.held_dups and not s.loading
            and s.pending_writes == 0)


class StreamMemory:
    """Eviction policy and gauge of a ``StreamRouter``'s in-memory streams (module docstring).
    ``idle_timeout_s``: seconds without a chunk before eviction; ``max_live``: most streams in
    memory; ``health``: a ``HealthState`` (live-streams count) or None; ``gauge``: a Prometheus
    ``Gauge`` or None."""

    def __init__(self, idle_timeout_s: float, max_live: int, health: Any = None, gauge: Any = None):
        self.idle_timeout_s = max(0.001, float(idle_timeout_s))
        self.max_live = max(1, int(max_live))
        self.health = health
        self.gauge = gauge
        self.period_s = min(1.0, self.idle_timeout_s / 4)
        self.evicted_idle = 0
        self.evicted_cap = 0

    def live(self, router: Any) -> int:
        """Streams held in memory over the router's open partitions."""
        return sum(len(st.streams) for st in router.parts.values())

    def sweep(self, router: Any, now: float | None = None) -> int:
        """Evict the idle streams of every open partition; returns how many."""
        now = time.monotonic() if now is None else now
        n = 0
        # the in-process store (memory mode) forgets the evicted stream's state with it; Redis
        # keeps the checkpoint until its TTL (no ``forget``)
        forget = getattr(router.store, "forget", None)
        for st in list(router.parts.values()):
            for rid, s in list(st.streams.items()):
                if now - s.last_used >= self.idle_timeout_s and _evictable(s):
                    del st.streams[rid]
                    if forget is not None:
                        forget(rid)
                    n += 1
        expire = getattr(router.store, "expire", None)
        if expire is not None:
            expire(now)
        self.evicted_idle += n
        return n

    def enforce_cap(self, router: Any) -> int:
        """Evict least recently used evictable streams while more than ``max_live`` are held."""
        over = self.live(router) - self.max_live
        if over <= 0:
            return 0
        cands = sorted(((s.last_used, id(st), rid, st) for st in router.parts.values()
                        for rid, s in st.streams.items() if _evictable(s)), key=lambda x: x[:2])
        n = 0
        forget = getattr(router.store, "forget", None)  # (as ``sweep``)
        for _, _, rid, st in cands[:over]:
            del st.streams[rid]
            if forget is not None:
                forget(rid)
            n += 1
        if n < over:
            log.warning("%d streams in memory, more than --max-live-streams %d, but none more is idle",
                        self.live(router), self.max_live)
        self.evicted_cap += n
        return n

    def publish(self, router: Any) -> int:
        """Push the live-streams count to the health state and the gauge; returns it."""
        n = self.live(router)
        if self.health is not None:
            self.health.set_live_streams(n)
        if self.gauge is not None:
            self.gauge.set(n)
        return n

    async def run(self, router: Any) -> None:
        """Sweep, cap and publish every ``period_s`` until cancelled. After a sweep that emptied
        memory of many streams, a garbage collection and ``malloc_trim`` return their memory to the
        OS (RSS back to where it was)."""
        while True:
            await asyncio.sleep(self.period_s)
            n = self.sweep(router) + self.enforce_cap(router)
            if n >= 100 or (n and not self.live(router)):
                gc.collect()
                _malloc_trim()
            self.publish(router)
