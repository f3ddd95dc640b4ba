"""Hostile records through the Kafka worker on a real broker (embedded Tansu unless
``KAFKA_BOOTSTRAP_SERVERS`` is set): each kind gets a reply or a dead letter, the worker never
stops, and the valid records next to them (in the same pool call) are answered correctly.

Kinds (issue 7): out-of-range numbers (token ids, ``derender-seq``), deep JSON nesting, oversized
header values and keys, values too large to dead-letter whole, illegal / internal / not allowed
reply topics, replies the broker refuses for a per-record reason."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.harness.kafka import chat_body, completion_body, hang_reply_topics
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import committed_and_end as _committed_and_end
from tests.harness.kafka import headers as _h
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import qwen3 as _qwen3
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from worker.core.service import DerenderService
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_CORRELATION_ID, HDR_KIND, HDR_REPLY_TOPIC, HDR_SEQ, HDR_STATUS
from worker.transport.topics import ensure_topics

pytestmark = pytest.mark.kafka


def _with(body: bytes, fn) -> bytes:
    obj = json.loads(body)
    fn(obj)
    return json.dumps(obj).encode()


def _set_prompt(v):
    def f(o):
        o["prompt_token_ids"][0] = v
    return f


def _set_token(v):
    def f(o):
        o["generate_response"]["choices"][0]["token_ids"][0] = v
    return f


async def test_out_of_range_numbers_and_deep_nesting_stay_with_their_record(kafka_bootstrap, kafka_broker_kind,
                                                                             qwen3_models):
    """A process pool (one process, so every fetched batch is one pool call of up to 16 records):
    each hostile record is answered with a 400, every valid neighbour with exactly the answer the
    core gives it alone, nothing is dead-lettered, no worker exit, offsets committed to the end."""
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    R = [(HDR_REPLY_TOPIC, n.reply.encode())]
    base = chat_body(tok, model, "base", "Hello there")
    deep_valid = base[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    hostile = {
        b"h-prompt-neg": (_with(base, _set_prompt(-1)), []),
        b"h-prompt-2^63": (_with(base, _set_prompt(2**63)), []),
        b"h-prompt-2^64": (_with(base, _set_prompt(2**64)), []),
        b"h-prompt-oov": (_with(base, _set_prompt(10_000_000)), []),
        b"h-token-2^70": (_with(base, _set_token(2**70)), []),
        b"h-created-2^64": (_with(base, lambda o: o["generate_response"].update(created=2**64)), []),
        b"h-logprob-byte": (_with(base, lambda o: o["generate_response"]["choices"][0].update(logprobs={"content": [
            {"token_id": 1, "logprob": -0.1, "bytes": [256]}]})), []),
        b"h-deep-invalid": (b'{"a":' * 100_000, R),  # unterminated, 100,000 levels
        b"h-deep-valid": (deep_valid, []),
        b"h-deep-array": (b"[" * 100_000, R),
        b"h-kind-huge": (base, [(HDR_KIND, b"k" * 100_000)]),
        b"h-seq-2^64": (b'{"stream":true,"generate_chunk":{"request_id":"s"}}', [(HDR_SEQ, str(2**64).encode())]),
        b"h-seq-5000-digits": (b'{"stream":true,"generate_chunk":{"request_id":"s"}}', [(HDR_SEQ, b"9" * 5000)]),
        b"h-seq-neg": (b'{"stream":true,"generate_chunk":{"request_id":"s"}}', [(HDR_SEQ, b"-1")]),
        b"h-seq-blank": (b'{"stream":true,"generate_chunk":{"request_id":"s"}}', [(HDR_SEQ, b" 1")]),
        b"h-seq-underscore": (b'{"stream":true,"generate_chunk":{"request_id":"s"}}', [(HDR_SEQ, b"1_0")]),
        b"k" * 5000: (b'{"stream":true,"generate_chunk":{"request_id":"s"}}', [(HDR_SEQ, b"0")]),  # key too long
    }
    records, valid = [], {}
    hs = list(hostile.items())
    for i in range(3 * len(hs)):
        key = f"v-{i}".encode()
        body = chat_body(tok, model, f"v-{i}", f"Valid answer number {i}")
        valid[key] = body
        records.append((key, body, [(HDR_CORRELATION_ID, key)]))
        if i % 3 == 1:
            hk, (hv, hh) = hs[i // 3]
            records.append((hk, hv, hh))
    await _produce(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, executor="process", num_workers=1, max_in_flight=64)
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        got = await _collect(bs, [n.reply, n.dlq], len(records), timeout=120, settle=0.5)
    assert worker._fatal is None
    assert got[n.dlq] == [], [(r.key, _h(r)) for r in got[n.dlq]]
    replies = {r.key: r for r in got[n.reply]}
    assert len(got[n.reply]) == len(records) and set(replies) == {r[0] for r in records}
    svc = DerenderService(qwen3_models)
    for key, body in valid.items():
        rec = replies[key]
        assert _h(rec)[HDR_STATUS] == b"200", (key, rec.value[:300])
        created = json.loads(rec.value)["created"]  # the input record's timestamp (s)
        assert created > 1_600_000_000, key
        assert rec.value == svc.derender(body, created=created).body, key
    for key in hostile:
        rec = replies[key]
        assert _h(rec)[HDR_STATUS] == b"400", (key[:40], rec.value[:300])
        err = json.loads(rec.value)["error"]
        assert err["type"] == "BadRequestError" and len(rec.value) < 2000, (key[:40], err)
    assert "nested too deeply" in json.loads(replies[b"h-deep-valid"].value)["error"]["message"]
    assert "outside the vocabulary" in json.loads(replies[b"h-prompt-oov"].value)["error"]["message"]
    for key in (b"h-seq-2^64", b"h-seq-blank", b"h-seq-underscore"):  # not a decimal number: no seq echoed
        assert HDR_SEQ not in _h(replies[key]), key
    committed, end = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == end == {0: len(records)}


# ------------------------------------------------------------------------------ broker-free ---
def test_parse_seq_bounds_the_header_before_converting():
    from types import SimpleNamespace

    from worker.transport.records import SEQ_MAX, parse_seq

    def seq(v):
        return parse_seq(SimpleNamespace(headers=[(HDR_SEQ, v)]))

    assert seq(b"0") == 0 and seq(b"17") == 17 and seq(b"007") == 7 and seq(str(SEQ_MAX).encode()) == SEQ_MAX
    # digits only, as docs/streaming.md says: every form Python's int() would also take is refused
    for bad in (str(SEQ_MAX + 1).encode(), str(2**64).encode(), b"9" * 5000, b"-1", b"+1", b"1e3", b"",
                "\u0661".encode(), "\uff11".encode(), b"\xff", b" 1", b"1 ", b" 17 ", b"\t1", b"1\n", b"1_0",
                b"0x10", bytearray(b"+0")):
        assert seq(bad) is None, bad
    assert parse_seq(SimpleNamespace(headers=None)) is None


def test_derender_job_keeps_any_exception_with_its_value():
    """``proc_jobs``-style batches: a value whose derender raises anything (here RecursionError,
    MemoryError, OverflowError from a service) gets a 500, its neighbours their own answer."""
    from worker.transport.jobs import derender_job

    class Svc:
        def derender(self, body, kind=None, created=None):
            from worker.core.service import DerenderResult
            if body.startswith(b'{"boom"'):
                raise {b'{"boom":1}': RecursionError, b'{"boom":2}': MemoryError}.get(body, OverflowError)("x")
            return DerenderResult(b'{"ok":true}', 200, "rid")

    values = [b'{"a":1}', b'{"boom":1}', b'{"a":2}', b'{"boom":2}', b'{"boom":3}', b'{"a":3}']
    outs = [derender_job(Svc(), v, None) for v in values]
    assert [o.status for o in outs] == [200, 500, 200, 500, 500, 200]
    assert all(o.crash for o in outs if o.status == 500)


def test_health_state_reasons():
    from worker.transport.health import HealthState
    h = HealthState()
    assert not h.ready and h.reasons == ["starting"]
    h.mark_started()
    assert h.ready and h.reasons == []
    h.set_reason("dead-letter:dlq", "cannot publish dead letters")
    h.set_reason("redis", "unreachable")
    h.set_reason("dead-letter:dlq", "still cannot publish")  # keeps its place
    assert not h.ready and h.reasons == ["dead-letter:dlq: still cannot publish", "redis: unreachable"]
    assert h.clear_reason("redis") and not h.clear_reason("redis")
    h.clear_reason("dead-letter:dlq")
    h.set_live_streams(3)
    assert h.snapshot() == {"ready": True, "reasons": [], "live_streams": 3}
    h.mark_stopping()
    assert not h.ready and h.reasons == ["stopping"]


# ------------------------------------------------------------------------------ dead letters ---
async def _produce_big(bs: str, topic: str, records: list[tuple]) -> None:
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False, max_request_size=32 * 1024 * 1024)
    await p.start()
    try:
        for key, value, headers, *part in records:
            await p.send_and_wait(topic, value, key=key, headers=headers, partition=part[0] if part else None)
    finally:
        await p.stop()


async def test_dead_letters_always_fit(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """A 10 MB value, a 100 KB key and 300 KB of headers, none addressable: the dead letter fits
    ``--dead-letter-max-bytes`` (key, value and headers cut, ``x-dlq-truncated`` says so, the
    SHA-256 and size identify the original value), the worker never stops and its neighbours are
    answered."""
    import hashlib

    from worker.transport.deadletter import DEFAULT_MAX_BYTES

    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    big = b"\x00" + b"x" * (10 * 1024 * 1024)
    small_json_garbage = b"[1, 2, 3]"
    hdrs = [(f"h{i}", b"v" * 30_000) for i in range(10)] + [("small", b"kept")]
    records = [(b"v-0", chat_body(tok, model, "v-0", "before"), []),
               (b"big", big, []),
               (b"k" * 100_000, small_json_garbage, hdrs),
               (b"v-1", chat_body(tok, model, "v-1", "after"), [])]
    await _produce_big(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group)
    assert settings.dead_letter_max_bytes == DEFAULT_MAX_BYTES == 512 * 1024
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        got = await _collect(bs, [n.reply, n.dlq], 4, timeout=60, settle=0.3)
    assert worker._fatal is None
    assert sorted(r.key for r in got[n.reply]) == [b"v-0", b"v-1"]
    assert all(_h(r)[HDR_STATUS] == b"200" for r in got[n.reply])
    d_big, d_hdr = got[n.dlq]
    for d in (d_big, d_hdr):
        size = len(d.key or b"") + len(d.value or b"") + sum(len(k) + len(v or b"") for k, v in d.headers)
        assert size <= DEFAULT_MAX_BYTES, size
        assert _h(d)["x-original-topic"] == n.inp.encode() and _h(d)["x-dlq-reason"] == b"unparseable-no-reply-topic"
    h = _h(d_big)
    assert h["x-original-offset"] == b"1" and h["x-dlq-truncated"] == b"value"
    assert h["x-original-value-sha256"] == hashlib.sha256(big).hexdigest().encode()
    assert h["x-original-value-size"] == str(len(big)).encode()
    assert big.startswith(d_big.value) and len(d_big.value) > DEFAULT_MAX_BYTES - 4096 and d_big.key == b"big"
    h = _h(d_hdr)
    assert set(h["x-dlq-truncated"].split(b",")) == {b"headers", b"key"} and d_hdr.value == small_json_garbage
    assert h["small"] == b"kept" and b"k" * 1000 in d_hdr.key and len(d_hdr.key) < 100_000
    committed, end = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == end == {0: 4}


async def test_unpublishable_dead_letter_pauses_the_partition_until_it_can_be_published(
        kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """The broker refuses the dead letters (as Kafka does for a missing dead-letter topic when
    topic auto-creation is off; the embedded broker auto-creates every legal topic, so the refusal
    is injected at the producer call, the rest is the real broker): the record stays (never
    skipped, never committed past), its partition pauses, the worker reports not ready with the
    reason and retries with backoff; the other partition keeps being answered. Once the broker
    accepts, the dead letter is published, the worker is ready again, every offset committed."""
    from aiokafka.errors import UnknownTopicOrPartitionError

    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 2, n.reply: 1})
    await _produce_big(bs, n.inp, [(b"bad", b"not json", [], 0), (b"v-0", chat_body(tok, model, "v-0", "zero"), [], 0),
                                   (b"v-1", chat_body(tok, model, "v-1", "one"), [], 1)])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group)
    worker = KafkaDerenderWorker(settings, qwen3_models)
    real_send, refused = worker.publisher.send, []
    dlq_exists = False

    async def send(out, **kw):  # (kw: the publisher's spans/note flags)
        if out.topic == n.dlq and not dlq_exists:
            refused.append(out.key)
            raise UnknownTopicOrPartitionError(f"{out.topic} (injected)")
        return await real_send(out, **kw)

    worker.publisher.send = send
    async with worker:
        got = await _collect(bs, [n.reply], 1, timeout=30)
        for _ in range(200):
            if not worker.health.ready and worker.health.reasons:
                break
            await asyncio.sleep(0.1)
        reasons = worker.health.reasons
        assert any(r.startswith(f"dead-letter:{n.inp}[0]") and n.dlq in r for r in reasons), reasons
        assert [r.key for r in got[n.reply]] == [b"v-1"]  # partition 1 goes on; partition 0 waits in order
        committed, _ = await _committed_and_end(bs, n.group, n.inp, 2)
        assert committed[0] in (None, 0), committed
        await asyncio.sleep(2.0)
        assert len(refused) >= 3 and set(refused) == {b"bad"}  # retried, with backoff (0.5, 1, 2 s)
        await ensure_topics(bs, {n.dlq: 1})
        dlq_exists = True
        dl = await _collect(bs, [n.dlq, n.reply], 3, timeout=60)
        assert [r.key for r in dl[n.dlq]] == [b"bad"] and sorted(r.key for r in dl[n.reply]) == [b"v-0", b"v-1"]
        for _ in range(100):
            if worker.health.ready:
                break
            await asyncio.sleep(0.1)
        assert worker.health.ready, worker.health.reasons
        for _ in range(50):
            committed, end = await _committed_and_end(bs, n.group, n.inp, 2)
            if committed == end:
                break
            await asyncio.sleep(0.2)
    assert worker._fatal is None
    assert committed == end == {0: 2, 1: 1}


# ------------------------------------------------------------------------------ reply topics ---
async def test_reply_topics_illegal_internal_not_allowed_and_too_large(kafka_bootstrap, kafka_broker_kind,
                                                                              qwen3_models):
    """Every bad reply topic is dead-lettered at once with its reason; a reply larger than
    ``--max-request-size`` is dead-lettered in full (``reply-too-large``) and answered with a
    small 413 error reply to the same address (issue 17, fault 2); none of them holds up the
    valid records behind them on the same partition."""
    import hashlib
    import re
    import time

    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    allowed = f"{n.reply}|{n.reply2}"
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.reply2: 1, n.dlq: 1})
    long_text = " ".join(["word"] * 3500)  # a reply of about 18 KB
    cases = {  # key -> (reply-topic header, expected x-dlq-reason prefix)
        b"dot": (b".", "invalid-reply-topic"), b"dotdot": (b"..", "invalid-reply-topic"),
        b"space": (b"bad topic", "invalid-reply-topic"), b"newline": (n.reply2.encode() + b"\n", "invalid-reply-topic"),
        b"long": (b"a" * 250, "invalid-reply-topic"), b"utf8": ("t\u00f6pic".encode(), "invalid-reply-topic"),
        b"internal": (b"__consumer_offsets", "reply-topic-not-allowed"),
        b"not-allowed": (b"someone-elses-topic", "reply-topic-not-allowed"),
    }
    records = []
    for i, (key, (topic, _)) in enumerate(cases.items()):
        records.append((key, chat_body(tok, model, key.decode(), "x"), [(HDR_REPLY_TOPIC, topic)]))
        records.append((f"v-{i}".encode(), chat_body(tok, model, f"v-{i}", f"valid {i}"),
                        [(HDR_REPLY_TOPIC, n.reply2.encode())]))
    records.append((b"too-large", chat_body(tok, model, "too-large", long_text), []))
    records.append((b"v-last", chat_body(tok, model, "v-last", "last"), []))
    await _produce_big(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, allowed_reply_topics=allowed, reply_topic_wait_ms=1000,
                         max_request_size=16 * 1024, dead_letter_max_bytes=8 * 1024, request_timeout_ms=30000)
    t0 = time.monotonic()
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        got = await _collect(bs, [n.reply, n.reply2, n.dlq], len(records) + 1, timeout=60, settle=0.3)
        elapsed = time.monotonic() - t0
    assert worker._fatal is None
    dl = {r.key: _h(r)["x-dlq-reason"].decode() for r in got[n.dlq]}
    assert set(dl) == set(cases) | {b"too-large"}, dl
    for key, (_, reason) in cases.items():
        assert dl[key].startswith(reason), (key, dl[key])
    limit = r"reply of (\d+) bytes exceeds the limit of 16384 bytes \(--max-request-size\)"
    m = re.fullmatch("reply-too-large: " + limit, dl[b"too-large"])
    assert m and int(m.group(1)) > 16384, dl[b"too-large"]
    big = [r for r in got[n.dlq] if r.key == b"too-large"][0]
    assert _h(big)["x-original-value-sha256"].decode() == hashlib.sha256(records[-2][1]).hexdigest()
    assert sorted(r.key for r in got[n.reply2]) == sorted(f"v-{i}".encode() for i in range(len(cases)))
    assert [r.key for r in got[n.reply]] == [b"too-large", b"v-last"]
    small = got[n.reply][0]
    assert _h(small)["derender-status"] == b"413" and _h(small)["correlation-id"] == b"too-large"
    err = json.loads(small.value)["error"]
    assert err["type"] == "PayloadTooLargeError" and err["code"] == 413 and re.fullmatch(limit, err["message"])
    assert json.loads(small.value)["request_id"] == "too-large" and len(small.value) < 1024
    assert elapsed < 25, elapsed  # no record waited the 30 s metadata timeout
    committed, end = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == end == {0: len(records)}


async def test_unknown_reply_topic_is_dead_lettered_without_blocking_the_partition(kafka_bootstrap,
                                                                                  kafka_broker_kind, qwen3_models):
    """A legal reply topic the broker never lists (Kafka with topic auto-creation off; the
    embedded broker auto-creates, so the producer's metadata wait for that one topic is made to
    hang, the rest is the real broker): its records are dead-lettered (reply-publish-failed:
    unknown topic) after ``reply_topic_wait_ms`` at most once per ``UNKNOWN_TOPIC_MEMORY_S``, not
    after the 30 s metadata timeout each, and the records behind them are answered."""
    import time

    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    missing = f"missing-{n.group}"
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    records = []
    for i in range(6):
        records.append((f"u-{i}".encode(), chat_body(tok, model, f"u-{i}", "x"), [(HDR_REPLY_TOPIC, missing.encode())]))
        records.append((f"v-{i}".encode(), chat_body(tok, model, f"v-{i}", f"valid {i}"), []))
    await _produce_big(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, reply_topic_wait_ms=800, request_timeout_ms=30000)
    worker = KafkaDerenderWorker(settings, qwen3_models)
    await worker.start()
    waits = hang_reply_topics(worker, lambda topic: topic == missing)
    t0 = time.monotonic()
    task = asyncio.create_task(worker.run())
    try:
        got = await _collect(bs, [n.reply, n.dlq], len(records), timeout=60, settle=0.3)
        elapsed = time.monotonic() - t0
    finally:
        worker.stop()
        await task
    assert sorted(r.key for r in got[n.reply]) == [f"v-{i}".encode() for i in range(6)]
    assert sorted(r.key for r in got[n.dlq]) == [f"u-{i}".encode() for i in range(6)]
    assert all(_h(r)["x-dlq-reason"].startswith(b"reply-publish-failed: unknown topic") for r in got[n.dlq])
    assert len(waits) == 1 and elapsed < 15, (waits, elapsed)  # one wait, then remembered as unknown


def test_reply_topic_rules():
    import re

    from worker.transport.records import reply_topic_problem
    assert reply_topic_problem("replies") is None and reply_topic_problem("a.b_c-D9") is None
    for bad in (".", "..", "", "a b", "a/b", "x" * 250, "t\n", "\u00e9"):
        assert reply_topic_problem(bad) == "invalid-reply-topic", bad
    assert reply_topic_problem("x" * 249) is None
    assert reply_topic_problem("__consumer_offsets") == "reply-topic-not-allowed"
    allow = re.compile(r"replies-[a-z]+")
    assert reply_topic_problem("replies-eu", allow) is None
    assert reply_topic_problem("replies-eu-x", allow) == "reply-topic-not-allowed"  # full match only
    assert reply_topic_problem("x-replies-eu", allow) == "reply-topic-not-allowed"


def test_settings_reject_bad_reliability_flags():
    from worker.transport.settings import WorkerSettings
    with pytest.raises(ValueError, match="dead-letter-max-bytes"):
        WorkerSettings(dead_letter_max_bytes=100)
    with pytest.raises(ValueError, match="dead-letter-max-bytes"):
        WorkerSettings(dead_letter_max_bytes=2 * 1024 * 1024, max_request_size=1024 * 1024)
    with pytest.raises(ValueError, match="allowed-reply-topics"):
        WorkerSettings(allowed_reply_topics="(")
    for kw in ({"dead_letter_topic": "."}, {"reply_topic": "__consumer_offsets"}, {"input_topic": "a b"}):
        with pytest.raises(ValueError, match="topic"):
            WorkerSettings(**kw)


@pytest.mark.parametrize("flag", ["--drain-timeout", "--stream-gap-timeout", "--stream-idle-timeout",
                                  "--state-store-outage-deadline", "--broker-outage-deadline"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_time_bounds_must_be_finite(flag, value, capsys):
    """``--drain-timeout inf``/``nan`` used to be taken: the stop backstop then never fired (a
    SIGTERM'd worker could block forever); ``inf`` for a gap/idle timeout or an outage deadline
    disarmed that bound too. Now an argparse error naming the flag, exit status 2."""
    import argparse

    from worker.transport.settings import add_run_args
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    assert parser.parse_args(["--drain-timeout", "0"]).drain_timeout == 0.0
    assert parser.parse_args([flag, "2.5"]) is not None
    with pytest.raises(SystemExit) as e:
        parser.parse_args([flag, value])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


# ------------------------------------------------------------------------------ no orphans ---
def _children_of(root: int) -> set[int]:
    """Every descendant pid of ``root`` (from /proc)."""
    import os
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    stat = f.read()
                parent[int(d)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError):
                continue
    out, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ")[1][:1] != b"Z"  # a zombie is dead (waiting for its reaper)
    except OSError:
        return False


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="/proc and prctl are Linux")
def test_kill_9_of_the_main_process_leaves_no_pool_process(kafka_bootstrap, qwen3_models, tmp_path):
    """``derender-worker run`` with a 2-process pool (fork server, resource tracker, 2 pool
    processes): SIGKILL the main process; within a few seconds no process it started is left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import msgspec

    repo = Path(__file__).resolve().parent.parent
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({m.name: msgspec.to_builtins(m) for m in qwen3_models}))
    n = _names()
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.transport.run", "--config", str(cfg), "--bootstrap-servers", kafka_bootstrap,
         "--stream-state", "memory", "--executor", "process", "--num-threads", "2", "--input-topic", n.inp,
         "--group-id", n.group, "--session-timeout-ms", "6000"],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kids: set[int] = set()
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "worker consuming" in line:
                break
        assert any("worker consuming" in ln for ln in lines), "".join(lines)
        kids = _children_of(proc.pid)
        assert len(kids) >= 4, kids  # fork server, resource tracker, 2 pool processes
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in kids):
            time.sleep(0.1)
        left = {p: open(f"/proc/{p}/cmdline", "rb").read()[:200] for p in kids if _alive(p)}
        assert not left, left
    finally:  # never leave processes behind, also when the test fails
        kids |= _children_of(proc.pid) if proc.poll() is None else set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for p in kids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_dead_letter_fits_by_the_producers_own_size_estimate():
    """For any mix of sizes (and null key/value/header values), the dead letter's size as the
    producer computes it (``estimate_size_in_bytes``, what ``max_request_size`` is checked
    against) stays within the limit, and the hash/size headers describe the full value."""
    import hashlib
    import random
    from types import SimpleNamespace

    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from worker.transport.deadletter import MIN_MAX_BYTES, dead_letter

    rng = random.Random(7)
    for limit in (MIN_MAX_BYTES, 64 * 1024, 512 * 1024):
        for _ in range(40):
            value = None if rng.random() < 0.1 else bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 10, 5000)))) \
                * rng.choice((1, 10, 200))
            key = None if rng.random() < 0.2 else b"k" * rng.choice((0, 5, 3000, 40_000))
            headers = [(f"h{i}" * rng.choice((1, 50)), None if rng.random() < 0.2 else b"v" * rng.choice((1, 900, 9000)))
                       for i in range(rng.choice((0, 3, 40)))]
            msg = SimpleNamespace(topic="in", partition=2, offset=99, key=key, value=value, headers=headers)
            dl = dead_letter(msg, "unparseable-no-reply-topic" * rng.choice((1, 100)), "dlq", limit)
            k, v, hs = dl.key, dl.value, dl.headers
            assert DefaultRecordBatchBuilder.estimate_size_in_bytes(k, v, hs) <= limit
            h = dict(hs)
            assert h["x-original-value-sha256"] == hashlib.sha256(value or b"").hexdigest().encode()
            assert h["x-original-value-size"] == str(len(value or b"")).encode()
            cut = set(h.get("x-dlq-truncated", b"").decode().split(",")) - {""}
            full = b"" if key is None and value is None else value  # neither: an empty value (the producer needs one)
            assert ("value" in cut) == (v != full) and ("key" in cut) == (k != key)
            assert k is not None or v is not None
            assert (value or b"").startswith(v or b"") and (key or b"").startswith(k or b"")


