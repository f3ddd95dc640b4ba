"""Chunked streaming in the Kafka worker: one engine-output record = one streaming chunk
(``DerenderChatStreamRequest`` / ``DerenderCompletionStreamRequest``) of a request; the worker
publishes one reply record per chunk carrying the OpenAI stream chunk(s) it yields.

Used by ``worker.transport.consumer.KafkaDerenderWorker`` for every input record that has a
``derender-seq`` header (user-facing reference: docs/streaming.md, "Streaming records"; docs/kafka.md).

Design
======
* **Identity and order.** The stream is the record key (the request id). All chunks of a stream
  share the key, hence the partition, hence arrive in order. ``derender-seq`` (ASCII decimal)
  numbers the chunks of a stream 0, 1, 2, ... without holes.
* **Sequential per stream, parallel across streams.** Each live stream has a queue and at most one
  runner task; the runner sends ``(value, state_bytes, seq, kind)`` to the derender pool and gets
  ``(reply, new_state_bytes)`` back, so chunk k+1 always sees chunk k's state while different
  streams run in parallel in the pool.
* **State.** The owner keeps each live stream (state bytes, next expected seq, replay window) in
  memory for its assigned partitions and writes it through to the state store (Redis:
  ``worker.state.redis_store``), batched: every write waiting when the writer wakes goes into one
  ``commit([...])`` (one EVALSHA), coalesced per request id (latest seq wins; fenced on seq). A worker
  that meets a stream it does not hold (new partition owner after a rebalance or a crash) loads
  it from the store (one ``get_many`` per poll, in a background task: the fetch loop never waits
  for the store) and continues. One it meets at its chunk 0 is not read: whatever is stored, chunk
  0 and the ones after it (a redelivered chunk 0 brings them all again: offsets commit in order)
  are re-derendered from no state (deterministic: identical replies) and their checkpoint writes
  are fenced "only if absent or older", so a newer stored checkpoint is never overwritten. On partition revoke the in-memory streams of the partition are
  dropped. Idle streams are evicted from memory (``worker.transport.stream_memory``); until then a
  stream with nothing running or waiting is *parked*: its state and replay window packed into one
  msgpack value, unpacked when its next chunk comes (few, large allocations per idle stream, so
  that their memory goes back to the OS once they are evicted).
* **Stored formats.** A stored value is read in any format this release reads and written in the
  format the pool selects (``worker.state.formats``; docs/delivery.md, "Rolling upgrades across
  releases"); one it cannot read (another Redis type, another release's version) ends its stream
  at its next chunk with one 409 (``LiveStream.unreadable``), never the worker.
* **State store outage.** Reads and checkpoint writes wait for the store (backoff, coalescing
  the writes that pile up) for at most ``--state-store-outage-deadline`` seconds
  (``worker.transport.outage``); then one line and ``DependencyOutage`` (exit status 2). Streams
  held in memory keep being derendered and answered meanwhile (their offsets commit once their
  checkpoints are written); streams that must be loaded wait; non-streaming records never wait.
* **Settings** (chat/completion streams): the core's write-once ``StreamSettings`` come with the
  first chunk's outcome, are held in the stream (``LiveStream.settings``, packed with it when
  parked) and written with its first checkpoint write (the store's ``:settings`` key; sent again
  when that write was fenced off or the store reports them lost). A pool process whose settings
  cache misses gets them from memory (at most ``SETTINGS_SEND_MAX`` bytes: with every chunk; more:
  when it asks, ``needs_settings``); a new owner reads them from the store once
  (``stored_settings``).
* **Checkpoint** (the stored value, msgpack ``Checkpoint``): the state after chunk ``q`` (stored
  with seq ``q``; None once the stream ended) plus the *replay window*: the reply values of the
  stream's recent chunks (every chunk whose input offset is not known committed, and at least the
  last ``--stream-replay-window``).
* **Per-chunk commit order**, one typed error per step: (1) produce the reply
  (``ReplyProduceError``), (2) broker ack, ``acks=all`` (``ReplyAckError``), (3) state write of
  the checkpoint covering the chunk (``StateCommitError``), (4) offset commit up to the lowest
  offset not through step 3 (``OffsetCommitError``; logged and retried, like the non-streaming
  path). A failure of 1-2 (after a dead-letter attempt) or of 3 (after the outage deadline) stops
  the worker without committing: the chunk is redelivered.
* **Redelivery / duplicates.** A chunk with ``seq`` < next expected is a duplicate: when its reply
  is in the replay window, the identical value (and headers) is published again; otherwise it is
  skipped (it is older than the window and its offset was committed, i.e. its reply was acked
  before). Because a checkpoint is written only after its replies are acked and offsets are
  committed only after the checkpoint, every redelivered chunk after a crash is either in the
  stored window (re-published byte-identically) or beyond the stored seq (re-derendered from the
  stored state: deterministic, byte-identical).
* **Gaps.** A chunk with ``seq`` > next expected is held (its offset stays uncommitted) until the
  missing ones arrive, at most ``--stream-gap-timeout`` seconds since the stream last progressed;
  then one 409 error reply ends the stream (``derender-stream-end: 1``). A stream with no state
  and no chunk 0 (unknown stream: its state was lost or expired, or chunk 0 was never sent) is a
  gap too and ends the same way, the 409 saying so. A held chunk leaves the partition's in-flight
  window (``st.wait_gap``): the partition's other records go on (only its commit waits), bounded
  by the ``stream-gap`` pause (``worker.transport.pauses``). A stream whose stored checkpoint
  cannot be read here (``stream_registry.cannot_continue``) is not waited for: its next new chunk
  ends it with a 409 at once.
* **End of stream.** The reply of the chunk that completes the request (every choice finished,
  usage sent), and every error reply, carries ``derender-stream-end: 1``. Its checkpoint is a
  tombstone (state None, window kept; a gap's also keeps the first missing seq,
  ``Checkpoint.gap_from``). A stream whose request completed has its key deleted once the offsets
  past it are committed (fenced on the seq), otherwise its TTL removes it; a stream ended by an
  error reply (413, 500, a 4xx, every 409), whose client may still send chunks, keeps its
  tombstone until the TTL, so that every owner answers those chunks alike, at once, and a
  stream ends once (``stream_registry.keeps_tombstone``). Later chunks of an ended stream get a
  409 error reply (duplicates are replayed/skipped as above).
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any, NamedTuple

from worker.core.service import error_body_for, record_api
from worker.logs import record_fields
from worker.state import formats as state_formats
from worker.transport.checkpoints import (
    Checkpoint,
    CheckpointWrite,
    CheckpointWriter,
    OffsetCommitError,
    ReplayEntry,
    ReplyAckError,
    ReplyProduceError,
    StateCommitError,
    StreamStepError,
    decode_checkpoint,
    encode_checkpoint,
    unreadable_reason,
)
from worker.transport.context import StreamContext
from worker.transport.deadletter import DeadLetterError
from worker.transport.jobs import JobOutcome, StreamOutcome, body_request_id, is_object_value
from worker.transport.outage import OutageClock
from worker.transport.records import (
    HDR_SEQ,
    HDR_STREAM_END,
    SEQ_MAX,
    STREAM_KEY_MAX_BYTES,
    kind_header,
    parse_seq,
    record_created,
    stream_id,
)
from worker.transport.stream_memory import StreamMemory
from worker.transport.stream_registry import (
    _GAP,
    _park,
    _Stream,
    _unpark,
    drop_streams,
    end_stream,
    end_unreadable,
    error_entry,
    held_offsets,
    held_pieces,
    record_pieces,
    stored_checkpoint,
    stream_api,
    take_held,
    trim_committed,
)

log = logging.getLogger(__name__)

__all__ = ["StreamRouter",
           # (defined in worker.transport.checkpoints, re-exported for existing imports)
           "StreamStepError", "ReplyProduceError", "ReplyAckError", "StateCommitError", "OffsetCommitError",
           "ReplayEntry", "Checkpoint", "encode_checkpoint", "decode_checkpoint"]

# ------------------------------------------------------------------------------- router ----


def _bad_chunk(msg, seq: int | None) -> str | None:
    """Why stream record ``msg`` (with parsed ``seq``) cannot be handed to a stream, or None."""
    if msg.key is None:
        return "stream chunk without a key (the key must be the request id)"
    if len(msg.key) > STREAM_KEY_MAX_BYTES:
        return f"stream chunk key of {len(msg.key)} bytes; at most {STREAM_KEY_MAX_BYTES} allowed"
    if seq is None:
        return f"invalid {HDR_SEQ} header: expected ASCII decimal digits, at most {SEQ_MAX}"
    return None


async def _answer_too_large(ctx: StreamContext, st, s: _Stream | None, msg, plan, err, write: bool, rid: str | None):
    """Reply ``plan`` of ``msg`` is larger than ``--max-request-size`` (``err``: the 413
    ``ReplyTooLarge``): dead-letter the record in full (retried until acked), and return the
    small 413 error reply to the same address that replaces ``plan``. For a new chunk of
    stream ``s`` (``write``) that reply ends the stream (``derender-stream-end: 1``): later
    chunks get the ended-stream 409, so no answer looks complete with a chunk missing."""
    small = await ctx.publisher.replace_too_large(st, msg, plan, err, s.rid if s else rid)
    if s is not None and write and not small.is_dead_letter:
        end_stream(s, err.status)
        if not any(k == HDR_STREAM_END for k, _ in small.headers):
            small.headers.append((HDR_STREAM_END, b"1"))
        log.warning("stream %r: chunk %s %d answered 413 (%s); stream ended", s.rid, HDR_SEQ,
                    parse_seq(msg), err.message,
                    extra=record_fields(msg.topic, msg.partition, msg.offset, s.rid))
    return small


class PiecesWrite(NamedTuple):
    """A chunk's piece bytes to write with its checkpoint (``CheckpointWrite`` fields ``at``,
    ``data``, ``touch``: offset, bytes, refresh the pieces' TTL; ``at`` -1: no pieces)."""

    at: int = -1
    data: bytes = b""
    touch: bool = False


