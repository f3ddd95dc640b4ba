"""Dead letters: the record published to ``--dead-letter-topic`` instead of a reply, when no
useful reply can be addressed (the reasons are listed in ``worker.transport.records``)."""
from __future__ import annotations

from worker.transport.records import HDR_DLQ_REASON

__all__ = ["dead_letter", "HDR_ORIGINAL_TOPIC", "HDR_ORIGINAL_PARTITION", "HDR_ORIGINAL_OFFSET"]

HDR_ORIGINAL_TOPIC = "x-original-topic"
HDR_ORIGINAL_PARTITION = "x-original-partition"
HDR_ORIGINAL_OFFSET = "x-original-offset"


def dead_letter(msg, reason: str, topic: str) -> tuple[str, bytes | None, bytes | None, list, str]:
    """The dead letter of record ``msg`` as a publish plan ``(topic, key, value, headers, reason)``:
    the original key, value and headers (minus any ``x-dlq-*``/``x-original-*`` ones), plus
    ``x-dlq-reason`` and the origin ``x-original-topic``/``-partition``/``-offset`` (ASCII decimal)."""
    headers = [(k, v) for k, v in (msg.headers or ()) if not k.startswith("x-dlq-") and not k.startswith("x-original-")]
    headers += [(HDR_DLQ_REASON, reason.encode("utf-8", "replace")),
                (HDR_ORIGINAL_TOPIC, msg.topic.encode()),
                (HDR_ORIGINAL_PARTITION, str(msg.partition).encode()),
                (HDR_ORIGINAL_OFFSET, str(msg.offset).encode())]
    return topic, msg.key, msg.value, headers, reason
