"""Record format of the Kafka transport: header names, and reading/validating headers of a record.

The worker consumes engine outputs and publishes OpenAI responses.

Message format
==============

Input (``--input-topic``, default ``engine-outputs``)
-----------------------------------------------------
* **key**: the request id (UTF-8). Used as the reply key and as the default correlation id.
  Messages with the same key must go to the same partition (the producer's default
  partitioner does this), because ordering is kept per partition.
* **value**: the JSON derender body, exactly what vLLM's ``/v1/chat/completions/derender``
  (``DerenderChatRequest``: ``model``, ``generate_response``, ``prompt_tokens``,
  ``prompt_token_ids``, ``chat_request``) or ``/v1/completions/derender``
  (``DerenderCompletionRequest``: ``model``, ``generate_responses[]``, ...) accepts.
* **headers** (all optional, UTF-8 values):

  ``reply-topic``
      topic to publish the reply to; default: the worker's ``--reply-topic``
      (``derender-replies``).
  ``correlation-id``
      opaque bytes echoed unchanged on the reply; default: the key, else the body's
      ``generate_response.request_id``.
  ``derender-kind``
      ``chat``, ``completion``, ``responses`` (Responses API, issue 14) or ``messages``
      (Anthropic Messages API, issue 26). When absent the body's shape decides:
      ``generate_response`` => chat (responses when it carries ``responses_request``, messages
      when it carries ``messages_request``), ``generate_responses`` => completion. Any other value is answered
      with a 400 error.
  ``content-type``
      ``application/json`` (informational; the value is always parsed as JSON).

Reply (``reply-topic`` header, else ``--reply-topic``)
------------------------------------------------------
* **key**: the input key; when the input had none, the request id read from the body, else the
  correlation id.
* **value**: the OpenAI response JSON (``chat.completion`` / ``text_completion``) or an OpenAI
  error object ``{"error": {"message", "type", "param", "code"}, "request_id"}``.
* **headers**: ``correlation-id`` (as above), ``content-type: application/json``,
  ``derender-status`` (``200``, ``400``, ``404``, ``413`` or ``500``, HTTP-like, as ASCII digits;
  ``worker.core.errors`` is the taxonomy; streams add ``409``),
  ``derender-kind`` (``chat``/``completion``; omitted when the body's kind cannot be told),
  ``traceparent``/``tracestate`` (W3C Trace Context, copied from the input when valid; see
  ``worker.tracing``).
* ``created`` in the value: the engine's when the body has one, else the input record's Kafka
  timestamp in seconds (``record_created``), so a redelivered record gets a byte-identical reply.

Dead letters (``--dead-letter-topic``, default ``derender-dlq``)
----------------------------------------------------------------
A message is dead-lettered, instead of answered, exactly when no useful reply can be addressed:

1. ``invalid-reply-topic``: the ``reply-topic`` header is not a legal Kafka topic name (empty,
   not ASCII, longer than 249 characters, characters outside ``[A-Za-z0-9._-]``, ``.``/``..``);
2. ``reply-topic-not-allowed``: it names an internal topic (``__`` prefix), the worker's own
   input or dead-letter topic, or does not match ``--allowed-reply-topics`` in full;
3. ``unparseable-no-reply-topic``: the value is not a JSON object (empty/null value, invalid
   UTF-8 or JSON, a JSON array/scalar) **and** there is no ``reply-topic`` header. (With the header
   the sender explicitly asked for a reply and gets a 400 error object instead.);
4. ``no-correlation-id``: no ``correlation-id`` header, no key and no readable request id;
5. ``derender-crashed``: a derender process died on this message, and again when the message
   was rerun alone in a one-process quarantine pool (poison pill);
6. ``reply-publish-failed: <error>``: the reply could not be published for a reason of its own
   (refused as too large, reply topic unknown after ``--reply-topic-wait-ms``);
7. ``internal-error: <error>``: planning the reply raised;
8. ``unreadable-record: <error>``: the Kafka client cannot read the record (a header key that is
   not UTF-8, a malformed record); its dead letter has only the origin headers
   (``worker.transport.unreadable``);
9. ``reply-too-large: reply of N bytes exceeds the limit of M bytes (--max-request-size)``: the
   reply is larger than the producer may send; unlike the others the record is *also* answered,
   with a small 413 ``PayloadTooLargeError`` error reply to the same address (a Messages record:
   Anthropic's error object, ``worker.core.service.error_body_for``; for a stream chunk
   it ends the stream: ``derender-stream-end: 1``, later chunks get the ended-stream 409);
   ``worker.transport.publisher``.

A dead-letter record carries the original key and value and headers, cut to fit
``--dead-letter-max-bytes``, plus ``x-dlq-reason``, ``x-original-topic``/``-partition``/``-offset``,
``x-original-value-sha256``/``-size`` and, when something was cut, ``x-dlq-truncated`` (see
``worker.transport.deadletter``). A dead letter the broker refuses is retried with the partition
paused and the worker not ready, never skipped.

Streaming
---------
A record with a ``derender-seq`` header is one chunk of a streamed request (key = request id,
value = ``DerenderChatStreamRequest``/``DerenderCompletionStreamRequest``); it is answered with
one reply whose value is a JSON array of OpenAI stream chunks and whose headers carry
``derender-seq`` and, on the stream's last reply, ``derender-stream-end: 1``. State per stream
lives in Redis (``--stream-state``, ``--redis-*``), chunks of a stream are derendered in order,
duplicates are replayed identically, gaps end the stream after ``--stream-gap-timeout``. See
``worker.transport.streams`` and docs/kafka.md ("Kafka message format"), docs/streaming.md.

Where each part lives: ``worker.transport.AGENTS.md``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from worker.logs import record_fields

__all__ = ["HDR_REPLY_TOPIC", "HDR_CORRELATION_ID", "HDR_KIND", "HDR_STATUS", "HDR_CONTENT_TYPE",
           "HDR_DLQ_REASON", "HDR_SEQ", "HDR_STREAM_END", "JSON_CT", "KINDS", "STREAM_KINDS", "TOPIC_RE",
           "header", "kind_header", "reply_topic_problem", "INTERNAL_TOPIC_PREFIX", "parse_seq", "bad_kind_message", "SEQ_MAX",
           "KIND_MAX_BYTES", "STREAM_KEY_MAX_BYTES", "record_created", "BINARY_KEY_PREFIX", "stream_id",
           "Outgoing"]

HDR_REPLY_TOPIC = "reply-topic"
HDR_CORRELATION_ID = "correlation-id"
HDR_KIND = "derender-kind"
HDR_STATUS = "derender-status"
HDR_CONTENT_TYPE = "content-type"
HDR_DLQ_REASON = "x-dlq-reason"
HDR_SEQ = "derender-seq"  # stream chunk sequence number (see worker.transport.streams)
HDR_STREAM_END = "derender-stream-end"
JSON_CT = b"application/json"
KINDS = ("chat", "completion", "responses", "messages")  # responses: issue 14 (Responses API); messages: issue 26
STREAM_KINDS = ("chat-stream", "completion-stream", "responses-stream",
                "messages-stream")  # also accepted on stream chunk records
TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


@dataclass(slots=True)
class Outgoing:
    """One record the worker publishes for an input record: its reply (``dlq_reason`` None) or
    its dead letter (``dlq_reason``: the ``x-dlq-reason`` value, also in ``headers``). ``headers``:
    ``(name, value)`` pairs in order; the stream path appends ``derender-seq``/``-stream-end``."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    dlq_reason: str | None = None

    @property
    def is_dead_letter(self) -> bool:
        return self.dlq_reason is not None


