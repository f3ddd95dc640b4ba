"""Counters of a Kafka worker: ``WorkerStats`` (plain, per worker; logged at stop and read by
tests) and ``PromMetrics`` (Prometheus objects, process-wide, served with ``--metrics-port``)."""
from __future__ import annotations

__all__ = ["WorkerStats", "PromMetrics"]


class WorkerStats:
    """Counters of one worker: ``processed`` (messages finished: replied or dead-lettered, offset
    committable), ``replied_ok`` (200 replies), ``errors`` (error replies, status != 200),
    ``dead_lettered``, ``crashes`` (core exceptions), ``commits``."""

    def __init__(self) -> None:
        self.processed = 0
        self.replied_ok = 0
        self.errors = 0
        self.dead_lettered = 0
        self.crashes = 0
        self.commits = 0
        self.stream_chunks = 0  # stream chunks derendered
        self.stream_replayed = 0  # duplicates answered from the replay window
        self.stream_skipped = 0  # duplicates older than the window (already acked), not answered
        self.stream_gaps = 0  # streams ended by a gap timeout (or never-seen first chunk)
        self.state_writes = 0  # batched checkpoint pipelines

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))

    def __repr__(self) -> str:
        return f"WorkerStats({self.as_dict()})"


class PromMetrics:
    """Process-wide Prometheus metrics, created on first use (default registry)."""

    _inst: PromMetrics | None = None

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram
        self.messages = Counter("derender_messages_total", "Messages finished, by outcome", ["outcome"])
        self.latency = Histogram("derender_seconds", "Derender wall time per message (seconds)")
        self.live_streams = Gauge("derender_live_streams", "Streams whose state is held in this worker's memory")

    @classmethod
    def get(cls) -> PromMetrics:
        """The process-wide instance (Prometheus metric names are global to the registry)."""
        if cls._inst is None:
            cls._inst = cls()
        return cls._inst

