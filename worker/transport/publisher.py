"""The reply publisher: the only place the worker sends records from (replies, error replies and
dead letters, for non-streaming records and stream chunks alike).

Rules, in the order they apply to one ``Outgoing`` reply:

1. a reply to a topic the producer does not know within ``--reply-topic-wait-ms`` is
   dead-lettered (``reply-publish-failed: unknown topic``; remembered for
   ``UNKNOWN_TOPIC_MEMORY_S``, all waits sharing one budget per window: ``reply_topic_known``);
2. a reply larger than ``--max-request-size`` (as the Kafka producer counts a record) is
   dead-lettered in full (``reply-too-large: ...``) and answered with a small 413 error reply to
   the same address (``too_large``/``shrink``: ``worker.core.errors.ReplyTooLarge``);
3. a reply the producer refuses at once, or whose delivery fails for good, is dead-lettered
   (``reply-publish-failed: <error>``); a delivery failing with a transient error while a reply
   topic is being created (``TRANSIENT_ERRORS``: aiokafka's ``UnknownError`` during auto-create,
   unknown topic or partition, no leader yet) is sent again, with backoff, for at most
   ``TRANSIENT_RETRY_S`` seconds first (``settle``); a delivery that timed out because the
   broker did not answer (``BROKER_TIMEOUT_ERRORS``: a frozen or unreachable broker past
   ``--request-timeout-ms``) is sent again, with backoff, for up to ``--broker-outage-deadline``
   seconds (the broker watch makes the worker give up by then), so a broker stall delays
   replies instead of dead-lettering them; while the worker stops (SIGTERM drain, a give-up) such
   a reply is sent again until the drain ends, whatever those deadlines: a broker timeout is
   never the record's fault, so it is never dead-lettered for the stop; a reply still unacked
   when the drain ends leaves its record uncommitted (the final commit stops below it) and the
   next owner of the partition answers it (docs/delivery.md, Shutdown);
4. a dead letter is retried until the broker acknowledges it (``dead_letter_until_acked``: the
   partition paused, the worker not ready meanwhile); never skipped, never a crash. Retrying
   stops only when the partition goes away or the worker stops (``DeadLetterError``: the record
   stays uncommitted and is redelivered).

Every acknowledgement's offset goes through ``ack_offsets.AckOffsets``: an offset handed out again
on a partition (the broker lost acknowledged records) is reported to ``on_broker_lost`` (the
broker watch: not ready, no more offset commits, exit; docs/kafka.md, "Embedded broker limits").
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NodeNotReadyError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
    UnknownError,
    UnknownTopicOrPartitionError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from worker.core.errors import ReplyTooLarge
from worker.core.service import error_body_for, record_api
from worker.tracing import TRACEPARENT, TRACESTATE, Tracer
from worker.transport.ack_offsets import AckOffsets
from worker.transport.deadletter import DeadLetterError, dead_letter
from worker.transport.health import HealthState
from worker.transport.pauses import PartitionPauses
from worker.transport.records import HDR_KIND, HDR_STATUS, Outgoing, log_fields

log = logging.getLogger(__name__)

__all__ = ["ReplyPublisher", "UNKNOWN_TOPIC_MEMORY_S", "TRANSIENT_ERRORS", "TRANSIENT_RETRY_S",
           "BROKER_TIMEOUT_ERRORS", "REPLY_BATCH_BYTES", "producer_config", "reply_partitioner"]

#: seconds a reply topic that did not appear within ``reply_topic_wait_ms`` counts as unknown
UNKNOWN_TOPIC_MEMORY_S = 10.0
#: delivery errors of a reply that pass while its topic is being (auto-)created (issue 16, item 4)
TRANSIENT_ERRORS = (UnknownError, UnknownTopicOrPartitionError, LeaderNotAvailableError, NotLeaderForPartitionError)
#: seconds a reply failing with ``TRANSIENT_ERRORS`` is sent again before it is dead-lettered
TRANSIENT_RETRY_S = 10.0
#: delivery errors of a reply when the broker does not answer (frozen, unreachable; aiokafka's
#: ``NodeNotReadyError``: the connection a timeout closed is not back before the batch expired):
#: sent again for up to ``--broker-outage-deadline`` seconds (rule 3)
BROKER_TIMEOUT_ERRORS = (KafkaTimeoutError, RequestTimedOutError, KafkaConnectionError, NodeNotReadyError)


#: most bytes of replies in one record batch (the producer's ``batch.size``, aiokafka's
#: ``max_batch_size``; never above ``--max-request-size``, which the reply topic must allow).
#: The client's 16 KiB default held ~8 replies of 2 KB per produce request and aiokafka keeps one
#: request in flight per broker (acks=all): a drain paid a broker round trip per 8 replies, and
#: the broker and this process a request each (docs/performance.md, issue 23)
REPLY_BATCH_BYTES = 1024 * 1024

_default_partitioner = DefaultPartitioner()


def reply_partitioner(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
    """The Kafka default partitioner (murmur2 of the key, as the Java client), short-cut for a
    topic of one partition, whose only partition it always returns (no per-reply hash)."""
    if len(all_partitions) == 1:
        return all_partitions[0]
    return _default_partitioner(key, all_partitions, available)


def producer_config(settings: Any) -> dict[str, Any]:
    """The reply producer's aiokafka settings (besides the client's): ``acks=all``, no
    idempotence, ``linger_ms=2``, ``max_request_size`` and ``REPLY_BATCH_BYTES`` batches from
    ``settings`` (a ``WorkerSettings``), ``reply_partitioner``."""
    return dict(acks="all", enable_idempotence=False, linger_ms=2, max_request_size=settings.max_request_size,
                max_batch_size=min(REPLY_BATCH_BYTES, settings.max_request_size), partitioner=reply_partitioner)


def _done_future() -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


class ReplyPublisher:
    """Sends ``Outgoing`` records with the rules of the module docstring.

    ``settings``: the ``WorkerSettings`` (reply and dead-letter topics, ``dead_letter_max_bytes``,
    ``max_request_size``, ``reply_topic_wait_ms``, ``input_topic``); ``producer``: the started
    ``AIOKafkaProducer`` (set before the first send); ``health``: not-ready reasons while a dead
    letter is retried; ``pauses``: the partition pauses; ``stopping``: set when the worker stops
    (retries end); ``tracer``: publish spans; ``on_dead_letter(reason)``: called for each dead
    letter acked next to a reply (the 413 case; other dead letters are counted by the caller as the
    record's outcome). ``on_broker_lost(text)``: called when an acknowledged offset went backwards
    on a partition (``acks``: the ``AckOffsets``); the default logs an ERROR line."""

    def __init__(self, settings: Any, health: HealthState, pauses: PartitionPauses, tracer: Tracer, *,
                 on_dead_letter: Any = None):
        self.settings = settings
        self.producer: Any = None
        self.health = health
        self.pauses = pauses
        self.tracer = tracer
        self.stopping: asyncio.Event | None = None
        self.on_dead_letter = on_dead_letter or (lambda reason: None)
        self._unknown_topics: dict[str, float] = {}  # reply topic -> monotonic time until it counts as unknown
        self._topic_wait_window = (0.0, 0.0)  # (monotonic end of the window, seconds spent waiting in it)
        self.acks = AckOffsets()
        self.on_broker_lost = lambda text: log.error("%s", text)

    def _stopped(self) -> bool:
        return self.stopping is not None and self.stopping.is_set()

    # -- what to send ---------------------------------------------------------------------------
    def dead_letter(self, msg: Any, reason: str) -> Outgoing:
        """The dead letter of ``msg`` for ``reason`` (``worker.transport.deadletter``)."""
        return dead_letter(msg, reason, self.settings.dead_letter_topic, self.settings.dead_letter_max_bytes)

    def too_large(self, out: Outgoing) -> ReplyTooLarge | None:
        """The 413 error of reply ``out`` when the producer would refuse it as larger than
        ``--max-request-size`` (aiokafka's own estimate of the record's size), else None."""
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(out.key, out.value, out.headers)
        return ReplyTooLarge(size, self.settings.max_request_size) if size > self.settings.max_request_size else None

    @staticmethod
    def shrink(out: Outgoing, err: ReplyTooLarge, request_id: str | None) -> Outgoing:
        """Reply ``out`` replaced by the small error reply of ``err`` to the same address (topic,
        key, headers; ``derender-status: 413``): the error object of the API its ``derender-kind``
        header names (``record_api``: Anthropic's error object for a Messages reply)."""
        kind = next((v for k, v in out.headers if k == HDR_KIND), None)
        api = record_api(kind.decode("ascii", "replace") if kind is not None else None)
        headers = [(k, str(err.status).encode() if k == HDR_STATUS else v) for k, v in out.headers]
        return Outgoing(out.topic, out.key, error_body_for(api, err.message, err.status, request_id), headers)

    # -- sending --------------------------------------------------------------------------------
    async def send(self, out: Outgoing, spans: bool | None = None, note: bool = True) -> asyncio.Future:
        """Produce ``out`` (in a ``derender.publish`` span child of the record's trace context;
        with a recording span the record's ``traceparent`` becomes the span's). Returns the
        delivery future; raises ``KafkaError`` when the producer refuses it at once. Its offset,
        once acknowledged, goes through ``acks`` (``note=False``: the caller hands it to
        ``note_acks`` with the records sent after it). ``spans``: ``tracer.enabled`` when the caller read
        it already (None: read it here)."""
        fut = await self._send(out, spans)
        if note:
            fut.add_done_callback(self._acked)
        return fut

    def note_acks(self, sent: list[tuple[str, asyncio.Future]]) -> None:
        """Put the deliveries of records sent in a row with ``note=False`` (``(topic, delivery)``
        in send order) through ``acks`` once acked: for a topic of one partition only its last
        pending one (acknowledged last, at the highest offset of them: the producer completes a
        partition's batches in order; should it fail, the ones before it that were acked count,
        ``_acked_last``), for any other topic each pending one (their partitions are known only
        from the acknowledgement). A delivery done already (acked while the caller sent the
        records after it) counts out of order (``AckOffsets.note_late``, from a done-callback:
        after the notes of deliveries acknowledged with it, whose callbacks are queued already):
        skipping it would leave the offsets it was acked at unknown, and an empty broker handing
        them out again unreported."""
        last: dict[str, list[asyncio.Future]] = {}
        single: dict[str, bool] = {}
        cluster = self.producer.client.cluster
        for topic, fut in sent:
            if fut.done():  # (its note after those of deliveries acked with it, queued already)
                fut.add_done_callback(self._acked_late)
                continue
            one = single.get(topic)
            if one is None:
                one = single[topic] = len(cluster.partitions_for_topic(topic) or ()) == 1
            if one:
                last.setdefault(topic, []).append(fut)
            else:
                fut.add_done_callback(self._acked)
        for futs in last.values():
            if len(futs) == 1:
                futs[0].add_done_callback(self._acked)
            else:
                futs[-1].add_done_callback(functools.partial(self._acked_last, futs[:-1]))

    def _acked_last(self, before: list[asyncio.Future], fut: asyncio.Future) -> None:
        """Done-callback of the last of deliveries ``before + [fut]`` to a topic of one
        partition: ``fut``'s offset to ``acks``; when ``fut`` failed, the offsets of those
        before it that were acked (done by then: the producer completes a partition's batches in
        order; one still pending is noted when acked)."""
        if not fut.cancelled() and fut.exception() is None:
            self._acked(fut)
            return
        for b in before:
            b.add_done_callback(self._acked_late if b.done() else self._acked)

    def _acked_late(self, fut: asyncio.Future) -> None:
        """A delivery done before it could be noted in acknowledgement order: its offset raises
        the partition's highest known one (``AckOffsets.note_late``), nothing is reported."""
        if fut.cancelled() or fut.exception() is not None:
            return
        md = fut.result()
        if md is not None:
            self.acks.note_late(md.topic, md.partition, md.offset)

    def _acked(self, fut: asyncio.Future) -> None:
        """Done-callback of a delivery: its offset to ``acks`` (in acknowledgement order)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        md = fut.result()
        if md is None:  # (no metadata: nothing to check)
            return
        problem = self.acks.note(md.topic, md.partition, md.offset)
        if problem is not None:
            self.on_broker_lost(problem)

    async def _send(self, out: Outgoing, spans: bool | None = None) -> asyncio.Future:
        headers = out.headers
        if not self.tracer.installed:
            return await self.producer.send(out.topic, value=out.value, key=out.key, headers=headers)
        carrier = [(k, v) for k, v in headers if k in (TRACEPARENT, TRACESTATE)]
        if not (self.tracer.enabled if spans is None else spans):  # the API without a provider: the headers a no-op span leaves (trace ones last)
            if carrier:
                headers = [h for h in headers if h[0] not in (TRACEPARENT, TRACESTATE)] + carrier
            return await self.producer.send(out.topic, value=out.value, key=out.key, headers=headers)
        with self.tracer.span("derender.publish", carrier, kind="producer",
                              **{"messaging.system": "kafka", "messaging.destination.name": out.topic,
                                 "derender.dead_letter_reason": out.dlq_reason}) as sp:
            if carrier and sp is not None:
                headers = [h for h in headers if h[0] not in (TRACEPARENT, TRACESTATE)]
                headers += self.tracer.reply_headers(carrier, sp)
            return await self.producer.send(out.topic, value=out.value, key=out.key, headers=headers)

    async def publish(self, st: Any, msg: Any, out: Outgoing, request_id: str | None = None, *,
                      spans: bool | None = None, note: bool = True) -> tuple[Outgoing, asyncio.Future]:
        """Send ``out`` for record ``msg`` of partition ``st`` -> ``(record actually sent, delivery
        future)`` (rules 1-4 of the module docstring; rule 2 needs ``request_id`` for the error
        object; ``spans``, ``note``: as for ``send``, for the record sent here). Raises
        ``DeadLetterError`` when a dead letter's retries stop."""
        if out.dlq_reason is None and not await self.reply_topic_known(out.topic):
            out = self.dead_letter(msg, f"reply-publish-failed: unknown topic {out.topic!r}")
        if out.dlq_reason is None:
            err = self.too_large(out)
            if err is not None:
                out = await self.replace_too_large(st, msg, out, err, request_id)
                if out.is_dead_letter:  # even the 413 was too big: the dead letter (acked) is all
                    return out, _done_future()
        if out.dlq_reason is None:
            try:
                return out, await self.send(out, spans=spans, note=note)
            except BROKER_TIMEOUT_ERRORS as e:  # the broker does not answer: settle() sends it again
                failed = asyncio.get_running_loop().create_future()
                failed.set_exception(e)
                return out, failed
            except KafkaError as e:  # refused at once for a reason of its own
                refused = out.topic
                out = self.dead_letter(msg, f"reply-publish-failed: {type(e).__name__}: {e}")
                log.warning("dead-lettering %s[%d]@%d: %s (reply topic %s)", msg.topic, msg.partition,
                            msg.offset, out.dlq_reason, refused, extra=log_fields(msg))
        elif out.dlq_reason is not None:
            log.warning("dead-lettering %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, out.dlq_reason,
                        extra=log_fields(msg))
        try:
            return out, await self.send(out, spans=spans, note=note)
        except KafkaError:
            pass
        await self.dead_letter_until_acked(st, msg, out)
        return out, _done_future()

    async def replace_too_large(self, st: Any, msg: Any, out: Outgoing, err: ReplyTooLarge,
                                request_id: str | None) -> Outgoing:
        """Rule 2: dead-letter ``msg`` in full (``reply-too-large: <err>``, retried until acked),
        then return the small 413 reply replacing ``out`` (or that dead letter, already acked,
        when even the small reply is too large: a key or headers of megabytes)."""
        reason = f"reply-too-large: {err.message}"
        log.warning("%s[%d]@%d: %s; answering 413 and dead-lettering the record", msg.topic, msg.partition,
                    msg.offset, err.message, extra=log_fields(msg, request_id))
        dl = self.dead_letter(msg, reason)
        await self.dead_letter_until_acked(st, msg, dl)
        small = self.shrink(out, err, request_id)
        if self.too_large(small) is not None:
            return dl
        self.on_dead_letter(reason)
        return small

    async def settle(self, st: Any, msg: Any, out: Outgoing, delivery: asyncio.Future,
                     request_id: str | None = None) -> Outgoing:
        """Await the broker's ack of ``out`` (``delivery``) -> the record acknowledged (``out``,
        or the dead letter that replaced it). Rules 3-4; raises ``DeadLetterError`` when a dead
        letter's retries stop, ``KafkaError`` never. While the worker stops, a reply failing with
        a transient or broker-timeout error is sent again until the caller's task is cancelled
        (the end of the drain): it is not dead-lettered because the worker stops."""
        t_end = None
        delay = 0.1
        while True:
            try:
                await delivery
                return out
            except KafkaError as e:
                if out.is_dead_letter:
                    break
                retry_s = (TRANSIENT_RETRY_S if isinstance(e, TRANSIENT_ERRORS) else
                           self.settings.broker_outage_deadline_s if isinstance(e, BROKER_TIMEOUT_ERRORS) else None)
                if retry_s is not None:
                    now = time.monotonic()
                    t_end = t_end if t_end is not None else now + retry_s
                    # stopping: sent again while the drain lasts, never dead-lettered for it (the
                    # drain's end cancels this; the record stays uncommitted and is redelivered)
                    if now < t_end or self._stopped():
                        log.info("reply of %s[%d]@%d to %s: %s: %s; sending it again in %.1fs", msg.topic,
                                 msg.partition, msg.offset, out.topic, type(e).__name__, e, delay,
                                 extra=log_fields(msg, request_id))
                        await asyncio.sleep(delay)
                        delay = min(1.0, delay * 2)
                        try:
                            delivery = await self.send(out)
                        except KafkaError as e2:  # refused at once: judged like a failed delivery
                            delivery = asyncio.get_running_loop().create_future()
                            delivery.set_exception(e2)
                        continue
                refused = out.topic
                out = self.dead_letter(msg, f"reply-publish-failed: {type(e).__name__}: {e}")
                log.warning("dead-lettering %s[%d]@%d: %s (reply topic %s)", msg.topic, msg.partition,
                            msg.offset, out.dlq_reason, refused, extra=log_fields(msg, request_id))
                break
        await self.dead_letter_until_acked(st, msg, out)
        return out

    async def dead_letter_until_acked(self, st: Any, msg: Any, out: Outgoing) -> None:
        """Publish dead letter ``out`` of ``msg`` and wait for the broker's ack, retrying with
        backoff (0.5 s doubling to 30 s) while it fails (dead-letter topic missing or unwritable).
        Meanwhile the partition ``st`` is paused (no new fetches; its offset cannot pass this
        record anyway) and the health state is not ready (reason key
        ``dead-letter:<topic>[<partition>]``). Raises ``DeadLetterError`` when the partition is
        revoked or the worker is stopping while retrying: the record stays uncommitted."""
        delay, paused, attempt = 0.5, False, 0
        key = f"dead-letter:{st.tp.topic}[{st.tp.partition}]"
        try:
            while True:
                attempt += 1
                try:
                    await (await self.send(out))
                    if attempt > 1:
                        log.warning("dead letter of %s[%d]@%d published after %d attempts", msg.topic,
                                    msg.partition, msg.offset, attempt)
                    return
                except KafkaError as e:
                    why = (f"cannot publish dead letters to {out.topic!r}: {type(e).__name__}: {e}; "
                           f"partition {st.tp.topic}[{st.tp.partition}] paused at offset {msg.offset}")
                    self.health.set_reason(key, why)
                    if st.closed or self._stopped():
                        raise DeadLetterError(why) from e
                    log.error("%s; retrying in %.1fs (attempt %d)", why, delay, attempt)
                    if not paused:
                        paused = self.pauses.pause(st.tp, "dead-letter")
                    try:  # the backoff, cut short by a stop request
                        await asyncio.wait_for(self.stopping.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                    delay = min(delay * 2, 30.0)
        finally:
            self.health.clear_reason(key)
            if paused and not st.closed:
                self.pauses.unpause(st.tp, "dead-letter")

    # -- reply topics ---------------------------------------------------------------------------
    async def reply_topic_known(self, topic: str) -> bool:
        """Whether the producer has (or gets within ``reply_topic_wait_ms``) metadata for
        ``topic``. A topic that did not appear is remembered as unknown for
        ``UNKNOWN_TOPIC_MEMORY_S`` seconds, so records addressed to it fail at once instead of each
        blocking its partition for the producer's full metadata wait (``request_timeout_ms``).
        All waits together are bounded too: at most ``reply_topic_wait_ms`` per
        ``UNKNOWN_TOPIC_MEMORY_S`` window, after which names not known yet fail at once until the
        window ends (records naming a new missing topic each could otherwise hold up their
        partition for ``reply_topic_wait_ms`` apiece)."""
        if topic == self.settings.reply_topic or self.producer.client.cluster.partitions_for_topic(topic):  # cached
            return True
        now = time.monotonic()
        until = self._unknown_topics.get(topic)
        if until is not None and until > now:
            return False
        end, spent = self._topic_wait_window
        if now >= end:
            end, spent = now + UNKNOWN_TOPIC_MEMORY_S, 0.0
            self._topic_wait_window = (end, spent)
        budget = self.settings.reply_topic_wait_ms / 1000 - spent
        try:
            if budget <= 0:
                raise asyncio.TimeoutError  # the window's waiting is spent: unknown at once
            await asyncio.wait_for(self.producer.partitions_for(topic), budget)
            self._unknown_topics.pop(topic, None)
            return True
        except (asyncio.TimeoutError, KafkaError):
            if len(self._unknown_topics) >= 1024:  # bounded: forget the oldest
                self._unknown_topics.pop(next(iter(self._unknown_topics)))
            self._unknown_topics[topic] = now + UNKNOWN_TOPIC_MEMORY_S
            # the producer's client added the name to the topics it refreshes metadata for, for
            # good: take it out again, so that names from records cannot grow that list forever
            client = self.producer.client
            known = getattr(client, "_topics", None)
            if isinstance(known, set) and topic in known:
                client.set_topics(known - {topic})
            return False
        finally:  # (concurrent waits of other partitions add up in the same window)
            cur_end, cur_spent = self._topic_wait_window
            if cur_end == end:
                self._topic_wait_window = (end, cur_spent + time.monotonic() - now)
