"""Structured logs (``worker.logs``) and W3C trace headers / OpenTelemetry spans
(``worker.tracing``) as units; the Kafka path is tested on the embedded broker in
tests/test_kafka_worker.py."""
from __future__ import annotations

import io
import json
import logging

import pytest

from worker import tracing
from worker.logs import record_fields, redact, setup_logging

TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def _log(fmt: str, level: str = "INFO") -> tuple[logging.Logger, io.StringIO]:
    buf = io.StringIO()
    setup_logging(level, fmt, stream=buf)
    return logging.getLogger("worker.test"), buf


def test_json_lines_with_record_fields_and_no_secrets(restore_logging):
    lg, buf = _log("json")
    lg.info("reply published to %s", "redis://user:hunter2@redis:6379/0",
            extra=record_fields("engine-outputs", 3, 17, "req-1", status=200))
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        lg.exception("failed", extra=record_fields(topic="t", partition=0, offset=1))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    a, b = (json.loads(x) for x in lines)
    assert list(a)[:8] == ["ts", "level", "logger", "message", "topic", "partition", "offset", "request_id"]
    assert (a["level"], a["logger"], a["topic"], a["partition"], a["offset"], a["request_id"], a["status"]) == (
        "INFO", "worker.test", "engine-outputs", 3, 17, "req-1", 200)
    assert a["ts"].endswith("Z") and "T" in a["ts"]
    assert "hunter2" not in lines[0] and "redis://user:***@redis:6379/0" in a["message"]
    assert "ValueError: boom" in b["exc_info"] and b["level"] == "ERROR"


def test_text_format_fields_and_redaction(restore_logging):
    lg, buf = _log("text", "WARNING")
    lg.info("hidden")
    lg.warning("cannot reach %s", "rediss://:pw@host", extra=record_fields(topic="t", partition=1, offset=2))
    out = buf.getvalue()
    assert "hidden" not in out
    assert "rediss://:***@host" in out and "pw@" not in out and "topic=t partition=1 offset=2" in out


def test_redact_leaves_plain_urls():
    assert redact("kafka:9092 http://host/path a://b@c") == "kafka:9092 http://host/path a://b@c"
    assert redact("x sasl://u:p@h y://v:w@z") == "x sasl://u:***@h y://v:***@z"


@pytest.mark.parametrize("value,ok", [
    (TP, True),
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", True),
    (b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", True),
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", False),
    (b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
    (b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
    (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),
    (b"garbage", False), (b"", False), (None, False), (b"00-" + b"a" * 300, False),
])
def test_traceparent_validation(value, ok):
    assert tracing.valid_traceparent(value) is ok


def test_trace_headers_keep_valid_ones_only():
    hs = [("content-type", b"application/json"), ("traceparent", TP), ("tracestate", b"congo=t61rcWkgMzE")]
    assert tracing.trace_headers(hs) == [("traceparent", TP), ("tracestate", b"congo=t61rcWkgMzE")]
    assert tracing.trace_headers([("tracestate", b"a=b")]) == []  # no traceparent: no tracestate
    assert tracing.trace_headers([("traceparent", b"bad"), ("tracestate", b"a=b")]) == []
    assert tracing.trace_headers([("traceparent", TP), ("tracestate", b"x" * 600)]) == [("traceparent", TP)]
    assert tracing.trace_headers([("traceparent", TP), ("tracestate", b"a=\x00")]) == [("traceparent", TP)]
    assert tracing.trace_headers(None) == []


def test_spans_are_children_of_the_record_and_the_reply_continues_the_trace():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    t = tracing.Tracer.__new__(tracing.Tracer)
    t._tracer = provider.get_tracer("test")
    t._prop = tracing.TraceContextTextMapPropagator()
    carrier = tracing.trace_headers([("traceparent", TP), ("tracestate", b"congo=t61rcWkgMzE")])
    with t.span("derender.publish", carrier, kind="producer", **{"messaging.destination.name": "r"}) as sp:
        hdrs = dict(t.reply_headers(carrier, sp))
    (s,) = exp.get_finished_spans()
    assert s.name == "derender.publish" and s.kind == trace.SpanKind.PRODUCER
    assert f"{s.context.trace_id:032x}" == TP.split(b"-")[1].decode()
    assert f"{s.parent.span_id:016x}" == TP.split(b"-")[2].decode()
    assert hdrs["traceparent"].split(b"-")[1] == TP.split(b"-")[1]  # same trace
    assert hdrs["traceparent"].split(b"-")[2] == f"{s.context.span_id:016x}".encode()  # this span is the parent
    assert hdrs["tracestate"] == b"congo=t61rcWkgMzE"


def test_without_opentelemetry_everything_is_a_no_op(monkeypatch):
    monkeypatch.setattr(tracing, "_otel_trace", None)
    monkeypatch.setattr(tracing, "TraceContextTextMapPropagator", None)
    t = tracing.Tracer()
    carrier = [("traceparent", TP)]
    with t.span("derender.decode", carrier) as sp:
        assert sp is None
    assert t.reply_headers(carrier, sp) == carrier
    assert tracing.setup_tracing({"OTEL_TRACES_EXPORTER": "console"}) is None


def test_setup_tracing_refuses_an_unknown_exporter():
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER"):
        tracing.setup_tracing({"OTEL_TRACES_EXPORTER": "carrier-pigeon"})
    assert tracing.setup_tracing({}) is None


def test_pool_processes_take_the_exported_log_settings(restore_logging, monkeypatch):
    from worker.logs import JsonFormatter, TextFormatter, export_log_settings, setup_logging_from_env
    monkeypatch.setenv("DERENDER_LOG_LEVEL", "INFO")
    monkeypatch.setenv("DERENDER_LOG_FORMAT", "text")
    export_log_settings("WARNING", "json")
    setup_logging_from_env()
    root = logging.getLogger()
    assert root.level == logging.WARNING and isinstance(root.handlers[0].formatter, JsonFormatter)
    monkeypatch.setenv("DERENDER_LOG_FORMAT", "yaml")
    monkeypatch.setenv("DERENDER_LOG_LEVEL", "loud")
    setup_logging_from_env()
    assert root.level == logging.INFO and isinstance(root.handlers[0].formatter, TextFormatter)
