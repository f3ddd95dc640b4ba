"""Batch mode over a streamed log: chunk lines of several requests interleaved with
non-streaming lines; stream state is kept per request id in memory, output stays in input order."""
from __future__ import annotations

import json
import random

import pytest

from tests.parity import corpus, missing_parser, service
from tests.parity_tools import compare as compare_mod
from tests.parity_tools import to_requests
from worker.offline.runner import run_batch


@pytest.mark.parametrize("workers", [1, 2])
def test_batch_streamed_log(tmp_path, workers):
    cases = [c for c in corpus() if (c.get("expected") or {}).get("stream") is not None
             and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)][:12]
    assert cases
    rng = random.Random(7)
    queues = [(c["id"], list(to_requests.stream_bodies(c))) for c in cases]
    plain = [to_requests.nonstream_body(c) for c in cases[:3]]
    lines: list[tuple[str | None, dict]] = []
    while any(q for _, q in queues):
        cid, q = rng.choice([x for x in queues if x[1]])
        lines.append((cid, q.pop(0)))
        if plain and rng.random() < 0.1:
            lines.append((None, plain.pop()))
    lines.extend((None, p) for p in plain)
    src = tmp_path / "log.jsonl"
    src.write_text("".join(json.dumps(b) + "\n" for _, b in lines))
    out = tmp_path / "out.jsonl"
    summary = run_batch(service(), str(src), str(out), workers=workers, progress=False)
    assert summary["lines"] == len(lines) and summary["ok"] == len(lines)
    got = [json.loads(x) for x in out.read_text().splitlines()]
    per_case: dict[str, list] = {}
    for (cid, _body), res in zip(lines, got):
        if cid is None:
            assert isinstance(res, dict) and res.get("object") in ("chat.completion", "text_completion")
        else:
            assert isinstance(res, list)
            per_case.setdefault(cid, []).extend(res)
    for c in cases:
        ok, _, why = compare_mod.compare_stream(c, per_case[c["id"]])
        assert ok, f"{c['id']}: {why}"


def test_batch_stream_list_lines_give_the_expected_streams(tmp_path):
    """A line holding a request's whole list of chunk bodies (to_requests.py --stream's format)
    yields that request's chunk list: compare.py --stream's check passes for every corpus case."""
    cases = [c for c in corpus() if (c.get("expected") or {}).get("stream") is not None
             and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)]
    src = tmp_path / "streams.jsonl"
    src.write_text("".join(json.dumps(to_requests.stream_bodies(c)) + "\n" for c in cases) + "\n")
    out = tmp_path / "out.jsonl"
    summary = run_batch(service(), str(src), str(out), workers=1, progress=False)
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(got) == len(cases) + 1 and summary["lines"] == len(cases) + 1
    assert got[-1]["error"]["message"] == "empty input line"  # a blank line still gets its output line
    for case, chunks in zip(cases, got):
        ok, _exact, why = compare_mod.compare_stream(case, chunks)
        assert ok, (case["id"], why)
