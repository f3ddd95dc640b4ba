"""Offsets the broker hands out in produce acknowledgements, per partition: an offset at or below
one already acknowledged on the same partition means the broker lost what it had acknowledged
there (a Kafka partition's offsets only grow): the topic was deleted and re-created, or the
broker restarted without its data. The embedded Tansu broker even acknowledges records to a
topic that no longer exists and hands their offsets out again once the topic is re-created
(docs/kafka.md, "Embedded broker limits"; reproduction: ops/repro/tansu_restart_loss.py).

Sound only in acknowledgement order: ``note`` is called from a done-callback added when the record
is sent (aiokafka completes a partition's batches in offset order, one request in flight per
broker, and the event loop runs the callbacks in completion order).
"""
from __future__ import annotations

__all__ = ["AckOffsets", "MAX_PARTITIONS"]

#: partitions remembered (reply topics are named by records): the oldest is forgotten past this
MAX_PARTITIONS = 4096


class AckOffsets:
    """Highest acknowledged offset per ``(topic, partition)`` (at most ``MAX_PARTITIONS``)."""

    def __init__(self, max_partitions: int = MAX_PARTITIONS):
        self.max_partitions = max_partitions
        self._high: dict[tuple[str, int], int] = {}

    def note(self, topic: str, partition: int, offset: int) -> str | None:
        """Record an acknowledgement -> None, or what went wrong when ``offset`` is at or below
        the highest one acknowledged before on that partition (the partition is tracked from the
        new offset on). A negative offset (none given) is ignored."""
        if offset < 0:
            return None
        key = (topic, partition)
        high = self._high.pop(key, None)  # re-inserted: most recently used last
        if len(self._high) >= self.max_partitions:
            self._high.pop(next(iter(self._high)))
        self._high[key] = offset
        if high is None or offset > high:
            return None
        return (f"the broker acknowledged offset {offset} on {topic}[{partition}] after offset {high}: it lost records "
                f"it had acknowledged there (topic deleted and re-created, or broker restarted without its data?)")

    def note_late(self, topic: str, partition: int, offset: int) -> None:
        """Record an acknowledgement seen out of acknowledgement order (a delivery done before it
        could be put through ``note``: acknowledgements noted since may have come after it): the
        partition's highest offset rises to ``offset`` if below it; nothing is reported (those
        later ones are, absent a loss, above ``offset``; after a loss, the next one at or below
        it is reported by ``note``). A negative offset (none given) is ignored."""
        if offset < 0:
            return
        key = (topic, partition)
        high = self._high.pop(key, None)
        if len(self._high) >= self.max_partitions:
            self._high.pop(next(iter(self._high)))
        self._high[key] = offset if high is None or offset > high else high
