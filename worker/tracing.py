"""Trace context across the worker: W3C Trace Context headers carried from an input record to
its reply or dead letter, and optional OpenTelemetry spans around decode, derender and publish.

* **Headers** (W3C Trace Context, https://www.w3.org/TR/trace-context/): a valid ``traceparent``
  (``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, ids not all zero, version not
  ``ff``; a later version is read by its first four fields, as the spec asks) and, only with it,
  ``tracestate`` (at most 512 bytes, printable ASCII; longer or odd values are dropped, the
  spec allowing a vendor to drop it) are copied to the reply. Invalid ones are not copied.
* **Spans** (extra ``[otel]``: ``opentelemetry-api``/``-sdk``): when the OpenTelemetry API is
  installed, ``Tracer.span(name, carrier)`` opens a span child of the record's ``traceparent``
  (kind CONSUMER for ``derender.derender``: from submission to the pool until its result, i.e.
  queueing, JSON decode and derender; PRODUCER for ``derender.publish``), and ``Tracer.reply_headers`` gives the reply the context of the publish
  span (so the reply continues the trace through this worker). Without the API every call is a
  no-op and the input headers are copied unchanged. A tracer provider is the operator's
  (``opentelemetry-instrument``) or, with ``OTEL_TRACES_EXPORTER=console``/``otlp`` and the SDK
  installed, the one ``setup_tracing`` builds (OTLP needs ``opentelemetry-exporter-otlp``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_TRACESTATE = 512
_TP = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def valid_traceparent(value: bytes | None) -> bool:
    """True for a W3C ``traceparent`` value this worker propagates (module docstring)."""
    if not value or len(value) > 256:
        return False
    m = _TP.match(value.strip())
    if m is None:
        return False
    version, trace_id, parent_id, _flags, rest = m.groups()
    if version == b"ff" or trace_id == b"0" * 32 or parent_id == b"0" * 16:
        return False
    return not (version == b"00" and rest)  # version 00 has exactly four fields


def _valid_tracestate(value: bytes | None) -> bool:
    return bool(value) and len(value) <= MAX_TRACESTATE and all(0x20 <= b < 0x7F for b in value)


def trace_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes]]:
    """The W3C trace headers of an input record to copy to its reply/dead letter: ``traceparent``
    when valid, then ``tracestate`` when valid and a ``traceparent`` was kept (first of each)."""
    tp = ts = None
    for k, v in headers or ():
        name = k.lower() if isinstance(k, str) else ""
        if name == TRACEPARENT and tp is None:
            tp = v
        elif name == TRACESTATE and ts is None:
            ts = v
    if not valid_traceparent(tp):
        return []
    assert tp is not None
    out = [(TRACEPARENT, bytes(tp).strip())]
    if _valid_tracestate(ts):
        assert ts is not None
        out.append((TRACESTATE, bytes(ts)))
    return out


try:  # optional: the [otel] extra
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracer, ProxyTracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised when the extra is not installed
    _otel_trace = None
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]
    NoOpTracerProvider = ProxyTracer = ProxyTracerProvider = None  # type: ignore[assignment,misc]


def otel_available() -> bool:
    """The OpenTelemetry API is installed (spans are then made; they are exported only when a
    tracer provider with an exporter is set)."""
    return _otel_trace is not None


class Tracer:
    """Spans of one worker process. ``span(name, carrier, **attributes)`` is a context manager
    yielding the span (None without OpenTelemetry); ``reply_headers(input_headers, span)`` gives
    the trace headers for the reply (input ones copied, or the span's context when there is a
    recording span)."""

    def __init__(self, name: str = "derender-worker"):
        self._tracer = _otel_trace.get_tracer(name) if _otel_trace is not None else None
        self._prop = TraceContextTextMapPropagator() if TraceContextTextMapPropagator is not None else None

    @property
    def installed(self) -> bool:
        """The OpenTelemetry API is installed (a reply's trace headers then go last, as
        ``derender.publish`` places them, whether or not spans are made)."""
        return self._tracer is not None

    @property
    def enabled(self) -> bool:
        """Spans are made: the OpenTelemetry API is installed and a tracer provider is set (its
        global one, or a tracer given directly). Without a provider the API's spans are no-ops
        that change no reply byte, so the hot path skips them (callers check this first)."""
        t = self._tracer
        if t is None:
            return False
        if type(t) is ProxyTracer:  # the API's tracer: real once a provider is set, a no-op until then
            return not isinstance(_otel_trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider))
        return True

    def _context(self, carrier: list[tuple[str, bytes]]):
        assert self._prop is not None
        return self._prop.extract({k: v.decode("ascii", "replace") for k, v in carrier})

    @contextlib.contextmanager
    def span(self, name: str, carrier: list[tuple[str, bytes]] | None = None, kind: str = "consumer",
             **attributes: Any) -> Iterator[Any]:
        """A span ``name`` child of ``carrier``'s trace context (output of ``trace_headers``);
        ``kind``: ``consumer``/``producer``/``internal``; None attribute values are dropped.
        An exception inside marks the span as failed and propagates."""
        if self._tracer is None:
            yield None
            return
        k = {"consumer": _otel_trace.SpanKind.CONSUMER, "producer": _otel_trace.SpanKind.PRODUCER}.get(
            kind, _otel_trace.SpanKind.INTERNAL)
        ctx = self._context(carrier) if carrier else None
        attrs = {a: v for a, v in attributes.items() if v is not None}
        with self._tracer.start_as_current_span(name, context=ctx, kind=k, attributes=attrs) as sp:
            yield sp

    def reply_headers(self, carrier: list[tuple[str, bytes]], span: Any = None) -> list[tuple[str, bytes]]:
        """Trace headers for a reply: ``span``'s context when it is recording (the reply then
        continues the trace from this worker's span; ``tracestate`` kept), else ``carrier``."""
        if span is None or self._prop is None or not span.is_recording():
            return list(carrier)
        out: dict[str, str] = {}
        self._prop.inject(out, context=_otel_trace.set_span_in_context(span))
        hdrs = [(TRACEPARENT, out[TRACEPARENT].encode())] if TRACEPARENT in out else []
        if TRACESTATE in out:
            hdrs.append((TRACESTATE, out[TRACESTATE].encode()))
        elif hdrs:
            hdrs.extend((k, v) for k, v in carrier if k == TRACESTATE)
        return hdrs or list(carrier)


