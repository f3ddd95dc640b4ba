"""Issue 25 item 2: the Responses and Messages non-streaming paths at chat's cost keep their
outcomes: the one typed Responses decode takes exactly the bodies the probe path would route as
Responses, and the Messages segment cuts found by one C-level search equal the per-id scan."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from worker.bench import floor
from worker.core import service as core_service
from worker.core.messages import derender as mderender

TOKDIR = Path(__file__).parent / "data" / "tokenizers"


@pytest.fixture(scope="module")
def svc():
    return floor.make_service(str(TOKDIR / "qwen3"))


def test_segments_by_one_search_equal_the_per_id_scan(svc):
    rt = svc.runtime("qwen3")
    added = sorted(rt.tokenizer.added_token_ids)
    rng = random.Random(7)
    for n in (0, 1, 5, 32, 33, 64, 300):
        for _ in range(20):
            ids = [rng.choice(added) if rng.random() < 0.1 else rng.randrange(1000, 100000) for _ in range(n)]
            if ids and rng.random() < 0.5:
                ids[-1] = added[0]  # an added id last: no cut after it
            ends = rt.stack.reasoning.end_ids if rt.stack.reasoning is not None else frozenset()
            cuts = [i + 1 for i, t in enumerate(ids[:-1]) if t in rt.tokenizer.added_token_ids and t not in ends]
            want = [(a, ids[a:z]) for a, z in zip([0] + cuts, cuts + [len(ids)])]
            assert mderender._segments(rt, ids) == want


def test_one_responses_decode_takes_only_responses_shaped_bodies(svc):
    chat = floor.build_bodies(svc.runtime("qwen3").tokenizer, "qwen3", 64, 1)[0][0]
    body = floor.path_body(chat, "responses")
    assert core_service._responses_decode(body, None) is not None
    assert core_service._responses_decode(body, "responses") is not None
    assert core_service._responses_decode(body, "chat") is None
    b = json.loads(body)
    assert core_service._responses_decode(chat, None) is None  # no responses_request: chat
    null_req = json.dumps({**b, "responses_request": None}).encode()
    assert core_service._responses_decode(null_req, None) is None
    for key in ("generate_chunk", "generate_responses"):  # two shapes: the probe path's 400
        two = json.dumps({**b, key: b["generate_response"]}).encode()
        assert core_service._responses_decode(two, None) is None
        res = svc.derender(two)
        assert res.status == 400
    no_model = json.dumps({k: v for k, v in b.items() if k != "model"}).encode()
    assert core_service._responses_decode(no_model, "responses") is None
    assert json.loads(svc.derender(no_model, "responses").body)["error"]["message"] == "model is required"
    a, c = svc.derender(body), svc.derender(body, "responses")
    assert (a.status, a.kind, a.request_id, a.body) == (c.status, c.kind, c.request_id, c.body) == \
        (200, "responses", "bench-0", a.body)
