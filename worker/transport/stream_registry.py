"""The stream registry: the streams a worker holds in memory per partition (``LiveStream``,
alias ``_Stream``; request id -> stream in ``partition.streams``), how an idle one is parked
(packed into one msgpack value) and unparked, and what happens to them when offsets commit
(replay windows trimmed, ended streams' stored checkpoints deleted) or the partition goes away.
Pure bookkeeping: no I/O (``worker.transport.streams`` runs them).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import msgspec

from worker.core.service import error_body_for, record_api
from worker.logs import record_fields
from worker.state import StateWrite, UnreadableState
from worker.transport.checkpoints import ReplayEntry, UnreadableCheckpoint, decode_stored
from worker.transport.records import SEQ_MAX, kind_header

log = logging.getLogger(__name__)

__all__ = ["LiveStream", "end_stream", "stored_checkpoint", "end_unreadable", "keeps_tombstone", "resume_stream",
           "cannot_continue", "take_held", "held_offsets", "trim_committed", "drop_streams", "record_pieces",
           "held_pieces", "stream_api", "error_entry", "ERROR_KINDS"]

_GAP = object()  # queue marker: the gap timer fired


class _Parked(msgspec.Struct, array_like=True):
    """A parked (idle) stream's state and replay window in one msgpack value (``_park``)."""

    state: bytes | None
    replies: list[ReplayEntry]
    offsets: list[int]  # input offset of each reply (-1: loaded from the store)
    settings: bytes | None = None  # the stream's write-once settings (``LiveStream.settings``)


_parked_encoder = msgspec.msgpack.Encoder()
_parked_decoder = msgspec.msgpack.Decoder(_Parked)


@dataclass(slots=True)
class LiveStream:
    """One stream held in memory. While nothing of it runs or waits (``_park``), its state and
    replay window live in ``packed`` (one bytes value) and ``state``/``window``/``queue``/``held``/
    ``held_dups`` are None: thousands of idle streams then cost one object and one buffer each
    instead of a dozen small objects scattered over the allocator's arenas (which a few surviving
    neighbours would keep in the RSS after the streams are evicted)."""

    rid: str
    state: bytes | None = None  # state after next_seq - 1 (None before chunk 0 / once ended)
    next_seq: int = 0
    ended: bool = False
    known: bool = False  # chunk 0 was seen (here or by a previous owner)
    window: OrderedDict = field(default_factory=OrderedDict)  # seq -> (ReplayEntry, input offset)
    queue: deque = field(default_factory=deque)
    held: dict = field(default_factory=dict)  # seq -> msg (beyond a gap)
    held_dups: list = field(default_factory=list)
    gap_deadline: float | None = None
    task: asyncio.Task | None = None
    end_offset: int = -1  # highest input offset handled after the stream ended
    gap_from: int = -1  # ended by a gap: the first missing seq (seqs from it on were never answered alone)
    deleted: bool = False
    keep_tombstone: bool = False  # ended by an error reply: its stored tombstone is left to the TTL (``keeps_tombstone``)
    #: why this worker cannot continue the stream (its stored checkpoint is unreadable:
    #: ``cannot_continue``); its next new chunk ends it at once with a 409 saying so
    broken: str | None = None
    ended_at: float = 0.0
    loading: bool = False  # being read from the store: its queue waits
    last_used: float = field(default_factory=time.monotonic)  # last chunk handed to it (idle eviction)
    pending_writes: int = 0  # checkpoints produced and not yet written (never evicted meanwhile)
    packed: bytes | None = None  # parked: encoded ``_Parked`` (state, window)
    #: the stream's append-only pieces (``worker.state.pieces``) from offset ``pieces_at`` on, as
    #: this worker wrote them (``pieces_at`` -1: none written here yet; bytes before
    #: ``pieces_at`` are in the store, written by an earlier owner)
    pieces: bytearray | None = None
    pieces_at: int = -1
    pieces_touched: float = 0.0  # time.monotonic() of this worker's last refresh of the pieces' TTL
    packed_len: int = 0  # parked: replay window length
    packed_first: int = -1  # parked: input offset of the window's first reply
    #: the stream's write-once settings (``DerenderService.derender_stream(settings_aside=True)``:
    #: its first chunk's outcome, or read from the store by a new owner on a pool process' miss);
    #: None: not held here (a Responses stream has none)
    settings: bytes | None = None
    settings_stored: bool = False  # a checkpoint write carrying them was applied (else: send them)
    #: the stream keeps settings in the store (a chat/completion stream; also when ``settings`` is
    #: not held: a new owner whose pool process had them cached), so its writes refresh their TTL
    settings_kept: bool = False
    settings_touched: float = 0.0  # time.monotonic() of this worker's last refresh of their TTL
    #: its stored state could not be read (another Redis type, another release's format): the
    #: 409 message its next chunk gets, ending it (``StreamRouter._handle``); None otherwise
    unreadable: str | None = None
    #: the API the stream speaks (``worker.core.service.record_api``: its chunks' result kind, a
    #: resumed checkpoint's state or replies, else a chunk's header or shape): the error object
    #: of the errors the transport builds for it (``error_entry``); None: not known yet
    api: str | None = None