#: topic names a record may not reply to: Kafka's internal topics (``__consumer_offsets``,
#: ``__transaction_state``, ...) and every other name starting with two underscores
INTERNAL_TOPIC_PREFIX = "__"


def reply_topic_problem(name: str, allowed: re.Pattern | None = None, forbidden: tuple[str, ...] = ()) -> str | None:
    """Why ``name`` (a decoded ``reply-topic`` header) cannot be replied to, or None when it can:
    ``"invalid-reply-topic"`` unless a legal Kafka topic name (1 to 249 characters of
    ``[A-Za-z0-9._-]``, not ``.`` or ``..``: Kafka's ``Topic.validate``);
    ``"reply-topic-not-allowed"`` for internal names (``__`` prefix), the names in ``forbidden``
    (the worker's input and dead-letter topics: replies there would be fed back to the worker or
    pass for dead letters) and names ``allowed`` (the ``--allowed-reply-topics`` pattern) does
    not match in full."""
    if not TOPIC_RE.match(name) or name in (".", ".."):
        return "invalid-reply-topic"
    if name.startswith(INTERNAL_TOPIC_PREFIX) or name in forbidden:
        return "reply-topic-not-allowed"
    if allowed is not None and allowed.fullmatch(name) is None:
        return "reply-topic-not-allowed"
    return None


