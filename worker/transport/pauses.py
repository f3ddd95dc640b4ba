"""Partition pauses of a Kafka worker, by reason: a partition is fetched again only when every
reason to pause it is lifted (the in-flight window of ``window()``, a dead letter being retried).

The window: once ``max_in_flight`` records of a partition are read past its oldest unfinished one
while that one is a stream record (it may wait: state store outage, stream gap), the partition is
paused until that record finishes (``resume_windows()``, called every commit interval). That
bounds memory and the replies a crash can repeat. Non-streaming records alone are bounded by the
worker's ``--max-in-flight`` permits and never trigger it.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["PartitionPauses"]


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
        """Check partition ``st`` (``inflight``, ``stream_inflight``, ``hi``) after a record was read."""
        if "window" in self.whys.get(st.tp, ()) or not st.stream_inflight:
            return
        oldest = min(st.inflight)
        if st.hi - oldest < self.max_in_flight or oldest not in st.stream_inflight:
            return
        if self.pause(st.tp, "window"):
            log.debug("pausing %s[%d]: %d records read past its oldest unfinished offset %d", st.tp.topic,
                      st.tp.partition, st.hi - oldest, oldest)

    def resume_windows(self, parts: dict) -> None:
        """Lift the window of every partition (``parts``: tp -> partition state) whose oldest
        unfinished record got within half a window of its highest read one."""
        for tp, whys in list(self.whys.items()):
            if "window" not in whys:
                continue
            st = parts.get(tp)
            if st is None or not st.inflight or st.hi - min(st.inflight) < self.max_in_flight // 2 + 1:
                self.unpause(tp, "window")
