"""The reply producer's settings and the per-record shortcuts of the non-streaming pipeline
(issue 23 item 5): batches of replies bounded by ``--max-request-size``, the one-partition
partitioner shortcut giving the Kafka default partitioner's answer, spans skipped only when the
OpenTelemetry API would make no-op ones, and a failed pool call still rerun per record."""
from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2

from tests.harness.kafka import chat_body, qwen3, tokenizer
from worker import tracing
from worker.core.service import DerenderService
from worker.transport.jobs import derender_job
from worker.transport.metrics import PromMetrics, WorkerStats
from worker.transport.pool import DerenderPool
from worker.transport.publisher import REPLY_BATCH_BYTES, producer_config, reply_partitioner
from worker.transport.settings import WorkerSettings
from worker.transport.unary import UnaryPipeline


def test_producer_config_batches_replies_within_the_request_size():
    cfg = producer_config(WorkerSettings())
    assert cfg["acks"] == "all" and cfg["enable_idempotence"] is False and cfg["linger_ms"] == 2
    assert cfg["max_batch_size"] == REPLY_BATCH_BYTES > 16384  # above the client's default batch
    assert cfg["max_request_size"] == WorkerSettings().max_request_size
    small = producer_config(WorkerSettings(max_request_size=300_000, dead_letter_max_bytes=200_000))
    assert small["max_batch_size"] == 300_000  # a batch never exceeds what the topic must allow
    assert cfg["partitioner"] is reply_partitioner


def test_reply_partitioner_is_the_default_partitioner():
    default = DefaultPartitioner()
    keys = [os.urandom(n) for n in range(0, 80)] + [f"req-{i}".encode() for i in range(300)]
    for parts in ([0, 1], [0, 1, 2], list(range(7)), list(range(64))):
        for key in keys:
            want = default(key, parts, parts)
            assert reply_partitioner(key, parts, parts) == want == parts[(murmur2(key) & 0x7FFFFFFF) % len(parts)]
    for key in keys + [None]:
        assert reply_partitioner(key, [0], [0]) == 0
        assert reply_partitioner(key, [5], []) == 5  # the only partition, available or not


def test_tracer_enabled_only_when_spans_are_made(monkeypatch):
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

    t = tracing.Tracer()
    assert type(t._tracer) is tracing.ProxyTracer
    monkeypatch.setattr(tracing._otel_trace, "get_tracer_provider", lambda: ProxyTracerProvider())
    assert not t.enabled  # the API's default: no-op spans, skipped
    monkeypatch.setattr(tracing._otel_trace, "get_tracer_provider", lambda: NoOpTracerProvider())
    assert not t.enabled
    monkeypatch.setattr(tracing._otel_trace, "get_tracer_provider", lambda: TracerProvider())
    assert t.enabled  # a provider set (later too): spans again
    given = tracing.Tracer.__new__(tracing.Tracer)
    given._tracer, given._prop = TracerProvider().get_tracer("test"), None
    assert given.enabled  # a tracer given directly (tests, embedding)
    monkeypatch.setattr(tracing, "_otel_trace", None)
    assert not tracing.Tracer().enabled


async def test_a_failed_pool_call_is_rerun_per_record_without_spans(qwen3_models):
    """The pipeline's span-less path: a chunk's pool call that failed is not the record's fault;
    each record is rerun alone (``DerenderPool.outcome``) and gets its own derender's reply."""
    tok = tokenizer(qwen3_models)
    service = DerenderService(qwen3_models)
    pool = DerenderPool(None, service, None, 1, "thread")
    pool.make()
    tracer = tracing.Tracer()
    tracer._tracer = None  # no OpenTelemetry: the span-less path whatever the environment
    unary = UnaryPipeline(pool, None, None, tracer, WorkerStats(), PromMetrics(), None,
                          permits=lambda: None, fatal=lambda e: None)
    try:
        for i, text in enumerate(["Hello there.", "A second answer."]):
            body = chat_body(tok, qwen3(qwen3_models).name, f"req-{i}", text)
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("the batch call failed"))
            msg = SimpleNamespace(value=body, headers=[], topic="in", partition=0, offset=i, key=None,
                                  timestamp=1_700_000_000_000)
            out = await unary.outcome(SimpleNamespace(msg=msg, call=failed, index=0))
            want = derender_job(service, body, None, 1_700_000_000)
            assert (out.body, out.status, out.request_id) == (want.body, 200, f"req-{i}")
    finally:
        pool.shutdown()


