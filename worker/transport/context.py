"""The typed context a Kafka worker hands its stream router (after quixstreams'
``processing/context.py``): the collaborators and the callbacks the router may use, and nothing
else; the router never sees the worker object.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from worker.transport.metrics import PromMetrics, WorkerStats
from worker.transport.planning import ReplyPlanner
from worker.transport.publisher import ReplyPublisher

__all__ = ["StreamContext"]


@dataclass(frozen=True, slots=True)
class StreamContext:
    """What ``StreamRouter`` works with.

    * ``publisher``: sends replies and dead letters (``ReplyPublisher``); ``planner``: plans them.
    * ``submit(value, state, seq, kind, created, pieces, settings) -> StreamOutcome``: derender one
      chunk in the pool.
    * ``finished(partition, offset)``: the record is through its commit order (committable);
      ``abandoned(partition, offset)``: it never will be (stays uncommitted, redelivered).
    * ``fatal(err)``: stop the worker (a step failed for good).
    * ``count(outgoing, outcome, msg, mode)``: a record's reply or dead letter was acked (stats,
      metrics; ``outcome`` has ``status`` and ``kind``).
    * ``stats``/``metrics``: the worker's counters and Prometheus metrics.
    """

    publisher: ReplyPublisher
    planner: ReplyPlanner
    submit: Callable[..., Awaitable[Any]]
    finished: Callable[[Any, int], None]
    abandoned: Callable[[Any, int], None]
    fatal: Callable[[BaseException], None]
    count: Callable[..., None]
    stats: WorkerStats
    metrics: PromMetrics
