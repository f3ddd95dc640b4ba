"""Per-stream append-only pieces next to a stream's checkpoint: what grows with the output and
is read only now and then, kept out of the state that is read and rewritten every chunk (issue
13 item 5, one mechanism for every stream kind): a Responses stream's log
(``worker.core.responses.log``: closed items, the open item's text and logprob entries) and a
chat stream's open tool-call body beyond what its parser still reads (``worker.core.stream``,
"Bounded state").

* ``commit(request_id, state, seq, at, data)``: ONE fenced write of the checkpoint and the
  piece bytes of the same chunk: the bytes go to offset ``at`` (the length the previous state
  recorded), so a redelivered chunk rewrites the same bytes instead of appending twice (pieces
  shorter than ``at`` were lost: the bytes are not written, so readers see the loss); refused
  (False) when a checkpoint with ``seq`` >= this one is stored. The Redis store runs it in its
  batched commit (``RedisStateStore.commit`` with ``StateWrite.at`` / ``data``: the Kafka
  worker's checkpoint writer puts every waiting stream's checkpoint and pieces in one EVALSHA);
* ``read(request_id, start, end)``: bytes ``[start, end)`` of the pieces; a reader truncates to
  the length its checkpoint records (bytes past it are a crashed chunk's, rewritten next time);
* ``delete(request_id, seq)``: fenced delete of the checkpoint and its pieces together.

Redis layout: the checkpoint of ``RedisStateStore`` (``{prefix}{<request_id>}``: seq digits then
state; a key of its older hash layout is read too) plus a string ``{prefix}{<request_id>}:pieces``
in the same Cluster hash slot (same hash tag), sharing its TTL (``RedisPieceStore.commit``
refreshes it on every write; the Kafka worker on the pieces' first write and then every quarter
TTL, ``StateWrite.touch``) and deleted with it.
"""
from __future__ import annotations

from worker.state.redis_store import (
    PIECES_SUFFIX,
    RedisStateStore,
    StateWrite,
    StoreReadError,
)

__all__ = ["RedisPieceStore", "MemoryPieceStore", "PIECES_SUFFIX"]


class RedisPieceStore:
    """Checkpoints with their pieces, over a ``RedisStateStore`` (its client, prefix, TTL and
    batched fenced commit)."""

    def __init__(self, store: RedisStateStore):
        self.store = store

    def pieces_key(self, request_id: str) -> str:
        """Redis key of a stream's pieces (same hash tag as its checkpoint)."""
        return self.store.key(request_id) + PIECES_SUFFIX

    async def commit(self, request_id: str, state: bytes, seq: int, at: int, data: bytes) -> bool:
        """Fenced write of a chunk's checkpoint and its piece bytes at offset ``at`` (one
        EVALSHA). False when a newer or equal ``seq`` is stored. Raises ``StoreWriteError`` /
        ``StoreConnectError``."""
        return (await self.store.commit([StateWrite(request_id, state, int(seq), int(at), data, touch=True)]))[0]

    async def read(self, request_id: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stream's pieces (``RedisStateStore.read_pieces``)."""
        return await self.store.read_pieces(request_id, start, end)

    async def delete(self, request_id: str, seq: int) -> bool:
        """Fenced delete of a stream's checkpoint and pieces (False when a newer seq is stored).
        Raises ``StoreWriteError`` / ``StoreConnectError``."""
        return (await self.store.commit([StateWrite(request_id, None, int(seq))]))[0]


class MemoryPieceStore:
    """In-process ``RedisPieceStore`` (same fencing and offset rule; no TTL): tests, one worker."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, tuple[bytes, int]] = {}
        self.pieces: dict[str, bytearray] = {}

    async def commit(self, request_id: str, state: bytes, seq: int, at: int, data: bytes) -> bool:
        """As ``RedisPieceStore.commit``."""
        cur = self.checkpoints.get(request_id)
        if cur is not None and cur[1] >= seq:
            return False
        buf = self.pieces.setdefault(request_id, bytearray())
        if data and len(buf) >= at:  # (shorter: lost; left short, as the Redis store does)
            buf[at:at + len(data)] = data
        self.checkpoints[request_id] = (state, seq)
        return True

    async def read(self, request_id: str, start: int, end: int) -> bytes:
        """As ``RedisPieceStore.read``."""
        got = bytes(self.pieces.get(request_id, b"")[start:end])
        if len(got) != max(end - start, 0):
            raise StoreReadError(f"pieces of {request_id!r} shorter than recorded", request_id)
        return got

    async def delete(self, request_id: str, seq: int) -> bool:
        """As ``RedisPieceStore.delete``."""
        cur = self.checkpoints.get(request_id)
        if cur is not None and cur[1] > seq:
            return False
        self.checkpoints.pop(request_id, None)
        self.pieces.pop(request_id, None)
        return True
