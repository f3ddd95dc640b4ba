"""Operability of the Kafka worker on the real embedded broker: ``created`` from the record
timestamp (byte-identical replies on redelivery, one value per stream), W3C trace headers carried
to replies and dead letters, OpenTelemetry spans, and log records naming the record."""
from __future__ import annotations

import json
import logging

import pytest
from aiokafka import AIOKafkaProducer

from tests.harness.kafka import chat_body
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import headers as _h
from tests.harness.kafka import names as _names
from tests.harness.kafka import qwen3 as _qwen3
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_CORRELATION_ID, HDR_DLQ_REASON, HDR_REPLY_TOPIC, HDR_SEQ
from worker.transport.topics import ensure_topics

pytestmark = pytest.mark.kafka

TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TS = b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
T0 = 1_700_000_000_123  # ms


async def _send(bs: str, topic: str, records: list[tuple]) -> None:
    """records: (key, value, headers, timestamp_ms or None)."""
    p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False)
    await p.start()
    try:
        for key, value, headers, ts in records:
            await p.send_and_wait(topic, value, key=key, headers=headers, timestamp_ms=ts)
    finally:
        await p.stop()


async def test_created_is_the_record_timestamp_and_trace_headers_follow(kafka_bootstrap, kafka_broker_kind,
                                                                         qwen3_models, caplog):
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    body = chat_body(tok, model, "r-1", "Hello there")
    engine = json.loads(body)
    engine["generate_response"]["created"] = 1_234_567_890
    trace = [("traceparent", TP), ("tracestate", TS)]
    await _send(bs, n.inp, [
        (b"r-1", body, [(HDR_CORRELATION_ID, b"first")] + trace, T0),
        (b"r-1", body, [(HDR_CORRELATION_ID, b"again")] + trace, T0),  # a redelivery: same record
        (b"r-2", json.dumps(engine).encode(), [(HDR_CORRELATION_ID, b"engine"), ("traceparent", b"garbage")], T0),
        (b"r-3", body, [(HDR_CORRELATION_ID, b"dlq"), (HDR_REPLY_TOPIC, b"bad topic!")] + trace, T0 + 5000),
    ])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group)
    with caplog.at_level(logging.WARNING, logger="worker.transport.consumer"):
        async with KafkaDerenderWorker(settings, qwen3_models):
            got = await _collect(bs, [n.reply, n.dlq], 4, timeout=60)
    by = {_h(r)[HDR_CORRELATION_ID]: r for r in got[n.reply]}
    first, again, eng = by[b"first"], by[b"again"], by[b"engine"]
    assert json.loads(first.value)["created"] == T0 // 1000
    assert first.value == again.value  # byte-identical on redelivery
    assert json.loads(eng.value)["created"] == 1_234_567_890  # the engine's value wins
    assert (_h(first)["traceparent"], _h(first)["tracestate"]) == (TP, TS)
    assert "traceparent" not in _h(eng) and "tracestate" not in _h(eng)  # invalid: not propagated
    (dl,) = got[n.dlq]
    assert _h(dl)[HDR_DLQ_REASON] == b"invalid-reply-topic"
    assert (_h(dl)["traceparent"], _h(dl)["tracestate"]) == (TP, TS)
    (rec,) = [r for r in caplog.records if "dead-lettering" in r.getMessage()]
    assert (rec.topic, rec.partition, rec.offset) == (n.inp, 0, 3)


