"""Streaming core: validation (OpenAI error objects), bodies vLLM refuses that we accept, state
round-trip and bounded size, stale sequence numbers."""
from __future__ import annotations

import json

from tests.parity import corpus, service
from tests.parity_tools import to_requests
from worker.core import stream as core_stream


def _case(cid: str) -> dict:
    return next(c for c in corpus() if c["id"] == cid)


def _chunk(rid="r", ids=(9707,), finish=None, **extra) -> dict:
    b = {"model": "qwen3", "stream": True,
         "generate_chunk": {"request_id": rid, "choices": [{"index": 0, "token_ids": list(ids),
                                                             "finish_reason": finish}]}}
    b.update(extra)
    return b


def _call(body: dict, state: bytes | None = None, **kw):
    res, st = service().derender_stream(json.dumps(body).encode(), state, **kw)
    return res, json.loads(res.body), st


REQ = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}


def test_refused_by_vllm_but_accepted():
    for cid in ("qwen3-err-stream-no-prompt-ids-v0", "qwen3-err-stream-two-choices-v0"):
        case = _case(cid)
        state = None
        views = []
        for b in to_requests.stream_bodies(case):
            res, out, state = _call(b, state)
            assert not res.is_error, out
            views.extend(out)
        if "two-choices" in cid:  # the patch sends choices 0 and 1 in every body, never finished
            assert {ck["choices"][0]["index"] for ck in views if ck["choices"]} == {0, 1}
        else:
            assert any(ck["choices"] and ck["choices"][0].get("finish_reason") for ck in views)
            assert views[-1]["usage"]["completion_tokens"] > 0


def test_two_choices_in_one_chunk_keep_separate_state():
    b = _chunk(chat_request={**REQ, "n": 2}, prompt_token_ids=[151644, 872, 198])
    b["generate_chunk"]["choices"] = [{"index": 0, "token_ids": [151668, 9707]},
                                      {"index": 1, "token_ids": [151668, 21927]}]
    res, out, st = _call(b)
    assert not res.is_error
    b2 = _chunk(ids=[151645], finish="stop")
    b2["generate_chunk"]["choices"].append({"index": 1, "token_ids": [151645], "finish_reason": "stop"})
    res, out, st = _call(b2, st)
    assert res.done
    assert out[-1]["usage"]["completion_tokens"] == 6 and out[-1]["choices"] == []


def test_errors_are_openai_objects():
    cases = [
        _chunk(ids=[10 ** 9], chat_request=REQ),                              # out of vocab
        _chunk(),                                                             # parser server, no chat_request
        _chunk(chat_request=REQ, stream=False),
        _chunk(chat_request=REQ, prompt_token_ids=[1, 2], prompt_tokens=3),
    ]
    dup = _chunk(chat_request=REQ)
    dup["generate_chunk"]["choices"].append({"index": 0, "token_ids": [1]})
    cases.append(dup)
    lp = _chunk(chat_request=REQ)
    lp["generate_chunk"]["choices"][0]["logprobs"] = {"content": []}
    cases.append(lp)
    for b in cases:
        res, out, st = _call(b)
        assert res.status == 400 and out["error"]["code"] == 400 and st is None, out
    res, st = service().derender_stream(b"{not json", None)
    assert res.status == 400 and st is None
    res, out, st = _call({**_chunk(chat_request=REQ), "model": "nope"})
    assert res.status == 404


def test_chunk_after_finish_and_stale_seq():
    res, out, st = _call(_chunk(chat_request=REQ, prompt_token_ids=[151644, 77091, 198]), seq=10)
    assert not res.is_error and res.seq == 10
    res, out, st2 = _call(_chunk(ids=[151645], finish="stop"), st, seq=11)
    assert res.done
    res, out, st3 = _call(_chunk(ids=[9707]), st2, seq=12)
    assert res.status == 400 and st3 is None
    res, out, st3 = _call(_chunk(ids=[9707]), st, seq=10)
    assert res.status == 409 and st3 is None


def test_state_bounded_and_roundtrip():
    rt = service().runtime("qwen3")
    tok = rt.tokenizer
    ids = tok.encode("<think>\n" + "reasoning goes on and on. " * 400 + "\n</think>\n\nAnswer " * 3)
    state = None
    sizes = []
    first = True
    for t in ids:
        b = _chunk(ids=[t])
        if first:
            b.update(chat_request=REQ, prompt_token_ids=[151644, 77091, 198])
            first = False
        res, out, state = _call(b, state)
        assert not res.is_error, out
        sizes.append(len(state))
        st = core_stream.decode_state(rt, state)
        assert core_stream.encode_state(st) == state
    assert max(sizes) < 2000, max(sizes)
    assert max(sizes[-200:]) <= max(sizes[:200]) + 64


def test_completion_echo_and_offsets():
    res, st = service().derender_stream(json.dumps({
        "model": "qwen3-noparser", "stream": True, "prompt_token_ids": [9707, 1879],
        "completion_request": {"model": "qwen3-noparser", "prompt": "Hello world", "echo": True, "logprobs": 0},
        "generate_chunk": {"request_id": "c", "choices": [{"index": 0, "token_ids": [0], "logprobs": {
            "content": [{"token_id": 0, "logprob": -1.0}]}}]}}).encode(), None)
    assert not res.is_error, res.body
    out = json.loads(res.body)
    ch = out[0]["choices"][0]
    assert ch["text"].startswith("Hello world")
    assert ch["logprobs"]["text_offset"] == [len("Hello world")]