def setup_tracing(environ: dict[str, str] | None = None) -> str | None:
    """Install an SDK tracer provider when none is set, the SDK is installed and
    ``OTEL_TRACES_EXPORTER`` is ``console`` or ``otlp`` (service name ``OTEL_SERVICE_NAME``,
    default ``derender-worker``). Returns the exporter used, or None (nothing installed).
    Raises ``ValueError`` for ``otlp`` without ``opentelemetry-exporter-otlp``."""
    env = os.environ if environ is None else environ
    exporter = (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    if _otel_trace is None or exporter in ("", "none"):
        return None
    try:
        # deferred: OpenTelemetry is an optional extra ([otel]), loaded only when OTEL_TRACES_EXPORTER is set
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER=%s but opentelemetry-sdk is not installed: no spans exported", exporter)
        return None
    if exporter == "console":
        exp = ConsoleSpanExporter()
    elif exporter == "otlp":
        try:
            # deferred: OpenTelemetry is an optional extra ([otel]), loaded only when OTEL_TRACES_EXPORTER is set
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise ValueError("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp installed") from e
        exp = OTLPSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: expected console, otlp or none")
    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME",
                                                                                "derender-worker")}))
    provider.add_span_processor(BatchSpanProcessor(exp))
    _otel_trace.set_tracer_provider(provider)
    return exporter


def kafka_span_attrs(msg: Any) -> dict[str, Any]:
    """OpenTelemetry messaging attributes (semantic conventions ``messaging.*``) of Kafka record
    ``msg`` (anything with ``topic``, ``partition``, ``offset``)."""
    return {"messaging.system": "kafka", "messaging.source.name": msg.topic,
            "messaging.kafka.partition": msg.partition, "messaging.kafka.offset": msg.offset}
