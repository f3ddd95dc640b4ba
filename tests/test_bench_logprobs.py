"""``derender-worker bench logprobs`` at test size: every API's body derenders through a real
``batch --workers 1`` subprocess and the command prints one figure line per (API, top). The
figures themselves are not checked (a benchmark, not a test)."""
from __future__ import annotations

import json
import re

from worker.bench.floor import build_bodies, make_service
from worker.bench.logprobs import _DEFAULT_TOKENIZER, as_api, main


def test_bodies_of_every_api_carry_the_same_engine_logprobs():
    tok = make_service(_DEFAULT_TOKENIZER).runtime("qwen3").tokenizer
    (chat,), _ = build_bodies(tok, "qwen3", 64, 1, top_logprobs=3)
    entries = json.loads(chat)["generate_response"]["choices"][0]["logprobs"]
    comp = json.loads(as_api(chat, "completion", 3))
    assert comp["completion_request"]["logprobs"] == 3
    assert comp["generate_responses"][0]["choices"][0]["logprobs"] == entries
    resp = json.loads(as_api(chat, "responses", 3))
    assert resp["responses_request"]["top_logprobs"] == 3 and "chat_request" not in resp
    assert "logprobs" not in json.loads(as_api(chat, "completion", None))["completion_request"]


def test_bench_logprobs_prints_one_line_per_api_and_top(capsys, tmp_path):
    assert main(["--tops", "2", "--records", "3", "--distinct", "2", "--tokens", "64", "--floor-repeats", "1",
                 "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("  round 1 ")]
    assert [x.split()[2] for x in lines] == ["chat", "completion", "responses"]
    for x in lines:  # 3 records cost less CPU than start-up: no figure then, never a negative one
        assert re.search(r"product +[\d.]+ us/record +floor +[\d.]+ us +[\d.]+x", x) or "too few records" in x, x
    assert main(["--apis", "messages"]) == 2
