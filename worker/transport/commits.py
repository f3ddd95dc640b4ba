"""Step 4 of the commit order: offset commits. A partition's committable offset is its lowest
unfinished record (else its highest fetched + 1); ``OffsetCommitter.commit`` commits every one
that moved (the worker calls it every ``--commit-interval-ms``, on rebalance and at shutdown).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from worker.transport.checkpoints import OffsetCommitError
from worker.transport.metrics import WorkerStats

log = logging.getLogger(__name__)

__all__ = ["OffsetCommitter"]


class OffsetCommitter:
    """Commits the offsets of ``parts`` (``TopicPartition`` -> partition state with
    ``update_committable()`` and ``committed``) with ``consumer`` (set once started).
    ``committed_hw``: highest offset committed per partition (the broker watchdog compares the
    broker's with it); ``on_committed(partition, offset)``: after a commit (stream windows).
    ``block(reason)`` stops every later commit (the broker lost data: a commit could pass records
    this worker never read; the next owner starts from the broker's offsets instead)."""

    def __init__(self, parts: dict, stats: WorkerStats, on_committed: Callable[[Any, int], None] | None = None):
        self.consumer: Any = None
        self.parts = parts
        self.stats = stats
        self.on_committed = on_committed
        self.committed_hw: dict[Any, int] = {}
        self.blocked: str | None = None

    def block(self, reason: str) -> None:
        """Commit nothing any more (the first ``reason`` is kept and logged once)."""
        if self.blocked is None:
            self.blocked = reason
            log.error("offsets are no longer committed: %s", reason)

    async def commit(self) -> None:
        """Commit every partition's committable offset that moved (nothing once ``block``ed).
        Commit failures (rebalance in progress, broker away) are logged; the offsets stay pending
        and are retried next time."""
        if self.consumer is None or self.blocked is not None:
            return
        offsets = {tp: st.update_committable() for tp, st in self.parts.items()}
        offsets = {tp: o for tp, o in offsets.items() if o is not None and o != self.parts[tp].committed}
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except Exception as e:
            err = OffsetCommitError(f"offset commit of {({f'{t.topic}[{t.partition}]': o for t, o in offsets.items()})} "
                                    f"failed: {type(e).__name__}: {e}")
            log.warning("%s", err)
            return
        self.stats.commits += 1
        for tp, off in offsets.items():
            self.committed_hw[tp] = max(self.committed_hw.get(tp, 0), off)
            if tp in self.parts:
                self.parts[tp].committed = off
                if self.on_committed is not None:
                    self.on_committed(self.parts[tp], off)

