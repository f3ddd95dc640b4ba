"""Reply planning: where the result of an input record goes, as an ``Outgoing`` record: its reply
(topic from the ``reply-topic`` header or ``--reply-topic``; key and ``correlation-id`` from the
input; ``derender-status``/``-kind``; the W3C trace context) or its dead letter, by the rules of
``worker.transport.records``. Pure: no I/O (sending is ``worker.transport.publisher``).
"""
from __future__ import annotations

import logging
from typing import Any

from worker.tracing import trace_headers
from worker.transport.deadletter import dead_letter
from worker.transport.jobs import JobOutcome
from worker.transport.records import (
    HDR_CONTENT_TYPE,
    HDR_CORRELATION_ID,
    HDR_KIND,
    HDR_REPLY_TOPIC,
    HDR_STATUS,
    JSON_CT,
    Outgoing,
    header,
    log_fields,
    reply_topic_problem,
)
from worker.transport.unreadable import UnreadableRecord

log = logging.getLogger(__name__)

__all__ = ["ReplyPlanner"]


class ReplyPlanner:
    """Plans replies with ``settings`` (a ``WorkerSettings``: ``reply_topic``,
    ``allowed_reply_topics_re``, ``input_topic``, ``dead_letter_topic``,
    ``dead_letter_max_bytes``)."""

    def __init__(self, settings: Any):
        self.settings = settings

    def plan(self, msg: Any, out: JobOutcome) -> Outgoing:
        """Decide where a finished message goes: its reply, or its dead letter (the dead-letter
        rules of ``worker.transport.records``)."""
        if isinstance(msg, UnreadableRecord):
            return self.dead_letter(msg, msg.reason)
        hdrs = msg.headers  # (a record without headers: nothing to look for)
        reply_hdr = header(msg, HDR_REPLY_TOPIC) if hdrs else None
        corr = header(msg, HDR_CORRELATION_ID) if hdrs else None
        if out.crash == "derender-crashed":
            return self.dead_letter(msg, "derender-crashed")
        reply_topic = self.settings.reply_topic
        if reply_hdr is not None:
            if len(reply_hdr) > 249 or not reply_hdr.isascii():
                return self.dead_letter(msg, "invalid-reply-topic")
            reply_topic = reply_hdr.decode("ascii")
            problem = reply_topic_problem(reply_topic, self.settings.allowed_reply_topics_re,
                                          (self.settings.input_topic, self.settings.dead_letter_topic))
            if problem is not None:
                return self.dead_letter(msg, problem)
        elif not out.is_object:
            return self.dead_letter(msg, "unparseable-no-reply-topic")
        rid = out.request_id.encode("utf-8") if out.request_id else None
        if corr is None:
            corr = msg.key or rid
        if corr is None:
            return self.dead_letter(msg, "no-correlation-id")
        key = msg.key or rid or corr
        headers = [(HDR_CORRELATION_ID, corr), (HDR_CONTENT_TYPE, JSON_CT),
                   (HDR_STATUS, str(out.status).encode())]
        if out.kind:
            headers.append((HDR_KIND, out.kind.encode()))
        if hdrs:
            headers.extend(trace_headers(hdrs))  # W3C trace context: the reply continues the trace
        return Outgoing(reply_topic, key, out.body, headers)

    def dead_letter(self, msg: Any, reason: str) -> Outgoing:
        """The dead letter of ``msg`` for ``reason`` (``worker.transport.deadletter``)."""
        return dead_letter(msg, reason, self.settings.dead_letter_topic, self.settings.dead_letter_max_bytes)

    def safe_plan(self, msg: Any, out: JobOutcome) -> Outgoing:
        """``plan``, except that an exception while planning this record (a bug met by an odd
        record) dead-letters it (``internal-error: ...``) instead of stopping the worker."""
        try:
            return self.plan(msg, out)
        except Exception as e:
            log.exception("planning the reply of %s[%d]@%d failed", msg.topic, msg.partition, msg.offset,
                          extra=log_fields(msg))
            return self.dead_letter(msg, f"internal-error: {type(e).__name__}: {e}")
