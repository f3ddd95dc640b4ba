"""Streaming parity.

1. Every corpus case with an expected stream: its streaming bodies (``to_requests.stream_bodies``)
   go through ``DerenderService.derender_stream`` chunk by chunk, threading our own state bytes
   (vLLM's ``stream_state`` is ignored), and the joined chunks are compared with the corpus'
   ``compare_stream`` rules.
2. Split independence: for every non-error chat/completion case, the non-streaming body is cut
   into 1-token, 3-token and random chunks (random ones also interleave the choices and put
   several choices in one body); the joined deltas must equal the non-streaming response
   (content, reasoning, tool call ids/names/arguments, finish/stop reasons, logprob tokens,
   completion text, usage).

Cases of models whose parsers are not registered yet are skipped.
"""
from __future__ import annotations

import copy
import json

import pytest

from tests.harness.streams import nonstream_view as _nonstream_view
from tests.harness.streams import run_stream, stream_bodies_from_nonstream
from tests.harness.streams import stream_view as _stream_view
from tests.parity import STREAM_CASES, missing_parser, nonstream_cases, service
from tests.parity_tools import compare as compare_mod
from tests.parity_tools import to_requests


@pytest.mark.parametrize("case", STREAM_CASES, ids=[c["id"] for c in STREAM_CASES])
def test_stream_parity(case):
    missing = missing_parser(case)
    if missing:
        pytest.skip(missing)
    chunks = run_stream(to_requests.stream_bodies(case))
    ok, _exact, why = compare_mod.compare_stream(case, chunks)
    assert ok, why


# ------------------------------------------------------------------ split independence ---








SPLIT_CASES = [c for c in nonstream_cases() if not (c.get("expected") or {}).get("error")]


@pytest.mark.parametrize("how", ["1", "3", "random"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c["id"] for c in SPLIT_CASES])
def test_stream_equals_nonstream(case, how):
    missing = missing_parser(case)
    if missing:
        pytest.skip(missing)
    body = to_requests.nonstream_body(case)
    res = service().derender(json.dumps(body).encode())
    if res.is_error:
        pytest.skip("non-streaming body is rejected")
    want = _nonstream_view(json.loads(res.body), case["endpoint"])
    for seed in ((0, 1, 2) if how == "random" else (0,)):
        bodies = stream_bodies_from_nonstream(copy.deepcopy(body), case["endpoint"], how, seed)
        got = _stream_view(run_stream(bodies), case["endpoint"])
        assert got == want, f"chunking {how} seed {seed}"
