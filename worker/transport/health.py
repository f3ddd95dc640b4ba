"""Health state of a Kafka worker: ready or not, and why not (Kubernetes readiness semantics:
"not ready" = do not count on this worker now; it keeps running and may recover by itself).

A ``HealthState`` is a set of *reasons*, each under a key chosen by the part of the worker that
detected the problem (e.g. ``"dead-letter:derender-dlq"``, ``"redis"``, ``"broker-topics"``):
``set_reason(key, text)`` when the problem starts, ``clear_reason(key)`` when it is over. The
worker is ready when it has started and no reason is set. It also carries the number of live
streams (streams held in memory), for the live-streams gauge.

Thread safe (one lock; every method is short and never blocks on I/O), so it can be read from
an HTTP server thread (e.g. a ``/readyz`` endpoint) while the event loop writes it, and written
from executor threads. Readers get copies, never the internal objects.
"""
from __future__ import annotations

import threading
import time

__all__ = ["HealthState"]


class HealthState:
    """Ready / not ready with the reasons, plus the live-streams count.

    ``ready`` is False until ``mark_started()`` was called (the worker joined its consumer
    group) and after ``mark_stopping()``; otherwise it is True exactly when no reason is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict[str, tuple[str, float]] = {}  # key -> (text, since: time.time())
        self._started = False
        self._stopping = False
        self._live_streams = 0
        self._gave_up: str | None = None  # a dependency's deadline passed (the give-up line)
        self._progress: float | None = None  # time.monotonic() the run loop last advanced

    # -- writers -------------------------------------------------------------------------------
    def set_reason(self, key: str, text: str) -> None:
        """Mark not ready because of ``key`` (replaces the text of an existing ``key``, keeping
        the time it was first set)."""
        with self._lock:
            since = self._reasons[key][1] if key in self._reasons else time.time()
            self._reasons[key] = (str(text), since)

    def clear_reason(self, key: str) -> bool:
        """Remove the reason ``key``; returns whether it was set."""
        with self._lock:
            return self._reasons.pop(key, None) is not None

    def mark_started(self) -> None:
        """The worker is running (consumer started); ready unless a reason is set."""
        with self._lock:
            self._started = True
            self._progress = time.monotonic()

    def progress(self) -> None:
        """The worker's run loop advanced (a fetch, a record finished): ``liveness``."""
        self._progress = time.monotonic()  # (one float store: atomic, no lock on the hot path)

    def give_up(self, line: str) -> None:
        """A dependency stayed away past its deadline (``line``: the give-up line): not live
        from now on (``liveness``), whatever the worker still manages to do before it exits."""
        with self._lock:
            self._gave_up = self._gave_up or str(line)

    def mark_stopping(self) -> None:
        """The worker is draining/stopping: not ready from now on."""
        with self._lock:
            self._stopping = True

    def set_live_streams(self, n: int) -> None:
        """Number of streams currently held in memory (all partitions)."""
        with self._lock:
            self._live_streams = max(0, int(n))

    # -- readers -------------------------------------------------------------------------------
    def liveness(self, stall_s: float = 10.0) -> str | None:
        """Why the worker is not live (Kubernetes liveness: "restart me"), or None: a dependency
        deadline passed (``give_up``), or, once started and while not stopping, its run loop has
        not advanced (``progress``) for ``stall_s`` seconds."""
        with self._lock:
            if self._gave_up is not None:
                return f"gave up: {self._gave_up}"
            if not self._started or self._stopping or self._progress is None:
                return None
            age = time.monotonic() - self._progress
        if age > stall_s:
            return f"run loop has not advanced for {age:.0f} s"
        return None

    @property
    def ready(self) -> bool:
        """True when started, not stopping and no reason is set."""
        with self._lock:
            return self._started and not self._stopping and not self._reasons

    @property
    def reasons(self) -> list[str]:
        """Why the worker is not ready, one line each, ``"<key>: <text>"`` in the order they were
        set; ``"starting"``/``"stopping"`` come first when they apply. Empty when ready."""
        with self._lock:
            out = [] if self._started else ["starting"]
            if self._stopping:
                out.append("stopping")
            out += [f"{k}: {t}" for k, (t, _) in sorted(self._reasons.items(), key=lambda kv: kv[1][1])]
            return out

    def has_reason(self, key: str) -> bool:
        """Whether the reason ``key`` is set."""
        with self._lock:
            return key in self._reasons

    @property
    def live_streams(self) -> int:
        """Streams held in memory (see ``set_live_streams``)."""
        with self._lock:
            return self._live_streams

    def snapshot(self) -> dict:
        """``{"ready": bool, "reasons": [str], "live_streams": int}`` (a copy; JSON-ready)."""
        with self._lock:
            ready = self._started and not self._stopping and not self._reasons
            live = self._live_streams
        return {"ready": ready, "reasons": self.reasons, "live_streams": live}
