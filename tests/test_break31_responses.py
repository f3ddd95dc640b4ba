"""Hostile pass over the non-streaming Responses-with-logprobs block path (issue 25 item 1/2):
through the service (bytes in, bytes out), every parity model, generated outputs (markers of
each family anywhere / repeated / unclosed, stray and split-character ids, EOS mid-output,
added tokens), hostile logprobs (NaN / -inf / None values, duplicate / None / out-of-range
candidate ids, unsorted or absent ranks, too many or too few entries), every finish, int / str
``stop_reason``, tool choices, ``skip_special_tokens``, ``parallel_tool_calls`` /
``max_tool_calls``, ``top_logprobs`` 0..20, prompt ids absent: the block path's status and
bytes are the token-by-token path's (``_step_blocks`` returning None)."""
from __future__ import annotations

import json
import random

import msgspec
import pytest

from schemas.responses import LOGPROBS_INCLUDE, DerenderResponsesRequest
from tests.harness.parsers import family_runtime, pieces_ids
from tests.harness.responses import HOSTILE_PIECES, TOOLS
from tests.parity import service as parity_service
from worker.bench.parsers import build_ids
from worker.core.errors import BadRequest
from worker.core.responses import blocks
from worker.core.responses import derender as rd
from worker.core.responses.derender import derender_responses
from worker.parsers.examples import cases

TEXT = HOSTILE_PIECES + ["functools[", "<|channel|>"]
MODELS = ["qwen3", "qwen3-coder", "qwen3-noparser", "deepseek-v4", "deepseek-v31-markup", "mistral-7b-v0.3",
          "mistral-v7-mistral-mode", "llama3"]


def _val(rng: random.Random, bad: bool):
    """A logprob value: odd finite ones; with ``bad``, sometimes NaN / -inf / None (the decode's 400)."""
    if bad and rng.random() < 0.1:
        return rng.choice([float("-inf"), float("nan"), None])
    return rng.choice([-0.5, -1.25, -0.0, 0.0, -20000.0, -1e30, -9999.5, -3.0, 1.5e-7, -1e-320])


def _lp(rng: random.Random, ids: list[int], k: int, vocab: int) -> dict:
    """Engine logprobs of ``ids``, irregular (odd values, candidates not the sampled id,
    duplicated, shuffled, unranked, one short or long); one body in 5 also invalid (NaN, None,
    ids outside the vocabulary, entries not one a token)."""
    bad = rng.random() < 0.2
    n = len(ids)
    if bad and rng.random() < 0.2:
        n += rng.choice([-1, 1])
    out = []
    for j in range(max(n, 0)):
        t = ids[j] if j < len(ids) and rng.random() < 0.95 else rng.randrange(vocab)
        m = rng.choice([k, k, k, max(k - 1, 0), k + 1])
        tops = []
        for r in range(m):
            c = t if r == 0 and rng.random() < 0.8 else rng.choice(
                [rng.randrange(vocab), t, rng.randrange(vocab)] + ([vocab + 5, -1, None] if bad and rng.random() < 0.1 else []))
            top = {"token_id": c, "logprob": _val(rng, bad) if rng.random() < 0.2 else -r - rng.random()}
            if rng.random() < 0.9:
                top["rank"] = rng.choice([r + 1, r + 1, r + 1, m - r, None])
            tops.append(top)
        if rng.random() < 0.2:
            rng.shuffle(tops)
        e = {"token_id": t, "logprob": _val(rng, bad) if rng.random() < 0.2 else -rng.random()}
        if not bad or rng.random() < 0.9:
            e["top_logprobs"] = tops
        if rng.random() < 0.8:
            e["rank"] = 1
        out.append(e)
    return {"content": out}


def _ids(rng: random.Random, tok) -> list[int]:
    added = sorted(tok.added_token_ids) or sorted(getattr(tok, "special_ids", ()) or ()) or [0, 1, 2]
    ids = pieces_ids(rng, tok, TEXT, 30, added)
    if rng.random() < 0.25 and tok.eos_token_ids:
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(sorted(tok.eos_token_ids)))
    return ids