async def test_every_stream_chunk_has_the_first_records_created(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").ids
    parts = [tok.encode("Hello").ids, tok.encode(" world").ids, [tok.token_to_id("<|im_end|>")]]
    recs = []
    for i, ids in enumerate(parts):
        b = {"model": model, "stream": True, "generate_chunk": {"request_id": "s-1", "choices": [
            {"index": 0, "token_ids": ids, "finish_reason": "stop" if i == 2 else None}]}}
        if i == 0:
            b |= {"prompt_token_ids": prompt, "prompt_tokens": len(prompt),
                  "chat_request": {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}}
        recs.append((b"s-1", json.dumps(b).encode(), [(HDR_SEQ, str(i).encode())], T0 + 7000 * i))
    await _send(bs, n.inp, recs)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, redis=None)
    async with KafkaDerenderWorker(settings, qwen3_models):
        got = await _collect(bs, [n.reply], 3, timeout=60)
    chunks = [c for r in got[n.reply] for c in json.loads(r.value)]
    assert len(got[n.reply]) == 3 and len(chunks) >= 3, [r.value for r in got[n.reply]]
    assert {c["created"] for c in chunks} == {T0 // 1000}


async def test_opentelemetry_spans_continue_the_records_trace(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    await _send(bs, n.inp, [(b"o-1", chat_body(tok, model, "o-1", "Traced"), [("traceparent", TP)], None)])
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group)
    worker = KafkaDerenderWorker(settings, qwen3_models)
    worker._tracer._tracer = provider.get_tracer("test")  # an SDK provider just for this worker
    async with worker:
        got = await _collect(bs, [n.reply], 1, timeout=60)
    spans = {s.name: s for s in exp.get_finished_spans()}
    assert {"derender.derender", "derender.publish"} <= set(spans)
    trace_id = TP.split(b"-")[1].decode()
    for s in spans.values():
        assert f"{s.context.trace_id:032x}" == trace_id
        assert f"{s.parent.span_id:016x}" == TP.split(b"-")[2].decode()
    (rep,) = got[n.reply]
    tp = _h(rep)["traceparent"].split(b"-")
    assert tp[1].decode() == trace_id and tp[2].decode() == f"{spans['derender.publish'].context.span_id:016x}"


def test_bench_kafka_prints_end_to_end_figures(kafka_bootstrap, capsys, monkeypatch):
    """``bench --kafka`` on the session broker with one worker subprocess: every record answered,
    figures printed beside the in-process core figure."""
    from worker.cli import main
    for k in ("DERENDER_LOG_LEVEL", "DERENDER_LOG_FORMAT"):  # main exports them: undone after the test
        monkeypatch.setenv(k, "INFO" if k.endswith("LEVEL") else "text")
    assert main(["bench", "--kafka", "--bootstrap-servers", kafka_bootstrap, "--rate", "50", "--requests", "20",
                 "--partitions", "2", "--distinct", "4", "--seconds", "0.2", "--fetch-max-wait-ms", "50"]) == 0
    out = capsys.readouterr().out
    assert "20 replies (0 missing)" in out and "p50" in out and "p99" in out, out
    assert "in-process core on the same bodies" in out


def test_bench_drain_prints_the_drain_and_batch_rates_and_their_ratio(kafka_bootstrap, capsys, monkeypatch):
    """``bench drain`` on the session broker: a pre-filled topic drained by one worker subprocess
    (every record answered, else exit 2), then ``batch`` on the same bodies; both rates and
    their ratio printed (figures, not asserted)."""
    import re

    from worker.cli import main
    for k in ("DERENDER_LOG_LEVEL", "DERENDER_LOG_FORMAT"):  # main exports them: undone after the test
        monkeypatch.setenv(k, "INFO" if k.endswith("LEVEL") else "text")
    assert main(["bench", "drain", "--bootstrap-servers", kafka_bootstrap, "--requests", "60", "--partitions", "2",
                 "--distinct", "4", "--timeout", "120", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    drain = re.search(r"kafka drain: (\d+) records/s", out)
    batch = re.search(r"batch: +(\d+) records/s", out)
    ratio = re.search(r"ratio drain / batch: ([\d.]+)", out)
    assert drain and batch and ratio, out
    assert int(drain.group(1)) > 0 and int(batch.group(1)) > 0
    ratio_printed, ratio_ints = float(ratio.group(1)), int(drain.group(1)) / int(batch.group(1))
    assert abs(ratio_printed - ratio_ints) <= 0.01 + 0.05 * ratio_ints, out  # (the rates are printed rounded)
