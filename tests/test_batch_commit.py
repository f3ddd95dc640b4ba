"""Batch mode that never loses output: atomic commit (also under SIGKILL), gzip output, exit
status when records fail, progress with total/ETA forced on/off, the failure summary, and
``--resume`` of a killed part-file run giving the same output as an uninterrupted run."""
from __future__ import annotations

import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest
from tqdm import tqdm

from tests.harness.batch import QWEN3, ROOT, TERMINATED, qwen3_bodies, run_cli, terminated_lines, write_jsonl
from tests.harness.batch import spawn as _spawn
from tests.harness.batch import wait_for as _wait_for
from tests.parity import corpus, missing_parser
from tests.parity_tools import to_requests


def test_missing_input_keeps_existing_output(tmp_path, capsys):
    out = tmp_path / "existing.jsonl"
    out.write_text("earlier output\n")
    assert run_cli(str(tmp_path / "missing.jsonl"), "-o", str(out), "--workers", "1") == 2
    assert out.read_text() == "earlier output\n"
    assert os.listdir(tmp_path) == ["existing.jsonl"]  # no temporary file left
    assert "No such file" in capsys.readouterr().err


def test_gzip_output_when_name_ends_in_gz(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies())
    assert run_cli(str(src), "-o", str(tmp_path / "out.jsonl"), "--workers", "1") == 0
    assert run_cli(str(src), "-o", str(tmp_path / "out.jsonl.gz"), "--workers", "2") == 0
    raw = (tmp_path / "out.jsonl.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw) == (tmp_path / "out.jsonl").read_bytes()


def test_gzip_input_told_by_its_magic_bytes_also_on_stdin(tmp_path):
    """``cat log.jsonl.gz | batch - ...`` and a gzip file without ``.gz`` in its name are read as
    gzip (RFC 1952 magic), not as 1 bad record per compressed line."""
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:5])
    assert run_cli(str(src), "-o", str(tmp_path / "ref.jsonl"), "--workers", "1") == 0
    ref = (tmp_path / "ref.jsonl").read_bytes()
    packed = tmp_path / "in.log"  # gzip content, a name that says nothing
    packed.write_bytes(gzip.compress(src.read_bytes()))
    assert run_cli(str(packed), "-o", str(tmp_path / "o1.jsonl"), "--workers", "1") == 0
    assert (tmp_path / "o1.jsonl").read_bytes() == ref
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "batch", "-", "-o", "-", "--config", QWEN3,
                           "--workers", "1"], input=packed.read_bytes(), capture_output=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ref


def test_stdout_reader_going_away_is_quiet(tmp_path):
    """``batch LOG -o - | head``: no error line, status 141 (128 + SIGPIPE) as a filter killed by
    SIGPIPE would report."""
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies() * 40)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "batch", str(src), "-o", "-", "--config", QWEN3,
                             "--workers", "1", "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdout.read(100).startswith(b"{")
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)  # (a hang is a failure, never a stuck suite)
    err = err.decode()
    assert proc.returncode == 141, err
    assert "Broken pipe" not in err and "Traceback" not in err


