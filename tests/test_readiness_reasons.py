"""Readiness reasons and the health port's address (issue 16, operator defect 6): every reason
line the worker puts in a ``/readyz`` 503 body matches a row of the table in ``ops/README.md``
(read from the file), and ``--metrics-host`` chooses the address the port binds (default
``0.0.0.0``, as before).

The reasons come from the real parts: ``HealthState``, the state store's ``OutageClock`` and
``DependencyProbe`` on a Redis port nobody listens on, and a ``derender-worker run`` subprocess
whose ``/readyz`` is read while it joins its group and while its embedded broker is down."""
from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.chaos.harness import Broker, WorkerProc
from tests.harness.cli import QWEN3, REPO, cli, one_error_line
from worker.cli import parse_args
from worker.state.redis_store import RedisSettings, RedisStateStore
from worker.transport.broker import free_port
from worker.transport.consumer import state_store_outage_clock
from worker.transport.endpoints import DependencyProbe, Endpoints
from worker.transport.health import HealthState
from worker.transport.metrics import PromMetrics
from worker.transport.settings import WorkerSettings


def _table() -> dict[str, re.Pattern]:
    """The reason rows of ops/README.md: documented text -> regex (a single capital letter stands
    for a variable part, ``Ns`` for a number of seconds)."""
    text = (REPO / "ops" / "README.md").read_text()
    section = text[text.index("`/readyz` reasons, one line each"):]
    section = section[:section.index("\n\n", section.index("| reason line |"))]
    rows = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    out = {}
    for row in rows:
        rx = re.escape(row).replace(r"Ns", r"\d+s")
        rx = re.sub(r"(?<![A-Za-z\\])[A-Z](?![A-Za-z])", ".+", rx)
        out[row] = re.compile(rx)
    return out


def _documented(line: str) -> str:
    matches = [row for row, rx in _table().items() if rx.fullmatch(line)]
    assert matches, f"readiness reason not in ops/README.md's table: {line!r}"
    return matches[0]


def test_the_table_is_read():
    rows = _table()
    assert "starting" in rows and "stopping" in rows and len(rows) >= 7, rows


async def test_in_process_reasons_are_documented():
    health = HealthState()
    assert _documented(health.reasons[0]) == "starting"
    health.mark_started()
    store = RedisStateStore.from_settings(RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=1))
    try:
        await DependencyProbe(health, {"state-store": store.ping}, timeout_s=3).check_once()
    finally:
        await store.close()
    (probe_line,) = health.reasons
    assert _documented(probe_line) == "state-store: unreachable: E"
    settings = WorkerSettings(redis=RedisSettings(url="redis://user:pw@10.0.0.9:6379/0"))
    clock = state_store_outage_clock(settings, health)
    clock.down("StoreReadError: redis get failed: Connection refused")
    line = next(r for r in health.reasons if "unavailable" in r)
    assert _documented(line) == "state-store: stream state store U unavailable for Ns: E"
    assert "pw" not in line
    health.mark_stopping()
    assert _documented(health.reasons[0]) == "stopping"


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_worker_s_reasons_are_documented():
    """A real worker: the 503 lines while it joins its group, then while its broker is down, are
    each a row of the table; the group and broker rows are among them."""
    broker = Broker(port=free_port()).start()
    port = free_port()
    w = None
    try:
        w = WorkerProc("w", ["--tokenizer", QWEN3, "--bootstrap-servers", broker.bootstrap_servers,
                             "--stream-state", "memory", "--num-threads", "1", "--metrics-port", str(port),
                             "--metrics-host", "127.0.0.1", "--input-topic", "readyz-in", "--group-id", "readyz",
                             "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000",
                             "--broker-outage-deadline", "120"])
        seen: set[str] = set()
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and w.alive:
            try:
                status, body = _readyz(port)
            except OSError:
                time.sleep(0.05)
                continue  # not listening yet (models loading)
            seen.update(ln for ln in body.splitlines() if status == 503)
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200, (seen, w.text())
        broker.stop()
        deadline = time.monotonic() + 30
        outage: set[str] = set()
        while time.monotonic() < deadline and not any(ln.startswith("broker:") for ln in outage):
            status, body = _readyz(port)
            outage.update(body.splitlines() if status == 503 else ())
            time.sleep(0.2)
        rows = {_documented(ln) for ln in seen | outage}
        assert "consumer-group: not a member of group G yet" in rows, seen
        assert "broker: Kafka broker B unavailable for Ns: E" in rows, outage
    finally:
        if w is not None:
            w.stop()
        broker.stop()


