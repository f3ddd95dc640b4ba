"""The worker's ``--max-in-flight`` permits: one per non-streaming record from its fetch to its
reply's ack. A plain counter for one event loop: taking a free permit and releasing several at
once (an acker finishing one executor call's records) are O(1) without ``asyncio.Semaphore``'s
per-call waiter scan (docs/performance.md, issue 23 item 5).
"""
from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Permits"]


class Permits:
    """``n`` permits (at least 1). ``take()``: one if free (no wait); ``acquire()``: wait for one
    (cancel-safe: a cancelled wait takes none); ``release(k)``: give back ``k``."""

    def __init__(self, n: int):
        self._free = max(1, int(n))
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def free(self) -> int:
        """Permits not taken now."""
        return self._free

    def locked(self) -> bool:
        """No permit is free."""
        return self._free <= 0

    def take(self) -> bool:
        """Take a permit if one is free -> whether one was taken."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> bool:
        """Take a permit, waiting until one is released -> True."""
        while self._free <= 0:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # woken, then cancelled: pass the wake-up on
                    self.release(0)
                raise
            finally:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass  # (taken out by release)
        self._free -= 1
        return True

    def release(self, k: int = 1) -> None:
        """Give back ``k`` permits; wakes as many waiters as permits are free (each takes its
        own when it runs, or waits again)."""
        self._free += k
        wake = self._free
        while wake > 0 and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                wake -= 1

    async def acquire_unless(self, stopping: asyncio.Event) -> bool:
        """Take a permit, waiting until one is released or ``stopping`` is set -> whether one
        was taken (none is kept when the stop comes first: a fetch loop waiting for capacity
        never keeps a stop or a give-up waiting)."""
        if self.take():
            return True
        got = asyncio.ensure_future(self.acquire())
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({got, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if got.done():
            return True
        got.cancel()
        await asyncio.gather(got, return_exceptions=True)
        if got.done() and not got.cancelled() and got.exception() is None:
            self.release()  # acquired while being cancelled
        return False
