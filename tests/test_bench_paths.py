"""``bench core``'s paths pass (issue 25 item 5): every API path's benchmark body carries the same
ids as the chat body it comes from, derenders to the same reasoning / call / logprob count, and
its I/O floor reads and writes the path's own types."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.bench import floor

TOKDIR = Path(__file__).parent / "data" / "tokenizers"


@pytest.fixture(scope="module")
def svc():
    return floor.make_service(str(TOKDIR / "qwen3"))


def _chat(svc, k):
    return floor.build_bodies(svc.runtime("qwen3").tokenizer, "qwen3", 64, 1, top_logprobs=k)[0][0]


@pytest.mark.parametrize("k", [None, 3])
def test_every_path_body_derenders_the_same_ids(svc, k):
    chat = _chat(svc, k)
    ids = json.loads(chat)["generate_response"]["choices"][0]["token_ids"]
    want = json.loads(svc.derender(chat, "chat").body)["choices"][0]["message"]
    call = want["tool_calls"][0]["function"]
    for api in ("completion", "responses", "messages"):
        body = json.loads(floor.path_body(chat, api))
        gr = body["generate_responses"][0] if api == "completion" else body["generate_response"]
        assert gr["choices"][0]["token_ids"] == ids
        res = svc.derender(floor.path_body(chat, api), floor.PATH_TYPES[api][0])
        assert res.status == 200, res.body[:300]
        out = json.loads(res.body)
        if api == "completion":
            c = out["choices"][0]
            assert "<tool_call>" in c["text"]
            assert (c["logprobs"] is not None) == (k is not None)
            if k is not None:
                assert len(c["logprobs"]["top_logprobs"][0]) == k
        elif api == "responses":
            items = {it["type"]: it for it in out["output"]}
            assert items["reasoning"]["content"][0]["text"] == want["reasoning"]
            assert (items["function_call"]["name"], items["function_call"]["arguments"]) == \
                (call["name"], call["arguments"])
            part = items["message"]["content"][0]
            assert (part["logprobs"] is not None) == (k is not None)
            if k is not None:
                assert len(part["logprobs"][0]["top_logprobs"]) == k
        else:
            blocks = {b["type"]: b for b in out["content"]}
            assert blocks["thinking"]["thinking"] == want["reasoning"]
            assert blocks["tool_use"]["input"] == json.loads(call["arguments"])


def test_io_floor_of_each_path_round_trips_its_reply(svc):
    chat = _chat(svc, 3)
    for api in floor.PATH_TYPES:
        body = floor.path_body(chat, api)
        dec, enc = floor.io_floor_of(svc, api, [body], 1e-6, 1)
        assert dec > 0 and enc > 0
    with pytest.raises(KeyError):
        floor.path_body(chat, "embeddings")