def test_exit_status_and_summary_when_records_fail(tmp_path, capsys):
    bodies = qwen3_bodies()[:6]
    bad = write_jsonl(tmp_path / "bad.jsonl", [dict(b, model="forgotten") for b in bodies])
    out = tmp_path / "out.jsonl"
    assert run_cli(str(bad), "-o", str(out), "--workers", "1") == 1  # nothing succeeded
    err = capsys.readouterr().err
    assert "6 records, 0 ok, 6 failed (404: 6)" in err
    assert "6 x 404 'The model `forgotten` does not exist." in err and "(first at line 1)" in err
    pattern = '\\{"(type":"error",")?error":\\{'  # OpenAI's error object, or Anthropic's
    assert f"grep -n -E '{pattern}' {out}" in err
    assert "serve it with --served-model-name" in err  # what to do about a 404
    # the hint lists exactly the failed lines
    listed = subprocess.run(["grep", "-n", "-E", pattern, str(out)], capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 6

    mixed = write_jsonl(tmp_path / "mixed.jsonl", bodies[:3] + [dict(bodies[0], model="forgotten")])
    assert run_cli(str(mixed), "-o", str(out), "--workers", "1") == 0
    err = capsys.readouterr().err
    assert "4 records, 3 ok, 1 failed (404: 1)" in err and "(first at line 4)" in err
    assert run_cli(str(mixed), "-o", str(out), "--workers", "1", "--fail-on-error") == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert run_cli(str(empty), "-o", str(out), "--workers", "1") == 0
    assert out.read_text() == ""


def test_progress_shows_total_and_eta_when_forced(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies())
    size = src.stat().st_size
    assert run_cli(str(src), "-o", str(tmp_path / "o.jsonl"), "--workers", "1", "--progress") == 0
    err = capsys.readouterr().err  # stderr is not a terminal here: shown because forced
    assert "100%" in err and "/" + tqdm.format_sizeof(size, divisor=1024) in err  # a total, in bytes of the input
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", err)  # elapsed<remaining (ETA)
    assert run_cli(str(src), "-o", str(tmp_path / "o.jsonl"), "--workers", "1", "--no-progress") == 0
    err = capsys.readouterr().err
    assert "%|" not in err and "batch:" in err


def test_progress_counts_records_in_plain_digits(tmp_path, capsys):
    """The bar's record count is a number a person reads (``records=10000``), not tqdm's
    ``format_num`` of an int postfix (``1e+4``)."""
    src = tmp_path / "in.jsonl"  # 9,999 blank lines (instant 400s) and one body: 10,000 records
    src.write_text("\n" * 9999 + json.dumps(qwen3_bodies()[0]) + "\n")
    assert run_cli(str(src), "-o", str(tmp_path / "o.jsonl"), "--workers", "1", "--progress") == 0
    err = capsys.readouterr().err
    assert "records=10000]" in err and "e+" not in err


def test_sigkilled_run_leaves_earlier_output_whole(tmp_path):
    """A run killed while writing never leaves a half-written file at the output path."""
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies() * 60)
    out = tmp_path / "out.jsonl"
    out.write_text("earlier output\n")
    proc = _spawn([str(src), "-o", str(out), "--workers", "1"], tmp_path)

    def writing() -> bool:
        return any(p.name.startswith(".out.jsonl.") and p.stat().st_size > 0 for p in tmp_path.iterdir())
    _wait_for(writing, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert out.read_text() == "earlier output\n"


@pytest.mark.parametrize("workers", [["--workers", "1"], ["--workers", "2"],
                                     ["--workers", "2", "--max-in-flight", "4", "--chunksize", "1"]],
                         ids=["1", "2", "2-full-window"])
def test_sigterm_removes_the_temporary_output_and_exits_143(tmp_path, workers):
    """``kill PID`` (SIGTERM, what job schedulers send) cleans up as Ctrl-C does: no temporary
    file left, earlier output untouched, one line, status 143, no pool process left behind."""
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies() * 60)
    out = tmp_path / "out.jsonl"
    out.write_text("earlier output\n")
    proc = _spawn([str(src), "-o", str(out), *workers], tmp_path)

    def writing() -> bool:
        return any(p.name.startswith(".out.jsonl.") and p.stat().st_size > 0 for p in tmp_path.iterdir())
    _wait_for(writing, proc)
    proc.send_signal(signal.SIGTERM)  # (2-full-window: the pool's task thread waits on the window)
    _, err = proc.communicate(timeout=60)  # (a hang is a failure, never a stuck suite)
    err = err.decode()
    assert proc.returncode == 143, err
    assert terminated_lines(err) == [TERMINATED]
    assert out.read_text() == "earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def _streamed_log() -> list[dict]:
    """Stream chunk bodies of several requests interleaved with non-streaming bodies (so requests
    span part boundaries), repeated to make a run of a few seconds."""
    cases = [c for c in corpus() if c["model"] == "qwen3" and (c.get("expected") or {}).get("stream") is not None
             and (c.get("expected_vllm") or {}).get("inputs", {}).get("choices") and not missing_parser(c)][:10]
    rng = random.Random(11)
    plain = qwen3_bodies()
    lines: list[dict] = []
    for rep in range(6):
        queues = []
        for c in cases:
            bodies = to_requests.stream_bodies(c)
            for b in bodies:
                b["generate_chunk"]["request_id"] = f"{b['generate_chunk'].get('request_id')}-{rep}"
            queues.append(bodies)
        while any(queues):
            q = rng.choice([q for q in queues if q])
            lines.append(q.pop(0))
            if rng.random() < 0.5:
                lines.append(plain[rng.randrange(len(plain))])
    return lines


def test_killed_run_resumes_to_the_uninterrupted_output(tmp_path):
    log = _streamed_log()
    src = write_jsonl(tmp_path / "in.jsonl", log)
    ref = tmp_path / "ref.jsonl"
    assert run_cli(str(src), "-o", str(ref), "--workers", "2", "--no-progress") == 0

    out = tmp_path / "out.jsonl.gz"
    parts = tmp_path / "out.jsonl.gz.parts"
    args = [str(src), "-o", str(out), "--workers", "2", "--resume", "--part-size", "97"]
    proc = _spawn(args, tmp_path)
    _wait_for(lambda: parts.is_dir() and len(list(parts.glob("part-*.jsonl.gz"))) >= 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    done_before = sorted(p.name for p in parts.glob("part-*.jsonl.gz"))
    n_parts = -(-len(log) // 97)
    assert 2 <= len(done_before) < n_parts, "the kill came too late to test a resume"

    rerun = _spawn(args, tmp_path)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err.decode()[-2000:]
    assert f"{len(done_before) * 97} from completed parts" in err.decode()
    assert gzip.decompress(out.read_bytes()) == ref.read_bytes()
    assert not parts.exists()


def test_resume_refuses_parts_of_another_input(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:10])
    out = tmp_path / "out.jsonl"
    assert run_cli(str(src), "-o", str(out), "--workers", "1", "--part-size", "4", "--keep-parts") == 0
    write_jsonl(src, qwen3_bodies()[:12])
    assert run_cli(str(src), "-o", str(out), "--workers", "1", "--part-size", "4", "--resume") == 2
    assert "cannot resume" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 10  # the earlier output is untouched


@pytest.mark.parametrize("workers", [1, 2])
def test_part_files_assemble_to_the_single_file_output(tmp_path, workers):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies())
    assert run_cli(str(src), "-o", str(tmp_path / "a.jsonl"), "--workers", str(workers)) == 0
    assert run_cli(str(src), "-o", str(tmp_path / "b.jsonl"), "--workers", str(workers), "--part-size", "7") == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "in.jsonl"]


def test_part_files_never_clear_a_foreign_folder(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:3])
    foreign = tmp_path / "out.jsonl.parts"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert run_cli(str(src), "-o", str(tmp_path / "out.jsonl"), "--workers", "1", "--part-size", "2") == 2
    assert "not a parts folder" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "mine" and not (tmp_path / "out.jsonl").exists()
