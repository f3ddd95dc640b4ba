"""Faults an operator meets, through the Kafka worker on a real broker (embedded Tansu unless
``KAFKA_BOOTSTRAP_SERVERS`` is set) and a real process pool: each fault stays with what it hit,
the worker never stops, and the valid records are answered.

Kinds: a derender pool process that dies while idle (OOM killer, ``kill -9``), found dead only
when the next batch is submitted; the same for the one-process quarantine pool."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.test_kafka_stream import make_stream
from tests.test_kafka_worker import (
    _collect,
    _committed_and_end,
    _h,
    _names,
    _produce,
    _settings,
    _tokenizer,
    chat_body,
)
from worker.core.service import DerenderService
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_SEQ, HDR_STATUS
from worker.transport.run import ensure_topics

pytestmark = pytest.mark.kafka


async def _kill_pool_processes(executor) -> None:
    """SIGKILL every process of ``executor`` (a ``ProcessPoolExecutor``) and wait until the
    executor noticed (its management thread marks it broken)."""
    for pid in list(executor._processes):
        os.kill(pid, signal.SIGKILL)
    for _ in range(200):
        if executor._broken:
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the executor never noticed its dead process")


async def test_pool_process_dead_while_idle_is_replaced_and_no_record_pays(kafka_bootstrap, kafka_broker_kind,
                                                                           qwen3_models):
    """Kill the only pool process while nothing runs: the next record (and a stream chunk, and a
    record rerun in the quarantine pool whose process was killed too) is answered like any other,
    nothing dead-lettered, no stream ended, no worker exit (before: BrokenProcessPool escaped the
    fetch loop at the next submit and the worker exited 1 after the drain timeout)."""
    bs, n = kafka_bootstrap, _names()
    tok = _tokenizer(qwen3_models)
    model = qwen3_models[0].name
    await ensure_topics(bs, {n.inp: 1, n.reply: 1, n.dlq: 1})
    settings = _settings(bs, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply, dead_letter_topic=n.dlq,
                         group_id=n.group, executor="process", num_workers=1, drain_timeout_s=5.0)
    body = chat_body(tok, model, "a-0", "First answer")
    _, chunks = make_stream(tok, "s-0", 0)
    svc = DerenderService(qwen3_models)
    async with KafkaDerenderWorker(settings, qwen3_models) as worker:
        await worker.wait_assigned()
        # the quarantine pool: started by a rerun, then its process dies while idle
        first = await worker.pool.quarantine(body, None, "test")
        assert first.status == 200 and first.crash is None
        await _kill_pool_processes(worker.pool._qpool)
        again = await worker.pool.quarantine(body, None, "test")
        assert again.status == 200 and again.crash is None, again
        # the main pool's process dies while idle; then a record, a stream chunk, another record
        await _kill_pool_processes(worker.pool.executor)
        records = [(b"a-0", body, []), (b"s-0", chunks[0], [(HDR_SEQ, b"0")]),
                   (b"a-1", chat_body(tok, model, "a-1", "Second answer"), [])]
        await _produce(bs, n.inp, records)
        got = await _collect(bs, [n.reply, n.dlq], len(records), timeout=60, settle=0.3)
        assert worker._fatal is None and not worker._stopping.is_set()
    assert got[n.dlq] == [], [(r.key, _h(r)) for r in got[n.dlq]]
    replies = {r.key: r for r in got[n.reply]}
    assert set(replies) == {b"a-0", b"s-0", b"a-1"}
    assert all(_h(r)[HDR_STATUS] == b"200" for r in replies.values()), [r.value[:200] for r in replies.values()]
    assert replies[b"a-0"].value == svc.derender(body).body
    assert b"derender-stream-end" not in dict(replies[b"s-0"].headers)  # the stream was not ended by the fault
    committed, end = await _committed_and_end(bs, n.group, n.inp, 1)
    assert committed == end == {0: len(records)}