NO_PIECES = PiecesWrite()


def keep_pieces(store: Any, s: _Stream, out) -> PiecesWrite:
    """The pieces write of outcome ``out`` of stream ``s`` (kept in ``s.pieces`` too); the
    pieces' TTL is set with their first bytes, then refreshed every quarter TTL."""
    if not out.pieces_len:
        return NO_PIECES
    at = out.pieces_len - len(out.append)
    record_pieces(s, at, out.append)
    now = time.monotonic()
    touch = (at == 0 and bool(out.append)) or now - s.pieces_touched > store_ttl_s(store) / 4
    if touch:
        s.pieces_touched = now
    return PiecesWrite(at, out.append, touch)


#: settings at most this long go to the pool with every chunk of a stream held here (a pool process
#: that has them cached skips their decode; one that has not decodes them at once); longer ones go
#: only when a pool process asks (``needs_settings``: one more pool call, no per-chunk copy of up to
#: 64 KiB of stop strings)
SETTINGS_SEND_MAX = 2048
#: the stream kinds whose write-once settings the store keeps (``jobs.derender_stream_job``:
#: ``settings_aside=True``; a Responses stream keeps its own state)
SETTINGS_KINDS = ("chat-stream", "completion-stream")


async def submit_chunk(ctx: StreamContext, store: Any, outage: OutageClock, s: _Stream, msg, seq: int,
                       kind: str | None):
    """Derender chunk ``msg`` of ``s`` in the pool (``ctx.submit``); when the core asks for the
    stream's stored write-once settings (a pool process without them cached: sent from memory,
    or read from ``store`` by a new owner) or stored piece bytes (a call closes, a Responses item
    or stream ends: rare), once more with them. An outcome that still asks after that is a 500
    (``crash`` says why), never an empty reply."""
    settings = s.settings if s.settings is not None and len(s.settings) <= SETTINGS_SEND_MAX else None
    pieces = None
    created = record_created(msg)
    out = await ctx.submit(msg.value, s.state, seq, kind, created, pieces, settings)
    for _ in range(2):
        if out.needs_settings and settings is None:
            settings = s.settings if s.settings is not None else await stored_settings(store, outage, s)
        elif out.needs_pieces is not None and pieces is None:
            pieces = await stored_pieces(store, outage, s, *out.needs_pieces)
        else:
            break
        if s.unreadable is not None:  # a side key of another Redis type: the stream ends with its 409
            why, s.unreadable = s.unreadable, None
            return StreamOutcome(error_body_for(stream_api(s, msg), why, 409, s.rid), 409, False, out.kind, None,
                                 is_object_value(msg.value or b""), seconds=out.seconds)
        out = await ctx.submit(msg.value, s.state, seq, kind, created, pieces, settings)
    if out.needs_settings or out.needs_pieces is not None:
        # the core still asks after it was given what it asked for: an internal inconsistency
        # (never an empty reply published as if derendered): the chunk gets a 500 and its stream ends
        what = "its settings" if out.needs_settings else f"piece bytes {out.needs_pieces}"
        why = f"the derender core asked again for {what} after they were given"
        out = StreamOutcome(error_body_for(stream_api(s, msg), f"internal error: {why}", 500, s.rid), 500, False,
                            out.kind, None,
                            is_object_value(msg.value or b""), crash=why, seconds=out.seconds)
    return out


