"""Stream checkpoints: the commit order of a stream chunk with its typed error per step, the
stored value (``Checkpoint``: state + replay window, msgpack), and the checkpoint writer (step 3).

Per-chunk commit order, one typed error per step (the non-streaming path is steps 1, 2, 4):

1. produce the reply (``ReplyProduceError``; a reply refused for a reason of its own is
   dead-lettered by ``worker.transport.publisher``);
2. broker ack, ``acks=all`` (``ReplyAckError``);
3. write of the checkpoint covering the chunk to the state store (``StateCommitError``; waits out
   an outage up to ``--state-store-outage-deadline``, then ``DependencyOutage``);
4. offset commit up to the lowest offset not through step 3 (``OffsetCommitError``; logged and
   retried at the next commit interval).

A failure of 1-2 (after a dead-letter attempt) or of 3 (after the outage deadline) stops the
worker without committing: the chunk is redelivered.

``CheckpointWriter`` (step 3): checkpoints handed to it (``add``) are coalesced per stream (the
latest seq's value, the merged chunks' piece bytes joined into one write at the first one's
offset, every merged record's offsets: memory stays one checkpoint per stream however
long the store is away) and written in one ``store.commit`` per wake-up (Redis: one EVALSHA
running one MGET and one SET/DEL per stream: ``worker.state.redis_store``); while the store
is unavailable the batch is kept, what arrives meanwhile merges into it, and it is retried with
backoff. Only once a checkpoint is durable are its records finished (``on_done``); after the
outage deadline its records are abandoned (never committed) and the worker stops.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from worker.state import StateStoreError, StateWrite
from worker.state import formats as state_formats
from worker.transport.outage import DependencyOutage, OutageClock
from worker.transport.records import HDR_SEQ

log = logging.getLogger(__name__)

__all__ = ["StreamStepError", "ReplyProduceError", "ReplyAckError", "StateCommitError", "OffsetCommitError",
           "ReplayEntry", "Checkpoint", "encode_checkpoint", "decode_checkpoint", "decode_stored", "CHECKPOINT_VERSION",
           "UnreadableCheckpoint", "unreadable_reason",
           "CheckpointWrite", "CheckpointWriter"]

CHECKPOINT_VERSION = 1


# --------------------------------------------------------------------------- typed errors ----
class StreamStepError(Exception):
    """A step of the per-chunk commit order failed; ``step`` names it."""

    step = "stream"


class ReplyProduceError(StreamStepError):
    """(1) the producer refused the reply (and its dead letter)."""

    step = "produce"


class ReplyAckError(StreamStepError):
    """(2) the broker did not acknowledge the reply (nor its dead letter)."""

    step = "ack"


class StateCommitError(StreamStepError):
    """(3) the checkpoint write failed (after retries); wraps a ``StateStoreError``."""

    step = "state"


class OffsetCommitError(StreamStepError):
    """(4) the offset commit failed (logged; retried at the next commit)."""

    step = "offsets"


# ---------------------------------------------------------------------------- checkpoints ----
class ReplayEntry(msgspec.Struct, array_like=True):
    """One published reply of a stream: enough to publish the identical record again."""

    seq: int
    status: int
    end: bool
    kind: str | None
    value: bytes


class Checkpoint(msgspec.Struct, array_like=True):
    """The stored value of a stream: format version, state after the stored seq (None = ended)
    and the replay window (ascending seq); ``gap_from``: a tombstone of a stream that a gap ended
    (a missing chunk, or chunk 0 of an unknown stream), the first missing seq: chunks from it on
    were never answered alone (-1 otherwise, and not stored: a trailing item that releases before
    it ignore, msgspec reading an array-like struct)."""

    v: int
    state: bytes | None
    replies: list[ReplayEntry]
    gap_from: int = -1


_ckpt_encoder = msgspec.msgpack.Encoder()
_ckpt_decoder = msgspec.msgpack.Decoder(Checkpoint)


def encode_checkpoint(state: bytes | None, replies: list[ReplayEntry], gap_from: int = -1) -> bytes:
    """The stored value (msgpack ``Checkpoint``) of a stream's ``state`` and replay window (and,
    for the tombstone of a stream a gap ended, ``gap_from`` >= 0: a fourth item; without it the
    bytes are the three items every release wrote)."""
    if gap_from < 0:
        return _ckpt_encoder.encode((CHECKPOINT_VERSION, state, replies))
    return _ckpt_encoder.encode(Checkpoint(CHECKPOINT_VERSION, state, replies, gap_from))


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Decode checkpoint bytes of this release's layout (``state_formats.CURRENT``). Raises
    ``msgspec.DecodeError``/``ValidationError`` on a foreign value."""
    return _ckpt_decoder.decode(data)


