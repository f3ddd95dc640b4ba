"""HTTP endpoints of a Kafka worker, on one port (``--metrics-port``): ``/livez``, ``/readyz``,
``/metrics``.

Served by the standard library's WSGI server (``wsgiref``, one thread per request) on a daemon
thread, so a probe or a scrape never waits for the event loop and never slows it down; ``/metrics``
is prometheus_client's WSGI app over the worker's registry (``worker.transport.metrics``).

``/livez`` (Kubernetes liveness: "restart me when this fails")
    200 ``ok`` while the event loop's heartbeat, a task that ticks every second, is younger than
    ``stall_s`` seconds (10), the run loop advanced within ``run_stall_s`` seconds (10; a fetch, a record
    finished; not checked while starting or stopping) and no dependency deadline has passed;
    503 otherwise, with one line: ``event loop stalled for N s``, ``run loop has not advanced for
    N s`` or ``gave up: <the give-up line>`` (``HealthState.liveness``).
``/readyz`` (Kubernetes readiness: "do not count on me now")
    200 ``ready`` when ``HealthState.ready`` (started, a member of its consumer group, state store
    and broker reachable, not stopping); 503 with one reason per line otherwise (``starting``,
    ``stopping``, ``<key>: <text>``).
``/metrics``
    Prometheus text format (OpenMetrics when the scraper asks for it).

Other paths: 404. Bodies are ``text/plain; charset=utf-8``.
"""
from __future__ import annotations

import asyncio
import logging
import socketserver
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from worker.transport.health import HealthState

log = logging.getLogger(__name__)

__all__ = ["Endpoints", "EndpointError", "DependencyProbe"]


class EndpointError(OSError):
    """The health/metrics port cannot be served: ``--metrics-port`` outside 0..65535, or taken /
    not allowed. A startup configuration error (``derender-worker run`` exits 2 with this line)."""


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not logged
        pass


class Endpoints:
    """``/livez``, ``/readyz`` and ``/metrics`` of one worker on ``host:port`` (``port`` 0 = a
    free port, read back from ``.port`` after ``start()``).

    ``health``: the worker's ``HealthState`` (read from the server threads; it is thread safe).
    ``registry``: the prometheus_client ``CollectorRegistry`` to expose. ``stall_s``: heartbeat age
    in seconds above which ``/livez`` fails; ``run_stall_s``: seconds without run-loop progress
    after which it fails (``HealthState.liveness``). Raises ``EndpointError`` (naming the flag) for a port
    outside 0..65535, and from ``start()`` when the port cannot be bound."""

    def __init__(self, health: HealthState, registry: Any, port: int, host: str = "0.0.0.0",
                 stall_s: float = 10.0, run_stall_s: float = 10.0):
        if not 0 <= int(port) <= 65535:
            raise EndpointError(f"--metrics-port {port}: not a TCP port (0..65535)")
        self.health = health
        self.host = host
        self.port = int(port)
        self.stall_s = float(stall_s)
        self.run_stall_s = float(run_stall_s)
        self._metrics_app = make_wsgi_app(registry)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._beat: float | None = None  # time.monotonic() of the last heartbeat
        self._beat_task: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and serve on a daemon thread; start the heartbeat on the running event loop."""
        try:
            self._server = make_server(self.host, self.port, self._app, server_class=_Server,
                                       handler_class=_QuietHandler)
        except OSError as e:
            raise EndpointError(f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port} "
                                f"(--metrics-host {self.host}): {e.strerror or e}") from e
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name=f"derender-http-{self.port}", daemon=True)
        self._thread.start()
        self._beat = time.monotonic()
        self._beat_task = asyncio.get_running_loop().create_task(self._heartbeat(), name="derender-heartbeat")
        log.info("health and metrics on %s:%d (/livez /readyz /metrics)", self.host, self.port)

    async def _heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Stop the heartbeat and the server (idempotent)."""
        if self._beat_task is not None:
            self._beat_task.cancel()
            await asyncio.gather(self._beat_task, return_exceptions=True)
            self._beat_task = None
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.get_running_loop().run_in_executor(None, server.shutdown)
            server.server_close()

    # -- WSGI ----------------------------------------------------------------------------------
    def livez(self) -> tuple[int, str]:
        """``(status, body)`` of ``/livez``."""
        if self._beat is None:
            return 503, "event loop not started\n"
        age = time.monotonic() - self._beat
        if age > self.stall_s:
            return 503, f"event loop stalled for {age:.0f} s\n"
        why = self.health.liveness(self.run_stall_s)
        if why is not None:
            return 503, why + "\n"
        return 200, "ok\n"

    def readyz(self) -> tuple[int, str]:
        """``(status, body)`` of ``/readyz``."""
        snap = self.health.snapshot()
        if snap["ready"]:
            return 200, "ready\n"
        return 503, "".join(f"{r}\n" for r in snap["reasons"] or ["not ready"])

    def _app(self, environ: dict, start_response) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics_app(environ, start_response)
        if path == "/livez":
            code, body = self.livez()
        elif path == "/readyz":
            code, body = self.readyz()
        else:
            code, body = 404, "not found: /livez /readyz /metrics\n"
        data = body.encode("utf-8")
        start_response(f"{code} {_REASON[code]}", [("Content-Type", "text/plain; charset=utf-8"),
                                                   ("Content-Length", str(len(data))),
                                                   ("Cache-Control", "no-store")])
        return [data]


_REASON = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


class DependencyProbe:
    """Readiness reasons for the worker's dependencies: every ``interval_s`` seconds each check
    of ``checks`` (key -> coroutine function) runs with a ``timeout_s`` limit; a check that raises,
    times out or returns False sets the reason ``key`` in ``health`` (the text names the error), a
    check that passes clears it. Transitions are logged (warning when a dependency goes away, info
    when it is back). Key used by the worker: ``state-store`` (Redis PING; the same key as the
    state store's ``OutageClock``: both mean "Redis does not answer"). The broker is watched by
    ``worker.transport.broker_watch`` (reason ``broker``)."""

    def __init__(self, health: HealthState, checks: dict[str, Any], interval_s: float = 5.0,
                 timeout_s: float = 5.0):
        self.health = health
        self.checks = dict(checks)
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Run the checks on the running event loop until ``close()``."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="derender-dependency-probe")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check_once()

    async def check_once(self) -> None:
        """Run every check once (concurrently) and update the reasons."""
        keys = list(self.checks)
        results = await asyncio.gather(*(self._check(k) for k in keys))
        for key, err in zip(keys, results, strict=True):
            if err is None:
                if self.health.clear_reason(key):
                    log.info("%s reachable again", key)
            else:
                if not self.health.has_reason(key):
                    log.warning("%s unreachable: %s (not ready)", key, err)
                self.health.set_reason(key, f"unreachable: {err}")

    async def _check(self, key: str) -> str | None:
        try:
            ok = await asyncio.wait_for(self.checks[key](), self.timeout_s)
        except asyncio.TimeoutError:
            return f"no answer within {self.timeout_s:g}s"
        except Exception as e:  # the failure is the probe's result: it becomes the readiness reason
            return f"{type(e).__name__}: {e}"
        return "check failed" if ok is False else None

    async def close(self) -> None:
        """Stop probing (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