def _park(s: LiveStream) -> None:
    """Pack an idle stream (nothing queued, held or loading) into ``s.packed``; no-op otherwise."""
    if s.packed is not None or s.queue or s.held or s.held_dups or s.loading:
        return
    entries = list(s.window.values())
    s.packed = _parked_encoder.encode(_Parked(s.state, [e for e, _ in entries], [o for _, o in entries],
                                              s.settings))
    s.packed_len = len(entries)
    s.packed_first = entries[0][1] if entries else -1
    s.state = s.window = s.queue = s.held = s.held_dups = s.settings = None


def _unpark(s: LiveStream) -> None:
    """Undo ``_park`` (before a chunk is handed to the stream); no-op when not parked."""
    if s.packed is None:
        return
    p = _parked_decoder.decode(s.packed)
    s.packed = None
    s.state = p.state
    s.settings = p.settings
    s.window = OrderedDict((e.seq, (e, o)) for e, o in zip(p.replies, p.offsets, strict=True))
    s.queue, s.held, s.held_dups = deque(), {}, []


_Stream = LiveStream  # (the name the router and the tests use)


def keeps_tombstone(status: int) -> bool:
    """Whether a stream ended by a reply of ``status`` keeps its stored tombstone until the TTL:
    every error reply (413, 500, a 4xx of the core, the 409 of a gap, an unknown stream or a
    state this worker cannot continue) ends a stream whose client may still send chunks, so any
    owner (after a crash, a rebalance, or once the stream is forgotten here) must answer them
    with the same ended-stream 409, never wait for a gap again and end it a second time (issue
    23 item 2). A gap's tombstone says where the gap began (``Checkpoint.gap_from``), so that a
    missing chunk arriving late is answered, not taken for an answered one. Not a completed
    request (200: nothing follows)."""
    return status != 200


def end_stream(s: LiveStream, status: int = 200) -> None:
    """Mark ``s`` ended by a reply of ``status`` (its state and pieces dropped; later chunks get
    the ended-stream 409; ``keeps_tombstone``)."""
    s.keep_tombstone = s.keep_tombstone or keeps_tombstone(status)
    s.ended = True
    s.known = True
    s.state = None
    s.settings = None
    s.pieces, s.pieces_at = None, -1
    s.ended_at = time.monotonic()


