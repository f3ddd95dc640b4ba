"""Records the Kafka client cannot read: find them, skip them, dead-letter them.

A record can pass the broker yet fail in the client's record parser: aiokafka decodes header
keys as strict UTF-8 (Kafka's protocol says String, but librdkafka or a raw-protocol producer
can send any bytes; Java brokers and consumers accept them), and rejects malformed records with
``CorruptRecordException``. The error escapes ``getmany`` with no record, no partition and no
offset, loses the records already drained by that call, and comes back on every fetch of that
partition: without this module one such record stops the worker, on every restart.

``isolate_unreadable`` recovers: it rewinds every assigned partition to the first offset the
worker has not received, re-reads each one record at a time (at most ``limit`` per partition)
and, where a read fails, takes the failing offset as the unreadable record's, skips it (seek
past) and returns it as an ``UnreadableRecord`` for the worker to dead-letter
(``unreadable-record``). The records read meanwhile are returned too, to be handled as usual.
The input topic must not be compacted (offsets without holes), which holds for a request topic.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from aiokafka.errors import CorruptRecordException

log = logging.getLogger(__name__)

__all__ = ["UNREADABLE_ERRORS", "UnreadableRecord", "isolate_unreadable"]

#: what the client's record parser raises for a record it cannot read
UNREADABLE_ERRORS = (UnicodeDecodeError, CorruptRecordException)


@dataclass
class UnreadableRecord:
    """Stands for a record the client could not read (``ConsumerRecord``-like: topic, partition,
    offset; no key, value or headers, since none could be read). ``reason``: the dead-letter
    reason, ``unreadable-record: <error>``."""

    topic: str
    partition: int
    offset: int
    reason: str
    key: bytes | None = None
    value: bytes | None = None
    headers: list = field(default_factory=list)


async def isolate_unreadable(consumer, resume_at: dict, limit: int, auto_offset_reset: str = "earliest",
                             read_timeout_ms: int = 200) -> dict:
    """Recover from an ``UNREADABLE_ERRORS`` raised by ``consumer.getmany`` (aiokafka
    ``AIOKafkaConsumer``). ``resume_at``: TopicPartition -> first offset not yet received by the
    worker (partitions missing there restart from their committed offset, else from the
    beginning under ``auto_offset_reset="earliest"``, else where the consumer stands).
    Returns TopicPartition -> records in offset order (``ConsumerRecord``s and at most one
    ``UnreadableRecord`` per partition, always last), like ``getmany``; the consumer's position is
    past everything returned. Raises what ``getmany`` raises for other reasons."""
    assignment = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
    starts: dict = {}
    for tp in assignment:
        start = resume_at.get(tp)
        if start is None:
            start = await consumer.committed(tp)
        if start is None and auto_offset_reset == "earliest":
            start = (await consumer.beginning_offsets([tp]))[tp]
        if start is not None:
            consumer.seek(tp, start)  # also drops what the fetcher buffered for it
        starts[tp] = start
    ends = await consumer.end_offsets(assignment) if assignment else {}
    out: dict = {}
    for tp in assignment:
        if starts[tp] is not None and starts[tp] >= ends.get(tp, 0):
            continue  # nothing to read there (and no read to wait for)
        got: list = []
        while len(got) < limit:
            try:
                recs = await consumer.getmany(tp, timeout_ms=read_timeout_ms, max_records=1)
            except UNREADABLE_ERRORS as e:
                offset = await consumer.position(tp)  # not advanced by the failed read
                reason = f"unreadable-record: {type(e).__name__}: {e}"[:1024]
                log.error("%s[%d]@%d cannot be read by the Kafka client (%s); skipping it and dead-lettering "
                          "what is known of it", tp.topic, tp.partition, offset, reason)
                consumer.seek(tp, offset + 1)
                got.append(UnreadableRecord(tp.topic, tp.partition, offset, reason))
                break
            msgs = recs.get(tp, [])
            if not msgs:
                break
            got.extend(msgs)
        if got:
            out[tp] = got
    return out