class UnreadableCheckpoint(ValueError):
    """A stored checkpoint value this release cannot read (``decode_stored``)."""


def decode_stored(data: bytes) -> Checkpoint:
    """A stored checkpoint value of any format this release reads (``worker.state.formats``:
    probed, converted to the current layout, decoded). Raises ``UnreadableCheckpoint`` naming
    what was found (another release's envelope / state version, not msgpack, ...)."""
    try:
        return _ckpt_decoder.decode(state_formats.checkpoint_in(data))
    except (state_formats.UnreadableValue, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise UnreadableCheckpoint(str(e)) from None


def unreadable_reason(rid: str, found: str, before: int = -1) -> str:
    """The message of the 409 that ends a stream whose stored state cannot be read (``found``:
    what the store holds; ``before``: the first seq it did not answer, when known, else -1)."""
    at = f" (before {HDR_SEQ} {before})" if before > 0 else ""
    return (f"stream {rid!r}: its stored state{at} is unreadable ({found}): an unreadable type or version, "
            f"written by another release or not by derender-worker (this release reads state formats "
            f"{sorted(state_formats.FORMATS)}); the stream state was lost or expired; stream ended")


# --------------------------------------------------------------------------------- writer ----
@dataclass
class CheckpointWrite:
    """A checkpoint to write: the latest of a stream's checkpoints produced since its last write
    (``n`` of them merged, their input ``offsets`` all finished once it is durable)."""

    st: Any  # the partition (``failed``, ``tp``)
    rid: str
    seq: int
    value: bytes  # encoded checkpoint
    offsets: list
    s: Any = None  # the stream (``pending_writes``: never evicted while a write is pending)
    n: int = 1  # checkpoints merged into this one
    #: the chunks' piece bytes, written at offset ``at`` with the checkpoint (``StateWrite``;
    #: -1: the stream keeps no pieces)
    at: int = -1
    data: bytes = b""
    touch: bool = False  # refresh the side keys' TTL (``StateWrite.touch``)
    #: the stream's write-once settings, sent until a write carrying them is applied
    #: (``StateWrite.settings``), and whether the stream keeps settings (``settings_kept``)
    settings: bytes = b""
    settings_kept: bool = False


def _merge(into: dict, wr: CheckpointWrite) -> None:
    """Add ``wr`` to the writes waiting in ``into`` (``(id(partition), rid) -> CheckpointWrite``):
    one write per stream, the latest seq's value, every merged record's offsets."""
    k = (id(wr.st), wr.rid)
    cur = into.get(k)
    if cur is None:
        into[k] = wr
        return
    cur.settings = cur.settings or wr.settings
    if wr.seq >= cur.seq:
        cur.seq, cur.value = wr.seq, wr.value
        cur.touch = cur.touch or wr.touch
        cur.settings_kept = wr.settings_kept
        if not wr.settings_kept:  # (an ended stream's tombstone: its settings are not read again)
            cur.settings = b""
        if wr.at < 0:  # (an ended stream's tombstone: its pieces are not read again)
            cur.at, cur.data = -1, b""
        elif 0 <= cur.at <= wr.at <= cur.at + len(cur.data):  # consecutive chunks: one write
            cur.data = cur.data[:wr.at - cur.at] + wr.data
        else:
            cur.at, cur.data = wr.at, wr.data
    cur.offsets.extend(wr.offsets)
    cur.n += wr.n


class CheckpointWriter:
    """Step 3 (module docstring) over ``store`` (``commit([StateWrite])``), waiting on ``outage``
    (an ``OutageClock``). ``on_done(st, offset)``: a record whose checkpoint is durable is
    finished; ``on_abandon(st, offset)``: one that will never be (its partition failed);
    ``on_fatal(err)``: the store stayed away past the deadline (``DependencyOutage``, its cause a
    ``StateCommitError``) or a write failed otherwise (``StateCommitError``); ``stats``: counts
    ``state_writes``."""

    def __init__(self, store: Any, outage: OutageClock, *, on_done, on_abandon, on_fatal, stats: Any):
        self.store = store
        self.outage = outage
        self.on_done = on_done
        self.on_abandon = on_abandon
        self.on_fatal = on_fatal
        self.stats = stats
        self._pending: dict[tuple[int, str], CheckpointWrite] = {}
        self._wake = asyncio.Event()
        self._inflight: list[CheckpointWrite] = []  # the batch being written

    def write_format(self) -> int:
        """The stored-state format written now: the store's ``formats`` selector's choice
        (``worker.state.formats``), else the current layout."""
        sel = getattr(self.store, "formats", None)
        return sel.write if isinstance(sel, state_formats.FormatSelector) else state_formats.CURRENT

    def add(self, wr: CheckpointWrite) -> None:
        """Queue ``wr`` (its records' reply is acked): written at the next wake-up."""
        _merge(self._pending, wr)
        self._wake.set()

    def busy_with(self, st: Any) -> bool:
        """Whether a checkpoint of partition ``st`` waits or is being written."""
        return any(w.st is st for w in self._pending.values()) or any(w.st is st for w in self._inflight)

    def _fail(self, writes: list[CheckpointWrite]) -> None:
        for wr in writes:
            wr.st.failed = True  # never commit past a record whose checkpoint was lost
            for off in wr.offsets:
                self.on_abandon(wr.st, off)

    async def run(self) -> None:
        """Write what waits, batch by batch, until cancelled (module docstring)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            batch, self._pending = self._pending, {}
            delay = 0.1
            while True:
                latest = self._inflight = list(batch.values())
                fmt = self.write_format()
                writes = [StateWrite(w.rid, state_formats.checkpoint_out(w.value, fmt), w.seq, w.at, w.data, w.touch,
                                     state_formats.settings_out(w.settings, fmt), w.settings_kept) for w in latest]
                try:
                    commit = getattr(self.store, "commit_codes", None) or self.store.commit
                    res = await commit(writes)
                    self.outage.up()
                    break
                except StateStoreError as e:
                    self.outage.down(f"checkpoint write of {len(writes)} stream(s): {type(e).__name__}: {e}")
                    if not self.outage.expired:
                        await asyncio.sleep(min(delay, max(0.01, self.outage.deadline_s - self.outage.down_for)))
                        delay = min(2.0, delay * 2)
                        for wr in self._pending.values():  # what piled up meanwhile joins the retry
                            _merge(batch, wr)
                        self._pending = {}
                        continue
                    err: Exception = DependencyOutage(self.outage.give_up_line())
                    err.__cause__ = StateCommitError(f"checkpoint write failed: {type(e).__name__}: {e}")
                except Exception as e:  # not a store error: a bug; stop without committing
                    err = StateCommitError(f"checkpoint write of {len(writes)} stream(s) failed: "
                                           f"{type(e).__name__}: {e}")
                    log.error("%s; stopping (the chunks will be redelivered)", err)
                self._fail(latest)
                self._inflight = []
                self.on_fatal(err)
                res = None
                break
            if res is None:
                continue
            self.stats.state_writes += 1
            for w, ok in zip(latest, res, strict=False):
                if ok == 3:
                    log.warning("stream %r: checkpoint at seq %d not written: the stored key has an unexpected "
                                "type or shape (another release's or a foreign value; left to its TTL)", w.rid, w.seq)
                    if w.settings and w.s is not None:
                        w.s.settings_stored = False
                elif not ok:
                    log.warning("stream %r: checkpoint at seq %d fenced off (a newer one is stored: another "
                                "worker advanced the stream)", w.rid, w.seq)
                    if w.settings and w.s is not None:  # its settings were not written: the next write carries them
                        w.s.settings_stored = False
                elif ok == 2 and w.s is not None:  # the store lost them (its checkpoint too): sent again
                    w.s.settings_stored = False
                    log.warning("stream %r: its settings were missing from the state store at seq %d; "
                                "written again with its next checkpoint", w.rid, w.seq)
            for wr in latest:
                if wr.s is not None:
                    wr.s.pending_writes -= wr.n
                for off in wr.offsets:
                    if wr.st.failed:  # a record before it was lost: never commit past that one
                        self.on_abandon(wr.st, off)
                    else:
                        self.on_done(wr.st, off)
            self._inflight = []