# -------------------------------------------------------------------------- --metrics-host ----
def test_metrics_host_flag_env_and_default(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith("DERENDER_"):
            monkeypatch.delenv(k)
    args, _ = parse_args(["run"])
    assert WorkerSettings.from_args(args).metrics_host == "0.0.0.0" == WorkerSettings().metrics_host
    args, _ = parse_args(["run", "--metrics-host", "127.0.0.1"])
    assert WorkerSettings.from_args(args).metrics_host == "127.0.0.1"
    monkeypatch.setenv("DERENDER_METRICS_HOST", "::1")
    assert WorkerSettings.from_args(parse_args(["run"])[0]).metrics_host == "::1"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
async def test_endpoints_bind_the_host(host):
    ep = Endpoints(HealthState(), PromMetrics().registry, 0, host=host)
    ep.start()
    try:
        assert ep._server.server_address[0] == host
        with socket.create_connection(("127.0.0.1", ep.port), timeout=3):
            pass
    finally:
        await ep.close()
    await asyncio.sleep(0)


@pytest.mark.kafka
def test_an_address_not_on_this_host_is_one_line(kafka_bootstrap):
    """203.0.113.1 (TEST-NET-3) is no address of this machine: one line naming both flags (the
    endpoints start first, before Redis, the tokenizers and the broker check)."""
    p = cli("run", "--tokenizer", QWEN3, "--bootstrap-servers", kafka_bootstrap, "--stream-state", "memory",
            "--num-threads", "1", "--metrics-port", "0", "--metrics-host", "203.0.113.1")
    one_error_line(p, "--metrics-port 0", "--metrics-host 203.0.113.1", "cannot listen")


# -------------------------------------------------- the port answers during start-up (issue 23) ----
def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_health_port_answers_while_run_waits_for_redis():
    """``run`` against a Redis port where nothing listens: ``/livez`` 200 and ``/readyz`` 503 naming
    the state store (a documented row) while it waits, long before its deadline (the port used
    to stay closed, so a probe saw only "connection refused"); no tokenizer is loaded meanwhile."""
    port, redis_port = free_port(), free_port()
    e = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DERENDER_")}
    e["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "run", "--tokenizer", QWEN3, "--num-threads", "1",
                             "--bootstrap-servers", "127.0.0.1:1", "--redis-url", f"redis://127.0.0.1:{redis_port}/0",
                             "--redis-timeout", "1", "--state-store-outage-deadline", "120", "--metrics-port",
                             str(port), "--metrics-host", "127.0.0.1"],
                            cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = live = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready, live = _get(port, "/readyz"), _get(port, "/livez")
            except OSError:
                time.sleep(0.1)
                continue
            if any(ln.startswith("state-store:") for ln in ready[1].splitlines()):
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[0]
        assert live == (200, "ok\n"), live
        assert ready[0] == 503 and ready[1].splitlines()[0] == "starting", ready
        (line,) = [ln for ln in ready[1].splitlines() if ln.startswith("state-store:")]
        assert _documented(line) == "state-store: stream state store U unavailable for Ns: E"
        assert f"127.0.0.1:{redis_port}" in line
        assert "warming-up" not in ready[1]  # Redis first: nothing loads before it answers
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "Traceback" not in out, out
