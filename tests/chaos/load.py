"""The mixed load of the ``redis-stall-*`` and ``rolling-*`` scenarios: live streams and
non-streaming records at a steady rate, published from one producer."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from tests.chaos.harness import CORR, CREATED_S, SEQ


async def mixed_load(bs: str, topic: str, streams: list, singles: list, *, live: int, seconds: float,
                     singles_per_s: float, chunk_every_s: float, marks: dict[str, Any],
                     stop: threading.Event | None = None) -> None:
    """Publish for ``seconds`` (or until ``stop`` is set): ``singles_per_s`` non-streaming records
    per second (from ``singles``, in order) and, for ``live`` stream slots, one chunk every
    ``chunk_every_s`` seconds; a slot whose stream ended takes the next of ``streams``. Fills
    ``marks``: ``t0`` (monotonic start), ``t0_wall`` (``time.time()`` then), ``sent_singles``,
    ``chunks`` (stream id -> chunks published), ``sent_at`` ((id, seq or None) -> ``time.time()``
    when it was handed to the producer)."""
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=False, linger_ms=5)
    await p.start()
    try:
        tick = 0.1
        slots = [[st, 0, i * chunk_every_s / live] for i, st in enumerate(streams[:live])]  # stream, next seq, due
        nxt = live
        sent_singles = 0
        sent_chunks: dict[str, int] = marks.setdefault("chunks", {})  # stream id -> chunks published
        sent_at: dict[tuple[str, int | None], float] = marks.setdefault("sent_at", {})
        t0 = marks["t0"] = time.monotonic()
        marks["t0_wall"] = time.time()
        while (now := time.monotonic() - t0) < seconds and not (stop is not None and stop.is_set()):
            want = min(len(singles), int(now * singles_per_s) + 1)
            for s in singles[sent_singles:want]:
                await p.send(topic, s.value, key=s.id.encode(), headers=[(CORR, s.id.encode())],
                             timestamp_ms=CREATED_S * 1000)
                sent_at[(s.id, None)] = time.time()
            sent_singles = want
            for slot in slots:
                st, seq, due = slot
                if st is None or due > now:
                    continue
                await p.send(topic, st.chunks[seq], key=st.id.encode(), headers=[(SEQ, str(seq).encode())],
                             timestamp_ms=CREATED_S * 1000)
                sent_at[(st.id, seq)] = time.time()
                slot[1], slot[2] = seq + 1, due + chunk_every_s
                sent_chunks[st.id] = seq + 1
                if seq + 1 >= len(st.chunks):
                    slot[0], slot[1] = (streams[nxt], 0) if nxt < len(streams) else (None, 0)
                    nxt += 1
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - t0 - now)))
        await p.flush()
        marks["sent_singles"] = sent_singles
    finally:
        await p.stop()
