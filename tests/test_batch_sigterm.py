"""SIGTERM (``kill PID``, a job scheduler's stop) at any instant of a ``batch`` run gives one of two
consistent outcomes: the temporary output removed, an earlier output untouched and status 143, or,
once the output was renamed into place, the complete output and the run's own status. A standard
input whose writer stays open does not delay the first."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.harness.batch import (
    QWEN3,
    ROOT,
    TERMINATED,
    qwen3_bodies,
    run_cli,
    table_json_columns,
    terminated_lines,
    write_jsonl,
)
from tests.harness.batch import wait_for as _wait_for
from worker.cli import batch as cli_batch
from worker.offline import commit


def _writing(d) -> bool:
    return any(p.name.startswith(".out.jsonl.") and p.stat().st_size > 0 for p in d.iterdir())


@pytest.mark.parametrize("mode", ["1", "2", "2-gzip"])
def test_sigterm_ends_a_run_whose_stdin_stays_open(tmp_path, mode):
    """``producer | batch - -o OUT`` with a producer that keeps its end open: SIGTERM ends the run
    while the reader is blocked on standard input (with ``--workers 2`` the read happens in the
    pool's task thread, which ``Pool.terminate`` joins)."""
    out = tmp_path / "out.jsonl"
    out.write_text("earlier output\n")
    data = "".join(json.dumps(b) + "\n" for b in qwen3_bodies()).encode()
    if mode.endswith("gzip"):
        data = gzip.compress(data)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "batch", "-", "-o", str(out), "--config", QWEN3,
                             "--no-progress", "--workers", mode[0], "--chunksize", "1",
                             "--max-in-flight", "100000"], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(data)
        proc.stdin.flush()  # and kept open: the run cannot reach the end of its input
        # results being written: the reader (no window: --max-in-flight) consumed the input long
        # before and waits in a read of standard input
        _wait_for(lambda: _writing(tmp_path), proc)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)  # generous: a hang (the bug) is a failure, never a stuck suite
        err = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.stdin.close()
        proc.wait()
    assert rc == 143, err
    assert terminated_lines(err) == [TERMINATED]
    assert out.read_text() == "earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def _signal_at(monkeypatch, instant: str) -> None:
    """Send this process SIGTERM at ``instant`` of the run's end: ``before-commit`` (the output
    complete in its temporary file, not yet renamed), ``after-rename`` (``os.replace`` of the
    final output done, its folder not yet synced), ``after-run`` (the summary being printed)."""
    def term() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the Python handler runs before this returns

    real_rename, real_summary = commit._fsync_rename, cli_batch.summary_lines

    def rename(tmp: str, final: str) -> None:
        real_rename(tmp, final)
        if os.path.basename(final).startswith("out.jsonl"):
            term()

    def summary(*a, **kw):
        term()
        return real_summary(*a, **kw)
    if instant == "after-rename":
        monkeypatch.setattr(commit, "_fsync_rename", rename)
    elif instant == "after-run":
        monkeypatch.setattr(cli_batch, "summary_lines", summary)
    else:
        for cls in (commit.SingleFileSink, commit.PartSink):
            real_finish = cls.finish

            def finish(self, n_parts, _real=real_finish):
                term()
                return _real(self, n_parts)
            monkeypatch.setattr(cls, "finish", finish)


@pytest.mark.parametrize("instant", ["before-commit", "after-rename", "after-run"])
@pytest.mark.parametrize("how", [["--workers", "1"], ["--workers", "2"], ["--workers", "1", "--part-size", "3"],
                                 ["--workers", "2", "parquet"]], ids=["1", "2", "parts", "2-parquet-input"])
def test_sigterm_at_the_commit_gives_a_consistent_outcome(tmp_path, monkeypatch, capsys, instant, how):
    """Before the final rename: nothing written, 143. From the rename on, the output is complete:
    the run finishes (summary, status 0) and says the SIGTERM came after the output was written,
    never 'no output written' over a written output."""
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:8])
    if "parquet" in how:  # the same records as a Parquet input
        how = how[:-1]
        pq.write_table(table_json_columns(qwen3_bodies()[:8]), src)
        src = src.rename(tmp_path / "in.parquet")
        assert run_cli(str(src), "-o", str(tmp_path / "ref.jsonl"), "--workers", "1") == 0
    else:
        assert run_cli(str(src), "-o", str(tmp_path / "ref.jsonl"), "--workers", "1") == 0
    out = tmp_path / "out.jsonl"
    out.write_text("earlier output\n")
    capsys.readouterr()
    _signal_at(monkeypatch, instant)
    rc = run_cli(str(src), "-o", str(out), *how)
    err = capsys.readouterr().err
    kept = ["out.jsonl.parts"] if instant == "before-commit" and "--part-size" in how else []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, "out.jsonl", "ref.jsonl", *kept])
    if instant == "before-commit":
        assert rc == 143, err
        assert out.read_text() == "earlier output\n"
        assert TERMINATED in err
        assert not kept or sorted(p.name for p in (tmp_path / kept[0]).iterdir() if p.suffix == ".jsonl") == \
            ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]  # completed parts kept
    else:
        assert rc == 0, err
        assert out.read_bytes() == (tmp_path / "ref.jsonl").read_bytes()
        assert "no output written" not in err and "batch: 8 records" in err
        assert "SIGTERM received after the output was written" in err


