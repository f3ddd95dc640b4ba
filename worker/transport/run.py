"""``derender-worker run`` (``main_run``): build the models and the worker from the flags, run it
until SIGTERM/SIGINT; also ``python -m worker.transport.run`` (the ``run`` subcommand alone).
Topic administration is ``worker.transport.topics``."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import runpy
import signal
import socket
import sys
import threading
import time
from typing import Any

from aiokafka.errors import KafkaConnectionError

from worker.config import models_from_args
from worker.core.service import DerenderService
from worker.state import StoreAuthError, StoreConnectError
from worker.state.redis_store import RedisStateStore
from worker.tracing import setup_tracing
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.endpoints import EndpointError
from worker.transport.outage import DependencyOutage, OutageClock
from worker.transport.settings import WorkerSettings, redact_url

log = logging.getLogger(__name__)

__all__ = ["main_run", "broker_unreachable", "check_state_store", "wait_for_state_store", "ExitBackstop",
           "SIGTERM_GRACE_S"]


async def check_state_store(redis_settings: Any) -> None:
    """Ping the Redis stream state store once. Raises ``StoreConnectError`` when it is unreachable."""
    store = RedisStateStore.from_settings(redis_settings)
    try:
        await store.ping()
    finally:
        await store.close()


async def wait_for_state_store(redis_settings: Any, clock: OutageClock) -> None:
    """Ping the Redis stream state store until it answers, with backoff, for at most
    ``clock.deadline_s`` seconds (``--state-store-outage-deadline``; not ready meanwhile).
    Raises ``DependencyOutage`` (its message is the one line to log) when it never answered."""
    await clock.retry(lambda: check_state_store(redis_settings), (StoreConnectError,))


#: seconds past ``--drain-timeout`` a stop request (SIGTERM/SIGINT) may take before the process
#: ends (the promise is 5 s; the rest is for the exit itself)
SIGTERM_GRACE_S = 4.5


class ExitBackstop:
    """Ends the process (``os._exit``) when stopping takes too long, whatever blocks it (a client
    call to a broker that is gone, a stuck pool process, a commit that never returns): after a
    fatal error within ``drain_timeout_s`` (exit 2 for a ``DependencyOutage``, else 1: the worker
    has given up, its deadline already passed), after a stop request within ``drain_timeout_s``
    + ``SIGTERM_GRACE_S`` (exit 1). A daemon thread, so it fires even when the event loop is
    blocked; an earlier deadline replaces a later one. Uncommitted records are redelivered."""

    def __init__(self, drain_timeout_s: float):
        self.drain_timeout_s = max(0.0, float(drain_timeout_s))
        self._timer: threading.Timer | None = None
        self._at = float("inf")
        self._lock = threading.Lock()

    def on_stopping(self, fatal: BaseException | None) -> None:
        """``KafkaDerenderWorker.on_stopping``: arm for a fatal error (``fatal``) or a stop request."""
        if fatal is None:
            self.arm(self.drain_timeout_s + SIGTERM_GRACE_S, 1, "stop requested")
        else:
            self.arm(self.drain_timeout_s, 2 if isinstance(fatal, DependencyOutage) else 1,
                     f"fatal error ({type(fatal).__name__})")

    def arm(self, seconds: float, status: int, why: str) -> None:
        with self._lock:
            at = time.monotonic() + seconds
            if at >= self._at:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._at = at
            self._timer = threading.Timer(seconds, self._fire, (seconds, status, why))
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._at = None, float("inf")

    @staticmethod
    def _fire(seconds: float, status: int, why: str) -> None:
        log.error("still stopping %.0fs after %s; exiting now with status %d (uncommitted records will be "
                  "redelivered)", seconds, why, status)
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # noqa: BLE001 - exiting anyway; a broken log handler must not stop it
                pass
        os._exit(status)


async def _run_until_signal(worker: KafkaDerenderWorker) -> None:
    loop = asyncio.get_running_loop()
    await worker.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()


_BROKER_HINT = ("Kafka broker unreachable at %s (%s): start it, or give a reachable one with "
                "--bootstrap-servers (env DERENDER_BOOTSTRAP_SERVERS or KAFKA_BOOTSTRAP_SERVERS)")
#: bootstrap servers tried by ``broker_unreachable`` at most (the list is read from a flag)
MAX_BOOTSTRAP_SERVERS = 32


def broker_unreachable(bootstrap_servers: str, timeout: float = 5.0) -> str | None:
    """None when one of ``bootstrap_servers`` (``host:port[,host:port...]``, IPv6 in brackets,
    the port 9092 when absent as in aiokafka) accepts a TCP connection within ``timeout``
    seconds each, else one line naming every failed address (the first ``MAX_BOOTSTRAP_SERVERS``).
    Only reachability: protocol, TLS and SASL problems surface when the clients start."""
    errors = []
    for entry in [e.strip() for e in bootstrap_servers.split(",") if e.strip()][:MAX_BOOTSTRAP_SERVERS]:
        host, sep, port = entry.rpartition(":")
        if not sep or not port.isdigit() or (host.startswith("[") != host.endswith("]")):
            host, port = entry, "9092"
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            return None
        except (OSError, ValueError, OverflowError) as e:
            errors.append(f"{entry}: {e.strerror if isinstance(e, OSError) and e.strerror else e}")
    return "; ".join(errors) or "no bootstrap server given"


def main_run(args: argparse.Namespace) -> int:
    """``derender-worker run``: build the models from the flags, run the worker until
    SIGTERM/SIGINT. Returns 0 after a clean drain, 2 (one log line) on bad configuration (flags,
    model files or parser names, unreachable Kafka broker at start) or when a dependency (Redis,
    the broker) stayed unavailable past its outage deadline, 1 on another fatal error.
    ``--metrics-port`` answers before the start-up waits (``_serve``)."""
    try:
        models = models_from_args(args)
        settings = WorkerSettings.from_args(args)
    except (ValueError, OSError) as e:
        log.error("bad configuration: %s", e)
        return 2
    worker = KafkaDerenderWorker(settings, models)  # nothing loads or connects yet
    backstop = ExitBackstop(settings.drain_timeout_s)
    worker.on_stopping = backstop.on_stopping
    try:
        return asyncio.run(_serve(worker, settings))  # (the backstop stays armed until the process has ended)
    except EndpointError as e:  # raised before anything else started
        log.error("bad configuration: %s", e)
        return 2
    except KafkaConnectionError as e:  # raised by the clients' bootstrap, i.e. at start
        log.error(_BROKER_HINT, settings.bootstrap_servers, e)
        return 2
    except DependencyOutage as e:
        if worker._fatal is not e:  # given up during start(): not logged yet
            log.error("%s", e)
        return 2
    except Exception:
        log.exception("worker failed")
        return 1


async def _serve(worker: KafkaDerenderWorker, settings: WorkerSettings) -> int:
    """Serve the health port, then the start-up steps (each not ready with its reason meanwhile:
    ``state-store`` while Redis does not answer, ``starting``, ``warming-up`` while the pool
    starts, ``consumer-group`` until it joined), then run until a stop. Blocking steps run in a
    thread so ``/livez`` keeps answering. Returns the exit status of a start-up failure (logged),
    0 after a clean drain; raises what ``main_run`` turns into one."""
    worker.serve_endpoints()
    started = False
    try:
        status = await _before_start(worker, settings)
        if status is not None:
            return status
        started = True
        await _run_until_signal(worker)
        return 0
    finally:
        if not started and worker.endpoints is not None:
            await worker.endpoints.close()


async def _before_start(worker: KafkaDerenderWorker, settings: WorkerSettings) -> int | None:
    """The checks before the pool starts; the exit status (2, logged) of the first that fails, or None."""
    if settings.redis is not None:  # before the derender pool is built (seconds to minutes)
        clock = worker.store_outage  # the worker's clock: its not-ready reason is state-store
        try:
            await wait_for_state_store(settings.redis, clock)
        except DependencyOutage as e:
            log.error("%s", e)
            return 2
        except StoreAuthError as e:  # wrong password / user: no wait fixes it
            log.error("stream state store %s: %s", redact_url(settings.redis.url), e)
            return 2
        except (ValueError, OSError) as e:
            log.error("stream state store %s unusable (%s): %s", redact_url(settings.redis.url), e, clock.hint)
            return 2
    # load every tokenizer and parser here, before any pool process exists: a bad path or parser
    # name is one error line and exit 2, not a pool initializer traceback + BrokenProcessPool
    worker.health.set_reason("warming-up", "loading the tokenizers")
    try:
        service = DerenderService(worker.models)
        await asyncio.to_thread(service.preload)
    except (ValueError, OSError) as e:
        log.error("bad model configuration: %s", e)
        return 2
    try:
        exporter = setup_tracing()
    except ValueError as e:
        log.error("bad tracing configuration: %s", e)
        return 2
    if exporter:
        log.info("OpenTelemetry spans exported with OTEL_TRACES_EXPORTER=%s", exporter)
    problem = await asyncio.to_thread(broker_unreachable, settings.bootstrap_servers)
    if problem:  # before the pool starts: one line, not the Kafka clients' error lines after it
        log.error(_BROKER_HINT, settings.bootstrap_servers, problem)
        return 2
    if settings.executor == "thread":  # the thread pool shares this service: no second load
        worker.pool.service = service
    return None


def _main(argv: list[str] | None = None) -> None:
    """``python -m worker.transport.run`` = ``derender-worker run`` (same flags, environment and
    one-line errors): runs ``worker.cli`` as ``__main__`` with ``run`` inserted, by module name, so
    that this library module does not import the command line package above it."""
    sys.argv[1:] = ["run", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("worker.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