async def stored_settings(store: Any, outage: OutageClock, s: _Stream) -> bytes:
    """Stream ``s``'s write-once settings from ``store`` (waiting out an outage on ``outage``),
    kept in ``s.settings``; ``b""`` when the store has none (lost or expired: the core answers
    the 409 "lost or expired")."""
    from worker.state import StoreConnectError, StoreKeyTypeError, StoreReadError
    try:
        got = await outage.retry(lambda: store.read_settings(s.rid), (StoreConnectError,))
    except StoreReadError as e:
        log.warning("stream %r: %s", s.rid, e)
        if isinstance(e, StoreKeyTypeError):
            s.unreadable = unreadable_reason(s.rid, "its settings key holds another Redis type")
        return b""
    if got is None:
        return b""
    got = state_formats.settings_in(got)  # (another readable format: in this release's layout)
    s.settings, s.settings_stored = got, True
    return got


def settings_write(store: Any, s: _Stream) -> tuple[bytes, bool, bool]:
    """``(settings, settings_kept, touch)`` of stream ``s``'s next checkpoint write: its
    write-once settings when no write carrying them is applied or on its way (the checkpoint
    writer clears ``settings_stored`` again when that one is fenced off, or when the store
    reports them lost), whether it keeps settings in the store, and whether their TTL is due
    for a refresh (every quarter TTL)."""
    if s.ended or (s.settings is None and not s.settings_kept):
        return b"", False, False
    now = time.monotonic()
    data = b"" if s.settings_stored or s.settings is None else s.settings
    touch = not data and now - s.settings_touched > store_ttl_s(store) / 4
    if data or touch:
        s.settings_touched = now
    s.settings_stored = True
    return data, True, touch


