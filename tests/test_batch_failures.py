"""``batch`` defects of issue 16, each reproduced: a line that is a JSON list but not one request's
chunk bodies (``[1,2,3]``, ``[]``) is a named error the suggested grep lists; a SIGKILLed run leaves
no traceback flood from its pool processes and a later run removes its stale temporary file (only
those of dead pids); a full disk (``/dev/full``: the kernel's ENOSPC, on ``flush`` and again on
``close``) leaves no temporary file; a failed part-file run's folder can be resumed; ``.gz`` output
is byte-identical across runs; an unusable output path is one line naming it, before models load."""
from __future__ import annotations

import builtins
import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.batch import QWEN3, ROOT, qwen3_bodies, run_cli, write_jsonl
from tests.harness.batch import spawn as _spawn
from tests.harness.batch import wait_for as _wait_for
from worker.offline import commit


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "worker.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _stream_list(body: dict) -> list[dict]:
    """One request's chunk bodies (to_requests.py --stream's line format) from a parity case."""
    from tests.parity import corpus, missing_parser
    from tests.parity_tools import to_requests
    case = next(c for c in corpus() if c["model"] == "qwen3" and (c.get("expected") or {}).get("stream") is not None
                and not missing_parser(c))
    return to_requests.stream_bodies(case)


def test_json_list_lines_that_are_not_chunk_lists_are_named_errors(tmp_path, capsys):
    ok = qwen3_bodies()[0]
    refused = _stream_list(ok)
    refused[0] = dict(refused[0], model="forgotten")  # a real chunk list whose first chunk is refused
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([json.dumps(ok), "[1,2,3]", "[]", json.dumps(refused), json.dumps(ok)]) + "\n")
    out = tmp_path / "out.jsonl"
    assert run_cli(str(src), "-o", str(out), "--workers", "1") == 0
    err = capsys.readouterr().err
    assert "5 records, 2 ok, 3 failed" in err, err
    assert "element 0 is not a JSON object" in err and "(first at line 2)" in err
    assert "empty array" in err and "(first at line 3)" in err
    assert "The model `forgotten` does not exist" in err and "(first at line 4)" in err
    assert "''" not in err  # every failure has its message
    lines = out.read_text().splitlines()
    assert json.loads(lines[1])["error"]["code"] == 400 and json.loads(lines[2])["error"]["code"] == 400
    hint = err.strip().splitlines()[-1].split("list them: ", 1)[1]
    listed = subprocess.run(hint, shell=True, capture_output=True, text=True).stdout
    assert [ln.split(":", 1)[0] for ln in listed.splitlines()] == ["2", "3", "4"]


def test_sigkill_leaves_no_traceback_and_the_next_run_removes_the_stale_temp(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies() * 100)  # 27 MB, some records of 4k tokens
    out = tmp_path / "out.jsonl"
    # two pool processes busy with chunks when the parent dies: they fail writing their results
    proc = _spawn([str(src), "-o", str(out), "--workers", "2", "--max-in-flight", "4000"], tmp_path)
    stale = tmp_path / f".out.jsonl.{proc.pid}.tmp"

    def writing() -> bool:
        try:
            return stale.stat().st_size > 2_000_000
        except FileNotFoundError:
            return False
    _wait_for(writing, proc)
    # stop the parent first: the pool processes go on and block writing results into the full
    # result pipe; killing the parent then breaks that pipe under them (without the fix: a
    # BrokenPipeError traceback per process, every time)
    proc.send_signal(signal.SIGSTOP)
    time.sleep(2)
    proc.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    err = proc.stderr.read().decode()  # EOF once every pool process (holding stderr) is gone too
    assert time.monotonic() - t0 < 10, "pool processes outlived the killed parent"
    proc.wait()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
    assert stale.exists()
    other = subprocess.Popen(["sleep", "120"])  # stands for a concurrent run (a live pid)
    try:
        live = tmp_path / f".out.jsonl.{other.pid}.tmp"
        live.write_text("busy")
        assert run_cli(str(src), "-o", str(out), "--workers", "1", "--no-progress") == 0
        assert not stale.exists() and live.read_text() == "busy"  # only the dead pid's file went
    finally:
        other.kill()
        other.wait()
    assert len(out.read_text().splitlines()) == len(qwen3_bodies()) * 100


_PARENT = """
import os, sys, time
from worker.offline.runner import _pool_init
parent = os.getpid()
child = os.fork()
if child == 0:
    _pool_init(parent)
    time.sleep(60)  # busy in a chunk, say
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


def test_a_batch_pool_process_dies_with_its_parent():
    """The pool initializer (``_pool_init``): when the batch process is killed hard, its pool
    processes are killed too (PR_SET_PDEATHSIG), whatever they were doing, so none lives on to
    fail writing a result to the gone parent."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], env=env, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the child has called _pool_init
    os.kill(child, 0)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the pool process outlived its killed parent")


