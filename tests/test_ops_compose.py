"""compose.yaml: validated against the Compose Specification schema vendored in ``check-jsonschema``
(``--builtin-schema vendor.compose-spec``, offline), then the facts an operator relies on: topics made
up front with a set partition count before any worker starts, two workers, healthchecks on /readyz,
published health/metrics ports, a stop grace period above the drain timeout, a client showing the
replies; the override for machines without a registry (``ops/compose.local.yaml``) merged onto it.
The stack itself runs in ``ops/compose-test.sh`` (CI, after pytest); here the healthcheck commands
and the override's topics script run against a local HTTP server and the embedded broker."""
from __future__ import annotations

import ast
import http.server
import json
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


# ---------------------------------------------------------------- one file for Docker and podman

OVERRIDE = REPO / "ops" / "compose.local.yaml"


class _ComposeLoader(yaml.SafeLoader):
    """PyYAML plus Compose's ``!reset`` tag (the value it resets to)."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: loader.construct_sequence(node)
                               if isinstance(node, yaml.SequenceNode) else loader.construct_mapping(node)
                               if isinstance(node, yaml.MappingNode) else None)


def _load_override() -> dict:
    return yaml.load(OVERRIDE.read_text(), Loader=_ComposeLoader)  # noqa: S506 - a SafeLoader subclass


def _merge(base, over):
    """Compose's merge of an override, as far as these files use it: mappings merge key by key,
    everything else (lists included: ``command``, ``healthcheck.test``, ``!reset []``) is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], over[k]) if k in base and k in over else over.get(k, base.get(k))
                for k in {**base, **over}}
    return over


def _merged() -> dict:
    return _merge(_load(), {k: v for k, v in _load_override().items() if not k.startswith("x-")})


def _healthchecks(c: dict) -> dict[str, list[str]]:
    return {n: s["healthcheck"]["test"] for n, s in c["services"].items() if "healthcheck" in s}


@pytest.mark.parametrize("which", ["compose.yaml", "compose.yaml + ops/compose.local.yaml"])
def test_exec_form_healthchecks_survive_whitespace_splitting(which):
    """podman 4.3's Docker API splits CMD healthcheck arguments at whitespace (``python -c "import
    ...; ..."`` then fails with SyntaxError): every CMD argument is one word."""
    c = _load() if which == "compose.yaml" else _merged()
    checks = _healthchecks(c)
    assert {"worker-1", "worker-2", "redis", "kafka"} <= set(checks)
    for name, test in checks.items():
        if test[0] == "CMD":
            assert all(a and not re.search(r"\s", a) for a in test[1:]), (name, test)
        else:
            assert test[0] == "CMD-SHELL" and name == "kafka" and which == "compose.yaml", (name, test)


def test_one_build_and_the_other_services_reuse_its_image():
    c = _load()
    built = {n: s for n, s in c["services"].items() if "build" in s}
    assert list(built) == ["worker-1"]
    image = built["worker-1"]["image"]
    assert built["worker-1"]["build"]["context"] == "."
    assert built["worker-1"]["build"]["args"]["BASE_IMAGE"] == "${DERENDER_BASE_IMAGE:-python:3.11-slim}"
    users = {n: s for n, s in c["services"].items() if s.get("image") == image and n != "worker-1"}
    assert set(users) == {"worker-2", "client"}
    assert all(s["pull_policy"] == "never" for s in users.values())  # never pulled from a registry


def test_merged_override_is_valid_compose(tmp_path):
    merged = tmp_path / "merged.yaml"
    merged.write_text(yaml.safe_dump(_merged()))
    p = _check(merged)
    assert p.returncode == 0, p.stdout + p.stderr


def test_override_runs_everything_on_loopback_with_the_same_topics():
    base, over, c = _load(), _load_override(), _merged()
    running = [n for n, s in c["services"].items() if "profiles" not in s]
    assert set(over["services"]) == set(running)  # every default service is adapted
    for n in running:
        s = c["services"][n]
        assert s["network_mode"] == "host" and not s.get("ports"), n
        for word in json.dumps(s).split('"'):
            for port in re.findall(r"127\.0\.0\.1:(\d+)", word):
                assert 19500 <= int(port) <= 19599, (n, word)
    kafka = c["services"]["kafka"]
    assert kafka["command"][:1] == ["broker"] and kafka["image"] == c["services"]["worker-1"]["image"]
    bs = "127.0.0.1:" + kafka["command"][kafka["command"].index("--port") + 1]
    assert kafka["healthcheck"]["test"][-1] == f"tcp://{bs}"
    workers = _workers(c)
    assert {w["environment"]["KAFKA_BOOTSTRAP_SERVERS"] for w in workers.values()} == {bs}
    assert bs in c["services"]["client"]["command"]
    ports = set()
    for name, w in workers.items():
        port = w["environment"]["DERENDER_METRICS_PORT"]
        assert w["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}/readyz", name
        assert w["depends_on"] == base["services"][name]["depends_on"]  # every condition kept
        ports.add(port)
    assert len(ports) == 2
    script = c["services"]["kafka-topics"]["command"][0]
    topics = ast.literal_eval(re.search(r"topics = (\{.*\})", script).group(1))
    assert topics == _topic_partitions(base)  # same names and partition counts as kafka-topics.sh
    assert f'bs = "{bs}"' in script


def test_override_topics_script_and_broker_healthcheck_work_on_a_real_broker():
    """The override's kafka-topics script (run by this Python) creates the topics with their
    partition counts on the embedded broker; the kafka healthcheck argv follows the port."""
    from worker.transport.broker import TansuBroker, free_port
    c = _merged()
    script = c["services"]["kafka-topics"]["command"][0]
    probe = c["services"]["kafka"]["healthcheck"]["test"][1:]
    assert probe[:3] == ["python", "-m", "worker.transport.probe"]
    with TansuBroker() as broker:
        p = run([sys.executable, "-c", script.replace("127.0.0.1:19592", broker.bootstrap_servers)],
                timeout=60, cwd=REPO)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.splitlines() == ["engine-outputs: 4 partitions", "derender-replies: 4 partitions",
                                         "derender-dlq: 1 partitions"]
        up = run([sys.executable, *probe[1:-1], f"tcp://{broker.bootstrap_servers}"], timeout=30, cwd=REPO)
        assert up.returncode == 0, up.stderr
    down = run([sys.executable, *probe[1:-1], f"tcp://127.0.0.1:{free_port()}"], timeout=30, cwd=REPO)
    assert down.returncode == 1 and "not healthy" in down.stderr
