"""``worker.transport.stream_registry``: what an offset commit does to ended streams. A stream
whose request completed has its stored tombstone deleted once the offsets past it are
committed; one ended by an error reply (413, 500, 4xx, and the 409 of a gap, an unknown stream
or a state it cannot continue), whose client may still send chunks, keeps it until the TTL, so a
later owner answers those chunks with the same ended-stream 409 (chaos ``reply-too-big``: a new
owner answered "lost or expired" instead; issue 23: a rolling upgrade's new owner waited for a
gap again and ended the stream twice). A gap's tombstone says where the gap began
(``Checkpoint.gap_from``), in bytes the previous release (e8f2be2) still reads."""
from __future__ import annotations

import time

import msgspec

from worker.transport.checkpoints import ReplayEntry, decode_checkpoint, encode_checkpoint
from worker.transport.stream_registry import (
    _Stream,
    cannot_continue,
    end_stream,
    keeps_tombstone,
    resume_stream,
    trim_committed,
)


def _ended(rid: str, status: int, end_offset: int = 5, last_seq: int = 2) -> _Stream:
    s = _Stream(rid, next_seq=last_seq + 1)
    end_stream(s, status)
    s.end_offset = end_offset
    return s


def test_a_completed_stream_is_deleted_once_committed_past_its_end():
    streams = {"done": _ended("done", 200)}
    assert trim_committed(streams, 5, 4) == []  # its last offset not committed yet
    (write,) = trim_committed(streams, 6, 4)
    assert (write.request_id, write.state, write.seq) == ("done", None, 2)
    assert trim_committed(streams, 7, 4) == []  # once


def test_a_stream_ended_by_an_error_keeps_its_tombstone_for_the_ttl():
    streams = {"err": _ended("err", 413), "done": _ended("done", 200)}
    assert [w.request_id for w in trim_committed(streams, 6, 4)] == ["done"]
    assert streams["err"].deleted and streams["err"].keep_tombstone
    streams["err"].ended_at = streams["done"].ended_at = time.monotonic() - 61
    assert trim_committed(streams, 7, 4) == [] and streams == {}  # forgotten in memory, not deleted


def test_an_error_end_is_not_undone_by_a_later_end():
    s = _ended("x", 500)
    end_stream(s)
    assert s.keep_tombstone


def test_which_endings_keep_the_tombstone():
    assert [st for st in (200, 400, 404, 409, 413, 500) if keeps_tombstone(st)] == [400, 404, 409, 413, 500]
    streams = {"gap": _ended("gap", 409)}
    assert trim_committed(streams, 6, 4) == [] and streams["gap"].keep_tombstone


#: ``encode_checkpoint(b"st", [ReplayEntry(3, 200, False, "chat-stream", b"[]")])`` as the previous
#: release (e8f2be2) wrote it: a checkpoint without a gap keeps these bytes
GOLDEN_CHECKPOINT = bytes.fromhex("9301c4027374919503ccc8c2ab636861742d73747265616dc4025b5d")


class _CheckpointE8f2be2(msgspec.Struct, array_like=True):
    """``worker.transport.checkpoints.Checkpoint`` of the previous release (e8f2be2), its reader."""

    v: int
    state: bytes | None
    replies: list[ReplayEntry]


def test_a_gap_tombstone_is_read_by_this_release_and_the_previous_one():
    plain = encode_checkpoint(b"st", [ReplayEntry(3, 200, False, "chat-stream", b"[]")])
    assert plain == GOLDEN_CHECKPOINT and decode_checkpoint(GOLDEN_CHECKPOINT).gap_from == -1
    # a stream that a gap ended: 0 and 1 answered, 2 missing, 409 on the held 4
    replies = [ReplayEntry(1, 200, False, "chat-stream", b"[]"), ReplayEntry(4, 409, True, None, b"{}")]
    tomb = encode_checkpoint(None, replies, gap_from=2)
    old = msgspec.msgpack.decode(tomb, type=_CheckpointE8f2be2)  # the previous release: a plain tombstone
    assert (old.v, old.state, old.replies) == (1, None, replies)
    s = _Stream("gap")
    resume_stream(s, 4, decode_checkpoint(tomb))
    assert (s.ended, s.next_seq, s.gap_from, s.keep_tombstone) == (True, 5, 2, True)
    assert sorted(s.window) == [1, 4]
    # a first missing seq past the stored one is not believed
    s = _Stream("odd")
    resume_stream(s, 4, decode_checkpoint(encode_checkpoint(None, replies, gap_from=10**30 % (1 << 63))))
    assert s.gap_from == 4


def test_a_stream_that_cannot_be_continued_expects_its_next_chunk():
    s = _Stream("bad")
    cannot_continue(s, 6, "DecodeError: bad")
    assert (s.known, s.next_seq, s.broken, s.ended) == (True, 7, "DecodeError: bad", False)
    s = _Stream("bad-head")
    cannot_continue(s, -1, "no seq")
    assert s.next_seq == 0


def test_a_stored_seq_beyond_seq_max_cannot_be_continued():
    """A stored value whose seq is beyond ``SEQ_MAX`` (hostile or damaged: no chunk can be
    newer) is a stream that cannot continue, from seq 0 on: its next chunk gets the 409 that
    ends it; resumed at that seq, every chunk was skipped as an answered duplicate, unanswered."""
    from worker.state import StoredState
    from worker.transport.records import SEQ_MAX
    from worker.transport.stream_registry import stored_checkpoint
    for seq in (SEQ_MAX + 1, 10 ** 20 - 1):
        s = _Stream("huge")
        assert stored_checkpoint(s, StoredState(encode_checkpoint(None, []), seq)) is None
        assert s.next_seq == 0 and "beyond" in s.broken
    s = _Stream("max")
    assert stored_checkpoint(s, StoredState(encode_checkpoint(None, []), SEQ_MAX)) is not None
    assert s.next_seq == SEQ_MAX + 1 and s.broken is None and s.ended  # (a tombstone)