def resume_stream(s: LiveStream, seq: int, ck) -> None:
    """Restore ``s`` from its stored checkpoint ``ck`` (``Checkpoint``: state, replay window) whose
    seq is ``seq``: the next expected seq, the state (None: a tombstone, the stream ended), the
    replay window, where a gap that ended it began (``ck.gap_from``), and whether an ended
    stream's tombstone stays until the TTL (its ending reply's status, ``keeps_tombstone``)."""
    s.known = True
    s.next_seq = seq + 1
    s.state = ck.state
    s.ended = ck.state is None
    s.api = s.api or record_api(next((e.kind for e in ck.replies if e.kind), None), b"", ck.state)
    if s.ended:
        s.ended_at = time.monotonic()
        s.gap_from = min(max(-1, ck.gap_from), seq)  # (bounded: a first missing seq is at most the last)
        last = next((e for e in ck.replies if e.seq == seq), None)  # the ending reply
        s.keep_tombstone = s.gap_from >= 0 or (last is not None and keeps_tombstone(last.status))
    for e in ck.replies:
        s.window[e.seq] = (e, -1)


def cannot_continue(s: LiveStream, seq: int, why: str) -> None:
    """``s`` has a stored checkpoint at ``seq`` (-1: unknown) that this worker cannot read
    (``why``: another release's layout, damaged bytes): its chunks up to ``seq`` were answered
    (skipped as old duplicates), its next new chunk ends it at once with a 409 naming ``why``
    (``StreamRouter._handle``), never after a gap wait."""
    s.known = True
    s.next_seq = max(0, seq + 1)
    s.broken = why


def record_pieces(s: LiveStream, at: int, data: bytes) -> None:
    """Keep a chunk's piece bytes written at offset ``at`` (the store's rule: bytes past the
    recorded length are replaced) in ``s.pieces``."""
    if s.pieces is None or at < s.pieces_at:
        s.pieces, s.pieces_at = bytearray(data), at
        return
    del s.pieces[at - s.pieces_at:]
    if len(s.pieces) < at - s.pieces_at:
        s.pieces.extend(b"\0" * (at - s.pieces_at - len(s.pieces)))
    s.pieces += data


def held_pieces(s: LiveStream, start: int, end: int) -> bytes | None:
    """Bytes ``[start, end)`` of the stream's pieces when this worker holds them all, else None
    (read them from the store: an earlier owner wrote them)."""
    if s.pieces is None or start < s.pieces_at or end > s.pieces_at + len(s.pieces):
        return None
    return bytes(s.pieces[start - s.pieces_at:end - s.pieces_at])


def take_held(st, s: LiveStream) -> tuple[list, list]:
    """``(held, dups)``: the chunks ``s`` holds behind its gap (ascending seq) and the duplicates
    of held seqs, taken out of it (its gap clock stopped); partition ``st`` counts them as
    running again (``gap_done``: the caller answers them now)."""
    held = [s.held[k] for k in sorted(s.held)]
    dups, s.held_dups = s.held_dups, []
    s.held.clear()
    s.gap_deadline = None
    for m in (*held, *dups):
        st.gap_done(m.offset)
    return held, dups


def held_offsets(streams: dict) -> set[int]:
    """Offsets of the records held behind gaps in ``streams`` (request id -> ``LiveStream``)."""
    return {m.offset for s in streams.values() if s.held or s.held_dups for m in (*s.held.values(), *s.held_dups)}


def drop_streams(streams: dict) -> list[int]:
    """Forget ``streams`` (partition revoked/closed): cancel their runners; returns the offsets of
    their held records (never committed: the caller abandons them)."""
    out = []
    for s in streams.values():
        if s.task is not None:
            s.task.cancel()
        if s.packed is not None:
            continue
        out.extend(m.offset for m in (*s.held.values(), *s.held_dups))
        s.held.clear()
        s.held_dups.clear()
    streams.clear()
    return out


