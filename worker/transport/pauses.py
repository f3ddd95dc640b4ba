"""Partition pauses of a Kafka worker, by reason: a partition is fetched again only when every
reason to pause it is lifted (the in-flight window of ``window()``, a dead letter being retried,
records waiting for the state store, records read past a held stream chunk).

The window: once ``max_in_flight`` records of a partition are read past its oldest *active*
unfinished one while that one is a stream record (a slow derender, a stream's queue), the
partition is paused until that record finishes (``resume_windows()``, called every commit
interval). That bounds memory and the replies a crash can repeat. Non-streaming records alone are
bounded by the worker's ``--max-in-flight`` permits and never trigger it.

Records that wait only for the state store (``st.store_wait``: stream chunks queued behind a
stream being read from the store, and chunks answered and acked whose checkpoint is not written
yet) are not *active*: a Redis stall or outage must not stop a partition's non-streaming records
(issue 17, fault 1). They are bounded on their own: the partition pauses (reason ``state-store``)
once ``STORE_WAIT_FACTOR * max_in_flight`` of them wait, and resumes below half of that.

Stream chunks held behind a gap (``st.gap_wait``: a missing chunk, or chunk 0 of an unknown
stream, waited for up to ``--stream-gap-timeout``) are not *active* either: a held stream must not
stop a partition's non-streaming records (issue 23 item 2: a rolling upgrade held them up to
48.7 s). The commit stays behind a held chunk, so every record read past it keeps its replay
entry (stream chunks) in memory until then: the partition pauses (reason ``stream-gap``) once
``GAP_WAIT_FACTOR * max_in_flight`` records are read past its oldest held chunk, and resumes once
that span is below half of it (the gap's 409 or the missing chunk finishes the held ones).
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["PartitionPauses", "STORE_WAIT_FACTOR", "GAP_WAIT_FACTOR"]

#: records of a partition that may wait for the state store, in units of ``--max-in-flight``
#: (64 x 64 = 4,096 by default: an 8 s Redis stall at ~500 stream chunks/s per partition)
STORE_WAIT_FACTOR = 64
#: records of a partition that may be read past its oldest held stream chunk (a gap), in units of
#: ``--max-in-flight`` (4,096 by default)
GAP_WAIT_FACTOR = 64


class PartitionPauses:
    """Pause reasons per partition over ``consumer`` (an ``AIOKafkaConsumer``, or None before it
    exists: then nothing is paused). ``max_in_flight``: the window size (records)."""

    def __init__(self, max_in_flight: int):
        self.consumer: Any = None
        self.max_in_flight = max_in_flight
        self.whys: dict[Any, set[str]] = {}  # TopicPartition -> reasons

    def pause(self, tp: Any, why: str) -> bool:
        """Pause fetching ``tp`` for ``why`` (until every reason is lifted); False when it is not assigned."""
        if self.consumer is None or tp not in self.consumer.assignment():
            return False
        whys = self.whys.setdefault(tp, set())
        if not whys:
            self.consumer.pause(tp)
        whys.add(why)
        return True

    def unpause(self, tp: Any, why: str) -> None:
        """Lift ``why``; fetching ``tp`` resumes when no reason is left."""
        whys = self.whys.get(tp)
        if whys is None:
            return
        whys.discard(why)
        if not whys:
            del self.whys[tp]
            if self.consumer is not None and tp in self.consumer.assignment():
                self.consumer.resume(tp)

    def forget(self, tp: Any) -> None:
        """``tp`` was revoked: a new assignment starts unpaused."""
        self.whys.pop(tp, None)

    def window(self, st: Any) -> None:
        """Check partition ``st`` (``active``, ``stream_inflight``, ``store_wait``, ``gap_wait``,
        ``gap_floor``, ``hi``) after a record was read: O(``max_in_flight``), whatever waits for
        the state store or behind a gap (``gap_wait`` is scanned only when ``gap_floor``, a lower
        bound of its oldest offset, says the span may have reached the bound; the scan raises it)."""
        whys = self.whys.get(st.tp, ())
        if "state-store" not in whys and len(st.store_wait) >= STORE_WAIT_FACTOR * self.max_in_flight:
            if self.pause(st.tp, "state-store"):
                log.info("pausing %s[%d]: %d records wait for the state store", st.tp.topic, st.tp.partition,
                         len(st.store_wait))
        gap_bound = GAP_WAIT_FACTOR * self.max_in_flight
        if "stream-gap" not in whys and st.gap_wait and st.hi - st.gap_floor >= gap_bound:
            st.gap_floor = min(st.gap_wait)
            if st.hi - st.gap_floor >= gap_bound and self.pause(st.tp, "stream-gap"):
                log.info("pausing %s[%d]: %d records read past its oldest held stream chunk (offset %d, waiting "
                         "for a missing chunk)", st.tp.topic, st.tp.partition, st.hi - st.gap_floor, st.gap_floor)
        if "window" in whys or not st.stream_inflight or not st.active:
            return
        oldest = min(st.active)
        if st.hi - oldest < self.max_in_flight or oldest not in st.stream_inflight:
            return
        if self.pause(st.tp, "window"):
            log.debug("pausing %s[%d]: %d records read past its oldest active offset %d", st.tp.topic,
                      st.tp.partition, st.hi - oldest, oldest)

    def resume_windows(self, parts: dict) -> None:
        """Lift the window of every partition (``parts``: tp -> partition state) whose oldest
        active record got within half a window of its highest read one, and the ``state-store``
        pause of those with fewer than half the bound waiting for the store, and the ``stream-gap``
        pause of those whose oldest held stream chunk got within half its bound."""
        for tp, whys in list(self.whys.items()):
            st = parts.get(tp)
            if "state-store" in whys and (
                    st is None or len(st.store_wait) < STORE_WAIT_FACTOR * self.max_in_flight // 2):
                self.unpause(tp, "state-store")
            if "window" in whys and (
                    st is None or not st.active or st.hi - min(st.active) < self.max_in_flight // 2 + 1):
                self.unpause(tp, "window")
            if "stream-gap" in whys and (
                    st is None or not st.gap_wait or st.hi - min(st.gap_wait) < GAP_WAIT_FACTOR * self.max_in_flight // 2):
                self.unpause(tp, "stream-gap")
