"""Errors the Kafka transport builds itself (issue 26 item 5), with a real Kafka-protocol broker
and a real Redis: for a Messages stream they are Anthropic's error object
(``worker.core.service.error_body_for``, validated with anthropic-sdk-python's ``ErrorResponse``)
with ``derender-status``, ``derender-stream-end: 1`` and ``derender-kind: messages-stream``: the
413 of a terminal reply over ``--max-request-size`` (ending the stream; a duplicate gets the
identical 413, a later chunk the ended-stream 409, on this owner and on a new one that reads
the tombstone), the 409 of a gap and of an unknown stream (told by header and by shape alone);
a non-streaming Messages record's 413 (``derender-kind: messages``, no stream end);
a chat stream's transport 409 stays OpenAI's object without a kind header."""
from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import defaultdict

import pytest

from tests.harness.kafka import REDIS_URL, make_stream
from tests.harness.kafka import collect as _collect
from tests.harness.kafka import committed_and_end as _committed_and_end
from tests.harness.kafka import headers as _h
from tests.harness.kafka import names as _names
from tests.harness.kafka import produce as _produce
from tests.harness.kafka import settings as _settings
from tests.harness.kafka import tokenizer as _tokenizer
from tests.harness.messages import BY_ID, MODELS
from tests.parity_tools import messages_to_requests as m2r
from worker.config import load_config_file
from worker.core.errors import error_body
from worker.core.service import error_body_for, record_api
from worker.state import RedisSettings
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.topics import ensure_topics

anthropic_types = pytest.importorskip("anthropic.types")

SEQ, END, STATUS, KIND = "derender-seq", "derender-stream-end", "derender-status", "derender-kind"
LIMIT = 8192


def _anthropic(rec, status: int, typ: str) -> str:
    """The Anthropic error message of reply ``rec`` (status, stream end, kind, SDK type checked)."""
    h = _h(rec)
    assert (h[STATUS], h[END], h[KIND]) == (str(status).encode(), b"1", b"messages-stream"), h
    obj = json.loads(rec.value)
    anthropic_types.ErrorResponse.model_validate(obj)
    assert set(obj) == {"type", "error"} and obj["type"] == "error" and obj["error"]["type"] == typ, obj
    return obj["error"]["message"]


def test_error_body_for_keeps_openai_bytes():
    """Every API but Messages gets exactly the OpenAI object's bytes; Messages Anthropic's."""
    for api in (None, "chat", "completion", "responses"):
        for status in (400, 409, 413, 500):
            assert error_body_for(api, "why", status, "rid-1") == error_body("why", status, "rid-1")
    assert json.loads(error_body_for("messages", "why", 413, "rid-1")) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "why"}}
    for status in (400, 404, 409, 413, 500):  # every status the worker answers: the SDK's type
        anthropic_types.ErrorResponse.model_validate_json(error_body_for("messages", "why", status))
    assert record_api("messages-stream") == record_api(None, b"", b"\xc1MSG2...") == "messages"
    assert record_api(None, b'{"model": "m", "generate_chunk": {}, "messages_request": {}}') == "messages"
    assert record_api(None, b'{"model": "m", "generate_chunk": {}, "messages_request": null}') is None
    assert record_api("chat-stream", b'{"messages_request": {}}') == "chat"  # (the kind wins)


def test_batch_ended_messages_stream_answers_anthropic_409():
    """``derender-worker batch``: a later chunk of a Messages stream an error ended gets the
    ended-stream 409 as Anthropic's object (a chat stream's stays OpenAI's)."""
    from worker.core.service import DerenderService
    from worker.offline.streams import StreamLines

    lines = StreamLines(DerenderService(load_config_file(str(MODELS))))
    bodies = m2r.stream_bodies(BY_ID["qwen3-plain"])
    bad = json.loads(json.dumps(bodies[1]))
    bad["generate_chunk"]["choices"].append(dict(bad["generate_chunk"]["choices"][0], index=1))
    outs = [lines.route(json.dumps(b).encode()) for b in (bodies[0], bad, bodies[2])]
    assert [s for _, s in outs] == [200, 400, 409]
    for body, _ in outs[1:]:
        obj = json.loads(body)
        anthropic_types.ErrorResponse.model_validate(obj)
        assert obj["error"]["type"] == "invalid_request_error"
    assert "already ended" in json.loads(outs[2][0])["error"]["message"]