def _body(rng: random.Random, svc, model: str) -> bytes:
    tok = svc.runtime(model).tokenizer
    ids = _ids(rng, tok)
    k = rng.choice([0, 0, 1, 2, 5, 20])
    fin = rng.choice(["stop", "length", "abort", None])
    sr = rng.choice([None, None, "</s>", "END", ids[-1] if ids else None, rng.randrange(tok.vocab_size)])
    choice = {"index": 0, "token_ids": ids, "finish_reason": fin, "stop_reason": sr, "logprobs": _lp(rng, ids, k, tok.vocab_size)}
    req: dict = {"model": model, "input": "x", "include": [LOGPROBS_INCLUDE], "top_logprobs": k}
    if rng.random() < 0.7:
        req["tools"] = TOOLS
        tc = rng.choice([None, "auto", "none", "required", {"type": "function", "name": "get_weather"}])
        if tc is not None:
            req["tool_choice"] = tc
        if rng.random() < 0.2:
            req["parallel_tool_calls"] = False
        if rng.random() < 0.1:
            req["max_tool_calls"] = 1
    if rng.random() < 0.2:
        req["chat_template_kwargs"] = {"enable_thinking": False, "thinking": rng.random() < 0.5}
    if rng.random() < 0.2:
        req["skip_special_tokens"] = False
    prompt = tok.encode("hi there") + (sorted(tok.added_token_ids)[:1] if rng.random() < 0.3 else [])
    body = {"model": model, "generate_response": {"request_id": "r-1", "choices": [choice]}, "responses_request": req}
    if rng.random() < 0.8:
        body["prompt_token_ids"] = prompt
        body["prompt_tokens"] = len(prompt)
    return json.dumps(body, allow_nan=True).encode()


def _run(svc, raw: bytes) -> tuple[int, bytes]:
    r = svc.derender(raw)
    return r.status, bytes(r.body)


def _both_paths(monkeypatch, svc, raw: bytes, step_blocks) -> tuple:
    """``(block path, token path)`` replies of ``raw`` (``_run``): the second with
    ``_step_blocks`` patched to None, then put back."""
    got = _run(svc, raw)
    monkeypatch.setattr(rd, "_step_blocks", lambda *a: None)
    want = _run(svc, raw)
    monkeypatch.setattr(rd, "_step_blocks", step_blocks)
    return got, want


@pytest.mark.parametrize("model", MODELS)
def test_hostile_block_path_is_the_token_path(model, monkeypatch):
    """``_body`` bodies through the service: block path = token path (status, bytes), 200 or
    400 only (never a 500)."""
    svc = parity_service()
    rng = random.Random(model)
    step_blocks = rd._step_blocks
    oks = 0
    for i in range(110):
        raw = _body(rng, svc, model)
        got, want = _both_paths(monkeypatch, svc, raw, step_blocks)
        assert got[0] in (200, 400), got
        assert got == want, (i, raw)
        oks += got[0] == 200
    assert oks > 50


def _derender(rt, body: dict) -> bytes:
    """The Response's JSON, or the 400's message."""
    try:
        return msgspec.json.encode(derender_responses(rt, msgspec.convert(body, DerenderResponsesRequest), 0))
    except (BadRequest, msgspec.ValidationError) as e:
        return b"400 " + str(e).encode()


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_hostile_parser_families(case, monkeypatch):
    """Every parser example's family (Harmony included): its markup cut, repeated and spliced,
    marker ids anywhere, stray ids, EOS mid-output, hostile logprobs, every finish and
    ``stop_reason``, tool choices, incremental call arguments or not: block path = token path."""
    rng = random.Random(case.name + "!")
    step_blocks = rd._step_blocks
    for streaming in ("whole", "incremental") if case.tool_parser else ("whole",):
        rt = family_runtime(case, streaming)
        tok = rt.tokenizer
        base = build_ids(tok, case.example, 60)
        marks = [tok.token_to_id(m) for m in case.example.markers if tok.token_to_id(m) is not None]
        for _ in range(10):
            ids: list[int] = []
            for _ in range(rng.randrange(1, 5)):
                i = rng.randrange(len(base))
                ids += base[i:rng.randrange(i, len(base) + 1)]
            for _ in range(rng.choice([0, 1, 2, 4])):
                ids.insert(rng.randrange(len(ids) + 1), rng.choice(
                    marks + sorted(tok.eos_token_ids) + [rng.randrange(tok.vocab_size)] if marks else
                    sorted(tok.eos_token_ids) + [rng.randrange(tok.vocab_size)]))
            k = rng.choice([0, 1, 3, 20])
            choice = {"index": 0, "token_ids": ids, "finish_reason": rng.choice(["stop", "length", "abort", None]),
                      "stop_reason": rng.choice([None, None, "x", ids[-1] if ids else None, rng.choice(marks or [7])]),
                      "logprobs": _lp(rng, ids, k, tok.vocab_size)}
            req: dict = {"model": "m", "input": "x", "include": [LOGPROBS_INCLUDE], "top_logprobs": k}
            if case.tools:
                req["tools"] = TOOLS
                tc = rng.choice([None, "none", "required", {"type": "function", "name": "get_weather"}])
                if tc is not None:
                    req["tool_choice"] = tc
            if case.example.kwargs and rng.random() < 0.7:
                req["chat_template_kwargs"] = case.example.kwargs
            if rng.random() < 0.2:
                req["skip_special_tokens"] = False
            prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") if rng.random() < 0.7 else None
            body = {"model": "m", "generate_response": {"request_id": "r-1", "choices": [choice]},
                    "responses_request": req, **({"prompt_token_ids": prompt} if prompt is not None else {})}
            try:
                body = msgspec.json.decode(msgspec.json.encode(body))
            except (msgspec.EncodeError, ValueError):
                continue
            got = _derender(rt, body)
            monkeypatch.setattr(rd, "_step_blocks", lambda *a: None)
            want = _derender(rt, body)
            monkeypatch.setattr(rd, "_step_blocks", step_blocks)
            assert got == want, body