def _put(obj, path: tuple, v):
    """A deep copy of JSON ``obj`` with ``v`` at ``path`` (``[v]`` when the last key is
    ``prompt_token_ids``)."""
    out = json.loads(json.dumps(obj))
    cur = out
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = [v] if path[-1] == "prompt_token_ids" else v
    return out


def test_core_out_of_range_ids_and_numbers_are_400_on_every_path(qwen3_models):
    """The core (shared by the worker and batch mode): prompt and output token ids < 0 or >= 2^63
    (or beyond the vocabulary), numbers >= 2^64 and deep nesting are 400s, never 500s, for chat,
    completion and stream bodies."""
    svc = DerenderService(qwen3_models)
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    chat = json.loads(chat_body(tok, model, "c", "Hello there"))
    comp = json.loads(completion_body(tok, model, "p", " a fox"))
    stream0 = {"stream": True, "model": model, "prompt_token_ids": chat["prompt_token_ids"],
               "chat_request": dict(chat["chat_request"], stream=True),
               "generate_chunk": {"request_id": "s", "choices": [{"index": 0, "token_ids": [9707]}]}}
    chat_paths = (("prompt_token_ids", 0), ("generate_response", "prompt_token_ids"),
                  ("generate_response", "choices", 0, "token_ids", 0))
    comp_paths = (("prompt_token_ids", 0, 0), ("generate_responses", 0, "choices", 0, "token_ids", 0))
    stream_paths = (("prompt_token_ids", 0), ("generate_chunk", "choices", 0, "token_ids", 0))
    for v in (-1, 2**63, 2**64, 10**30, 200_000):
        for base, paths in ((chat, chat_paths), (comp, comp_paths)):
            for path in paths:
                res = svc.derender(json.dumps(_put(base, path, v)).encode())
                assert res.status == 400, (v, path, res.body[:300])
        for path in stream_paths:
            res, state = svc.derender_stream(json.dumps(_put(stream0, path, v)).encode(), None, 0)
            assert res.status == 400 and state is None, (v, path, res.body[:300])
    for seq in (-1, 2**63 - 1, 2**64):
        res, _ = svc.derender_stream(json.dumps(stream0).encode(), None, seq)
        assert res.status == 400, (seq, res.body[:300])
    deep = b'{"model":"' + model.encode() + b'","generate_response":' + b"[" * 100_000
    assert svc.derender(deep).status == 400
    assert svc.derender_stream(b'{"generate_chunk":' + b"{" * 100_000, None, 0)[0].status == 400


