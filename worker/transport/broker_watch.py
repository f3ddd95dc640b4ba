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

Every ``tick_s`` (locally, no request) and on every acknowledgement (``lose``, from the reply
publisher's ``AckOffsets``), two more signs of lost data, latched too:

* an input partition's log ends below this worker's position (fetch high watermark < position):
  the topic was re-created or the broker restarted without its data, and a broker that answers
  such a fetch with no records instead of OFFSET_OUT_OF_RANGE (the embedded Tansu) lets the
  consumer skip the new log's first records;
* a produce acknowledgement's offset at or below one acknowledged before on the same partition.

Any latched loss also stops the worker's offset commits at once (``on_lost``): a commit could
pass records of the new log this worker never read, and replies acknowledged by a broker that
lost them could be counted as delivered; left uncommitted, they are read again by the next owner
(duplicates, never losses). docs/kafka.md, "Embedded broker limits".

(Log end offsets are not used: some Kafka-protocol brokers report a batch's base offset there.)

aiokafka reconnects by itself; the watchdog only observes.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka.errors import IllegalStateError

from worker.transport.outage import DependencyOutage, OutageClock

log = logging.getLogger(__name__)

__all__ = ["BrokerWatch"]


class BrokerWatch:
    """Watch the broker of ``consumer`` for ``input_topic`` (module docstring). ``committed``: the
    worker's dict ``TopicPartition -> highest offset it committed`` (updated after each commit);
    ``clock``: an ``OutageClock`` (deadline, health reason); ``on_fatal(err)``: called once with
    the ``DependencyOutage`` when the deadline passed; ``on_lost(text)``: called once when a data
    loss is latched (stop committing); ``period_s``: seconds between broker checks; ``tick_s``:
    seconds between local position checks; ``timeout_s``: per request."""

    def __init__(self, consumer: Any, input_topic: str, committed: dict, clock: OutageClock, on_fatal,
                 period_s: float = 2.0, timeout_s: float = 10.0, on_lost=None, tick_s: float = 0.1):
        self.consumer = consumer
        self.input_topic = input_topic
        self.committed = committed
        self.clock = clock
        self.on_fatal = on_fatal
        self.on_lost = on_lost
        self.period_s = period_s
        self.tick_s = tick_s
        self.timeout_s = timeout_s
        self.lost: str | None = None  # latched data-loss description

    def lose(self, text: str) -> None:
        """Latch data loss ``text`` (the first one is kept) and report it once to ``on_lost``
        (logged as an ERROR when there is none). Safe to call from a done-callback."""
        if self.lost is not None:
            return
        self.lost = text
        if self.on_lost is not None:
            self.on_lost(text)
        else:
            log.error("%s", text)

    async def position_problem(self) -> str | None:
        """An input partition whose fetch high watermark is below this worker's position, or
        None. Local (the consumer's last fetch responses; partitions without a position within
        0.1 s, e.g. while a rebalance resets them, are skipped); never raises."""
        high = {}
        for tp in list(self.consumer.assignment()):
            if tp.topic != self.input_topic:
                continue
            try:
                hw = self.consumer.highwater(tp)
            except (AssertionError, IllegalStateError):
                continue  # revoked meanwhile
            if hw is not None:
                high[tp] = hw
        if not high:
            return None
        tasks = {tp: asyncio.ensure_future(self.consumer.position(tp)) for tp in high}
        done, pending = await asyncio.wait(tasks.values(), timeout=0.1)
        for task in pending:
            task.cancel()
        for tp, task in tasks.items():
            if task not in done or task.exception() is not None:
                continue  # no position yet, or revoked meanwhile (IllegalStateError)
            pos = task.result()
            if pos > high[tp]:
                return (f"broker log of {tp.topic}[{tp.partition}] ends at offset {high[tp]}, below this worker's "
                        f"position {pos}: it lost records this worker had read (topic re-created, or broker "
                        f"restarted without its data?)")
        return None

    async def problem(self) -> str | None:
        """What is wrong with the broker now, or None. Never raises (a failure is the problem)."""
        if self.lost is not None:
            return self.lost
        try:
            topics = await asyncio.wait_for(self.consumer.topics(), self.timeout_s)
            if self.committed and self.input_topic not in topics:
                self.lose(f"input topic {self.input_topic!r} is gone from the broker after this worker read "
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
                self.lose(f"broker lost the committed offsets of {tp.topic}[{tp.partition}]: it has {got[tp]}, "
                          f"this worker committed {off} (broker restarted without its data?)")
                return self.lost
        return None

    async def run(self) -> None:
        """Check positions every ``tick_s`` and the broker every ``period_s`` (at once after a
        loss is latched) until cancelled or the deadline passed (then ``on_fatal``)."""
        next_check = time.monotonic() + self.period_s
        reported = None
        while True:
            await asyncio.sleep(min(self.tick_s, self.period_s))
            if self.lost is None:
                pos = await self.position_problem()
                if pos is not None:
                    self.lose(pos)
            if time.monotonic() < next_check and self.lost == reported:
                continue
            next_check = time.monotonic() + self.period_s
            problem = await self.problem()
            reported = self.lost
            if problem is None:
                self.clock.up()
                continue
            self.clock.down(problem)
            if self.clock.expired:
                self.on_fatal(DependencyOutage(self.clock.give_up_line()))
                return