def store_ttl_s(store: Any) -> float:
    """The state store's key TTL in seconds (a stream's pieces share it)."""
    ms = getattr(store, "ttl_ms", None)
    return ms / 1000.0 if ms else float(getattr(store, "ttl_s", 900.0))


async def stored_pieces(store: Any, outage: OutageClock, s: _Stream, start: int, end: int) -> tuple[int, bytes]:
    """``(start, bytes [start, end))`` of stream ``s``'s pieces: from memory when this worker
    wrote them, else from ``store`` (waiting out an outage on ``outage``); pieces the store lost
    give fewer bytes (the core answers that with the 409 "lost or expired")."""
    from worker.state import StoreConnectError, StoreKeyTypeError, StoreReadError
    got = held_pieces(s, start, end)
    if got is not None:
        return start, got
    stop = end if s.pieces is None else min(end, max(s.pieces_at, start))
    try:
        old = await outage.retry(lambda: store.read_pieces(s.rid, start, stop), (StoreConnectError,))
    except StoreReadError as e:
        log.warning("stream %r: %s", s.rid, e)
        if isinstance(e, StoreKeyTypeError):
            s.unreadable = unreadable_reason(s.rid, "its pieces key holds another Redis type")
        return start, b""
    rest = held_pieces(s, stop, end) if end > stop else b""
    return start, old + (rest or b"")


def _gap_why(s: _Stream, gap_timeout_s: float) -> str:
    """The 409 message of stream ``s`` ended by a gap (its held seqs) after ``gap_timeout_s``."""
    seqs = sorted(s.held)
    if not s.known and s.next_seq == 0:
        # chunks of a stream share its key, hence its partition, hence arrive in order: a later
        # chunk with no stored state means the state was lost or expired (state store
        # restarted without persistence, flushed, TTL passed) or chunk 0 was never produced
        return (f"unknown stream {s.rid!r}: no state for it; its stream state was lost or expired (or its "
                f"first chunk, {HDR_SEQ} 0, was never sent); got {HDR_SEQ} {', '.join(map(str, seqs))}, "
                f"waited {gap_timeout_s:g}s; stream ended")
    return (f"stream {s.rid!r}: chunk(s) {s.next_seq}..{seqs[0] - 1} missing after "
            f"{gap_timeout_s:g}s (held {HDR_SEQ} {', '.join(map(str, seqs))}); stream ended")


