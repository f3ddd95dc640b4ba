"""The derender as a Ray Data transform, on a local Ray with this machine's 2 CPUs: the CLI engine
(``batch --engine ray``) gives the same output as the local engine, in input order, over 2
actors; whole-request stream lines work and single stream-chunk records are refused clearly;
``Derender`` used directly from Python on ``ray.data.read_parquet``."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness.batch import QWEN3, table_json_columns
from tests.parity import corpus, missing_parser, nonstream_cases
from tests.parity_tools import to_requests
from worker.config import load_config_file
from worker.core.service import DerenderService
from worker.offline.runner import run_batch

ray = pytest.importorskip("ray", reason="the [ray] extra is part of [test]; install derender-worker[test]")

from worker.offline.ray_engine import STREAM_CHUNK_REFUSED, Derender, run_ray  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def qwen3_service():
    return DerenderService(load_config_file(QWEN3))


def _lines() -> list:
    """qwen3 non-streaming bodies (ok and refused), whole-request stream lines, a blank line."""
    bodies = [to_requests.nonstream_body(c) for c in nonstream_cases()
              if c["model"] == "qwen3" and not missing_parser(c)]
    streams = [to_requests.stream_bodies(c) for c in corpus() if c["model"] == "qwen3"
               and (c.get("expected") or {}).get("stream") is not None
               and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)][:8]
    lines: list = list(bodies)
    for i, s in enumerate(streams):
        lines.insert(7 * i + 3, s)
    lines.insert(20, "")
    return lines


def test_cli_ray_engine_equals_local_engine(tmp_path, local_ray, qwen3_service):
    """Same bytes as the local engine, except that a single stream-chunk record is refused with a
    clear reason (its neighbours unharmed). The input is gzip under a name without ``.gz``."""
    lines = _lines()
    chunk = to_requests.stream_bodies(next(c for c in corpus() if c["model"] == "qwen3"
                                           and (c.get("expected") or {}).get("stream") is not None))[0]
    lines.insert(30, chunk)
    # a body with raw U+2028 / U+0085 in a JSON string (one record, not three) and a line that
    # is not UTF-8 (a 400 for that line, not a failed run)
    base = next(x for x in lines if isinstance(x, dict) and x.get("chat_request"))
    odd = dict(base, chat_request=dict(base["chat_request"], user="a\u2028b\u0085c"))
    raw = [json.dumps(x, ensure_ascii=False).encode() if x != "" else b"" for x in lines]
    raw[5:5] = [json.dumps(odd, ensure_ascii=False).encode(), b'{"model": "qwen3", "x": "\xff\xfe"}']
    assert "\u2028".encode() in raw[5]
    src = tmp_path / "in.log"  # gzip told by content in both engines, not by a .gz name
    src.write_bytes(gzip.compress(b"".join(x + b"\n" for x in raw)))
    lines[5:5] = [odd, "not utf-8"]
    ref = tmp_path / "ref.jsonl"
    run_batch(qwen3_service, str(src), str(ref), workers=1, progress=False)
    out = tmp_path / "ray.jsonl"
    summary = run_ray(qwen3_service, str(src), str(out), workers=2, actor_cpus=0.5, batch_size=16, progress=False)
    assert summary["actors"] == 2 and summary["lines"] == len(lines)
    got, want = out.read_text().splitlines(), ref.read_text().splitlines()
    assert len(got) == len(want) == len(lines)
    assert json.loads(got[32])["error"]["message"] == STREAM_CHUNK_REFUSED  # line 30 before the 2 above
    assert got[:32] + got[33:] == want[:32] + want[33:]
    assert json.loads(got[6])["error"]["code"] == 400  # the non-UTF-8 line; got[5] is one record, as locally


def test_derender_class_on_ray_data_parquet(tmp_path, local_ray, qwen3_service):
    bodies = [x for x in _lines() if isinstance(x, dict) and "generate_response" in x]
    table = table_json_columns(bodies)
    table = table.append_column("index", pa.array(range(len(bodies)), pa.int64()))
    src = tmp_path / "in.parquet"
    pq.write_table(table, src, row_group_size=10)
    ref = tmp_path / "ref.parquet"
    run_batch(qwen3_service, str(src), str(ref), workers=1, progress=False)

    ds = ray.data.read_parquet(str(src)).repartition(4).map_batches(  # 4 blocks: both actors get work
        Derender, fn_constructor_kwargs={"config": QWEN3}, batch_size=8, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=0.5)
    rows = sorted(ds.take_all(), key=lambda r: r["index"])  # order restored by the carried index
    want = pq.read_table(ref).to_pylist()
    assert [r["index"] for r in rows] == list(range(len(bodies)))
    assert [json.loads(r["response"]) for r in rows] == [json.loads(r["response"]) for r in want]
    assert [r["content"] for r in rows] == [r["content"] for r in want]


def test_ray_engine_responses_equals_local_engine(tmp_path, local_ray):
    """Responses bodies (issue 14) and whole-request Responses stream lines through Ray Data:
    the same bytes as the local engine, and the reference's answers (compare_responses.py)."""
    from tests.harness.responses import CASES, MODELS
    from tests.parity_tools import compare_responses as cmp
    from tests.parity_tools import responses_to_requests as r2r
    svc = DerenderService(load_config_file(str(MODELS)))
    lines = [r2r.nonstream_body(c) for c in CASES] + [r2r.stream_bodies(c) for c in CASES[:6]]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    ref, out = tmp_path / "ref.jsonl", tmp_path / "ray.jsonl"
    run_batch(svc, str(src), str(ref), workers=1, progress=False)
    run_ray(svc, str(src), str(out), workers=2, actor_cpus=0.5, batch_size=8, progress=False)
    got = out.read_text().splitlines()
    assert got == ref.read_text().splitlines() and len(got) == len(lines)
    for case, line in zip(CASES, got):
        assert cmp.compare_nonstream(case, json.loads(line)) is None, case["id"]
    for case, line in zip(CASES[:6], got[len(CASES):]):
        events = json.loads(line)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert cmp.norm_response(events[-1]["response"]) == case["expected"]["nonstream"]


def test_ray_engine_messages_equals_local_engine(tmp_path, local_ray):
    """Anthropic Messages bodies (issue 26) and whole-request Messages stream lines through Ray
    Data: the same bytes as the local engine, and the reference's answers (compare_messages.py)."""
    from tests.harness.messages import CASES, MODELS
    from tests.parity_tools import compare_messages as cmp
    from tests.parity_tools import messages_to_requests as m2r
    svc = DerenderService(load_config_file(str(MODELS)))
    streamed = [c for c in CASES if not m2r.is_error_case(c)][:6]
    lines = [m2r.nonstream_body(c) for c in CASES] + [m2r.stream_bodies(c) for c in streamed]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    ref, out = tmp_path / "ref.jsonl", tmp_path / "ray.jsonl"
    run_batch(svc, str(src), str(ref), workers=1, progress=False)
    run_ray(svc, str(src), str(out), workers=2, actor_cpus=0.5, batch_size=8, progress=False)
    got = out.read_text().splitlines()
    assert got == ref.read_text().splitlines() and len(got) == len(lines)
    for case, line in zip(CASES, got):
        assert cmp.compare_nonstream(case, json.loads(line)) is None, case["id"]
    for case, line in zip(streamed, got[len(CASES):]):
        assert cmp.compare_stream(case, [json.loads(line)]) is None, case["id"]
