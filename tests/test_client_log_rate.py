"""Broker-outage logging (issue 16, operator defect 2): the Kafka client library's lines are one
per cause per interval, with a count of those dropped, so the worker's own warning stays
visible. Unit level on ``worker.logs.RateLimitFilter`` (a fake clock), then end to end: a real
worker subprocess whose embedded broker is stopped under it."""
from __future__ import annotations

import io
import json
import logging
import re
import time

import pytest

from tests.chaos.harness import Broker, WorkerProc
from tests.harness.cli import QWEN3
from worker.logs import CLIENT_LOG_INTERVAL_S, RateLimitFilter, setup_logging
from worker.transport.broker import free_port


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _record(name: str, msg: str, *args, level=logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_one_line_per_cause_per_interval_with_a_count():
    clock = _Clock()
    f = RateLimitFilter(interval_s=30, clock=clock)
    out = []
    for i in range(2100):  # 70 lines/s for 30 s, node ids varying: one cause
        clock.t = 1000.0 + i / 70
        r = _record("aiokafka.client", "Unable connect to node with id %s: %s", i % 3, "refused")
        if f.filter(r):
            out.append(r)
    assert len(out) == 1 and not hasattr(out[0], "suppressed")
    clock.t += 1
    r = _record("aiokafka.client", "Unable connect to node with id %s: %s", 1, "refused")
    assert f.filter(r) and r.suppressed == 2099
    assert f.filter(_record("aiokafka.client", "Unable to update metadata from %s", [1]))  # another cause
    assert f.filter(_record("aiokafka.client", "Unable connect to node with id %s: %s", 1, "x",
                            level=logging.WARNING))  # another level: another cause
    assert not f.filter(_record("aiokafka.client", "Unable connect to node with id %s: %s", 2, "refused"))


def test_other_loggers_are_never_limited():
    f = RateLimitFilter(interval_s=30, clock=_Clock())
    for name in ("worker.transport.broker_watch", "aiokafkax", "root", "kafka"):
        assert all(f.filter(_record(name, "broker unreachable")) for _ in range(100)), name


def test_causes_remembered_are_bounded():
    clock = _Clock()
    f = RateLimitFilter(interval_s=30, clock=clock, max_causes=8)
    for i in range(1000):
        assert f.filter(_record("aiokafka", f"message built per call {i}"))
    assert len(f._causes) == 8


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_count_is_a_field_in_both_formats(fmt):
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    try:
        setup_logging("INFO", fmt, stream=buf)
        (flt,) = root.handlers[0].filters
        clock = _Clock()
        flt.clock = clock
        log = logging.getLogger("aiokafka.conn")
        for _ in range(50):
            log.error("Connect to %s failed", "127.0.0.1:9")
        clock.t += CLIENT_LOG_INTERVAL_S + 1
        log.error("Connect to %s failed", "127.0.0.1:9")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2, lines
    if fmt == "json":
        assert json.loads(lines[1])["suppressed"] == 49
    else:
        assert lines[1].endswith("suppressed=49"), lines[1]


def test_a_broker_outage_is_a_few_lines_not_seventy_a_second():
    """A worker whose broker goes away: over 12 s of outage the client library's lines stay
    a handful (one per cause), where they were ~70 a second, and the worker's own warning about
    the unreachable broker is there."""
    broker = Broker(port=free_port()).start()
    w = None
    try:
        w = WorkerProc("w", ["--tokenizer", QWEN3, "--bootstrap-servers", broker.bootstrap_servers,
                             "--stream-state", "memory", "--num-threads", "1", "--metrics-port", "0",
                             "--input-topic", "outage-logs-in", "--group-id", "outage-logs",
                             "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000"])
        deadline = time.monotonic() + 90
        while not w.assigned() and time.monotonic() < deadline and w.alive:
            time.sleep(0.2)
        assert w.assigned(), w.text()
        broker.stop()
        t0 = time.monotonic()
        time.sleep(12)
        assert w.alive, w.text()
        during = [x for t, x in w.lines if t >= t0]
        client = [x for x in during if re.search(r" aiokafka[.\w]*: ", x)]
        causes = {re.sub(r"\d+", "N", x.split(": ", 1)[1].split(" suppressed=")[0])[:60] for x in client}
        assert len(client) <= 3 * max(1, len(causes)) and len(client) < 30, "\n".join(client)
        assert any("broker" in x.lower() and "aiokafka" not in x for x in during), "\n".join(during[-20:])
    finally:
        if w is not None:
            w.stop()
        broker.stop()