_W = ["😀", "🌤️", " 東京", "天气", " ñ", "é", " a", "\n", "%", "  ", "\u00a0", "ß"]


def _edge(rng: random.Random, svc, model: str) -> bytes:
    """A ``_body`` with one edge: the prompt ending inside a character whose rest opens the
    output, the output ending in EOS / an int ``stop_reason`` id (its entry: the final part's),
    or a request's logprob fields odd (``include`` or ``top_logprobs`` absent, out of range,
    repeated, no ``responses_request``)."""
    tok = svc.runtime(model).tokenizer
    body = json.loads(_body(rng, svc, model))
    ch = body["generate_response"]["choices"][0]
    k = body["responses_request"]["top_logprobs"]
    v = rng.randrange(3)
    if v == 0:
        p = tok.encode("".join(rng.choice(_W) for _ in range(rng.randrange(1, 6))))
        cut = rng.randrange(len(p) + 1)
        body["prompt_token_ids"], rest = p[:cut], p[cut:]
        body.pop("prompt_tokens", None)
        ch["token_ids"] = rest + ch["token_ids"]
        ch["logprobs"]["content"] = [{"token_id": t, "logprob": -0.5, "top_logprobs": [
            {"token_id": t, "logprob": -0.5, "rank": 1}][:k]} for t in rest] + ch["logprobs"]["content"]
        if rng.random() < 0.3:
            body["generate_response"]["prompt_token_ids"] = body.pop("prompt_token_ids")
    elif v == 1:
        eos = sorted(tok.eos_token_ids) or [0]
        t = rng.choice(eos + [rng.randrange(tok.vocab_size)])
        add = rng.choice([[t], [t, rng.choice(eos)]])
        ch["token_ids"] += add
        ch["logprobs"]["content"] += [{"token_id": x, "logprob": -0.25, "top_logprobs": [
            {"token_id": x, "logprob": -0.25, "rank": 1}] * min(k, 1)} for x in add]
        ch["finish_reason"] = rng.choice(["stop", "stop", "length", "abort"])
        ch["stop_reason"] = rng.choice([None, t, add[-1], "s"])
    else:
        req = body["responses_request"]
        f = rng.randrange(6)
        if f == 0:
            req.pop("include")
        elif f == 1:
            req.pop("top_logprobs")
        elif f == 2:
            req["include"] = ["reasoning.encrypted_content", LOGPROBS_INCLUDE, LOGPROBS_INCLUDE]
        elif f == 3:
            req["top_logprobs"] = rng.choice([-1, 21, None])
        elif f == 4:
            req["include"] = None
        else:
            body["responses_request"] = None
    return json.dumps(body).encode()


@pytest.mark.parametrize("model", MODELS)
def test_hostile_edges_block_path_is_the_token_path(model, monkeypatch):
    """``_edge`` bodies: block path = token path (status, bytes); and, every 4th, a fallback
    after the block texts were taken (``blocks.plan`` refusing) = token path."""
    svc = parity_service()
    rng = random.Random(model + "edge")
    step_blocks, plan = rd._step_blocks, blocks.plan
    oks = 0

    def refuse(*a, **kw):
        raise blocks.Fallback

    for i in range(80):
        raw = _edge(rng, svc, model)
        got, want = _both_paths(monkeypatch, svc, raw, step_blocks)
        assert got[0] in (200, 400), got
        assert got == want, (i, raw)
        if i % 4 == 0:  # a fallback after the block texts: the record as it was, token steps
            monkeypatch.setattr(blocks, "plan", refuse)
            assert _run(svc, raw) == want, (i, raw)
            monkeypatch.setattr(blocks, "plan", plan)
        oks += got[0] == 200
    assert oks > 25
