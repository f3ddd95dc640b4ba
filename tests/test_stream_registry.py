"""``worker.transport.stream_registry``: what an offset commit does to ended streams. A stream
whose request completed has its stored tombstone deleted once the offsets past it are
committed; one ended by an error reply (413, gap 409, 500, 4xx), whose client may still send
chunks, keeps it until the TTL, so a later owner answers those chunks with the same
ended-stream 409 (chaos ``reply-too-big``: a new owner answered "lost or expired" instead). Not
a gap's 409: its tombstone does not say which chunks were missing."""
from __future__ import annotations

import time

from worker.transport.stream_registry import _Stream, end_stream, keeps_tombstone, trim_committed


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
    assert [st for st in (200, 400, 404, 409, 413, 500) if keeps_tombstone(st)] == [400, 404, 413, 500]
    streams = {"gap": _ended("gap", 409)}
    assert [w.request_id for w in trim_committed(streams, 6, 4)] == ["gap"]
