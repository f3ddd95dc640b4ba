"""Metrics and health endpoints: the code's metrics equal the table of ops/README.md (names, types,
labels, bounded label values), the HTTP endpoints (/livez, /readyz, /metrics), the dependency
probe, the instrumented state store, and a real worker on the embedded broker whose /readyz goes
503 -> 200 and whose /metrics counts the records it processed."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.kafka import REDIS_URL, chat_body, make_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import qwen3 as _qwen3
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from tests.opsutil import REPO, metrics_table
from worker.state import RedisSettings, StateWrite
from worker.state.memory_store import MemoryStateStore
from worker.transport.broker import free_port
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.endpoints import DependencyProbe, EndpointError, Endpoints
from worker.transport.health import HealthState
from worker.transport.metrics import DLQ_REASONS, PromMetrics, dlq_reason_label
from worker.transport.records import HDR_REPLY_TOPIC, HDR_SEQ
from worker.transport.topics import ensure_topics

TABLE = metrics_table()
STD_PREFIXES = ("process_", "python_")  # the client library's standard collectors


def _samples(registry) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of every derender_ sample."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in registry.collect() for s in fam.samples if s.name.startswith("derender_")}


def _check_against_table(families) -> None:
    """``families``: prometheus_client metric families (from a registry or a parsed scrape)."""
    seen = set()
    for fam in families:
        if fam.name.startswith(STD_PREFIXES):
            continue
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        assert name in TABLE, f"{name} is exported but not in the ops/README.md table"
        row = TABLE[name]
        assert fam.type == row["type"], name
        seen.add(name)
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            assert set(labels) == set(row["labels"]), (name, labels)
            for k, v in labels.items():
                if row["labels"][k] is not None:
                    assert v in row["labels"][k], (name, k, v)
    assert seen == set(TABLE), f"in the table, not exported: {sorted(set(TABLE) - seen)}"


def test_registry_matches_table():
    m = PromMetrics()
    for name, row in TABLE.items():  # dynamic labels: one child, so that label names show up
        dyn = [k for k, v in row["labels"].items() if v is None]
        if dyn:
            assert dyn == list(row["labels"]), name
            if name != "derender_build_info":  # (set by the constructor: its one series)
                getattr(m, {"derender_consumer_lag": "lag"}[name]).labels(*["0"] * len(dyn)).set(1)
    _check_against_table(m.registry.collect())
    # every bounded label combination exists from the start, at 0
    samples = _samples(m.registry)
    for name, row in TABLE.items():
        bounded = {k: v for k, v in row["labels"].items() if v is not None}
        if not bounded or row["type"] == "histogram":
            continue
        n = 1
        for v in bounded.values():
            n *= len(v)
        assert sum(1 for (sname, _) in samples if sname == name) == n, name


def test_table_check_catches_a_mismatch():
    m = PromMetrics()
    m.lag.labels("t", "0").set(1)
    from prometheus_client import Counter
    Counter("derender_surprise", "not in the table", ["request_id"], registry=m.registry).labels("r1").inc()
    with pytest.raises(AssertionError, match="derender_surprise"):
        _check_against_table(m.registry.collect())


def test_dlq_reason_label_is_bounded():
    assert dlq_reason_label("reply-publish-failed: KafkaTimeoutError: boom") == "reply-publish-failed"
    assert dlq_reason_label("derender-crashed") == "derender-crashed"
    assert dlq_reason_label("something new") == "other" and dlq_reason_label(None) == "other"
    assert set(DLQ_REASONS) == set(TABLE["derender_dead_letters_total"]["labels"]["reason"])
    # every reason the record format documents has its own label value
    import re

    from worker.transport import records
    documented = set(re.findall(r"^\d+\. ``([a-z-]+)", records.__doc__, re.M))
    assert len(documented) >= 7 and documented <= set(DLQ_REASONS), documented - set(DLQ_REASONS)


def test_finished_counts_outcomes_kinds_and_end_to_end():
    m = PromMetrics()
    now_ms = int(time.time() * 1000)
    m.finished("unary", "chat", None, 200, now_ms - 1500)
    m.finished("unary", "completion", None, 404, now_ms)
    m.finished("unary", None, "unparseable-no-reply-topic", None, now_ms)
    m.finished("stream", "chat-stream", None, 200, None)  # no timestamp: no end-to-end sample
    m.finished("stream", "bogus", None, None, -1, duplicate=True)
    m.finished("unary", "responses", None, 200, None)
    m.finished("stream", "responses-stream", None, 400, None)
    s = _samples(m.registry)

    def proc(mode, kind, outcome):
        return s[("derender_records_processed_total", (("kind", kind), ("mode", mode), ("outcome", outcome)))]
    assert proc("unary", "chat", "ok") == 1 and proc("unary", "completion", "error") == 1
    assert proc("unary", "unknown", "dead_letter") == 1 and proc("stream", "chat", "ok") == 1
    assert proc("stream", "unknown", "duplicate") == 1
    assert proc("unary", "responses", "ok") == 1 and proc("stream", "responses", "error") == 1
    assert proc("stream", "completion", "ok") == 0  # every bounded series exists from the start
    assert s[("derender_dead_letters_total", (("reason", "unparseable-no-reply-topic"),))] == 1
    assert s[("derender_end_to_end_seconds_count", (("mode", "unary"),))] == 3
    assert s[("derender_end_to_end_seconds_count", (("mode", "stream"),))] == 0
    assert 1.4 < s[("derender_end_to_end_seconds_sum", (("mode", "unary"),))] < 30


async def test_instrumented_store_counts_ops_and_errors():
    from worker.state.redis_store import RedisSettings, RedisStateStore
    m = PromMetrics()
    store = m.wrap_store(MemoryStateStore())
    await store.ping()
    assert (await store.get_many(["a"])) == {"a": None}
    assert await store.commit([StateWrite("a", b"x", 0)]) == [True]
    assert await store.commit([StateWrite("a", None, 0)]) == [True]
    assert store.data == {}  # other attributes pass through
    port = free_port()  # nothing listens there
    bad = m.wrap_store(RedisStateStore.from_settings(RedisSettings(url=f"redis://127.0.0.1:{port}/0", timeout_s=1)))
    with pytest.raises(Exception) as e:
        await bad.ping()
    await bad.close()
    assert type(e.value).__name__ == "StoreConnectError"
    s = _samples(m.registry)

    def ops(op, outcome):
        return s[("derender_state_operations_total", (("op", op), ("outcome", outcome)))]
    assert (ops("ping", "ok"), ops("read", "ok"), ops("write", "ok"), ops("delete", "ok")) == (1, 1, 1, 1)
    assert ops("ping", "error") == 1 and ops("write", "error") == 0
    assert s[("derender_state_operation_seconds_count", (("op", "ping"),))] == 2


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_endpoints_livez_readyz_metrics():
    health, m = HealthState(), PromMetrics()
    m.ready.set_function(lambda: 1.0 if health.ready else 0.0)
    ep = Endpoints(health, m.registry, 0, host="127.0.0.1", stall_s=0.5)
    ep.start()
    try:
        get = lambda path: asyncio.to_thread(_get, ep.port, path)  # noqa: E731
        assert await get("/livez") == (200, "ok\n")
        assert await get("/readyz") == (503, "starting\n")
        health.mark_started()
        assert await get("/readyz") == (200, "ready\n")
        health.set_reason("broker", "unreachable: KafkaError: no broker")
        assert await get("/readyz") == (503, "broker: unreachable: KafkaError: no broker\n")
        code, text = await get("/metrics")
        assert code == 200 and "derender_ready 0.0" in text and "process_cpu_seconds_total" in text
        health.clear_reason("broker")
        assert "derender_ready 1.0" in (await get("/metrics"))[1]
        assert (await get("/nope"))[0] == 404
        # a blocked event loop: /livez (served by its own thread) reports the stall
        def later():
            time.sleep(0.9)  # asks while the loop is blocked, 0.9 s after its last heartbeat
            return _get(ep.port, "/livez")
        fut = asyncio.get_running_loop().run_in_executor(None, later)
        time.sleep(1.5)  # noqa: ASYNC251 - blocking the loop on purpose
        code, text = await fut
        assert code == 503 and text.startswith("event loop stalled for"), text
        await asyncio.sleep(1.1)  # the heartbeat ticks again
        assert (await get("/livez"))[0] == 200
        health.mark_stopping()
        assert await get("/readyz") == (503, "stopping\n")
    finally:
        await ep.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/livez", timeout=2)


async def test_livez_fails_once_a_deadline_passed_or_the_run_loop_stopped_advancing():
    """Issue 17, fault 3: ``/livez`` is 503 once a dependency deadline has passed (the give-up
    line of its ``OutageClock``) or, while running, the run loop has not advanced for
    ``run_stall_s`` (10 s in the worker); starting and stopping are not "stuck"."""
    from worker.transport.outage import OutageClock
    health = HealthState()
    ep = Endpoints(health, PromMetrics().registry, 0, host="127.0.0.1", run_stall_s=0.4)
    ep.start()
    try:
        get = lambda: asyncio.to_thread(_get, ep.port, "/livez")  # noqa: E731
        await asyncio.sleep(0.6)
        assert await get() == (200, "ok\n")  # starting (models loading): not judged
        health.mark_started()
        for _ in range(5):
            health.progress()
            await asyncio.sleep(0.15)
            assert await get() == (200, "ok\n")
        await asyncio.sleep(0.6)  # no progress for longer than run_stall_s
        code, text = await get()
        assert code == 503 and text.startswith("run loop has not advanced for"), text
        health.progress()
        assert await get() == (200, "ok\n")
        clock = OutageClock("Kafka broker b:9092", "broker", 0.0, health)
        clock.down("broker unreachable: KafkaConnectionError")
        assert clock.expired and await get() == (200, "ok\n")  # (not given up until someone gives up)
        line = clock.give_up_line()
        health.progress()
        code, text = await get()
        assert code == 503 and text == f"gave up: {line}\n" and "giving up" in text, text
        health.mark_stopping()
        assert (await get())[0] == 503  # still: it gave up
    finally:
        await ep.close()


async def test_dependency_probe_sets_and_clears_reasons():
    from worker.state.redis_store import RedisSettings, RedisStateStore
    health = HealthState()
    health.mark_started()
    up = {"ok": False}

    async def broker():
        return up["ok"]
    store = RedisStateStore.from_settings(RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=1))
    probe = DependencyProbe(health, {"broker": broker, "state-store": store.ping}, timeout_s=3)
    try:
        await probe.check_once()
        reasons = health.reasons
        assert not health.ready and reasons[0] == "broker: unreachable: check failed"
        assert reasons[1].startswith("state-store: unreachable: StoreConnectError"), reasons
        up["ok"] = True
        probe.checks["state-store"] = MemoryStateStore().ping
        await probe.check_once()
        assert health.ready and health.reasons == []
    finally:
        await store.close()


def _scrape(port: int) -> tuple[list, dict]:
    code, text = _get(port, "/metrics")
    assert code == 200
    fams = list(text_string_to_metric_families(text))
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}
    return fams, values


@pytest.mark.kafka
async def test_real_worker_readyz_and_metrics(kafka_bootstrap, kafka_broker_kind, qwen3_models,
                                              redis_prefix):
    """The flow an operator sees: /readyz 503 while starting, 200 once in the group; /metrics
    counts unary records, an error, a dead letter and stream chunks (Redis state store)."""
    bs, u = kafka_bootstrap, uuid.uuid4().hex[:8]
    inp, reply, dlq = f"in-{u}", f"rep-{u}", f"dlq-{u}"
    await ensure_topics(bs, {inp: 2, reply: 1, dlq: 1})
    tok, model = _tokenizer(qwen3_models), _qwen3(qwen3_models).name
    settings = _settings(bs, kafka_broker_kind, input_topic=inp, reply_topic=reply, dead_letter_topic=dlq,
                         group_id=f"g-{u}", metrics_port=0,
                         redis=RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120))
    _, chunks = make_stream(tok, f"m-stream-{u}", 0)
    w = KafkaDerenderWorker(settings, qwen3_models)
    task = asyncio.create_task(w.run())
    try:
        t0 = time.monotonic()
        while (w.endpoints is None or w.endpoints.port == 0) and time.monotonic() - t0 < 30:  # bound
            await asyncio.sleep(0.01)
        port = w.endpoints.port
        first = await asyncio.to_thread(_get, port, "/readyz")
        assert first[0] == 503 and ("starting" in first[1] or "consumer-group" in first[1]), first
        assert (await asyncio.to_thread(_get, port, "/livez"))[0] == 200
        statuses = [first[0]]
        while statuses[-1] != 200 and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.05)
            statuses.append((await asyncio.to_thread(_get, port, "/readyz"))[0])
        assert statuses[-1] == 200, statuses
        _, before = await asyncio.to_thread(_scrape, port)
        assert before[("derender_ready", ())] == 1.0
        assert before[("derender_records_processed_total", (("kind", "chat"), ("mode", "unary"), ("outcome", "ok")))] == 0

        J = [("content-type", b"application/json")]
        await _produce(bs, inp, [
            (b"m-ok", chat_body(tok, model, "m-ok", "Hello metrics"), J, 0),
            (b"m-404", chat_body(tok, "no-such-model", "m-404", "x"), J, 1),
            (b"m-dlq", b"\x00\xffgarbage", J, 0),  # not JSON, no reply-topic header: dead letter
            (None, json.dumps({"stream": True, "model": model, "generate_chunk": {"request_id": "m-kl",
                                                                                  "choices": []}}).encode(),
             [(HDR_REPLY_TOPIC, reply.encode()), (HDR_SEQ, b"0")], 1),  # keyless stream chunk: 400 reply
        ] + [(f"m-stream-{u}".encode(), chunks[k], [(HDR_SEQ, str(k).encode())], 0) for k in range(3)])
        got = await _collect(bs, [reply, dlq], 7, timeout=30)
        assert (len(got[reply]), len(got[dlq])) == (6, 1)
        deadline = time.monotonic() + 10
        while True:  # the gauges are sampled by the commit loop (100 ms here)
            fams, after = await asyncio.to_thread(_scrape, port)
            lags = {k: v for k, v in after.items() if k[0] == "derender_consumer_lag"}
            if len(lags) == 2 and not any(lags.values()) and after[("derender_records_in_flight", ())] == 0 \
                    and after[("derender_live_streams", ())] == 1:
                break
            assert time.monotonic() < deadline, (lags, after[("derender_records_in_flight", ())])
            await asyncio.sleep(0.1)
    finally:
        w.stop()
        await task

    def val(name, **labels):
        return after[(name, tuple(sorted(labels.items())))]
    assert val("derender_records_received_total", mode="unary") == 3
    assert val("derender_records_received_total", mode="stream") == 4
    assert val("derender_records_processed_total", mode="unary", kind="chat", outcome="ok") == 1
    assert val("derender_records_processed_total", mode="unary", kind="chat", outcome="error") == 1
    assert val("derender_records_processed_total", mode="unary", kind="unknown", outcome="dead_letter") == 1
    assert val("derender_records_processed_total", mode="stream", kind="unknown", outcome="error") == 1
    assert val("derender_records_processed_total", mode="stream", kind="chat", outcome="ok") == 3
    assert val("derender_processing_seconds_count", mode="stream") == 3  # chunks derendered
    assert val("derender_live_streams") == 1  # 3 chunks of a longer stream: still in progress
    for op in ("ping", "write"):  # startup ping, checkpoints
        assert val("derender_state_operations_total", op=op, outcome="ok") >= 1, op
        assert val("derender_state_operations_total", op=op, outcome="error") == 0, op
    # a stream met at its chunk 0 is not read from the store (its writes are fenced instead)
    assert val("derender_state_operations_total", op="read", outcome="ok") == 0
    assert val("derender_state_operations_total", op="read", outcome="error") == 0
    assert val("derender_state_operation_seconds_count", op="write") >= 1
    assert val("derender_dead_letters_total", reason="unparseable-no-reply-topic") == 1
    assert val("derender_processing_seconds_count", mode="unary") == 3
    assert val("derender_end_to_end_seconds_count", mode="unary") == 3
    assert val("derender_end_to_end_seconds_count", mode="stream") == 4
    assert val("derender_assigned_partitions") == 2
    assert {dict(k[1])["partition"] for k in lags} == {"0", "1"}
    assert {dict(k[1])["topic"] for k in lags} == {inp}
    assert val("derender_pool_restarts_total") == 0
    _check_against_table(fams)


async def test_endpoints_port_errors_name_the_flag():
    with pytest.raises(EndpointError, match="--metrics-port 70000"):
        Endpoints(HealthState(), PromMetrics().registry, 70000)
    first = Endpoints(HealthState(), PromMetrics().registry, 0, host="127.0.0.1")
    first.start()
    try:
        taken = Endpoints(HealthState(), PromMetrics().registry, first.port, host="127.0.0.1")
        with pytest.raises(EndpointError, match=f"--metrics-port {first.port}: cannot listen"):
            taken.start()
    finally:
        await first.close()


def test_run_with_a_taken_metrics_port_is_one_line_exit_2(tmp_path):
    """``derender-worker run --metrics-port P`` with P taken: one error line naming the flag, exit 2
    (with a reachable broker: an unreachable one is reported first, before the pool starts)."""
    from worker.transport.broker import TansuBroker
    with socket.socket() as s, TansuBroker() as broker:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "worker.transport.run", "--tokenizer", str(REPO / "worker/demo_data/qwen3"),
             "--served-model-name", "qwen3", "--bootstrap-servers", broker.bootstrap_servers, "--stream-state", "memory",
             "--executor", "thread", "--metrics-port", str(port)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    errors = [ln for ln in out.splitlines() if "ERROR" in ln]
    assert len(errors) == 1 and f"--metrics-port {port}: cannot listen" in errors[0], out


def test_build_info_names_this_release_and_version_flag_prints_the_same():
    from worker.buildinfo import version
    from worker.state.formats import CURRENT, FORMATS
    series = {k: v for k, v in _samples(PromMetrics().registry).items() if k[0] == "derender_build_info"}
    want = (("state_format", str(CURRENT)), ("state_formats_read", ",".join(map(str, sorted(FORMATS)))),
            ("version", version()))
    assert series == {("derender_build_info", want): 1.0}
    assert version() not in ("", "unknown")  # the tests run an installed (editable) package
    out = subprocess.run([sys.executable, "-m", "worker.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"derender-worker {version()} (stream state format {CURRENT}; reads {want[1][1]})"
