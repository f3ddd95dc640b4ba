"""``created`` of responses and stream chunks: the engine's value when the body has one, else the
caller's (the Kafka worker passes the input record's timestamp), else 0 (batch, deterministic);
every chunk of a stream carries its first chunk's value, as OpenAI streams do."""
from __future__ import annotations

import json
from pathlib import Path

from tests.parity import service

EXAMPLES = Path(__file__).resolve().parents[1] / "worker" / "demo_data" / "examples.jsonl"


def _example(kind: str) -> dict:
    for line in EXAMPLES.read_text().splitlines():
        ex = json.loads(line)
        if ex["kind"] == kind:
            return ex["body"]
    raise LookupError(kind)


def _derender(body: dict, created=None) -> dict:
    res = service().derender(json.dumps(body).encode(), created=created)
    assert not res.is_error, res.body
    return json.loads(res.body)


def test_chat_created_engine_value_else_caller_else_zero():
    body = _example("chat")
    assert "created" not in body["generate_response"]
    assert _derender(body)["created"] == 0
    assert _derender(body, created=1_700_000_123)["created"] == 1_700_000_123
    body["generate_response"]["created"] = 1_600_000_000
    assert _derender(body, created=1_700_000_123)["created"] == 1_600_000_000


def test_completion_created_engine_value_else_caller():
    body = _example("completion")
    assert _derender(body, created=42)["created"] == 42
    body["generate_responses"][0]["created"] = 7
    assert _derender(body, created=42)["created"] == 7


def test_same_created_gives_byte_identical_replies():
    raw = json.dumps(_example("chat")).encode()
    a = service().derender(raw, created=1_700_000_000).body
    b = service().derender(raw, created=1_700_000_000).body
    assert a == b


def _chunk(ids, finish=None, **extra) -> bytes:
    b = {"model": "qwen3", "stream": True,
         "generate_chunk": {"request_id": "cr", "choices": [{"index": 0, "token_ids": ids, "finish_reason": finish}]}}
    b.update(extra)
    return json.dumps(b).encode()


def test_every_stream_chunk_carries_the_first_chunks_created():
    svc = service()
    first = _chunk([151668, 9707], chat_request={"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]},
                   prompt_token_ids=[151644, 872, 198])
    res, st = svc.derender_stream(first, None, created=1_700_000_001)
    chunks = json.loads(res.body)
    res, st = svc.derender_stream(_chunk([11, 1879]), st, created=1_700_000_999)  # a later record's time
    chunks += json.loads(res.body)
    res, st = svc.derender_stream(_chunk([151645], "stop"), st, created=5)
    chunks += json.loads(res.body)
    assert res.done and len(chunks) >= 3
    assert {c["created"] for c in chunks} == {1_700_000_001}


def test_stream_created_defaults_to_zero_and_completion_streams_too():
    svc = service()
    res, st = svc.derender_stream(_chunk([9707], "stop", chat_request={"model": "qwen3", "messages": []},
                                         prompt_token_ids=[151644, 872, 198]), None)
    assert not res.is_error, res.body
    assert {c["created"] for c in json.loads(res.body)} == {0}
    comp = _chunk([9707], completion_request={"model": "qwen3", "prompt": "hi"}, prompt_token_ids=[6023])
    res, st = svc.derender_stream(comp, None, created=99)
    assert not res.is_error, res.body
    res2, _ = svc.derender_stream(_chunk([13], "stop"), st, created=100)
    assert {c["created"] for c in json.loads(res.body) + json.loads(res2.body)} == {99}
