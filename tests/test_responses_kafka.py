"""Responses API derender through the Kafka worker (issue 14), with a real Kafka-protocol broker
and a real Redis: the public Responses cases as ``responses`` records (by header and by shape)
and as ``responses-stream`` chunk records (one reply per chunk, value = JSON array of events),
compared with compare_responses.py's rules; the same results as through ``derender-worker
batch`` (tests/test_responses.py); an error reply carries ``derender-status`` and, on a stream,
``derender-stream-end: 1``."""
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
from tests.harness.responses import CASES, MODELS
from tests.parity_tools import compare_responses as cmp
from tests.parity_tools import responses_to_requests as r2r
from worker.config import load_config_file
from worker.state import RedisSettings
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.topics import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

SEQ, END, STATUS, KIND = "derender-seq", "derender-stream-end", "derender-status", "derender-kind"


def test_responses_through_kafka_worker(kafka_bootstrap, kafka_broker_kind, redis_prefix):  # noqa: F811
    models = load_config_file(str(MODELS))
    n = _names()
    u = uuid.uuid4().hex[:6]
    unary, stream = [], []
    for i, case in enumerate(CASES):
        body = r2r.nonstream_body(case)
        rid = f"{case['id']}-{u}"
        body["generate_response"]["request_id"] = rid
        hdrs = [(KIND, b"responses")] if i % 2 else []  # half by header, half by shape
        unary.append((rid.encode(), json.dumps(body).encode(), hdrs))
        for k, b in enumerate(r2r.stream_bodies(case)):
            b["generate_chunk"]["request_id"] = f"s-{rid}"
            h = [(SEQ, str(k).encode())] + ([(KIND, b"responses-stream")] if i % 2 else [])
            stream.append((f"s-{rid}".encode(), json.dumps(b).encode(), h))
    # errors: a stream chunk with two choices (400, ends the stream); previous_response_id (400)
    bad = r2r.stream_bodies(CASES[0])[0]
    bad["generate_chunk"]["request_id"] = f"bad-{u}"
    bad["generate_chunk"]["choices"].append(dict(bad["generate_chunk"]["choices"][0], index=1))
    prev = r2r.nonstream_body(CASES[0])
    prev["responses_request"]["previous_response_id"] = "resp_x"
    prev["generate_response"]["request_id"] = f"prev-{u}"
    extra = [(f"bad-{u}".encode(), json.dumps(bad).encode(), [(SEQ, b"0")]),
             (f"prev-{u}".encode(), json.dumps(prev).encode(), [])]
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis)
    total = len(unary) + len(stream) + len(extra)

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 4, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, unary + stream + extra)
            got = await _collect(kafka_bootstrap, [n.reply, n.dlq], total, timeout=120, settle=0.5)
        return got

    got = asyncio.run(go())
    assert not got[n.dlq]
    by_key = defaultdict(list)
    for r in got[n.reply]:
        by_key[r.key.decode()].append(r)
    assert len(got[n.reply]) == total
    for case in CASES:
        rid = f"{case['id']}-{u}"
        (rec,) = by_key[rid]
        assert _h(rec)[STATUS] == b"200" and _h(rec)[KIND] == b"responses"
        why = cmp.compare_nonstream(case, json.loads(rec.value))
        assert why is None, (case["id"], why)
        recs = sorted(by_key[f"s-{rid}"], key=lambda r: int(_h(r)[SEQ]))
        assert [int(_h(r)[SEQ]) for r in recs] == list(range(len(r2r.chunk_sizes(case))))
        assert all(_h(r)[STATUS] == b"200" for r in recs)
        assert [END in _h(r) for r in recs] == [False] * (len(recs) - 1) + [True]
        why = cmp.compare_stream(case, [json.loads(r.value) for r in recs])
        assert why is None, (case["id"], why)
    (b,) = by_key[f"bad-{u}"]
    assert _h(b)[STATUS] == b"400" and _h(b)[END] == b"1" and "exactly one" in json.loads(b.value)["error"]["message"]
    (p,) = by_key[f"prev-{u}"]
    assert _h(p)[STATUS] == b"400" and json.loads(p.value)["error"]["param"].endswith("previous_response_id")


def _top20(case: dict) -> list[dict]:
    """The case's stream bodies asking for top_logprobs 20 (engine entries with 20 candidates)."""
    bodies = r2r.stream_bodies(case)
    for b in bodies:
        b["responses_request"]["top_logprobs"] = 20
        for ch in b["generate_chunk"]["choices"]:
            for e in (ch["logprobs"] or {}).get("content", []):
                e["top_logprobs"] = [{"token_id": e["token_id"], "logprob": e["logprob"]}] + [
                    {"token_id": 1000 + j, "logprob": -5.0 - j, "rank": j + 1} for j in range(19)]
    return bodies


def test_terminal_reply_over_the_size_limit(kafka_bootstrap, kafka_broker_kind, redis_prefix):  # noqa: F811
    """A terminal chunk repeats the whole response (with logprobs: the per-token list four times:
    output_text.done, content_part.done, output_item.done, the terminal response). When that
    reply exceeds the producer's --max-request-size (issue 17 rule 2): the chunk is answered with
    a small 413 error reply that ends the stream (``derender-stream-end: 1``), the full record is
    dead-lettered (reason ``reply-too-large``), and the earlier replies stand."""
    models = load_config_file(str(MODELS))
    n = _names()
    case = next(c for c in CASES if c["id"] == "qwen3-logprobs")
    bodies = _top20(case)
    rid = f"big-{uuid.uuid4().hex[:6]}"
    recs = []
    for k, b in enumerate(bodies):
        b["generate_chunk"]["request_id"] = rid
        recs.append((rid.encode(), json.dumps(b).encode(), [(SEQ, str(k).encode())]))
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis,
                         max_request_size=65536, dead_letter_max_bytes=16384)

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        async with KafkaDerenderWorker(settings, models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, recs)
            return await _collect(kafka_bootstrap, [n.reply, n.dlq], len(recs), timeout=60, settle=1.0)

    got = asyncio.run(go())
    replies, dlq = got[n.reply], got[n.dlq]
    assert len(replies) == len(recs) and len(dlq) == 1
    replies.sort(key=lambda r: int(_h(r)[SEQ]))
    assert [int(_h(r)[SEQ]) for r in replies] == list(range(len(recs)))
    assert all(_h(r)[STATUS] == b"200" and END not in _h(r) for r in replies[:-1])
    last = _h(replies[-1])
    assert last[STATUS] == b"413" and last[END] == b"1"
    err = json.loads(replies[-1].value)["error"]
    assert err["message"].startswith("reply of ") and "(--max-request-size)" in err["message"]
    h = _h(dlq[0])
    assert h["x-dlq-reason"].startswith(b"reply-too-large: reply of ")
    assert h[SEQ] == str(len(recs) - 1).encode() and dlq[0].value == recs[-1][1]