@pytest.mark.kafka
@pytest.mark.redis
def test_messages_stream_transport_errors(kafka_bootstrap, kafka_broker_kind, redis_prefix):  # noqa: F811
    models = load_config_file(str(MODELS))
    tok = _tokenizer(models)
    n = _names()
    u = uuid.uuid4().hex[:6]
    case = BY_ID["qwen3-plain"]
    word = tok.encode(" word", add_special_tokens=False).ids

    def bodies(rid: str, big: bool = False) -> list[bytes]:
        out = []
        for b in m2r.stream_bodies(case):
            b["generate_chunk"]["request_id"] = rid
            out.append(b)
        if big:  # the terminal chunk carries ~12 KB of " word" (and the end): its reply is over LIMIT
            last = out[-1]["generate_chunk"]["choices"][0]
            last["token_ids"] = word * 2500 + last["token_ids"]
        return [json.dumps(b).encode() for b in out]

    big, gap, unk, cunk = f"big-{u}", f"gap-{u}", f"unk-{u}", f"chat-unk-{u}"
    bb, gb, ub = bodies(big, big=True), bodies(gap), bodies(unk)
    _, cb = make_stream(tok, cunk, 0)
    last = len(bb) - 1

    def rec(rid, body, seq, kind=None):
        return (rid.encode(), body, [(SEQ, str(seq).encode())] + ([(KIND, kind)] if kind else []))

    # big: by shape; gap: by header; unknown: by shape alone (its chunk 0 never comes)
    first = [rec(big, bb[k], k) for k in range(len(bb))] + [rec(big, bb[1], last + 1), rec(big, bb[last], last)]
    first += [rec(gap, gb[k], k, b"messages-stream") for k in (0, 1, 3)] + [rec(unk, ub[2], 2), rec(cunk, cb[2], 2)]
    one = m2r.nonstream_body(case)  # a non-streaming Messages record (by shape) whose Message is over LIMIT
    one["generate_response"]["request_id"] = f"one-{u}"
    one["generate_response"]["choices"][0]["token_ids"] = word * 2500 + one["generate_response"]["choices"][0]["token_ids"]
    first.append((f"one-{u}".encode(), json.dumps(one).encode(), []))
    redis = RedisSettings(url=REDIS_URL, prefix=redis_prefix, ttl_s=120)
    settings = _settings(kafka_bootstrap, kafka_broker_kind, input_topic=n.inp, reply_topic=n.reply,
                         dead_letter_topic=n.dlq, group_id=n.group, redis=redis, max_request_size=LIMIT,
                         dead_letter_max_bytes=4096, stream_gap_timeout_s=1.5)

    async def owner(records, want: int) -> dict:
        async with KafkaDerenderWorker(settings, models) as w:
            await w.wait_assigned(30)
            await _produce(kafka_bootstrap, n.inp, records)
            got = await _collect(kafka_bootstrap, [n.reply, n.dlq], want, timeout=90, settle=0.5)
            for _ in range(100):  # every offset committed before the next owner
                committed, end = await _committed_and_end(kafka_bootstrap, n.group, n.inp, 1)
                if committed == end:
                    break
                await asyncio.sleep(0.1)
        assert committed == end, (committed, end)
        return got

    async def go():
        await ensure_topics(kafka_bootstrap, {n.inp: 1, n.reply: 1, n.dlq: 1})
        got1 = await owner(first, len(bb) + 2 + 3 + 2 + 1 + 2)
        got2 = await owner([rec(big, bb[1], last + 2)], len(bb) + 2 + 3 + 2 + 1 + 2 + 1)  # a new owner
        return got1, got2

    got1, got2 = asyncio.run(go())
    by_key = defaultdict(list)
    for r in got1[n.reply]:
        by_key[r.key.decode()].append(r)
    assert len(got1[n.dlq]) == 2 and all(_h(d)["x-dlq-reason"].startswith(b"reply-too-large: ") for d in got1[n.dlq])

    b = by_key[big]
    assert [(int(_h(r)[SEQ]), _h(r)[STATUS]) for r in b] == \
        [(k, b"200") for k in range(last)] + [(last, b"413"), (last + 1, b"409"), (last, b"413")]
    msg = _anthropic(b[last], 413, "invalid_request_error")
    assert re.fullmatch(rf"reply of \d+ bytes exceeds the limit of {LIMIT} bytes \(--max-request-size\)", msg), msg
    assert b[-1].value == b[last].value and _h(b[-1])[END] == b"1"  # the duplicate: the identical 413
    ended = _anthropic(b[last + 1], 409, "invalid_request_error")
    assert ended == f"stream {big!r} already ended (last {SEQ} {last}); chunk {SEQ} {last + 1} ignored"
    late = [r for r in got2[n.reply] if r.key == big.encode() and int(_h(r)[SEQ]) == last + 2]
    assert len(late) == 1 and late[0].value == b[last + 1].value.replace(
        f"{SEQ} {last + 1} ignored".encode(), f"{SEQ} {last + 2} ignored".encode())
    _anthropic(late[0], 409, "invalid_request_error")

    g = by_key[gap]
    assert [(int(_h(r)[SEQ]), _h(r)[STATUS]) for r in g] == [(0, b"200"), (1, b"200"), (3, b"409")]
    assert "chunk(s) 2..2 missing" in _anthropic(g[2], 409, "invalid_request_error")
    (k,) = by_key[unk]
    assert _anthropic(k, 409, "invalid_request_error").startswith(f"unknown stream {unk!r}")

    (o,) = by_key[f"one-{u}"]  # non-streaming: the 413 is Anthropic's too (no stream end)
    h = _h(o)
    assert (h[STATUS], h[KIND], END in h) == (b"413", b"messages", False), h
    obj = json.loads(o.value)
    anthropic_types.ErrorResponse.model_validate(obj)
    assert obj["error"]["type"] == "invalid_request_error" and obj["error"]["message"].startswith("reply of ")

    (c,) = by_key[cunk]  # a chat stream's transport 409: OpenAI's object, no kind header (as always)
    assert _h(c)[STATUS] == b"409" and _h(c)[END] == b"1" and KIND not in _h(c)
    err = json.loads(c.value)
    assert err["request_id"] == cunk and err["error"]["type"] == "ConflictError" and err["error"]["code"] == 409
    assert c.value == error_body(err["error"]["message"], 409, cunk)