def trim_committed(streams: dict, offset: int, replay_window: int) -> list:
    """Offsets below ``offset`` are committed: trim the replay windows of ``streams`` to
    ``replay_window`` (keeping every reply whose input offset is not committed), repack idle ones,
    forget streams ended long ago; returns the fenced deletes (``StateWrite``, state None) of the
    streams that ended before ``offset`` (not of those ended by an error: ``keeps_tombstone``)."""
    deletes = []
    now = time.monotonic()
    for rid, s in list(streams.items()):
        if s.packed is not None and s.packed_len > replay_window and s.packed_first < offset:
            _unpark(s)  # its window is trimmed, then it is packed again
        w = s.window
        while w is not None and len(w) > replay_window:
            first = next(iter(w.values()))
            if first[1] >= offset:
                break
            w.popitem(last=False)
        if w is not None and s.task is None:
            _park(s)
        if s.ended and s.task is None and not s.held and s.end_offset < offset:
            if not s.deleted:
                s.deleted = True
                if not s.keep_tombstone:
                    deletes.append(StateWrite(rid, None, s.next_seq - 1))
            elif now - s.ended_at > 60.0:
                del streams[rid]  # forget it (its replies were committed long ago)
    return deletes


def stored_checkpoint(s: LiveStream, got):
    """Resume ``s`` from ``got`` (``get_many``'s ``StoredState`` of any format this release reads)
    and return its checkpoint; None when ``got`` cannot be read (``UnreadableState``: another Redis
    type...; ``UnreadableCheckpoint``): the stream then cannot continue here (``cannot_continue``:
    its next new chunk gets the one 409 that ends it, no gap wait); so is a seq beyond
    ``SEQ_MAX``."""
    try:
        if isinstance(got, UnreadableState):
            raise UnreadableCheckpoint(got.reason)
        if not 0 <= got.seq <= SEQ_MAX:  # (no chunk is newer: each would be skipped as answered, unanswered)
            raise UnreadableCheckpoint(f"seq {got.seq} beyond {SEQ_MAX}")
        ck = decode_stored(got.state)
    except UnreadableCheckpoint as e:
        seq = getattr(got, "seq", -1)
        seq = seq if 0 <= seq <= SEQ_MAX else -1
        log.error("stream %r: unreadable stored state at seq %d (%s); its next chunk ends it with a 409", s.rid, seq, e)
        cannot_continue(s, seq, str(e))
        return None
    resume_stream(s, got.seq, ck)
    return ck


def end_unreadable(s: LiveStream, msg, seq: int) -> ReplayEntry:
    """End ``s``, whose stored state could not be read (``s.unreadable``), at chunk ``seq``
    (``msg``): the 409 reply entry that says so."""
    why, s.unreadable = s.unreadable, None
    log.warning("%s", why, extra=record_fields(msg.topic, msg.partition, msg.offset, s.rid))
    s.next_seq = max(s.next_seq, seq + 1)
    end_stream(s, 409)
    return error_entry(s, msg, seq, 409, why)


#: the ``derender-kind`` of an error reply the transport builds, by API: a Messages one names its
#: kind (its value is Anthropic's error object, not OpenAI's, and a stream's tombstone keeps its
#: API in its replies); the others carry none, as they always did
ERROR_KINDS = {"messages": "messages-stream"}


def stream_api(s: LiveStream | None, msg) -> str | None:
    """The API of stream ``s`` (remembered: ``LiveStream.api``), else of its chunk ``msg`` (its
    ``derender-kind`` header, else its body's shape: ``record_api``); remembered in ``s``."""
    api = s.api if s is not None else None
    if api is None:
        api = record_api(kind_header(msg), msg.value or b"")
        if s is not None:
            s.api = api
    return api


def error_entry(s: LiveStream | None, msg, seq: int, status: int, why: str, end: bool = True,
                request_id: str | None = None) -> ReplayEntry:
    """The error reply entry the transport builds for chunk ``seq`` (``msg``) of stream ``s``
    (None: a chunk no stream takes): ``why`` in the error object of the stream's API
    (``stream_api``, ``error_body_for``), ``status``, ending the stream unless ``end`` is False;
    ``request_id``: the OpenAI object's when there is no stream (else the stream's id)."""
    api = stream_api(s, msg)
    rid = s.rid if s is not None else request_id
    return ReplayEntry(seq, status, end, ERROR_KINDS.get(api or ""), error_body_for(api, why, status, rid))
