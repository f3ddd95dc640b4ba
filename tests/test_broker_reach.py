"""The embedded broker on a compose network and the reachability checks around it:
``derender-worker broker --advertised-host`` (Tansu's advertised listener: clients are told that
host, not the listen address), ``worker.transport.run.broker_unreachable`` (``run``'s one-line
start check) and the container health probe ``python -m worker.transport.probe``."""
from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

from worker.transport.broker import TansuBroker, free_port, wait_for_port
from worker.transport.probe import probe
from worker.transport.run import broker_unreachable

REPO = Path(__file__).resolve().parent.parent


async def _advertised(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of every broker in a metadata reply from ``bootstrap`` (no connection to them)."""
    from aiokafka.client import AIOKafkaClient
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        return sorted((b.host, b.port) for b in client.cluster.brokers())
    finally:
        await client.close()


def test_broker_advertises_the_given_host():
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "broker", "--host", "127.0.0.1", "--port",
                             str(port), "--advertised-host", "kafka.invalid"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port("127.0.0.1", port, 20, proc)
        assert asyncio.run(_advertised(f"127.0.0.1:{port}")) == [("kafka.invalid", port)]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert f"kafka.invalid:{port}" in out
    with TansuBroker() as b:  # default: the listen address is the advertised one
        assert asyncio.run(_advertised(b.bootstrap_servers)) == [("127.0.0.1", b.port)]


def test_broker_unreachable_reads_every_bootstrap_form():
    """host:port lists, IPv6 brackets, a missing port (9092), an out-of-range port."""
    dead = free_port()
    with TansuBroker() as b:
        assert broker_unreachable(f"127.0.0.1:{dead},{b.bootstrap_servers}") is None
        assert broker_unreachable(f"[::1]:{dead}, localhost:{b.port}") is None
    why = broker_unreachable(f"127.0.0.1:{dead},[::1]:{dead}", timeout=1)
    assert f"127.0.0.1:{dead}: " in why and f"[::1]:{dead}: " in why
    assert broker_unreachable("", timeout=1) == "no bootstrap server given"
    assert "99999" in broker_unreachable("127.0.0.1:99999", timeout=1)


class _Readyz(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self):  # noqa: N802 (http.server API)
        self.send_response(_Readyz.status)
        self.end_headers()
        self.wfile.write(b"not ready: starting\nconsumer-group: not a member\n" if _Readyz.status != 200 else b"ready\n")

    def log_message(self, *a):
        pass


def test_probe_http_tcp_and_bad_urls():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Readyz)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/readyz"
    try:
        _Readyz.status = 503
        assert probe(url) == (False, "503 not ready: starting")
        _Readyz.status = 200
        assert probe(url)[0] is True
        assert probe(f"tcp://127.0.0.1:{srv.server_address[1]}")[0] is True
    finally:
        srv.shutdown()
        srv.server_close()
    dead = free_port()
    assert probe(f"http://127.0.0.1:{dead}/readyz", 1)[0] is False
    assert probe(f"tcp://127.0.0.1:{dead}", 1)[0] is False
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for bad in ("ftp://x/", "tcp://nohost", "127.0.0.1:9400"):
        p = subprocess.run([sys.executable, "-m", "worker.transport.probe", bad], env=env, capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 2 and p.stderr.startswith("probe: "), (bad, p.stderr)


def test_broker_on_a_taken_port_says_so():
    """``derender-worker broker --port P`` while another broker listens on P: it used to print
    "broker ... on 127.0.0.1:P" (the readiness wait reached the other broker) and then "exited with
    status 0" naming a log it had just deleted. Now it refuses before starting, naming the port."""
    with TansuBroker() as first:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.run([sys.executable, "-m", "worker.cli", "broker", "--port", str(first.port)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert "Ctrl-C stops it" not in proc.stdout, proc.stdout
        assert f"127.0.0.1:{first.port} is already in use" in proc.stderr, proc.stderr
        assert first.proc is not None and first.proc.poll() is None  # the first broker is untouched
