"""Kafka transport: replies, error replies, dead letters, commits, restarts, order and SIGTERM,
through a real Kafka-protocol broker (``kafka_bootstrap``: env, testcontainers or embedded Tansu)
and the real derender core with the Qwen3 tokenizer of ``tests/data/models.json``.

Plus broker-free unit tests of the reply/dead-letter decision rules.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
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
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.jobs import derender_job
from worker.transport.records import (
    HDR_CORRELATION_ID,
    HDR_DLQ_REASON,
    HDR_KIND,
    HDR_REPLY_TOPIC,
    HDR_SEQ,
    HDR_STATUS,
)
from worker.transport.settings import WorkerSettings, add_run_args
from worker.transport.topics import ensure_topics

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------- broker-free unit tests ---
class _Svc:
    def derender(self, body, kind=None, created=None):
        from worker.core.service import DerenderResult
        return DerenderResult(b'{"ok":true}', 200, "rid-1")


class _Boom:
    def derender(self, body, kind=None, created=None):
        raise RuntimeError("kaboom")


def test_derender_job_rejects_unknown_kind_and_survives_core_exceptions():
    out = derender_job(_Svc(), b'{"model":"m","generate_response":{}}', "bogus")
    assert out.status == 400 and b"derender-kind" in out.body and out.is_object
    out = derender_job(_Svc(), b'{"model":"m","generate_responses":[]}', None)
    assert out.status == 200 and out.kind == "completion" and out.request_id == "rid-1"
    out = derender_job(_Boom(), b"[1,2]", None)
    assert out.status == 500 and not out.is_object and "kaboom" in out.crash
    assert json.loads(out.body)["error"]["code"] == 500


def test_stream_job_kind_message_lists_every_accepted_value():
    from worker.transport.jobs import derender_stream_job
    out = derender_stream_job(None, b'{"generate_chunk":{"request_id":"r9"}}', None, 0, "bogus")
    err = json.loads(out.body)
    assert out.status == 400 and err["request_id"] == "r9"
    for k in ("'chat'", "'completion'", "'chat-stream'", "'completion-stream'"):
        assert k in err["error"]["message"], err
    assert "'chat-stream'" in json.loads(derender_job(_Svc(), b"{}", "bogus").body)["error"]["message"]


def test_redis_unreachable_fails_fast_with_one_line(qwen3_models, tmp_path):
    """Default ``--stream-state redis`` and no Redis: waits ``--state-store-outage-deadline``, then
    exits 2 with one clear line, before the pool."""
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({m.name: msgspec.to_builtins(m) for m in qwen3_models}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_REDIS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "worker.transport.run", "--config", str(cfg), "--bootstrap-servers",
         "127.0.0.1:1", "--redis-url", f"redis://127.0.0.1:{port}/0", "--redis-timeout", "2",
         "--state-store-outage-deadline", "1.5"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert time.monotonic() - t0 < 30, out
    assert "Traceback" not in out and "pool ready" not in out, out
    lines = [ln for ln in out.splitlines() if " ERROR " in ln]
    assert len(lines) == 1, out
    assert f"127.0.0.1:{port}" in lines[0] and "--redis-url" in lines[0] and "--stream-state memory" in lines[0]


def test_plan_rules():
    w = KafkaDerenderWorker(WorkerSettings(reply_topic="R", dead_letter_topic="D"), service=_Svc())
    from worker.transport.jobs import JobOutcome

    def msg(key=None, headers=(), value=b"{}"):
        return SimpleNamespace(key=key, headers=tuple(headers), value=value, topic="in", partition=3, offset=7)

    ok = JobOutcome(b"{}", 200, "rid", "chat", True)
    bad = JobOutcome(b"{}", 400, None, None, False)
    # default reply topic, correlation = key
    p = w.planner.plan(msg(b"k"), ok)
    topic, key, hdrs, reason = p.topic, p.key, p.headers, p.dlq_reason
    assert (topic, key, reason) == ("R", b"k", None) and dict(hdrs)[HDR_CORRELATION_ID] == b"k"
    assert dict(hdrs)[HDR_STATUS] == b"200" and dict(hdrs)[HDR_KIND] == b"chat"
    # no key: key and correlation come from the body's request id
    p = w.planner.plan(msg(None), ok)
    key, hdrs = p.key, p.headers
    assert key == b"rid" and dict(hdrs)[HDR_CORRELATION_ID] == b"rid"
    # unparseable without reply-topic -> DLQ; with it -> error reply there
    assert w.planner.plan(msg(b"k"), bad).dlq_reason == "unparseable-no-reply-topic"
    assert w.planner.plan(msg(b"k", [(HDR_REPLY_TOPIC, b"X")]), bad).topic == "X"
    # invalid reply topic -> DLQ with original coordinates
    p = w.planner.plan(msg(b"k", [(HDR_REPLY_TOPIC, b"bad topic!")]), ok)
    topic, hdrs, reason = p.topic, p.headers, p.dlq_reason
    assert topic == "D" and reason == "invalid-reply-topic"
    assert dict(hdrs)["x-original-offset"] == b"7" and dict(hdrs)["x-original-partition"] == b"3"
    # nothing to correlate with -> DLQ
    assert w.planner.plan(msg(None), JobOutcome(b"{}", 200, None, "chat", True)).dlq_reason == "no-correlation-id"
    # replies into the worker's own input topic or its dead-letter topic -> DLQ
    for own in (w.settings.input_topic.encode(), b"D"):
        assert w.planner.plan(msg(b"k", [(HDR_REPLY_TOPIC, own)]), ok).dlq_reason == "reply-topic-not-allowed", own


def test_run_args_read_env(monkeypatch):
    monkeypatch.setenv("DERENDER_INPUT_TOPIC", "from-env")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k:1")
    monkeypatch.setenv("DERENDER_MAX_IN_FLIGHT", "7")
    ap = argparse.ArgumentParser()
    add_run_args(ap)
    from worker.flags import apply_env
    apply_env(ap)  # the CLI does this for every subcommand (tests/test_cli.py)
    a = ap.parse_args([])
    assert (a.input_topic, a.bootstrap_servers, a.max_in_flight) == ("from-env", "k:1", 7)
    s = WorkerSettings.from_args(ap.parse_args(["--input-topic", "flag"]))
    assert s.input_topic == "flag" and s.security == {"security_protocol": "PLAINTEXT"}


# ------------------------------------------------------------------------- through the broker ---
@pytest.mark.kafka
async def test_mixed_messages_replies_dead_letters_commits_and_restart(kafka_bootstrap, kafka_broker_kind,
                                                                        qwen3_models):
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 2, n.reply: 1, n.reply2: 1, n.dlq: 1})
    J = [("content-type", b"application/json")]
    records = [
        (b"r-chat", chat_body(tok, model, "r-chat", "Hello from Kafka!"),
         J + [(HDR_KIND, b"chat"), (HDR_CORRELATION_ID, b"corr-chat")], 0),
        (b"r-comp", completion_body(tok, model, "r-comp", " there lived a fox"), J, 1),
        (b"r-404", chat_body(tok, "no-such-model", "r-404", "x"), J, 0),
        (b"r-badjson", b"{not json", [(HDR_REPLY_TOPIC, n.reply2.encode()), (HDR_CORRELATION_ID, b"c-bj")], 1),
        (b"r-dlq", b"\x00\xffgarbage", J, 0),
        (b"r-oov", chat_body(tok, model, "r-oov", "", ids=[10_000_000, 5]), J, 1),
        (b"r-kind", chat_body(tok, model, "r-kind", "hi"), J + [(HDR_KIND, b"bogus")], 0),
        (None, chat_body(tok, model, None, "anonymous"), J, 1),  # no key, no id -> DLQ
        # stream chunk without a key: 400 error reply keyed by generate_chunk.request_id
        (None, json.dumps({"stream": True, "model": model, "generate_chunk": {"request_id": "r-keyless",
                                                                              "choices": []}}).encode(),
         [(HDR_REPLY_TOPIC, n.reply2.encode()), (HDR_SEQ, b"3")], 0),
        # stream chunk with a non-numeric seq: 400 error reply without a derender-seq header
        (b"r-badseq", b'{"stream":true,"generate_chunk":{"request_id":"r-badseq"}}', [(HDR_SEQ, b"x1")], 1),
    ]
    await _produce(bs, n.inp, records)
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group)
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        got = await _collect(bs, [n.reply, n.reply2, n.dlq], 10, timeout=30)
    assert worker.stats.processed == 10, worker.stats
    assert (worker.stats.replied_ok, worker.stats.errors, worker.stats.dead_lettered) == (2, 6, 2), worker.stats

    replies = {r.key: r for r in got[n.reply]}
    assert set(replies) == {b"r-chat", b"r-comp", b"r-404", b"r-oov", b"r-kind", b"r-badseq"}
    chat = replies[b"r-chat"]
    assert _h(chat)[HDR_CORRELATION_ID] == b"corr-chat" and _h(chat)[HDR_STATUS] == b"200"
    assert _h(chat)[HDR_KIND] == b"chat" and _h(chat)["content-type"] == b"application/json"
    body = json.loads(chat.value)
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert "Hello from Kafka!" in (msg.get("content") or "") + (msg.get("reasoning") or msg.get("reasoning_content") or "")
    comp = replies[b"r-comp"]
    assert _h(comp)[HDR_STATUS] == b"200" and _h(comp)[HDR_KIND] == b"completion"  # told by shape
    assert _h(comp)[HDR_CORRELATION_ID] == b"r-comp"  # defaults to the key
    cbody = json.loads(comp.value)
    assert cbody["object"] == "text_completion" and cbody["choices"][0]["text"] == " there lived a fox"
    for key, status in ((b"r-404", 404), (b"r-oov", 400), (b"r-kind", 400)):
        rec = replies[key]
        assert _h(rec)[HDR_STATUS] == str(status).encode(), (key, rec.value)
        err = json.loads(rec.value)["error"]
        assert err["code"] == status and err["message"], (key, err)

    kerr = json.loads(replies[b"r-kind"].value)["error"]
    assert all(k in kerr["message"] for k in ("'chat'", "'completion'", "'chat-stream'", "'completion-stream'"))
    bs_ = replies[b"r-badseq"]
    assert _h(bs_)[HDR_STATUS] == b"400" and HDR_SEQ not in _h(bs_), _h(bs_)
    assert json.loads(bs_.value)["error"]["type"] == "BadRequestError"

    r2 = {r.key: r for r in got[n.reply2]}
    assert set(r2) == {b"r-badjson", b"r-keyless"}
    kl = r2[b"r-keyless"]
    assert _h(kl)[HDR_STATUS] == b"400" and _h(kl)[HDR_CORRELATION_ID] == b"r-keyless" and _h(kl)[HDR_SEQ] == b"3"
    klb = json.loads(kl.value)
    assert klb["request_id"] == "r-keyless" and "without a key" in klb["error"]["message"]
    bj = r2[b"r-badjson"]
    assert bj.key == b"r-badjson" and _h(bj)[HDR_CORRELATION_ID] == b"c-bj" and _h(bj)[HDR_STATUS] == b"400"
    assert "error" in json.loads(bj.value)

    dlq = {r.key: r for r in got[n.dlq]}
    assert set(dlq) == {b"r-dlq", None}
    d = dlq[b"r-dlq"]
    assert d.value == b"\x00\xffgarbage" and _h(d)[HDR_DLQ_REASON] == b"unparseable-no-reply-topic"
    assert _h(d)["x-original-topic"] == n.inp.encode() and _h(d)["x-original-partition"] == b"0"
    assert _h(d)["x-original-offset"] == b"2" and _h(d)["content-type"] == b"application/json"
    assert _h(dlq[None])[HDR_DLQ_REASON] == b"no-correlation-id"

    committed, end = await _committed_and_end(bs, n.group, n.inp, 2)
    assert committed == end == {0: 5, 1: 5}

    # a restarted member of the same group redoes nothing
    async with KafkaDerenderWorker(settings, qwen3_models) as again:
        await again.wait_assigned(30)
        await asyncio.sleep(1.0)
    assert again.stats.processed == 0, again.stats
    got2 = await _collect(bs, [n.reply, n.reply2, n.dlq], 10, timeout=5, settle=0.3)
    assert sum(map(len, got2.values())) == 10


@pytest.mark.kafka
async def test_undeliverable_stream_reply_retries_not_ready_and_stops_without_the_drain_timeout(
        kafka_bootstrap, kafka_broker_kind, qwen3_models, caplog):
    """A stream reply whose delivery fails and whose dead letter fails too: the worker keeps
    retrying the dead letter (no exit, no skipped record), reports not ready with the reason, and
    a stop() ends it at once (not after ``drain_timeout``), leaving the record uncommitted."""
    from aiokafka.errors import KafkaError
    caplog.set_level(logging.INFO, logger="worker.transport")
    bs, n = kafka_bootstrap, _names()
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, drain_timeout_s=20.0, stream_gap_timeout_s=2.0)
    w = KafkaDerenderWorker(settings, qwen3_models)
    await w.start()

    async def lost(plan, **kw):  # (kw: the publisher's spans/note flags)
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(KafkaError("simulated NotLeaderForPartitionError"))
        return fut

    w.publisher.send = lost
    task = asyncio.create_task(w.run())
    try:
        await w.wait_assigned(30)
        body = json.dumps({"stream": True, "generate_chunk": {"request_id": "r-lost", "choices": []}}).encode()
        await _produce(bs, n.inp, [(None, body, [(HDR_REPLY_TOPIC, n.reply.encode()), (HDR_SEQ, b"0")]),
                                   (b"r-held", body, [(HDR_SEQ, b"4")])])  # held behind a gap
        for _ in range(600):
            if any(r.startswith("dead-letter:") for r in w.health.reasons):
                break
            await asyncio.sleep(0.05)
        assert not w.health.ready and any("cannot publish dead letters" in r for r in w.health.reasons)
        await asyncio.sleep(1.5)  # still retrying: no exit
        assert w._fatal is None and not task.done()
        assert "retrying in" in caplog.text
        t0 = time.monotonic()
        w.stop()
        await asyncio.wait_for(task, 15)  # no fatal error raised
        assert time.monotonic() - t0 < 5
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert "stop requested" in caplog.text and "drain did not finish" not in caplog.text
    committed, _ = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed[0] in (None, 0), committed  # the undelivered reply's record is redelivered


@pytest.mark.kafka
async def test_process_pool_keeps_per_partition_order(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """Default executor (process pool, 2 processes): 30 messages of one key come back in order."""
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 3, n.reply: 1, n.dlq: 1})
    N = 30
    await _produce(bs, n.inp, [(b"same-key", chat_body(tok, model, f"req-{i}", f"Answer number {i} " * (1 + i % 7)),
                                [(HDR_CORRELATION_ID, f"c{i}".encode())]) for i in range(N)])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, executor="process", num_workers=2, max_in_flight=8)
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        got = await _collect(bs, [n.reply], N, timeout=60)
    assert [_h(r)[HDR_CORRELATION_ID] for r in got[n.reply]] == [f"c{i}".encode() for i in range(N)]
    assert all(_h(r)[HDR_STATUS] == b"200" for r in got[n.reply]), [r.value[:200] for r in got[n.reply]]
    assert worker.stats.replied_ok == N
    committed, end = await _committed_and_end(bs, n.group, n.inp, 3)
    assert all(committed[p] in (None, end[p]) for p in end), (committed, end)
    assert sum(v or 0 for v in committed.values()) == N


@pytest.mark.kafka
async def test_cli_run_drains_and_commits_on_sigterm(kafka_bootstrap, kafka_broker_kind, qwen3_models, tmp_path):
    """``derender-worker run`` (via ``python -m worker.transport.run``) as a subprocess: replies, then SIGTERM -> exit 0 with offsets committed."""
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({m.name: msgspec.to_builtins(m) for m in qwen3_models}))
    N = 5
    await _produce(bs, n.inp, [(f"k{i}".encode(), chat_body(tok, model, f"k{i}", f"reply {i}"), []) for i in range(N)])
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    session = "2000" if kafka_broker_kind == "tansu" else "6000"
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.transport.run", "--config", str(cfg), "--bootstrap-servers", bs,
         "--input-topic", n.inp, "--reply-topic", n.reply, "--dead-letter-topic", n.dlq, "--group-id", n.group,
         "--executor", "thread", "--num-threads", "1", "--session-timeout-ms", session,
         "--heartbeat-interval-ms", "500"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        got = await _collect(bs, [n.reply], N, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.get_running_loop().run_in_executor(None, lambda: proc.communicate(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()
            out, _ = proc.communicate()
    assert len(got[n.reply]) == N, out.decode(errors="replace")[-3000:]
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    committed, end = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == end == {0: N}


@pytest.mark.kafka
async def test_two_workers_share_the_group_without_duplicates(kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """A second member joins mid-stream: partitions are rebalanced (the first drains and commits
    what it gives up), every message is answered exactly once, per-key order holds."""
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    await ensure_topics(bs, {n.inp: 4, n.reply: 1, n.dlq: 1})
    N = 200
    await _produce(bs, n.inp, [(f"key-{i % 10}".encode(), chat_body(tok, model, f"r{i}", f"message {i}"),
                                [(HDR_CORRELATION_ID, str(i).encode())]) for i in range(N)])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, max_in_flight=8)
    async with KafkaDerenderWorker(settings, qwen3_models) as w1:
        await w1.wait_assigned(30)
        async with KafkaDerenderWorker(settings, qwen3_models) as w2:
            got = await _collect(bs, [n.reply], N, timeout=60, settle=0.5)
    ids = [int(_h(r)[HDR_CORRELATION_ID]) for r in got[n.reply]]
    assert sorted(ids) == list(range(N))  # all answered, none twice
    assert w1.stats.processed + w2.stats.processed == N
    by_key: dict[bytes, list[int]] = {}
    for r in got[n.reply]:
        by_key.setdefault(r.key, []).append(int(_h(r)[HDR_CORRELATION_ID]))
    assert all(v == sorted(v) for v in by_key.values())
    committed, end = await _committed_and_end(bs, n.group, n.inp, 4)
    assert committed == end and sum(end.values()) == N


@pytest.mark.kafka
def test_demo_exits_zero(capsys):
    """``derender-worker demo`` end to end (its own embedded broker unless KAFKA_BOOTSTRAP_SERVERS)."""
    from worker.cli.demo import add_demo_args, main_demo
    ap = argparse.ArgumentParser()
    add_demo_args(ap)
    argv = ["--quiet"]
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        argv += ["--bootstrap-servers", os.environ["KAFKA_BOOTSTRAP_SERVERS"]]
    assert main_demo(ap.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "examples derendered OK" in out and "status 200" in out


@pytest.mark.kafka
async def test_revoke_while_a_record_of_a_call_hangs_keeps_every_permit_and_commits_what_was_acked(
        kafka_bootstrap, kafka_broker_kind, qwen3_models):
    """One executor call's three records of a partition; the second one's reply topic lookup
    hangs (a topic the broker never lists: the embedded broker auto-creates, so the producer's
    metadata wait for that one topic is made to hang). A revoke then drains past
    ``drain_timeout_s`` and drops the partition: every ``--max-in-flight`` permit the three took
    comes back (none is lost for the rest of the worker's life), and the first record, whose
    reply the broker acknowledged, is committed (the next owner does not answer it again)."""
    bs, n = kafka_bootstrap, _names()
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    missing = f"missing-{n.group}"
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    await _produce(bs, n.inp, [(b"a", chat_body(tok, model, "a", "first"), []),
                               (b"b", chat_body(tok, model, "b", "x"), [(HDR_REPLY_TOPIC, missing.encode())]),
                               (b"c", chat_body(tok, model, "c", "third"), [])])
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, executor="process", num_workers=1, max_in_flight=8,
                         drain_timeout_s=1.0, reply_topic_wait_ms=600_000)
    worker = KafkaDerenderWorker(settings, qwen3_models)
    await worker.start()
    waits = hang_reply_topics(worker, lambda topic: topic == missing)
    task = asyncio.create_task(worker.run())
    try:
        got = await _collect(bs, [n.reply], 1, timeout=60, until=lambda g: bool(g[n.reply]) and bool(waits))
        assert [r.key for r in got[n.reply]] == [b"a"]
        parts = list(worker._parts)
        assert len(parts) == 1 and 1 in worker._parts[parts[0]].inflight  # b hangs
        await worker._on_revoked(parts)  # (the rebalance listener's callback)
        assert not worker._parts
        assert worker._sem.free == 8
    finally:
        worker.stop()
        await task
    committed, _ = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == {0: 1}