async def test_a_reply_whose_connection_is_not_ready_is_sent_again_not_dead_lettered():
    """aiokafka fails a batch with ``NodeNotReadyError`` when the connection a broker timeout
    closed is not back before the batch expires (seen after a broker freeze, under load): the
    broker did not answer, so the reply is sent again (rule 3), never dead-lettered for it."""
    from aiokafka.errors import NodeNotReadyError

    from worker.transport.health import HealthState
    from worker.transport.pauses import PartitionPauses
    from worker.transport.publisher import BROKER_TIMEOUT_ERRORS, ReplyPublisher
    from worker.transport.records import Outgoing

    assert issubclass(NodeNotReadyError, BROKER_TIMEOUT_ERRORS)
    loop = asyncio.get_running_loop()
    sent: list[str] = []

    class Producer:  # records what is sent; every delivery succeeds
        async def send(self, topic, value=None, key=None, headers=None):
            sent.append(topic)
            fut = loop.create_future()
            fut.set_result(None)
            return fut

    pub = ReplyPublisher(WorkerSettings(broker_outage_deadline_s=30.0), HealthState(), PartitionPauses(64),
                         tracing.Tracer())
    pub.producer = Producer()
    first = loop.create_future()
    first.set_exception(NodeNotReadyError("Attempt to send a request to node which is not ready (node id 1)."))
    reply = Outgoing("replies", b"k", b"{}", [])
    msg = SimpleNamespace(topic="in", partition=0, offset=7, key=b"k", value=b"{}", headers=[], timestamp=1)
    st = SimpleNamespace(tp=SimpleNamespace(topic="in", partition=0), closed=False)
    acked = await pub.settle(st, msg, reply, first)
    assert acked is reply and not acked.is_dead_letter and sent == ["replies"]


async def test_skipped_spans_leave_the_headers_a_no_op_span_leaves(monkeypatch):
    """With the OpenTelemetry API and no provider, ``send`` skips the span but sends the same
    headers, in the same order, as through a no-op span (trace headers last: a stream reply's
    ``derender-seq`` and a dead letter's own headers come before them); without the API the
    headers go as planned."""
    pytest.importorskip("opentelemetry.trace")
    from opentelemetry.trace import NoOpTracer, ProxyTracerProvider

    from worker.transport.health import HealthState
    from worker.transport.pauses import PartitionPauses
    from worker.transport.publisher import ReplyPublisher
    from worker.transport.records import Outgoing

    loop = asyncio.get_running_loop()
    sent: list[list] = []

    class Producer:
        async def send(self, topic, value=None, key=None, headers=None):
            sent.append(list(headers))
            return loop.create_future()

    tp = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = [("correlation-id", b"c"), ("traceparent", tp), ("tracestate", b"a=b"), ("derender-seq", b"3")]
    monkeypatch.setattr(tracing._otel_trace, "get_tracer_provider", lambda: ProxyTracerProvider())
    skipped, spanned, absent = tracing.Tracer(), tracing.Tracer(), tracing.Tracer()
    spanned._tracer = NoOpTracer()  # spans made, none recording
    absent._tracer = None
    assert not skipped.enabled and spanned.enabled and not absent.installed
    for t in (skipped, spanned, absent):
        pub = ReplyPublisher(WorkerSettings(), HealthState(), PartitionPauses(64), t)
        pub.producer = Producer()
        await pub.send(Outgoing("replies", b"k", b"{}", list(headers)))
    assert sent[0] == sent[1] == [headers[0], headers[3], headers[1], headers[2]]
    assert sent[2] == headers


async def test_records_of_one_pool_call_get_their_own_outcome_in_each_partition_order():
    """One executor call derenders records of two partitions (fetch order a0, b0, a1): each
    partition's sequencer takes its records as one queue item and publishes each with the
    outcome at its own index of the call's result, in offset order."""
    from worker.transport.consumer import _Job
    from worker.transport.jobs import JobOutcome

    loop = asyncio.get_running_loop()
    tracer = tracing.Tracer()
    tracer._tracer = None
    published: list[tuple[str, int, bytes]] = []

    class Publisher:
        async def publish(self, st, msg, plan, request_id, spans=None, note=True):
            published.append((msg.topic, msg.offset, plan))
            done = loop.create_future()
            done.set_result(None)
            return plan, done

    planner = SimpleNamespace(safe_plan=lambda msg, out: out.body)
    unary = UnaryPipeline(None, planner, Publisher(), tracer, WorkerStats(), PromMetrics(), None,
                          permits=lambda: None, fatal=lambda e: None)
    call = loop.create_future()
    msgs = [SimpleNamespace(topic=t, partition=0, offset=o, key=None, headers=[]) for t, o in
            (("a", 0), ("b", 0), ("a", 1))]
    jobs = [_Job(m, call, i) for i, m in enumerate(msgs)]
    parts = {t: SimpleNamespace(jobs=asyncio.Queue(), acks=asyncio.Queue()) for t in "ab"}
    parts["a"].jobs.put_nowait([jobs[0], jobs[2]])
    parts["b"].jobs.put_nowait([jobs[1]])
    tasks = [asyncio.create_task(unary.sequencer(st)) for st in parts.values()]
    try:
        call.set_result([JobOutcome(f"out-{i}".encode(), 200, None, "chat", True) for i in range(3)])
        await asyncio.wait_for(asyncio.gather(*(st.jobs.join() for st in parts.values())), 5)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert [p for p in published if p[0] == "a"] == [("a", 0, b"out-0"), ("a", 1, b"out-2")]
    assert [p for p in published if p[0] == "b"] == [("b", 0, b"out-1")]
    acked = parts["a"].acks.get_nowait()  # one acker item per executor call's records of the partition
    assert parts["a"].acks.empty()
    assert [(job.msg.offset, out.body) for job, _, out, _ in acked] == [(0, b"out-0"), (1, b"out-2")]
