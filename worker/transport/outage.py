"""Outages of the worker's dependencies (the stream state store, the Kafka broker): degrade,
report not ready, wait with backoff, and give up with one clear line after a deadline.

``OutageClock`` tracks one dependency: ``down(reason)`` when a call failed (the first one starts
the outage: one WARNING line and a ``HealthState`` reason under ``key``), ``up()`` when a call
worked again (one INFO line with the duration; the reason is cleared). ``expired`` tells whether
the outage lasted longer than ``deadline_s``; ``raise_if_expired()`` raises ``DependencyOutage``,
the fatal error after which ``derender-worker run`` exits with status 2. ``retry(fn)`` runs an
async call until it works or the deadline passes, sleeping with capped exponential backoff.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

__all__ = ["DependencyOutage", "OutageClock"]

T = TypeVar("T")


class DependencyOutage(Exception):
    """A dependency stayed unavailable longer than its deadline (``--state-store-outage-deadline``,
    ``--broker-outage-deadline``); the message is the one line logged before exit status 2."""


class OutageClock:
    """One dependency's outage state. ``what``: its name in log lines (e.g. ``"stream state store
    redis://host:6379/0"``); ``key``: the ``HealthState`` reason key (e.g. ``"state-store"``);
    ``deadline_s``: seconds an outage may last (0 = give up at the first failure); ``health``: a
    ``HealthState`` or None; ``hint``: appended to the give-up line (what the operator can do)."""

    def __init__(self, what: str, key: str, deadline_s: float, health: Any = None, hint: str = "",
                 backoff_s: tuple[float, float] = (0.1, 2.0)):
        self.what = what
        self.key = key
        self.deadline_s = max(0.0, float(deadline_s))
        self.health = health
        self.hint = hint
        self.backoff_s = backoff_s
        self.since: float | None = None  # time.monotonic() of the first failure of the outage
        self.reason = ""
        self.outages = 0  # outages seen (figures, tests)

    @property
    def is_down(self) -> bool:
        return self.since is not None

    @property
    def down_for(self) -> float:
        """Seconds the current outage has lasted (0 when up)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    @property
    def expired(self) -> bool:
        return self.since is not None and self.down_for >= self.deadline_s

    def down(self, reason: str) -> None:
        """A call failed with ``reason``: starts the outage (logged once) or updates its reason."""
        self.reason = reason
        if self.since is None:
            self.since = time.monotonic()
            self.outages += 1
            log.warning("%s unavailable (%s): waiting for it, at most %.0fs; not ready meanwhile", self.what, reason,
                        self.deadline_s)
        if self.health is not None:
            self.health.set_reason(self.key, f"{self.what} unavailable for {self.down_for:.0f}s: {reason}")

    def up(self) -> None:
        """A call worked: ends the outage (logged once with its duration)."""
        if self.since is not None:
            log.info("%s available again after %.1fs", self.what, self.down_for)
            self.since = None
            self.reason = ""
        if self.health is not None:
            self.health.clear_reason(self.key)

    def give_up_line(self) -> str:
        """The one line logged when the deadline passed (also marks ``health`` given up: ``/livez`` 503)."""
        line = (f"{self.what} unavailable for {self.down_for:.0f}s (deadline {self.deadline_s:g}s): {self.reason}; "
                f"giving up{': ' + self.hint if self.hint else ''}")
        if self.health is not None:
            self.health.give_up(line)
        return line

    def raise_if_expired(self) -> None:
        """Raises ``DependencyOutage`` (with ``give_up_line()``) when the outage outlived its deadline."""
        if self.expired:
            raise DependencyOutage(self.give_up_line())

    async def retry(self, fn: Callable[[], Awaitable[T]], retry_on: tuple[type[BaseException], ...]) -> T:
        """``await fn()`` until it returns (then ``up()``); on an exception of ``retry_on`` mark the
        outage (``down``) and sleep with backoff (``backoff_s`` = first, cap). Raises
        ``DependencyOutage`` once the outage outlived the deadline; other exceptions propagate."""
        delay, cap = self.backoff_s
        while True:
            try:
                out = await fn()
            except retry_on as e:
                self.down(f"{type(e).__name__}: {e}")
                self.raise_if_expired()
                await asyncio.sleep(min(delay, max(0.01, self.deadline_s - self.down_for)))
                delay = min(cap, delay * 2)
                continue
            self.up()
            return out