class StreamRouter:
    """The streaming half of a ``KafkaDerenderWorker`` (see the module docstring). ``ctx``: the
    ``StreamContext`` it works with (publisher, planner, the pool's ``submit``, the
    finished/abandoned/fatal callbacks, stats); it never sees the worker. ``store``: a
    ``RedisStateStore`` or ``MemoryStateStore``; ``outage``: the ``OutageClock`` reads and writes
    wait on (default: give up at the first failure); ``memory``: the ``StreamMemory`` eviction
    policy (default: 900 s idle, 20,000 streams)."""

    def __init__(self, ctx: StreamContext, store: Any, gap_timeout_s: float, replay_window: int,
                 outage: OutageClock | None = None, memory: StreamMemory | None = None):
        self.ctx = ctx
        self.store = store
        self.gap_timeout_s = gap_timeout_s
        self.replay_window = max(0, replay_window)
        self.outage = outage or OutageClock("stream state store", "state-store", 0.0)
        self.memory = memory or StreamMemory(900.0, 20000)
        self.parts: dict[int, Any] = {}  # id(partition) -> open partition (eviction, gauge)
        self.writer = CheckpointWriter(store, self.outage, on_done=ctx.finished, on_abandon=ctx.abandoned,
                                       on_fatal=ctx.fatal, stats=ctx.stats)
        self._writer: asyncio.Task | None = None
        self._bg: set[asyncio.Task] = set()
        self._answers: dict[int, set[asyncio.Task]] = {}  # id(partition) -> running answer() tasks
        self._acking: set[int] = set()  # id(partition) whose stream acker is awaiting a delivery

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._writer = asyncio.create_task(self.writer.run(), name="derender-state-writer")
        sweeper = asyncio.create_task(self.memory.run(self), name="derender-stream-sweeper")
        self._bg.add(sweeper)
        sweeper.add_done_callback(self._bg.discard)
        state_formats.start_advertising(self.store, self._bg)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        for t in list(self._bg):
            t.cancel()
        await asyncio.gather(*self._bg, return_exceptions=True)
        try:
            await self.store.close()
        except Exception:
            log.exception("closing the state store failed")

    def open_partition(self, st) -> None:
        st.streams = {}
        self.parts[id(st)] = st
        st.sacks = asyncio.Queue()
        st.tasks.append(asyncio.create_task(self._acker(st), name=f"derender-sack-{st.tp.topic}-{st.tp.partition}"))

    def held_offsets(self, st) -> set[int]:
        """Offsets of the records of ``st`` held behind gaps."""
        return held_offsets(st.streams)

    async def drain(self, st) -> None:
        """Wait until every stream record of ``st`` is finished except the held ones (gaps). Once
        the partition failed (a reply, dead letter or checkpoint of it was lost: the worker is
        stopping and nothing past that record is committed), wait only for the work still running,
        not for records that can no longer finish."""
        while True:
            busy = any(s.task is not None or s.loading for s in st.streams.values()) \
                or any(not t.done() for t in self._answers.get(id(st), ()))
            if not busy and st.sacks.empty() and id(st) not in self._acking \
                    and not self.writer.busy_with(st) \
                    and (st.failed or not (st.stream_inflight - self.held_offsets(st))):
                return
            await asyncio.sleep(0.02)

    def _fail(self, st, offsets) -> None:
        """Records of ``st`` that will not be answered/checkpointed (a step failed): never
        committed (they stay in ``st.inflight``, the partition is marked failed), capacity released."""
        st.failed = True
        for off in offsets:
            self.ctx.abandoned(st, off)

    def drop_partition(self, st) -> None:
        """Forget the partition's streams (revoke/close); held records stay uncommitted."""
        for off in drop_streams(st.streams):
            self.ctx.abandoned(st, off)
        self._answers.pop(id(st), None)
        self.parts.pop(id(st), None)

    # -- intake ----------------------------------------------------------------------------
    parse_seq = staticmethod(parse_seq)

    def intake(self, st, msgs: list) -> None:
        """Hand a poll's stream records of partition ``st`` to their streams, in order, without
        waiting: streams held in memory run at once, and so do new ones met at their chunk 0 (not
        read); other unknown ones are read from the store in one background ``get_many`` (their records queue meanwhile, and so do later ones of the same
        stream: order is kept per stream, never across streams)."""
        now = time.monotonic()
        new: list[str] = []
        for m in msgs:
            seq = self.parse_seq(m)
            if _bad_chunk(m, seq) is not None:
                self.dispatch(st, m)
                continue
            rid = stream_id(m.key)
            s = st.streams.get(rid)
            if s is None:
                # met at chunk 0: not read (module docstring, "State")
                s = st.streams[rid] = _Stream(rid, loading=seq != 0)
                if s.loading:
                    new.append(rid)
            _unpark(s)
            s.last_used = now
            s.queue.append(m)
            if s.loading:
                st.wait_store((m.offset,))  # (not in the in-flight window: it waits for the store)
            else:
                self._kick(st, s)
        if new:
            task = asyncio.create_task(self._load(st, new), name=f"derender-stream-load-{st.tp.partition}")
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        self.memory.enforce_cap(self)

    async def _load(self, st, rids: list[str]) -> None:
        """Read the streams ``rids`` of ``st`` from the store (waiting out an outage), then run them."""
        from worker.state import StoreConnectError
        from worker.transport.outage import DependencyOutage
        try:
            stored = await self.outage.retry(lambda: self.store.get_many(rids), (StoreConnectError,))
        except Exception as e:  # DependencyOutage (deadline), StoreReadError (malformed state)
            if not isinstance(e, DependencyOutage):
                log.error("reading %d stream state(s) failed: %s: %s; stopping (they will be redelivered)",
                          len(rids), type(e).__name__, e)
            for rid in rids:
                s = st.streams.get(rid)
                if s is not None and s.loading:
                    self._fail(st, [m.offset for m in s.queue if m is not _GAP])
                    s.queue.clear()
            self.ctx.fatal(e)
            return
        for rid in rids:
            s = st.streams.get(rid)
            if s is None or not s.loading:  # the partition was dropped meanwhile
                continue
            got = stored.get(rid)
            if got is not None and stored_checkpoint(s, got) is not None:
                log.info("stream %r resumed from the store at seq %d%s", rid, got.seq, " (ended)" if s.ended else "")
            s.loading = False
            st.store_done([m.offset for m in s.queue if m is not _GAP])
            if st.closed:
                for m in s.queue:
                    if m is not _GAP:
                        self.ctx.abandoned(st, m.offset)
                s.queue.clear()
                continue
            self._kick(st, s)

    def dispatch(self, st, msg) -> None:
        """Hand one stream record to its stream's runner (``load`` must have run for it)."""
        seq = self.parse_seq(msg)
        why = _bad_chunk(msg, seq)
        if why is not None:
            # a 400 error reply, addressed like any reply: key, else the body's request id (the
            # dead-letter rules apply when neither nor a correlation-id header can address it)
            rid = msg.key.decode("utf-8", "replace") if msg.key is not None else body_request_id(msg.value)
            # seq -1: the reply carries no derender-seq header (there is no valid one to echo)
            echo = rid if rid is None or len(rid) <= STREAM_KEY_MAX_BYTES else None  # not an over-long key
            entry = error_entry(None, msg, seq if seq is not None else -1, 400, why, end=False, request_id=echo)

            async def answer():
                try:
                    await self._publish(st, None, msg, entry, is_object=is_object_value(msg.value or b""), rid=rid)
                except DeadLetterError as e:
                    log.warning("%s; %s[%d]@%d stays uncommitted", e, msg.topic, msg.partition, msg.offset)
                    self._fail(st, [msg.offset])
                except Exception as e:
                    log.error("%s; stopping (it will be redelivered)", e)
                    self._fail(st, [msg.offset])
                    self.ctx.fatal(e)

            task = asyncio.create_task(answer())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
            answers = self._answers.setdefault(id(st), set())
            answers.add(task)
            task.add_done_callback(answers.discard)
            return
        rid = stream_id(msg.key)
        s = st.streams[rid]
        _unpark(s)
        s.queue.append(msg)
        self._kick(st, s)

    def _kick(self, st, s: _Stream) -> None:
        if s.task is None and s.queue and not s.loading:
            s.task = asyncio.create_task(self._run(st, s), name=f"derender-stream-{s.rid}")

    async def _run(self, st, s: _Stream) -> None:
        try:
            while s.queue:
                item = s.queue.popleft()
                if item is _GAP:
                    await self._gap_check(st, s)
                else:
                    await self._handle(st, s, item)
        except DeadLetterError as e:  # stopping/revoked while a dead letter was retried: redelivered
            log.warning("stream %r: %s; its records stay uncommitted", s.rid, e)
            unsent = [m.offset for m in s.queue if m is not _GAP]
            s.queue.clear()
            self._fail(st, unsent)
        except Exception as e:  # a publish failure: stop the worker, nothing past it is committed
            log.exception("stream %r failed", s.rid)
            # the record(s) being handled and the queued ones will not finish: give them up
            # (uncommitted, redelivered) so that the drain does not wait for them
            unsent = [m.offset for m in s.queue if m is not _GAP]
            s.queue.clear()
            self._fail(st, unsent)
            self.ctx.fatal(e)
        finally:
            s.task = None
            _park(s)  # (a no-op when chunks wait)

    # -- per-chunk logic -------------------------------------------------------------------
    async def _handle(self, st, s: _Stream, msg) -> None:
        seq = self.parse_seq(msg)
        if s.unreadable is not None:  # its stored state cannot be read: one 409 ends it
            return await self._publish(st, s, msg, end_unreadable(s, msg, seq), write=True)
        if seq < s.next_seq or s.ended:
            await self._old_or_ended(st, s, msg, seq)
            return
        if s.broken is not None:  # its stored state cannot be continued here: no gap wait
            await self._end_broken(st, s, msg, seq)
            return
        if seq > s.next_seq:
            if seq in s.held:
                s.held_dups.append(msg)
            else:
                s.held[seq] = msg
            st.wait_gap(msg.offset)  # (out of the in-flight window: the partition's other records go on)
            if s.gap_deadline is None:
                self._arm_gap(st, s)
            return
        await self._derender_publish(st, s, msg, seq)
        while not s.ended and s.next_seq in s.held:
            m = s.held.pop(s.next_seq)
            st.gap_done(m.offset)
            await self._derender_publish(st, s, m, self.parse_seq(m))
        if s.held or s.held_dups:
            if s.ended or not s.held:  # ended with later chunks held, or only duplicates left
                later, dups = take_held(st, s)
                for m in (*later, *dups):
                    await self._old_or_ended(st, s, m, self.parse_seq(m))
            else:
                self._arm_gap(st, s)  # progress was made: the gap clock restarts
        else:
            s.gap_deadline = None

    def _arm_gap(self, st, s: _Stream) -> None:
        s.gap_deadline = time.monotonic() + self.gap_timeout_s

        def fire(deadline=s.gap_deadline):
            if s.gap_deadline == deadline and s.held and st.streams.get(s.rid) is s:
                s.queue.append(_GAP)
                self._kick(st, s)

        asyncio.get_running_loop().call_later(self.gap_timeout_s + 0.001, fire)

    async def _gap_check(self, st, s: _Stream) -> None:
        if not s.held or s.gap_deadline is None or time.monotonic() < s.gap_deadline:
            return
        why = _gap_why(s, self.gap_timeout_s)
        log.warning("%s", why)
        self.ctx.stats.stream_gaps += 1
        msgs, dups = take_held(st, s)
        last = self.parse_seq(msgs[-1])
        entry = error_entry(s, msgs[-1], last, 409, why)
        s.gap_from = s.next_seq  # a missing chunk arriving later is answered, not taken for a duplicate
        s.next_seq = last + 1
        end_stream(s, 409)
        await self._publish(st, s, msgs[-1], entry, write=True, extra_offsets=[m.offset for m in msgs[:-1]])
        for m in dups:
            await self._old_or_ended(st, s, m, self.parse_seq(m))

    async def _end_broken(self, st, s: _Stream, msg, seq: int) -> None:
        """End stream ``s``, whose stored checkpoint this worker cannot read (``s.broken``), at its
        new chunk ``msg`` (``seq`` >= next expected) with one 409; its tombstone (kept until the
        TTL) makes every later owner answer its later chunks with the ended-stream 409."""
        why = unreadable_reason(s.rid, s.broken, before=s.next_seq)
        log.warning("%s", why, extra=record_fields(msg.topic, msg.partition, msg.offset, s.rid))
        if seq > s.next_seq:
            s.gap_from = s.next_seq  # (the chunks between were never answered: a late one gets the 409)
        s.next_seq = seq + 1
        end_stream(s, 409)
        entry = error_entry(s, msg, seq, 409, why)
        await self._publish(st, s, msg, entry, write=True)

    async def _old_or_ended(self, st, s: _Stream, msg, seq: int) -> None:
        s.end_offset = max(s.end_offset, msg.offset) if s.ended else s.end_offset
        hit = s.window.get(seq)
        late = s.ended and 0 <= s.gap_from <= seq  # after a gap ended the stream: never answered alone
        if hit is not None:
            self.ctx.stats.stream_replayed += 1
            await self._publish(st, s, msg, hit[0])
        elif seq < s.next_seq and not late:
            self.ctx.stats.stream_skipped += 1
            self.ctx.metrics.finished("stream", kind_header(msg), None, None, msg.timestamp, duplicate=True)
            log.info("stream %r: duplicate %s %d older than the replay window: skipped (its reply was acked)",
                     s.rid, HDR_SEQ, seq)
            self.ctx.finished(st, msg.offset)
        else:
            gap = f", ended after {HDR_SEQ} {s.gap_from} was missing for {self.gap_timeout_s:g}s" if late else ""
            why = f"stream {s.rid!r} already ended (last {HDR_SEQ} {s.next_seq - 1}{gap}); chunk {HDR_SEQ} {seq} ignored"
            log.info("%s: answered 409", why, extra=record_fields(msg.topic, msg.partition, msg.offset, s.rid))
            entry = error_entry(s, msg, seq, 409, why)
            await self._publish(st, s, msg, entry)

    async def _derender_publish(self, st, s: _Stream, msg, seq: int) -> None:
        """Derender and publish one in-order chunk. An unexpected exception for this record (a
        bug, ``MemoryError``...; not a failed publish step, which stops the worker) stays with it:
        the chunk is answered with a 500 error that ends its stream, the partition moves on."""
        try:
            await self._derender_publish_one(st, s, msg, seq)
        except StreamStepError:
            raise
        except Exception as e:
            log.exception("stream %r: chunk %s[%d]@%d failed; ending the stream with a 500", s.rid, msg.topic,
                          msg.partition, msg.offset)
            self.ctx.stats.crashes += 1
            s.next_seq = max(s.next_seq, seq + 1)
            end_stream(s, 500)
            entry = error_entry(s, msg, seq, 500, f"internal error: {type(e).__name__}: {e}")
            await self._publish(st, s, msg, entry, write=True)

    async def _derender_publish_one(self, st, s: _Stream, msg, seq: int) -> None:
        kind = kind_header(msg)
        out = await submit_chunk(self.ctx, self.store, self.outage, s, msg, seq, kind)
        self.ctx.metrics.processing_stream.observe(out.seconds)
        if out.crash:
            self.ctx.stats.crashes += 1
            log.error("stream derender raised on %s[%d]@%d key=%r:\n%s", msg.topic, msg.partition, msg.offset,
                      msg.key[:256] if msg.key else msg.key, out.crash,  # (a key can be MBs)
                      extra=record_fields(msg.topic, msg.partition, msg.offset, s.rid))
        s.known = s.known or seq == 0 or out.status == 200
        s.api = s.api or record_api(out.kind)  # (the core's kind: its stored state's wins over a header)
        if out.settings:  # the stream's first chunk: its write-once settings, stored with its checkpoint
            s.settings, s.settings_stored = out.settings, False
        s.settings_kept = s.settings_kept or (out.status == 200 and out.kind in SETTINGS_KINDS)
        s.next_seq = seq + 1
        end = out.status != 200 or out.done
        if end:
            end_stream(s, out.status)
        else:
            s.state = out.state
        self.ctx.stats.stream_chunks += 1
        # (one shared kind string, not one unpickled copy per reply held in replay windows)
        entry = ReplayEntry(seq, out.status, end, sys.intern(out.kind) if out.kind else out.kind, out.body)
        await self._publish(st, s, msg, entry, write=True, is_object=out.is_object,
                            pieces=NO_PIECES if end else keep_pieces(self.store, s, out))

    async def _publish(self, st, s: _Stream | None, msg, entry: ReplayEntry, *, write: bool = False,
                       extra_offsets: list | None = None, is_object: bool = True, rid: str | None = None,
                       pieces: PiecesWrite = NO_PIECES) -> None:
        """Steps 1 (produce) here; 2-4 follow in the partition's stream acker / state writer.
        ``rid``: the request id addressing the reply when there is no stream ``s``; ``pieces``: the
        chunk's piece bytes for its checkpoint. An ``entry.seq`` < 0 (no valid ``derender-seq``)
        puts no ``derender-seq`` header on the reply."""
        out = JobOutcome(entry.value, entry.status, s.rid if s else rid, entry.kind, is_object)
        plan = self.ctx.planner.safe_plan(msg, out)
        too_big = None
        if not plan.is_dead_letter:
            if entry.seq >= 0:
                plan.headers.append((HDR_SEQ, str(entry.seq).encode()))
            if entry.end:
                plan.headers.append((HDR_STREAM_END, b"1"))
            too_big = self.ctx.publisher.too_large(plan)
            if too_big is not None:  # the full record is dead-lettered; a 413 answers (and ends the stream)
                plan = await _answer_too_large(self.ctx, st, s, msg, plan, too_big, write, rid)
                if s is not None and write and not plan.is_dead_letter:
                    entry = ReplayEntry(entry.seq, too_big.status, True, entry.kind, plan.value)
        wr = None  # the checkpoint is built before anything is sent: nothing can fail after the send
        if write and s is not None:
            s.window[entry.seq] = (entry, msg.offset)
            sv, kept, touch = settings_write(self.store, s)
            ck = encode_checkpoint(s.state, [e for e, _ in s.window.values()], s.gap_from if s.ended else -1)
            wr = CheckpointWrite(st, s.rid, entry.seq, ck,
                                 [msg.offset, *(extra_offsets or ())], s, at=pieces.at, data=pieces.data,
                                 touch=pieces.touch or touch, settings=sv, settings_kept=kept)
        try:
            # a reply refused for a reason of its own is dead-lettered; a dead letter is retried
            # until acked (partition paused, not ready) unless the partition goes away meanwhile
            if too_big is not None and plan.is_dead_letter:  # (already acked by _too_large)
                delivery = asyncio.get_running_loop().create_future()
                delivery.set_result(None)
            else:
                plan, delivery = await self.ctx.publisher.publish(st, msg, plan, s.rid if s else rid)
        except DeadLetterError:
            raise
        except Exception as e:
            raise ReplyProduceError(f"producing the reply of {msg.topic}[{msg.partition}]@{msg.offset} failed: "
                                    f"{type(e).__name__}: {e}") from e
        if wr is not None:
            s.pending_writes += 1  # (its runner task keeps it from eviction until here)
        if s is not None and s.ended:
            s.end_offset = max(s.end_offset, msg.offset, *(extra_offsets or ()))
        st.sacks.put_nowait((msg, plan, entry, delivery, wr))

    async def _acker(self, st) -> None:
        """Step 2 (ack) in send order, then hand the checkpoint to the writer (step 3)."""
        while True:
            msg, plan, entry, delivery, wr = await st.sacks.get()
            self._acking.add(id(st))
            try:
                plan = await self.ctx.publisher.settle(st, msg, plan, delivery)  # (retried until acked)
                self.ctx.count(plan, _Counted(entry.status, entry.kind), msg, "stream")
                if wr is None:
                    self.ctx.finished(st, msg.offset)
                else:
                    st.wait_store(wr.offsets)  # acked: only the checkpoint is left (not in the window)
                    self.writer.add(wr)
            except DeadLetterError as e:
                log.warning("%s; %s[%d]@%d stays uncommitted", e, msg.topic, msg.partition, msg.offset)
                self._fail(st, [msg.offset, *(wr.offsets if wr is not None else ())])
            except Exception as e:
                err = ReplyAckError(f"reply of {msg.topic}[{msg.partition}]@{msg.offset} not acknowledged: "
                                    f"{type(e).__name__}: {e}")
                log.error("%s; stopping (it will be redelivered)", err)
                self._fail(st, [msg.offset, *(wr.offsets if wr is not None else ())])
                self.ctx.fatal(err)
            finally:
                self._acking.discard(id(st))
                st.sacks.task_done()

    # -- after an offset commit ------------------------------------------------------------
    def on_committed(self, st, offset: int) -> None:
        """Offsets below ``offset`` of partition ``st`` are committed: trim replay windows and
        delete the stored checkpoints of streams that ended before it (``stream_registry``)."""
        deletes = trim_committed(st.streams, offset, self.replay_window)
        if deletes:
            async def go():
                try:
                    await self.store.commit(deletes)
                except Exception as e:  # the TTL removes them anyway
                    log.warning("deleting %d ended stream state(s) failed: %s: %s", len(deletes), type(e).__name__, e)
            t = asyncio.create_task(go())
            self._bg.add(t)
            t.add_done_callback(self._bg.discard)


class _Counted:
    """Adapter for ``KafkaDerenderWorker._count`` (reads ``status`` and ``kind``)."""

    def __init__(self, status: int, kind: str | None = None):
        self.status = status
        self.kind = kind
