"""compose.yaml: validated against the Compose Specification schema vendored in ``check-jsonschema``
(``--builtin-schema vendor.compose-spec``, offline), then the facts an operator relies on: topics made
up front with a set partition count before any worker starts, two workers, healthchecks on /readyz,
published health/metrics ports, a stop grace period above the drain timeout, a client showing the
replies. The stack itself cannot run here (no Docker engine); the healthcheck command is run
against a local HTTP server instead."""
from __future__ import annotations

import http.server
import re
import shlex
import subprocess
import sys
import threading

import pytest
import yaml

from tests.opsutil import REPO, run, tool

COMPOSE = REPO / "compose.yaml"


def _load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the `<<: *worker` merge keys


def _check(path) -> subprocess.CompletedProcess:
    return run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)])


def test_compose_spec_schema():
    p = _check(COMPOSE)
    assert p.returncode == 0, p.stdout + p.stderr


def test_compose_spec_schema_rejects_a_mistake(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("condition: service_completed_successfully",
                                               "condition: service_done", 1))
    p = _check(bad)
    assert p.returncode != 0 and "service_done" in p.stdout + p.stderr


def _seconds(d: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(d))
    assert parts and "".join(a + b for a, b in parts) == str(d), d
    return sum(float(n) * units[u] for n, u in parts)


def _workers(c: dict) -> dict[str, dict]:
    return {n: s for n, s in c["services"].items() if s.get("command", [None])[0] == "run"}


def _topic_partitions(c: dict) -> dict[str, int]:
    script = c["services"]["kafka-topics"]["command"][0].replace("$$", "$")
    out = {}
    for line in script.splitlines():
        w = shlex.split(line)
        if "--create" in w:
            assert "--if-not-exists" in w
            out[w[w.index("--topic") + 1]] = int(w[w.index("--partitions") + 1])
    return out


def test_topics_up_front_and_two_workers():
    c = _load()
    workers = _workers(c)
    assert len(workers) == 2
    env = next(iter(workers.values()))["environment"]
    parts = _topic_partitions(c)
    assert set(parts) == {env["DERENDER_INPUT_TOPIC"], env["DERENDER_REPLY_TOPIC"], env["DERENDER_DEAD_LETTER_TOPIC"]}
    assert parts[env["DERENDER_INPUT_TOPIC"]] >= len(workers)  # every worker can hold a partition
    assert c["services"]["kafka"]["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for name, w in workers.items():
        assert w["depends_on"]["kafka-topics"] == {"condition": "service_completed_successfully"}, name
        assert w["environment"]["DERENDER_GROUP_ID"] == env["DERENDER_GROUP_ID"]
    assert c["services"]["kafka-topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_workers_health_ports_and_grace():
    c = _load()
    host_ports = set()
    for name, w in _workers(c).items():
        env = w["environment"]
        port = env["DERENDER_METRICS_PORT"]
        test = w["healthcheck"]["test"]
        assert test[0] == "CMD" and f"127.0.0.1:{port}/readyz" in test[-1], name
        (mapping,) = w["ports"]
        host, container = mapping.split(":")
        assert container == port
        host_ports.add(host)
        assert _seconds(w["stop_grace_period"]) > float(env["DERENDER_DRAIN_TIMEOUT"]), name
        assert w["stop_signal"] == "SIGTERM"
    assert len(host_ports) == 2  # one published port per worker
    client = c["services"]["client"]
    assert client["command"][:2] == ["demo", "--no-worker"]
    assert all(v == {"condition": "service_healthy"} for v in client["depends_on"].values())
    assert set(client["depends_on"]) == set(_workers(c))


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self):  # noqa: N802 (http.server API)
        code = _Handler.status if self.path == "/readyz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"not ready: test\n" if code != 200 else b"ok\n")

    def log_message(self, *a):
        pass


@pytest.fixture
def http_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_healthcheck_command_follows_readyz(http_server):
    """The worker healthcheck (the exact argv, run by this Python) fails on 503 and passes on 200."""
    c = _load()
    w = next(iter(_workers(c).values()))
    argv = list(w["healthcheck"]["test"][1:])
    assert argv[0] == "python"  # present in the python:3.11-slim image; curl/wget are not
    port = http_server.server_address[1]
    argv = [sys.executable] + [a.replace(":" + w["environment"]["DERENDER_METRICS_PORT"] + "/", f":{port}/")
                               for a in argv[1:]]
    _Handler.status = 503
    assert run(argv, timeout=30).returncode != 0
    _Handler.status = 200
    assert run(argv, timeout=30).returncode == 0


def test_monitoring_profile_scrapes_the_workers():
    c = _load()
    prom, graf = c["services"]["prometheus"], c["services"]["grafana"]
    assert prom["profiles"] == ["monitoring"] and graf["profiles"] == ["monitoring"]
    for svc in (prom, graf):  # every mounted file or folder is in the repository
        for vol in svc["volumes"]:
            src = vol.split(":")[0]
            assert (REPO / src).exists(), src
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    cfg = yaml.safe_load((REPO / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    assert cfg["rule_files"] == ["alerts.yaml"] and "/etc/prometheus/alerts.yaml" in mounts
    (job,) = cfg["scrape_configs"]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{n}:{w['environment']['DERENDER_METRICS_PORT']}" for n, w in _workers(c).items()}
    ds = yaml.safe_load((REPO / "ops/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((REPO / "ops/grafana/provisioning/dashboards/derender.yaml").read_text())
    dash_dir = prov["providers"][0]["options"]["path"]
    assert any(v.split(":")[1].startswith(dash_dir + "/") and v.split(":")[0].endswith(".json")
               for v in graf["volumes"])
