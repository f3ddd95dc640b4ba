"""Per-stream append-only pieces next to a stream's checkpoint: what grows with the output of a
Responses stream (``worker.core.responses.log``: closed items, the open item's text and logprob
entries), kept out of the state that is read and rewritten every chunk.

A small interface, meant to be swapped for the performance issue's piece mechanism (one
mechanism for both) when it lands:

* ``commit(request_id, state, seq, at, data)``: ONE fenced write of the checkpoint and the
  piece bytes of the same chunk: the bytes go to offset ``at`` (the length the previous state
  recorded), so a redelivered chunk rewrites the same bytes instead of appending twice; refused
  (False) when a checkpoint with ``seq`` >= this one is stored, exactly as
  ``RedisStateStore.commit``;
* ``read(request_id, start, end)``: bytes ``[start, end)`` of the pieces; a reader truncates to
  the length its checkpoint records (bytes past it are a crashed chunk's, rewritten next time);
* ``delete(request_id, seq)``: fenced delete of the checkpoint and its pieces together.

Redis layout: the checkpoint of ``RedisStateStore`` (``{prefix}{<request_id>}``: seq digits then
state; a key of its older hash layout is read too) plus a string ``{prefix}{<request_id>}:pieces`` in the same Cluster hash slot (same
hash tag), sharing its TTL (both refreshed by every commit) and deleted with it.
"""
from __future__ import annotations

from worker.state.redis_store import (
    _CONN_ERRORS,
    SEQ_DIGITS,
    RedisStateStore,
    StoreConnectError,
    StoreDeleteError,
    StoreReadError,
    StoreWriteError,
    seq_digits,
)

__all__ = ["RedisPieceStore", "MemoryPieceStore", "PIECES_SUFFIX"]

PIECES_SUFFIX = ":pieces"

# The stored seq of KEYS[1] as SEQ_DIGITS digits (string layout), or false when absent; a key of the
# older hash layout (GET refused: WRONGTYPE) gives its q, zero-padded.
_STORED_SEQ = """
local function stored_seq(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    local h = redis.call('HGET', k, 'q')
    if not h then return false end
    return string.rep('0', SEQ_DIGITS_N - string.len(h)) .. h
  end
  if v then return string.sub(v, 1, SEQ_DIGITS_N) end
  return false
end
""".replace("SEQ_DIGITS_N", str(SEQ_DIGITS))
# KEYS[1] checkpoint, KEYS[2] pieces; ARGV: stored value (seq digits + state), seq digits, ttl_ms,
# at, data. 1 = written, 0 = fenced off (stored seq >= seq). SETRANGE at the recorded length: idempotent.
_CAS_COMMIT = _STORED_SEQ + """
local cur = stored_seq(KEYS[1])
if cur and cur >= ARGV[2] then return 0 end
if string.len(ARGV[5]) > 0 then redis.call('SETRANGE', KEYS[2], tonumber(ARGV[4]), ARGV[5]) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return 1
"""
# KEYS[1] checkpoint, KEYS[2] pieces; ARGV: seq digits. 1 = deleted (or absent), 0 = fenced off.
_CAS_DELETE = _STORED_SEQ + """
local cur = stored_seq(KEYS[1])
if cur and cur > ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""


class RedisPieceStore:
    """Checkpoints with their pieces, over a ``RedisStateStore`` (its client, prefix and TTL)."""

    def __init__(self, store: RedisStateStore):
        self.store = store
        self._commit = store.client.register_script(_CAS_COMMIT)
        self._delete = store.client.register_script(_CAS_DELETE)

    def pieces_key(self, request_id: str) -> str:
        """Redis key of a stream's pieces (same hash tag as its checkpoint)."""
        return self.store.key(request_id) + PIECES_SUFFIX

    async def commit(self, request_id: str, state: bytes, seq: int, at: int, data: bytes) -> bool:
        """Fenced write of a chunk's checkpoint and its piece bytes at offset ``at`` (one Lua
        call). False when a newer or equal ``seq`` is stored. Raises ``StoreWriteError`` /
        ``StoreConnectError``."""
        keys = [self.store.key(request_id), self.pieces_key(request_id)]
        try:
            q = seq_digits(int(seq))
            return bool(await self._commit(keys=keys, args=[q + state, q, self.store.ttl_ms, int(at), data]))
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis write failed: {type(e).__name__}: {e}", request_id) from e
        except Exception as e:  # redis.exceptions.RedisError (script errors included)
            raise StoreWriteError(f"redis write failed: {type(e).__name__}: {e}", request_id) from e

    async def read(self, request_id: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stream's pieces (``b""`` for an empty range). Raises
        ``StoreReadError`` when fewer bytes are stored (pieces lost: the stream cannot go on)."""
        if end <= start:
            return b""
        try:
            got = bytes(await self.store.client.getrange(self.pieces_key(request_id), start, end - 1))
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis read failed: {type(e).__name__}: {e}", request_id) from e
        except Exception as e:
            raise StoreReadError(f"redis read failed: {type(e).__name__}: {e}", request_id) from e
        if len(got) != end - start:
            raise StoreReadError(f"pieces of {request_id!r} hold {start + len(got)} bytes, the checkpoint "
                                 f"records {end}", request_id)
        return got

    async def delete(self, request_id: str, seq: int) -> bool:
        """Fenced delete of a stream's checkpoint and pieces (False when a newer seq is stored)."""
        keys = [self.store.key(request_id), self.pieces_key(request_id)]
        try:
            return bool(await self._delete(keys=keys, args=[seq_digits(int(seq))]))
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis delete failed: {type(e).__name__}: {e}", request_id) from e
        except Exception as e:
            raise StoreDeleteError(f"redis delete failed: {type(e).__name__}: {e}", request_id) from e


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
        if data:
            if len(buf) < at:
                buf.extend(b"\0" * (at - len(buf)))  # SETRANGE pads with zero bytes
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
