"""Issue 13, hostile sequences against the write-once stream settings (``derender_stream(
settings_aside=True)``): random chunkings of qwen3 chat streams (reasoning, a hermes call, stop
strings, n=2 with interleaved choices, tool_choice required / named, engine logprobs with
irregular candidate lists), with redelivered earlier chunks (stale seq: 409, state kept), later
chunks carrying another request (400, state kept) or the same request again, and a cache miss
(another worker process) on a random third of the chunks, give exactly the replies and statuses
of the same chunks with the settings kept inside the state; settings that another stream wrote,
truncated or empty are the 409 "lost or expired", and the stream goes on with the right ones."""
from __future__ import annotations

import json
import random

import pytest

from tests.parity import service
from worker.core.service import DerenderService

_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
_TEXTS = ["<think>\nlet me see 天气 😀</think>\n\nSure, calling it.\n<tool_call>\n"
          '{"name": "f", "arguments": {"a": "東京🌤️"}}\n</tool_call>',
          "plain answer with emoji 😀🌤️ and 東京 STOPHERE more text after",
          "<think>short</think>hello world, no call here ~~~~ end",
          '[{"name": "f", "arguments": {"a": 1}}]']


def _stream(rng: random.Random, tok, rid: str) -> list[tuple[bytes, int]]:
    """One hostile stream: ``[(body, seq), ...]`` in delivery order."""
    ids = tok.encode(rng.choice(_TEXTS)) + ([151645] if rng.random() < 0.8 else [])
    k = rng.choice([0, 2, 5, 20])
    lp = rng.random() < 0.5
    n = rng.choice([1, 1, 2])
    req: dict = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "tools": _TOOLS}
    if lp:
        req.update(logprobs=True, top_logprobs=k)
    if rng.random() < 0.3:
        req["stop"] = rng.choice([["STOPHERE"], ["~~"], [f"s{i}x" for i in range(300)] + ["end"]])
    if rng.random() < 0.2:
        req["tool_choice"] = rng.choice(["required", {"type": "function", "function": {"name": "f"}}])
    if n > 1:
        req["n"] = n
    by: dict[int, list] = {}
    for ci in range(n):
        i = 0
        while i < len(ids):
            step = rng.choice([1, 1, 2, 3, 7])
            part = ids[i:i + step]
            i += step
            ch: dict = {"index": ci, "token_ids": part,
                        "finish_reason": ("stop" if ids[-1] == 151645 else "length") if i >= len(ids) else None}
            if lp:
                ents = []
                for t in part:
                    m = rng.choice([k, k, 0, max(k - 1, 0)])
                    cands = [rng.choice([t, rng.randrange(151669), 151668, 0]) for _ in range(m)]
                    ents.append({"token_id": t, "logprob": -0.25, "top_logprobs": [
                        {"token_id": c, "logprob": rng.choice([-0.5, -1.0, -30000.0, 0.0]),
                         **({"rank": rng.choice([1, j + 1, m - j])} if rng.random() < 0.8 else {})}
                        for j, c in enumerate(cands)]})
                ch["logprobs"] = {"content": ents}
            by.setdefault(ci, []).append(ch)
    order = [ci for ci, chs in by.items() for _ in chs]
    rng.shuffle(order)
    its = {ci: iter(chs) for ci, chs in by.items()}
    bodies = []
    for j, ci in enumerate(order):
        b: dict = {"model": "qwen3", "stream": True,
                   "generate_chunk": {"request_id": rid, "choices": [next(its[ci])]}}
        if j == 0:
            b["prompt_token_ids"] = [151644, 872, 198]
            b["chat_request"] = req
        elif rng.random() < 0.15:
            b["chat_request"] = req  # the same request bytes again: allowed
        bodies.append(b)
    ops = []
    for j, b in enumerate(bodies):
        mut = rng.random()
        if j > 0 and mut < 0.05:
            ops.append((json.dumps({**b, "chat_request": {**req, "top_logprobs": 3}}).encode(), j))
        if j > 0 and mut > 0.95:
            ops.append((json.dumps(bodies[j - 1]).encode(), j - 1))  # redelivered: stale
        ops.append((json.dumps(b).encode(), j))
    return ops


def _inline(svc: DerenderService, ops) -> list[tuple[int, bytes]]:
    state, out = None, []
    for body, seq in ops:
        res, new = svc.derender_stream(body, state, seq=seq, created=5)
        state = new if new is not None else state
        out.append((res.status, res.body))
    return out


def _aside(svc: DerenderService, ops, rng: random.Random, foreign: bytes) -> list[tuple[int, bytes]]:
    """Settings stored apart; a random third of the chunks go to a fresh process (cache miss),
    which is first handed wrong settings (another stream's, truncated, empty: 409, nothing
    changed) and then the stored ones."""
    cfgs = list({id(m): m for m in svc.models.values()}.values())
    state, stored, out = None, b"", []
    for body, seq in ops:
        s = DerenderService(cfgs) if rng.random() < 0.3 else svc
        if s is not svc:
            s._runtimes = svc._runtimes  # (the tokenizers loaded once; the settings cache is its own)
        res, new = s.derender_stream(body, state, seq=seq, created=5, settings_aside=True)
        if res.needs_settings:
            assert res.body == b"" and new is None
            for wrong in (foreign, stored[:-1], b""):
                r, n2 = s.derender_stream(body, state, seq=seq, created=5, settings_aside=True, settings=wrong)
                assert r.status == 409 and n2 is None, r.body
                assert "lost or expired" in json.loads(r.body)["error"]["message"]
            res, new = s.derender_stream(body, state, seq=seq, created=5, settings_aside=True, settings=stored)
        assert not res.needs_settings
        if res.settings:
            assert not stored or state is None  # written once per stream
            stored = res.settings
        state = new if new is not None else state
        out.append((res.status, res.body))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_settings_aside_under_hostile_sequences_equal_inline_settings(seed):
    svc = service()
    tok = svc.runtime("qwen3").tokenizer
    rng = random.Random(f"hostile-settings-{seed}")
    foreign = svc.derender_stream(_stream(random.Random("other"), tok, "other")[0][0], None, created=5,
                                  settings_aside=True)[0].settings
    assert foreign
    statuses = set()
    for i in range(12):
        ops = _stream(rng, tok, f"h{seed}-{i}")
        want = _inline(service(), ops)
        got = _aside(svc, ops, random.Random(f"miss-{seed}-{i}"), foreign)
        assert got == want
        statuses.update(s for s, _ in want)
    # streams ran, hostile chunks were refused (stale: 409, foreign request: 400), nothing crashed
    assert {200, 400, 409} <= statuses and 500 not in statuses