async def test_reply_resent_while_its_topic_is_being_created(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """Issue 16, item 4 (in the reply publisher): a reply whose delivery fails with aiokafka's
    ``UnknownError`` (seen while a broker auto-creates the reply topic) is sent again, not
    dead-lettered: the requester gets its reply, nothing goes to the dead-letter topic."""
    from aiokafka.errors import UnknownError

    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    await _produce_big(bs, n.inp, [(b"k-0", chat_body(tok, model, "k-0", "zero"), [], 0),
                                   (b"k-1", chat_body(tok, model, "k-1", "one"), [], 0)])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group)
    worker = KafkaDerenderWorker(settings, qwen3_models)
    real_send, failed = worker.publisher.send, []

    async def send(out, **kw):  # (kw: the publisher's spans/note flags)
        if out.topic == n.reply and len(failed) < 3:  # the first three deliveries fail as during auto-create
            failed.append(out.key)
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(UnknownError("[Error -1] UnknownError (injected)"))
            return fut
        return await real_send(out, **kw)

    worker.publisher.send = send
    async with worker:
        got = await _collect(bs, [n.reply, n.dlq], 2, timeout=30, settle=0.5)
    assert worker._fatal is None and len(failed) == 3
    assert sorted(r.key for r in got[n.reply]) == [b"k-0", b"k-1"] and got[n.dlq] == []
    assert all(_h(r)[HDR_STATUS] == b"200" for r in got[n.reply])
    assert worker.stats.dead_lettered == 0 and worker.stats.replied_ok == 2