def header(msg, name: str) -> bytes | None:
    """Value of the first header ``name`` of record ``msg`` (aiokafka ``ConsumerRecord``), or None."""
    for k, v in msg.headers or ():
        if k == name:
            return v
    return None


#: longest ``derender-kind`` value looked at (the accepted ones are far shorter); longer values
#: are cut to this many bytes plus "..." (still rejected, and the error message stays short)
KIND_MAX_BYTES = 64
#: longest key (request id) of a stream chunk record: it names the stream in memory and in the
#: state store (a Redis key); longer keys are answered with a 400
STREAM_KEY_MAX_BYTES = 1024


#: prefix of the stream id of a key that is not UTF-8 (or that starts with this prefix itself)
BINARY_KEY_PREFIX = "hex:"


def stream_id(key: bytes) -> str:
    """The id naming the stream of a chunk record with key ``key`` (in memory, in the state store,
    in its error messages): the key decoded as UTF-8, or, when it is not UTF-8 or starts with
    ``BINARY_KEY_PREFIX``, that prefix and the key in lowercase hex. Distinct keys always get
    distinct ids (decoding with replacement characters would let two binary keys, e.g. raw UUID
    bytes, share one stream and receive each other's replies)."""
    try:
        s = key.decode("utf-8")
    except UnicodeDecodeError:
        return BINARY_KEY_PREFIX + key.hex()
    return BINARY_KEY_PREFIX + key.hex() if s.startswith(BINARY_KEY_PREFIX) else s


def kind_header(msg) -> str | None:
    """The ``derender-kind`` header, decoded (invalid UTF-8 replaced), stripped and lower-cased;
    None when absent; cut to ``KIND_MAX_BYTES`` (+ "...") when longer."""
    raw = header(msg, HDR_KIND)
    if raw is None:
        return None
    if len(raw) > KIND_MAX_BYTES:
        return raw[:KIND_MAX_BYTES].decode("utf-8", "replace").strip().lower() + "..."
    return raw.decode("utf-8", "replace").strip().lower()


#: largest ``derender-seq``: the next expected one (seq + 1) still fits a signed 64-bit integer
#: (the stream state and the checkpoint store it as msgpack int64)
SEQ_MAX = 2**63 - 2
_SEQ_DIGITS = len(str(SEQ_MAX))
_SEQ_TEXT = re.compile(rb"[0-9]+")  # ASCII digits only (bytes pattern: no Unicode digits)


def parse_seq(msg) -> int | None:
    """The ``derender-seq`` header as an int in ``[0, SEQ_MAX]``; None when absent, not ASCII
    decimal digits only (docs/streaming.md, stream input record table: no blanks, sign, ``_`` separator or
    non-ASCII digit, all of which Python's ``int`` would take) or out of range (checked on the
    text's length before converting, so a huge header costs nothing)."""
    for k, v in msg.headers or ():
        if k == HDR_SEQ:
            if not isinstance(v, (bytes, bytearray)) or not 0 < len(v) <= _SEQ_DIGITS \
                    or _SEQ_TEXT.fullmatch(v) is None:
                return None
            n = int(v)
            return n if n <= SEQ_MAX else None
    return None


def bad_kind_message(kind: str) -> str:
    """Error message of an unknown ``derender-kind`` header value (lists every accepted value)."""
    return (f"unknown {HDR_KIND} header {kind!r}; expected 'chat', 'completion', 'responses' or 'messages' "
            f"(stream chunk records, which carry a {HDR_SEQ} header, also accept 'chat-stream', "
            "'completion-stream', 'responses-stream' or 'messages-stream')")


def record_created(msg) -> int | None:
    """``created`` for the reply of record ``msg``: its Kafka timestamp (CreateTime or
    LogAppendTime, milliseconds) in whole seconds; None when the record has none (<= 0)."""
    ts = getattr(msg, "timestamp", None)
    if not isinstance(ts, int) or ts <= 0:
        return None
    return ts // 1000


def log_fields(msg: Any, request_id: str | None = None) -> dict[str, Any]:
    """Log ``extra`` naming Kafka record ``msg`` (``worker.logs.record_fields``: the JSON log fields
    topic/partition/offset/request_id)."""
    return record_fields(msg.topic, msg.partition, msg.offset, request_id)
