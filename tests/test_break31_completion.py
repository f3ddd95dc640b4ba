"""Hostile comparison of the completion logprobs block built as JSON
(``worker.core.logprob_completion.completion_logprobs_json``, the service's non-streaming path)
with the encoded ``CompletionLogprobs`` Struct (``derender_completion`` without
``json_logprobs``), through the service's bytes-in bytes-out entry: sampled ids and candidates
drawn from added tokens, byte pieces (U+FFFD repair), ids of equal texts, ids whose text is
``""``, texts with ``%`` / quotes / backslashes, random ids and (rarely) ids out of the
vocabulary or None; candidate lists empty, short, long (over ``max_logprobs`` too), the sampled
id first, absent or anywhere, duplicate ids, ranks in order / reversed / None / mixed /
random; logprobs of 0, -0.0, huge, subnormal, below the floor, missing; ``logprobs`` 0..21 or
None, echo, several prompts and choices, stop strings (trimmed entries), EOS kept or not,
skip_special_tokens off, ``return_token_ids``, on a fresh and a warm table: the reply (status
and bytes) is the Struct path's, and never a 500."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import worker.core.service as service
from worker.config import ServedModelConfig
from worker.core.service import DerenderService

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
_LPS = [-0.5, -1.25, -3.0, -20000.0, -1e308, 0.0, -0.0, 1e308, -1e-320, 5.0, -9999.0, -9999.000001]


def _pools(tok) -> dict:
    texts = tok.decode_singles(list(range(min(tok.vocab_size, 60000))))
    by: dict = {}
    for i, s in enumerate(texts):
        if not s.endswith("\ufffd"):
            by.setdefault(s, []).append(i)
    text = tok.encode("mixed 天气预报 text 😀 with emoji 🌤️ and 東京 100% %s words, plain")
    pools = {"added": sorted(tok.added_token_ids), "text": text,
             "pieces": [i for i, s in enumerate(texts) if s.endswith("\ufffd")][:200],
             "empty": [i for i, s in enumerate(texts) if s == ""][:50],
             "equal": [i for s, v in by.items() if len(v) > 1 for i in v][:200],
             "escape": [i for i, s in enumerate(texts) if "%" in s or '"' in s or "\\" in s][:100]}
    return {k: v or text[:1] for k, v in pools.items()} | {"vocab": tok.vocab_size}


def _id(rng: random.Random, pools: dict, bad: float):
    if rng.random() < bad:
        return rng.choice([-1, pools["vocab"], pools["vocab"] + 1000, 2 ** 40, None])
    key = rng.choice(["added", "text", "text", "pieces", "empty", "equal", "escape", "random"])
    return rng.randrange(pools["vocab"]) if key == "random" else rng.choice(pools[key])


def _entry(rng: random.Random, pools: dict, t, k: int, bad: float) -> dict:
    m = rng.choice([0, k, k, k + 1, k + 2, rng.randint(0, 22)])
    if rng.random() < 0.5:
        cands = [t] + [_id(rng, pools, bad) for _ in range(m)]
    else:
        cands = [_id(rng, pools, bad) for _ in range(m)]
        if rng.random() < 0.5 and cands:
            cands.insert(rng.randrange(len(cands)), t)
    if rng.random() < 0.2 and cands:
        cands.append(rng.choice(cands))  # a duplicate id
    if rng.random() < 0.98:
        cands = cands[:20]
    shape = rng.random()
    tops = []
    for j, c in enumerate(cands):
        rank = j + 1 if shape < 0.6 else None if shape < 0.7 else len(cands) - j if shape < 0.8 else \
            rng.choice([None, j + 1, 1, 0, -3]) if shape < 0.9 else rng.randint(-2, 30)
        top = {"token_id": c, "logprob": rng.choice(_LPS), "rank": rank}
        if rng.random() < 0.1:
            del top["logprob"]
        tops.append(top)
    e = {"token_id": t, "logprob": rng.choice(_LPS), "top_logprobs": tops}
    if rng.random() < 0.2:
        e["rank"] = rng.choice([None, 1, 5])
    return e


def _body(rng: random.Random, tok, pools: dict, i: int) -> bytes:
    k = rng.choice([0, 0, 1, 2, 5, 20, 20, rng.randint(0, 21), None])
    bad = 0.02 if rng.random() < 0.1 else 0.0
    n = rng.choice([rng.randint(0, 8), rng.randint(9, 40), rng.randint(9, 120)])
    gens, prompts = [], []
    for _ in range(rng.choice([1, 1, 2])):
        prompt = tok.encode("hello world 天气 ") if rng.random() < 0.8 else []
        prompts.append(prompt)
        choices = []
        for ci in range(rng.choice([1, 1, 2, 3])):
            ids = [_id(rng, pools, bad / 2) for _ in range(n)]
            if rng.random() < 0.4 and tok.eos_token_ids:
                ids.append(sorted(tok.eos_token_ids)[0])
            c = {"index": ci, "token_ids": ids, "finish_reason": rng.choice(["stop", "length", None, "abort", "stop"]),
                 "stop_reason": rng.choice([None, None, ids[-1] if ids else None, "END", 7])}
            if rng.random() < 0.9:
                entries = [_entry(rng, pools, t, k or 0, bad) for t in ids]
                if rng.random() < 0.05 and entries:
                    entries.pop()
                c["logprobs"] = {"content": entries}
            choices.append(c)
        gens.append({"request_id": f"c-{i}", "choices": choices, "prompt_token_ids": prompt})
    req = {"model": "m", "logprobs": k, "echo": rng.random() < 0.3, "skip_special_tokens": rng.random() < 0.7,
           "return_token_ids": rng.random() < 0.2}
    if rng.random() < 0.2:
        req["stop"] = rng.choice(["天", " ", "o", ["ld", "%"]])
        req["include_stop_str_in_output"] = rng.random() < 0.5
    body = {"model": "m", "generate_responses": gens, "completion_request": req}
    if rng.random() < 0.5:
        body["prompt_token_ids"] = prompts
        body["prompt_tokens"] = list(map(len, prompts))
    return json.dumps(body).encode()


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-7b-v0.3", "deepseek-v4"])
def test_hostile_completion_logprobs_give_the_struct_reply(name, monkeypatch):
    svc = DerenderService([ServedModelConfig(name="m", tokenizer=str(TOKDIR / name), max_logprobs=20)])
    tok = svc.runtime("m").tokenizer
    pools = _pools(tok)
    rng = random.Random(f"brk31-completion-{name}")
    struct = service.derender_completion
    ok = 0
    for i in range(400):
        if i % 50 == 0:
            tok.logprob_rows = None  # a fresh table: ids filled (and strings held) inside the blocks
        body = _body(rng, tok, pools, i)
        fast = svc.derender(body, "completion")
        with monkeypatch.context() as m:
            m.setattr(service, "derender_completion", lambda rt, req, created=None, json_logprobs=False:
                      struct(rt, req, created))
            slow = svc.derender(body, "completion")
        assert (fast.status, fast.body) == (slow.status, slow.body), body
        assert fast.status < 500, fast.body
        ok += fast.status == 200
    assert ok > 250