def _full_disk(monkeypatch, match: str) -> None:
    """Files of ``worker.offline.commit`` whose path contains ``match`` are created, but their
    writes go to /dev/full (ENOSPC from the kernel on flush, and again on close)."""
    real_open = builtins.open

    def open_(path, mode="r", *a, **kw):
        if match in os.fspath(path) and "w" in mode:
            real_open(path, mode).close()
            return real_open("/dev/full", mode)
        return real_open(path, mode, *a, **kw)
    monkeypatch.setattr(commit, "open", open_, raising=False)


def test_atomic_file_removes_its_temp_when_close_fails_again(tmp_path, monkeypatch):
    _full_disk(monkeypatch, "out.bin")
    with pytest.raises(OSError) as e, commit.atomic_file(str(tmp_path / "out.bin")) as f:
        f.write(b"x" * 100)  # buffered: the ENOSPC comes from flush(), then again from close()
    assert e.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_disk_full_leaves_no_temp_and_the_part_run_resumes(tmp_path, monkeypatch, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:9])
    ref = tmp_path / "ref.jsonl"
    assert run_cli(str(src), "-o", str(ref), "--workers", "1") == 0
    out = tmp_path / "out.jsonl"
    out.write_text("earlier output\n")
    _full_disk(monkeypatch, "out.jsonl")
    assert run_cli(str(src), "-o", str(out), "--workers", "1") == 2
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl", "ref.jsonl"]  # no temp file
    assert out.read_text() == "earlier output\n"

    # part files: part 0 is written, part 1 hits the full disk
    monkeypatch.undo()
    _full_disk(monkeypatch, "part-00001.jsonl")
    args = [str(src), "-o", str(out), "--workers", "1", "--part-size", "4", "--resume"]
    assert run_cli(*args) == 2
    parts = tmp_path / "out.jsonl.parts"
    assert sorted(p.name for p in parts.iterdir()) == ["manifest.json", "part-00000.json", "part-00000.jsonl"]
    monkeypatch.undo()  # space freed
    capsys.readouterr()
    assert run_cli(*args) == 0
    assert "4 from completed parts" in capsys.readouterr().err
    assert out.read_bytes() == ref.read_bytes() and not parts.exists()


def test_parts_folder_of_a_run_that_failed_before_its_manifest_resumes(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:5])
    parts = tmp_path / "out.jsonl.parts"
    parts.mkdir()
    (parts / ".manifest.json.99999999.tmp").write_text("{")  # the manifest write was cut short
    assert run_cli(str(src), "-o", str(tmp_path / "out.jsonl"), "--workers", "1", "--part-size", "2",
                   "--resume") == 0
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5 and not parts.exists()


def test_gz_output_is_byte_identical_across_runs(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:8])
    out = tmp_path / "out.jsonl.gz"
    assert run_cli(str(src), "-o", str(out), "--workers", "1") == 0
    first = out.read_bytes()
    time.sleep(1.1)  # a header mtime would differ now
    assert run_cli(str(src), "-o", str(out), "--workers", "2") == 0
    assert out.read_bytes() == first
    # RFC 1952 header: FLG without FNAME (0x08), MTIME 0
    assert first[3] & 0x08 == 0 and first[4:8] == b"\0\0\0\0"
    assert b".tmp" not in first[:64]
    assert gzip.decompress(first).count(b"\n") == 8


def test_unusable_output_is_one_line_naming_it_before_models_load(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:1])
    missing_model = str(tmp_path / "no-such-model")  # would be the error if models loaded first
    (tmp_path / "a-file").write_text("x")
    for out, why in [(tmp_path / "no-such-dir" / "out.jsonl", "does not exist"),
                     (tmp_path / "a-file" / "out.jsonl", "is not a folder"),
                     (tmp_path, "is a folder"),
                     ("/proc/out.jsonl", "cannot create a file in '/proc'")]:
        p = _cli("batch", str(src), "-o", str(out), "--model", missing_model)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and f"output {str(out)!r}" in lines[0] and why in lines[0], p.stderr
        assert "no-such-model" not in p.stderr and ".tmp" not in p.stderr
    p = _cli("batch", str(src), "-o", str(tmp_path / "ok.jsonl"), "--config", QWEN3, "--workers", "1")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["a-file", "in.jsonl", "ok.jsonl"]  # the probe file is gone
