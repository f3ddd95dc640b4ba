"""Broker watchdog of a Kafka worker: notice a broker that is unreachable or that lost the data
this worker already read (the embedded Tansu broker keeps everything in memory, so a restart
loses every topic, record and offset), report it (``HealthState`` reason ``broker``), and stop
the worker with one clear line (``DependencyOutage``, exit status 2) when it lasts longer than
``--broker-outage-deadline`` seconds, instead of spinning on errors forever.

Every ``period_s`` it asks the broker for the topic list and for the group's committed offsets
of every input partition this worker committed. Problems:

* the broker does not answer (any client error or timeout);
* the input topic is gone after this worker had read from it;
* a partition's committed offset is missing or below one this worker committed: the group's
  offsets vanished, which a healthy broker never does while the group is active (a later owner
  only commits further). Latched like the previous one: neither recovers, so the worker exits
  once the deadline passed.

(Log end offsets are not used: some Kafka-protocol brokers report a batch's base offset there.)

aiokafka reconnects by itself; the watchdog only observes.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from worker.transport.outage import DependencyOutage, OutageClock

log = logging.getLogger(__name__)

__all__ = ["BrokerWatch"]


class BrokerWatch:
    """Watch the broker of ``consumer`` for ``input_topic`` (module docstring). ``committed``: the
    worker's dict ``TopicPartition -> highest offset it committed`` (updated after each commit);
    ``clock``: an ``OutageClock`` (deadline, health reason); ``on_fatal(err)``: called once with
    the ``DependencyOutage`` when the deadline passed; ``timeout_s``: per request."""

    def __init__(self, consumer: Any, input_topic: str, committed: dict, clock: OutageClock, on_fatal,
                 period_s: float = 2.0, timeout_s: float = 10.0):
        self.consumer = consumer
        self.input_topic = input_topic
        self.committed = committed
        self.clock = clock
        self.on_fatal = on_fatal
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.lost: str | None = None  # latched data-loss description

    async def problem(self) -> str | None:
        """What is wrong with the broker now, or None. Never raises (a failure is the problem)."""
        if self.lost is not None:
            return self.lost
        try:
            topics = await asyncio.wait_for(self.consumer.topics(), self.timeout_s)
            if self.committed and self.input_topic not in topics:
                self.lost = (f"input topic {self.input_topic!r} is gone from the broker after this worker read "
                             f"from it (broker restarted without its data?)")
                return self.lost
            expect = {tp: off for tp, off in self.committed.items() if tp.topic == self.input_topic}
            got = {}
            for tp in expect:
                got[tp] = await asyncio.wait_for(self.consumer.committed(tp), self.timeout_s)
        except Exception as e:  # noqa: BLE001 - any client error is "unreachable"; it is reported
            return f"broker unreachable: {type(e).__name__}: {e}"
        for tp, off in expect.items():
            if got[tp] is None or got[tp] < off:
                self.lost = (f"broker lost the committed offsets of {tp.topic}[{tp.partition}]: it has {got[tp]}, "
                             f"this worker committed {off} (broker restarted without its data?)")
                return self.lost
        return None

    async def run(self) -> None:
        """Check every ``period_s`` until cancelled or the deadline passed (then ``on_fatal``)."""
        while True:
            await asyncio.sleep(self.period_s)
            problem = await self.problem()
            if problem is None:
                self.clock.up()
                continue
            self.clock.down(problem)
            if self.clock.expired:
                self.on_fatal(DependencyOutage(self.clock.give_up_line()))
                return
