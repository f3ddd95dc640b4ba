"""In-process stream state store (``--stream-state memory``): the ``RedisStateStore`` API for a
single worker, state lost with the process."""
from __future__ import annotations

from worker.state.redis_store import StoredState

__all__ = ["MemoryStateStore"]


class MemoryStateStore:
    """In-process stand-in for ``RedisStateStore`` (same async API, same fencing, no TTL): one
    worker only, state lost with the process. Default of ``WorkerSettings`` (tests, demo).
    ``data``: request id -> (checkpoint bytes, seq)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}

    async def ping(self) -> None:
        """Always reachable."""
        return None

    async def close(self) -> None:
        """Nothing to release."""
        return None

    async def get_many(self, request_ids: list[str]) -> dict:
        """``{request_id: StoredState | None}`` for each id (like ``RedisStateStore.get_many``)."""
        out = {}
        for rid in request_ids:
            v = self.data.get(rid)
            out[rid] = StoredState(v[0], v[1]) if v else None
        return out

    async def commit(self, writes: list) -> list[bool]:
        """Apply ``StateWrite``s fenced on seq (a write older than the stored seq is refused:
        False); ``state`` None deletes. Same rules as ``RedisStateStore.commit``."""
        res = []
        for w in writes:
            cur = self.data.get(w.request_id)
            if w.state is None:
                if cur and cur[1] > w.seq:
                    res.append(False)
                else:
                    self.data.pop(w.request_id, None)
                    res.append(True)
            elif cur and cur[1] >= w.seq:
                res.append(False)
            else:
                self.data[w.request_id] = (w.state, w.seq)
                res.append(True)
        return res
