"""Batch formats on the parity corpus: Parquet (JSON string and struct columns) and OpenAI Batch
JSONL give the same answers as plain JSONL; flattened Parquet columns agree with the response;
format detection by name and content, overridable."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness.batch import table_json_columns
from tests.parity import missing_parser, nonstream_cases, service
from tests.parity_tools import to_requests
from worker.offline import formats
from worker.offline.runner import run_batch


def corpus_bodies() -> list[dict]:
    return [to_requests.nonstream_body(c) for c in nonstream_cases() if not missing_parser(c)]


def jsonl_answers(tmp_path: Path, bodies: list[dict], name: str = "ref") -> list:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    out = tmp_path / f"{name}.out.jsonl"
    run_batch(service(), str(src), str(out), workers=1, progress=False)
    return [json.loads(x) for x in out.read_text().splitlines()]




def parquet_answers(tmp_path: Path, table: pa.Table, name: str, **kw) -> tuple[list, pa.Table]:
    src = tmp_path / f"{name}.parquet"
    pq.write_table(table, src, row_group_size=17)
    out = tmp_path / f"{name}.out.parquet"
    summary = run_batch(service(), str(src), str(out), workers=2, progress=False, row_group_rows=9, **kw)
    assert summary["input_format"] == "parquet" == summary["output_format"]
    t = pq.read_table(out)
    assert pq.ParquetFile(out).metadata.num_row_groups > 1
    assert t.column("index").to_pylist() == list(range(table.num_rows))
    return [json.loads(x) for x in t.column("response").to_pylist()], t


@pytest.mark.parametrize("kind", ["generate_response", "generate_responses"])
def test_parquet_round_trip_equals_jsonl(tmp_path, kind):
    bodies = [b for b in corpus_bodies() if kind in b]
    assert len(bodies) > 10
    ref = jsonl_answers(tmp_path, bodies)
    got, table = parquet_answers(tmp_path, table_json_columns(bodies), "in")
    assert got == ref
    rows = table.to_pylist()
    for r, ans in zip(rows, ref):
        if "error" in ans:
            assert r["status_code"] != 200 and r["error"] == ans["error"]["message"] and r["content"] is None
            continue
        c0 = ans["choices"][0]
        assert r["status_code"] == 200 and r["num_choices"] == len(ans["choices"])
        if kind == "generate_response":
            m = c0["message"]
            assert (r["content"], r["reasoning"]) == (m["content"], m.get("reasoning"))
            assert (json.loads(r["tool_calls"]) if r["tool_calls"] else None) == (m.get("tool_calls") or None)
        else:
            assert r["content"] == c0["text"]
        assert r["finish_reason"] == c0["finish_reason"]
        assert (r["prompt_tokens"], r["completion_tokens"], r["total_tokens"]) == (
            ans["usage"]["prompt_tokens"], ans["usage"]["completion_tokens"], ans["usage"]["total_tokens"])


def test_parquet_struct_columns_equal_jsonl(tmp_path):
    """Struct-typed columns (Arrow's inferred type of the bodies, keys of every row): the largest
    set of corpus bodies Arrow can type together."""
    picked: list[dict] = []
    for b in corpus_bodies():
        try:
            pa.array(picked + [b])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            continue
        picked.append(b)
    assert len(picked) >= 30
    table = pa.Table.from_struct_array(pa.array(picked))
    assert pa.types.is_struct(table.schema.field("generate_response").type)
    ref = jsonl_answers(tmp_path, picked)
    got, _ = parquet_answers(tmp_path, table, "structs")
    assert got == ref


def test_parquet_chat_and_completion_in_one_file_with_json_string_columns(tmp_path):
    """Chat and completion bodies in one file: ``prompt_tokens`` / ``prompt_token_ids`` differ in
    type between the kinds, so every field but ``model`` goes in as a JSON string (docs/batch.md's
    recipe) and is parsed back."""
    bodies = corpus_bodies()
    assert {"generate_response", "generate_responses"} <= {k for b in bodies for k in b}
    keys = sorted({k for b in bodies for k in b})
    table = pa.table({k: [b.get(k) if k == "model" or k not in b else json.dumps(b[k]) for b in bodies]
                      for k in keys})
    assert pa.types.is_string(table.schema.field("prompt_tokens").type)
    got, _ = parquet_answers(tmp_path, table, "mixed")
    assert got == jsonl_answers(tmp_path, bodies)


def test_openai_batch_round_trip_equals_jsonl(tmp_path):
    bodies = corpus_bodies()
    ref = jsonl_answers(tmp_path, bodies)
    src = tmp_path / "batch_in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": b}) + "\n" for i, b in enumerate(bodies)))
    assert formats.detect_input_format(str(src)) == "openai-batch"
    out = tmp_path / "batch_out.jsonl"
    summary = run_batch(service(), str(src), str(out), workers=2, progress=False)
    assert summary["output_format"] == "openai-batch"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [ln["response"]["body"] for ln in lines] == ref
    for i, (ln, ans) in enumerate(zip(lines, ref)):
        assert ln["custom_id"] == f"req-{i}" and ln["id"] == f"batch_req_{i}"
        if "error" in ans:
            assert ln["response"]["status_code"] == ans["error"]["code"]
            assert ln["error"]["message"] == ans["error"]["message"] and ln["error"]["code"]
        else:
            assert ln["response"]["status_code"] == 200 and ln["error"] is None
            assert ln["response"]["request_id"] == ans["id"]
    # --output-format jsonl: plain answers, the same as the JSONL run
    plain = tmp_path / "plain.jsonl"
    run_batch(service(), str(src), str(plain), workers=1, progress=False, output_format="jsonl")
    assert [json.loads(x) for x in plain.read_text().splitlines()] == ref
    # Parquet output keeps custom_id
    pout = tmp_path / "batch_out.parquet"
    run_batch(service(), str(src), str(pout), workers=1, progress=False)
    assert pq.read_table(pout).column("custom_id").to_pylist() == [f"req-{i}" for i in range(len(bodies))]


def test_openai_batch_bad_lines_get_error_lines(tmp_path):
    good = corpus_bodies()[0]
    src = tmp_path / "b.jsonl"
    src.write_text(json.dumps({"custom_id": "a", "body": good}) + "\n"
                   + json.dumps({"custom_id": "b", "body": None}) + "\n"
                   + "{not json\n\n"
                   + json.dumps({"custom_id": "c", "body": good}) + "\n")
    out = tmp_path / "o.jsonl"
    summary = run_batch(service(), str(src), str(out), workers=1, progress=False)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [ln["custom_id"] for ln in lines] == ["a", "b", None, None, "c"]
    assert [ln["response"]["status_code"] for ln in lines] == [200, 400, 400, 400, 200]
    assert summary["ok"] == 2 and summary["errors"] == {"400": 3}


def test_format_override_flags(tmp_path):
    bodies = corpus_bodies()[:4]
    src = tmp_path / "data.bin"  # a name that says nothing
    pq.write_table(table_json_columns(bodies), src)
    out = tmp_path / "o.txt"
    summary = run_batch(service(), str(src), str(out), workers=1, progress=False, input_format="parquet",
                        output_format="parquet")
    assert summary["ok"] == summary["lines"] == 4
    assert [json.loads(x) for x in pq.read_table(out).column("response").to_pylist()] == \
        jsonl_answers(tmp_path, bodies)
    with pytest.raises(ValueError, match="unknown output format"):
        run_batch(service(), str(src), str(out), workers=1, progress=False, input_format="parquet",
                  output_format="csv")


def test_parquet_part_files_assemble_to_the_single_file_output(tmp_path):
    bodies = [b for b in corpus_bodies() if "generate_response" in b][:60]
    src = tmp_path / "in.parquet"
    pq.write_table(table_json_columns(bodies), src, row_group_size=16)
    one, parts = tmp_path / "one.parquet", tmp_path / "parts.parquet"
    run_batch(service(), str(src), str(one), workers=1, progress=False, row_group_rows=8)
    summary = run_batch(service(), str(src), str(parts), workers=2, progress=False, row_group_rows=8, part_size=25)
    assert summary["lines"] == 60
    assert pq.read_table(parts).equals(pq.read_table(one))
    assert not (tmp_path / "parts.parquet.parts").exists()


def test_parquet_flattens_stream_records_like_the_nonstream_answer(tmp_path):
    """A whole streamed request (JSON list of chunk bodies) gets the same choice-0 columns as the
    non-streaming answer for the same tokens (deltas joined, tool call fragments merged)."""
    from tests.parity import corpus
    cases = [c for c in corpus() if (c.get("expected") or {}).get("stream") is not None
             and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)]
    src_s, src_n = tmp_path / "s.jsonl", tmp_path / "n.jsonl"
    src_s.write_text("".join(json.dumps(to_requests.stream_bodies(c)) + "\n" for c in cases))
    src_n.write_text("".join(json.dumps(to_requests.nonstream_body(c)) + "\n" for c in cases))
    out_s, out_n = tmp_path / "s.parquet", tmp_path / "n.parquet"
    run_batch(service(), str(src_s), str(out_s), workers=1, progress=False)
    run_batch(service(), str(src_n), str(out_n), workers=1, progress=False)
    rows_s, rows_n = pq.read_table(out_s).to_pylist(), pq.read_table(out_n).to_pylist()
    compared = 0
    for c, s, n in zip(cases, rows_s, rows_n):
        if n["status_code"] != 200 or s["status_code"] != 200:
            continue
        compared += 1
        for col in ("content", "reasoning"):  # a stream cannot tell "" from no text
            assert s[col] == (n[col] or None), (c["id"], col, s[col], n[col])
        for col in ("finish_reason", "num_choices", "prompt_tokens", "completion_tokens"):
            assert s[col] == n[col], (c["id"], col, s[col], n[col])

        def calls(v):
            return [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in json.loads(v or "[]")]
        assert calls(s["tool_calls"]) == calls(n["tool_calls"]), c["id"]
    assert compared > 50
