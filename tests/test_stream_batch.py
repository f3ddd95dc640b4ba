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


def _refused_chunk_case():
    """A corpus stream of >= 4 chunk bodies whose chunk 1 is made invalid (an output id past the
    vocabulary): (case, chunk bodies)."""
    c = next(c for c in corpus() if (c.get("expected") or {}).get("stream") is not None
             and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)
             and len(to_requests.stream_bodies(c)) >= 4)
    bodies = to_requests.stream_bodies(c)
    bodies[1]["generate_chunk"]["choices"][0]["token_ids"] = [10**9]
    return c, bodies


@pytest.mark.parametrize("workers", [1, 2])
def test_batch_a_refused_chunk_ends_its_stream(tmp_path, workers):
    """As the Kafka worker: a chunk answered with an error ends its stream; every later chunk line
    of that request gets the ended-stream 409 (never chunks derendered without the refused chunk's
    tokens); another stream in the same file is untouched."""
    _c, bodies = _refused_chunk_case()
    other = next(c for c in corpus() if (c.get("expected") or {}).get("stream") is not None
                 and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)
                 and to_requests.stream_bodies(c)[0]["generate_chunk"]["request_id"]
                 != bodies[0]["generate_chunk"]["request_id"])
    lines = [*bodies[:2], *to_requests.stream_bodies(other), *bodies[2:]]
    src = tmp_path / "log.jsonl"
    src.write_text("".join(json.dumps(b) + "\n" for b in lines))
    out = tmp_path / "out.jsonl"
    run_batch(service(), str(src), str(out), workers=workers, progress=False)
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert isinstance(got[0], list) and got[1]["error"]["code"] == 400
    n_other = len(to_requests.stream_bodies(other))
    ok, _, why = compare_mod.compare_stream(other, [x for r in got[2:2 + n_other] for x in r])
    assert ok, why
    for r in got[2 + n_other:]:
        assert r["error"]["code"] == 409 and "already ended" in r["error"]["message"], r


def test_batch_stream_list_stops_at_the_first_error(tmp_path):
    """A stream-list line whose chunk 1 is refused: its array ends with that error object and the
    line's status is the error's (the later bodies are not derendered)."""
    _c, bodies = _refused_chunk_case()
    src = tmp_path / "streams.jsonl"
    src.write_text(json.dumps(bodies) + "\n")
    out = tmp_path / "out.jsonl"
    summary = run_batch(service(), str(src), str(out), workers=1, progress=False)
    got = json.loads(out.read_text())
    assert got[-1]["error"]["code"] == 400 and all("error" not in x for x in got[:-1]), got[-1]
    assert summary["ok"] == 0