#: runs ``batch`` with a lock of the run's main thread (``threading.Semaphore``'s condition: the
#: window; ``IMapIterator``'s: the pool's results) taken at its 20th use, and SIGTERM delivered
#: right then, as when the signal lands between a ``with lock:``'s acquire and its block
_LOCK_RACE = """
import os, signal, sys, threading
from multiprocessing import pool as mp_pool
from worker.cli import main
cls, name = {"window": (threading.Semaphore, "release"), "results": (mp_pool.IMapIterator, "next")}[sys.argv[1]]
real, calls = getattr(cls, name), [0]
def wrapped(self, *a, **kw):
    if threading.current_thread() is threading.main_thread():
        calls[0] += 1
        if calls[0] == 20:
            self._cond.acquire()
            os.kill(os.getpid(), signal.SIGTERM)  # a handler that raises here leaves the lock held
            self._cond.release()
    return real(self, *a, **kw)
setattr(cls, name, wrapped)
if name == "next":  # also its alias, which a for loop calls
    cls.__next__ = wrapped
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("lock", ["window", "results"])
def test_sigterm_inside_a_lock_shared_with_the_pool_threads(tmp_path, lock):
    """With ``--workers 2`` a SIGTERM is raised at a safe point of the result loop, never inside a
    lock the pool's threads (or the cleanup) need: 143, temporary output removed, no hang."""
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies() * 10)
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _LOCK_RACE, lock, "batch", str(src), "-o", str(out), "--config",
                           QWEN3, "--no-progress", "--workers", "2", "--chunksize", "1"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=120)  # generous: a hang (the bug) is a failure
    err = proc.stderr.decode()
    assert proc.returncode == 143, err
    assert terminated_lines(err) == [TERMINATED]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_results_slower_than_the_poll_interval_are_waited_for(tmp_path, monkeypatch):
    """With a pool the result loop waits ``runner.POLL_S`` at a time (to act on a deferred SIGTERM):
    a result slower than that is waited for again, never an error."""
    from worker.offline import runner
    src = write_jsonl(tmp_path / "in.jsonl", qwen3_bodies()[:40])
    assert run_cli(str(src), "-o", str(tmp_path / "ref.jsonl"), "--workers", "1") == 0
    monkeypatch.setattr(runner, "POLL_S", 1e-6)
    assert run_cli(str(src), "-o", str(tmp_path / "out.jsonl"), "--workers", "2", "--chunksize", "4") == 0
    assert (tmp_path / "out.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_a_stuck_pool_teardown_does_not_hold_the_aborted_run(capsys):
    """``Pool.terminate`` can block for ever (cpython#96995): an aborted run waits for it a bounded
    time, says so, and goes on; a teardown that returns is reported as finished."""
    import threading

    from worker.offline import runner

    class Stuck:
        def __init__(self):
            self.release = threading.Event()

        def terminate(self):
            self.release.wait()

    stuck = Stuck()
    try:
        assert runner._terminate(stuck, wait_s=0.2) is False
    finally:
        stuck.release.set()
    assert "cpython#96995" in capsys.readouterr().err

    class Quick:
        def terminate(self):
            return None

    assert runner._terminate(Quick(), wait_s=5) is True


def test_ctrl_c_to_the_process_group_exits_130_without_a_pool_traceback(tmp_path):
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group, the pool
    processes included: the batch process ends the run (status 130, the temporary output removed,
    an earlier output untouched) and no pool process prints a ``KeyboardInterrupt`` traceback."""
    out = tmp_path / "out.jsonl"
    out.write_text("earlier output\n")
    data = "".join(json.dumps(b) + "\n" for b in qwen3_bodies()).encode()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "batch", "-", "-o", str(out), "--config", QWEN3,
                             "--no-progress", "--workers", "2", "--chunksize", "1"], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True,  # its own group, as a terminal's foreground job
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.stdin.write(data)
        proc.stdin.flush()  # kept open: the run is still going when the signal comes
        _wait_for(lambda: _writing(tmp_path), proc)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
        err = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.stdin.close()
        proc.wait()
    assert rc == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "PoolWorker" not in err, err
    assert "interrupted" in err, err
    assert out.read_text() == "earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
