"""Anthropic Messages derender through the Kafka worker (issue 26), with a real Kafka-protocol
broker and a real Redis: the public Messages cases as ``messages`` records (by header and by
shape) and as ``messages-stream`` chunk records (one reply per chunk, value = JSON array of
events), compared with compare_messages.py's rules; the same results as through
``derender-worker batch`` (tests/test_messages.py); an error reply is an Anthropic error object
with ``derender-status`` and, on a stream, ``derender-stream-end: 1``."""
from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict

import pytest

from tests.harness.kafka import REDIS_URL
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import headers as _h
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import settings as _settings
from tests.harness.messages import CASES, MODELS
from tests.parity_tools import compare_messages as cmp
from tests.parity_tools import messages_to_requests as m2r
from worker.config import load_config_file
from worker.state import RedisSettings
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.topics import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

SEQ, END, STATUS, KIND = "derender-seq", "derender-stream-end", "derender-status", "derender-kind"


def test_messages_through_kafka_worker(kafka_bootstrap, kafka_broker_kind, redis_prefix):  # noqa: F811
    models = load_config_file(str(MODELS))
    n = _names()
    u = uuid.uuid4().hex[:6]
    unary, stream = [], []
    for i, case in enumerate(CASES):
        body = m2r.nonstream_body(case)
        rid = f"{case['id']}-{u}"
        body["generate_response"]["request_id"] = rid
        hdrs = [(KIND, b"messages")] if i % 2 else []  # half by header, half by shape
        unary.append((rid.encode(), json.dumps(body).encode(), hdrs))
        for k, b in enumerate(m2r.stream_bodies(case)):
            b["generate_chunk"]["request_id"] = f"s-{rid}"
            h = [(SEQ, str(k).encode())] + ([(KIND, b"messages-stream")] if i % 2 else [])
            stream.append((f"s-{rid}".encode(), json.dumps(b).encode(), h))
    ok = next(c for c in CASES if c["id"] == "qwen3-plain")
    bad = m2r.stream_bodies(ok)[0]  # two choices: 400, ends the stream
    bad["generate_chunk"]["request_id"] = f"bad-{u}"
    bad["generate_chunk"]["choices"].append(dict(bad["generate_chunk"]["choices"][0], index=1))
    extra = [(f"bad-{u}".encode(), json.dumps(bad).encode(), [(SEQ, b"0")])]
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis)
    total = len(unary) + len(stream) + len(extra)

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 4, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, unary + stream + extra)
            return await _collect(kafka_bootstrap, [n.reply, n.dlq], total, timeout=180, settle=0.5)

    got = asyncio.run(go())
    assert not got[n.dlq]
    by_key = defaultdict(list)
    for r in got[n.reply]:
        by_key[r.key.decode()].append(r)
    assert len(got[n.reply]) == total
    passed = {False: 0, True: 0}
    for case in CASES:
        rid = f"{case['id']}-{u}"
        (rec,) = by_key[rid]
        assert _h(rec)[KIND] == b"messages"
        why = cmp.compare_nonstream(case, json.loads(rec.value))
        assert why is None, (case["id"], why)
        passed[False] += 1
        recs = sorted(by_key[f"s-{rid}"], key=lambda r: int(_h(r)[SEQ]))
        assert [int(_h(r)[SEQ]) for r in recs] == list(range(len(m2r.chunk_sizes(case))))
        assert [END in _h(r) for r in recs] == [False] * (len(recs) - 1) + [True]
        why = cmp.compare_stream(case, [json.loads(r.value) for r in recs])
        assert why is None, (case["id"], why)
        passed[True] += 1
    assert passed == {False: 42, True: 42}
    (b,) = by_key[f"bad-{u}"]
    err = json.loads(b.value)
    assert _h(b)[STATUS] == b"400" and _h(b)[END] == b"1"
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "exactly one" in err["error"]["message"]
