"""In-process stream state store (``--stream-state memory``): the ``RedisStateStore`` API for a
single worker, state lost with the process.

Bounded like the Redis store: every entry expires ``ttl_s`` seconds after its last read or write
(the Redis key TTL), and beyond ``max_entries`` the least recently used entry is dropped
(nothing of it is kept: a later chunk of that stream finds no state, like after a Redis TTL)."""
from __future__ import annotations

import time
from collections import OrderedDict

from worker.state.redis_store import DEFAULT_TTL_S, StoredState, StoreReadError

__all__ = ["MemoryStateStore"]


class MemoryStateStore:
    """In-process stand-in for ``RedisStateStore`` (same async API, same fencing): one worker only,
    state lost with the process. ``data``: request id -> (checkpoint bytes, seq), least recently
    used first; ``pieces``: request id -> its append-only pieces (``worker.state.pieces``: written
    with the checkpoint at the recorded offset, dropped with it); ``settings``: request id -> its
    write-once settings (``StateWrite.settings``, dropped with it). ``ttl_s``: seconds an entry
    lives without use; ``max_entries``: most entries kept."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_entries: int = 20000) -> None:
        self.data: OrderedDict[str, tuple[bytes, int]] = OrderedDict()
        self.pieces: dict[str, bytearray] = {}
        self.settings: dict[str, bytes] = {}
        self._used: dict[str, float] = {}  # request id -> time.monotonic() of the last use
        self.ttl_s = float(ttl_s)
        self.max_entries = max(1, int(max_entries))

    async def ping(self) -> None:
        """Always reachable."""
        return None

    async def close(self) -> None:
        """Nothing to release."""
        return None

    def _touch(self, rid: str, now: float) -> None:
        self.data.move_to_end(rid)
        self._used[rid] = now

    def _drop(self, rid: str) -> None:
        self.data.pop(rid, None)
        self._used.pop(rid, None)
        self.pieces.pop(rid, None)
        self.settings.pop(rid, None)

    def forget(self, request_id: str) -> None:
        """Drop a stream's entry, pieces and settings now (the worker evicted the stream from
        memory: ``worker.transport.stream_memory``; with this store nothing else holds its state)."""
        self._drop(request_id)

    def expire(self, now: float | None = None) -> int:
        """Drop the entries unused for ``ttl_s`` seconds; returns how many."""
        now = time.monotonic() if now is None else now
        n = 0
        while self.data:
            rid = next(iter(self.data))
            if now - self._used.get(rid, now) < self.ttl_s:
                break
            self._drop(rid)
            n += 1
        return n

    async def get_many(self, request_ids: list[str]) -> dict:
        """``{request_id: StoredState | None}`` for each id (like ``RedisStateStore.get_many``;
        reading refreshes an entry's time, as the Redis TTL)."""
        now = time.monotonic()
        self.expire(now)
        out = {}
        for rid in request_ids:
            v = self.data.get(rid)
            out[rid] = StoredState(v[0], v[1]) if v else None
            if v:
                self._touch(rid, now)
        return out

    async def commit(self, writes: list) -> list[bool]:
        """Apply ``StateWrite``s fenced on seq (a write older than the stored seq is refused:
        False); ``state`` None deletes. Same rules as ``RedisStateStore.commit``."""
        return [c != 0 for c in await self.commit_codes(writes)]

    async def commit_codes(self, writes: list) -> list[int]:
        """``commit`` with ``RedisStateStore.commit_codes``'s codes (2: applied, the stream's
        settings missing)."""
        now = time.monotonic()
        self.expire(now)
        res = []
        for w in writes:
            cur = self.data.get(w.request_id)
            if w.state is None:
                if cur and cur[1] > w.seq:
                    res.append(0)
                else:
                    self._drop(w.request_id)
                    res.append(1)
            elif cur and cur[1] >= w.seq:
                res.append(0)
            else:
                self.data[w.request_id] = (w.state, w.seq)
                self._touch(w.request_id, now)
                if w.at >= 0 and w.data:  # at the recorded offset: a redelivered chunk rewrites
                    buf = self.pieces.setdefault(w.request_id, bytearray())
                    if len(buf) >= w.at:  # (shorter: lost; left short, as the Redis store does)
                        buf[w.at:w.at + len(w.data)] = w.data
                code = 1
                if w.settings:
                    self.settings[w.request_id] = w.settings
                elif w.settings_kept and cur is None and w.request_id not in self.settings:
                    code = 2
                res.append(code)
        while len(self.data) > self.max_entries:
            self._drop(next(iter(self.data)))
        return res

    async def read_settings(self, request_id: str) -> bytes | None:
        """As ``RedisStateStore.read_settings``."""
        return self.settings.get(request_id)

    async def read_pieces(self, request_id: str, start: int, end: int) -> bytes:
        """As ``RedisStateStore.read_pieces`` (``StoreReadError`` when fewer bytes are kept)."""
        if end <= start:
            return b""
        got = bytes(self.pieces.get(request_id, b"")[start:end])
        if len(got) != end - start:
            raise StoreReadError(f"pieces of {request_id!r} hold {start + len(got)} bytes, the checkpoint "
                                 f"records {end}", request_id)
        return got
