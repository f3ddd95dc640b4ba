"""Dead letters: the record published to ``--dead-letter-topic`` instead of a reply, when no
useful reply can be addressed (the reasons are listed in ``worker.transport.records``).

A dead letter always fits: its key, value and headers together stay within
``--dead-letter-max-bytes`` (default ``DEFAULT_MAX_BYTES`` = 512 KiB, half of Kafka's default
``message.max.bytes`` of 1 MiB; the client cannot see the broker's or topic's limit, so the
operator sets it below them). What does not fit is cut, in this order of preference: original
headers (the largest kept within an eighth of the limit), then the key (at most
``KEY_MAX_BYTES``), then the value (the rest). ``x-dlq-truncated`` then lists what was cut, and
``x-original-value-sha256``/``x-original-value-size`` always identify the full original value.
"""
from __future__ import annotations

import hashlib

from worker.transport.records import HDR_DLQ_REASON, Outgoing

__all__ = ["dead_letter", "DeadLetterError", "DEFAULT_MAX_BYTES", "MIN_MAX_BYTES", "KEY_MAX_BYTES", "REASON_MAX_BYTES",
           "HDR_ORIGINAL_TOPIC", "HDR_ORIGINAL_PARTITION", "HDR_ORIGINAL_OFFSET", "HDR_ORIGINAL_VALUE_SHA256",
           "HDR_ORIGINAL_VALUE_SIZE", "HDR_TRUNCATED"]

HDR_ORIGINAL_TOPIC = "x-original-topic"
HDR_ORIGINAL_PARTITION = "x-original-partition"
HDR_ORIGINAL_OFFSET = "x-original-offset"
#: lowercase hex SHA-256 of the full original value (of b"" for a null value)
HDR_ORIGINAL_VALUE_SHA256 = "x-original-value-sha256"
#: size of the full original value in bytes (ASCII decimal)
HDR_ORIGINAL_VALUE_SIZE = "x-original-value-size"
#: what was cut to fit ``--dead-letter-max-bytes``: comma-separated ``headers``, ``key``, ``value``
#: (absent when nothing was cut)
HDR_TRUNCATED = "x-dlq-truncated"

DEFAULT_MAX_BYTES = 512 * 1024
MIN_MAX_BYTES = 4096
KEY_MAX_BYTES = 16 * 1024
REASON_MAX_BYTES = 1024
#: bytes reserved for the record and batch framing (Kafka record batch v2: 61-byte batch header,
#: up to ~20 bytes of varints per record and ~10 per header; generous)
_OVERHEAD = 256
_PER_HEADER = 10


class DeadLetterError(Exception):
    """A dead letter could not be published and retrying stopped (partition revoked, drain given
    up): its record stays uncommitted and will be redelivered."""


def _hsize(k: str, v: bytes | None) -> int:
    return len(k.encode("utf-8", "replace")) + len(v or b"") + _PER_HEADER


def dead_letter(msg, reason: str, topic: str, max_bytes: int = DEFAULT_MAX_BYTES,
                ) -> Outgoing:
    """The dead letter of record ``msg`` (aiokafka ``ConsumerRecord``) as an ``Outgoing`` to
    ``topic`` with ``dlq_reason`` = ``reason``: the original key, value and headers (minus any
    ``x-dlq-*``/``x-original-*`` ones), plus ``x-dlq-reason`` (``reason``, at most
    ``REASON_MAX_BYTES`` of UTF-8), the origin ``x-original-topic``/``-partition``/``-offset``
    (ASCII decimal), ``x-original-value-sha256`` and ``x-original-value-size``; everything cut to
    fit ``max_bytes`` (>= ``MIN_MAX_BYTES``) as the module docstring says, ``x-dlq-truncated``
    naming the parts that were cut. A record with neither key nor value gets an empty value (the
    producer refuses one with neither); ``x-original-value-size`` then says 0."""
    value = msg.value
    key = msg.key
    full = value or b""
    ours = [(HDR_DLQ_REASON, reason.encode("utf-8", "replace")[:REASON_MAX_BYTES]),
            (HDR_ORIGINAL_TOPIC, str(msg.topic).encode("utf-8", "replace")[:512]),
            (HDR_ORIGINAL_PARTITION, str(msg.partition).encode()),
            (HDR_ORIGINAL_OFFSET, str(msg.offset).encode()),
            (HDR_ORIGINAL_VALUE_SHA256, hashlib.sha256(full).hexdigest().encode()),
            (HDR_ORIGINAL_VALUE_SIZE, str(len(full)).encode())]
    budget = max(MIN_MAX_BYTES, max_bytes) - _OVERHEAD - sum(_hsize(k, v) for k, v in ours) \
        - _hsize(HDR_TRUNCATED, b"headers,key,value")
    cut: list[str] = []
    original = [(k, v) for k, v in (msg.headers or ())
                if not k.startswith("x-dlq-") and not k.startswith("x-original-")]
    kept, used, hbudget = [], 0, budget // 8
    for k, v in original:
        size = _hsize(k, v)
        if used + size > hbudget:
            if "headers" not in cut:
                cut.append("headers")
            continue  # a later, smaller header may still fit
        kept.append((k, v))
        used += size
    budget -= used
    if key is not None and len(key) > min(KEY_MAX_BYTES, budget // 2):
        key = key[:min(KEY_MAX_BYTES, budget // 2)]
        cut.append("key")
    budget -= len(key or b"")
    if value is not None and len(value) > budget:
        value = value[:max(0, budget)]
        cut.append("value")
    if key is None and value is None:
        value = b""  # the producer refuses a record with neither (a null-key tombstone, an unreadable record)
    headers = kept + ours
    if cut:
        headers.append((HDR_TRUNCATED, ",".join(cut).encode()))
    return Outgoing(topic, key, value, headers, reason)
