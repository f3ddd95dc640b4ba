"""Batch helpers shared by the batch test modules."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

from tests.parity import missing_parser, nonstream_cases
from tests.parity_tools import to_requests
from worker.cli import main as cli_main
from worker.offline import formats


def table_json_columns(bodies: list[dict]) -> pa.Table:
    """One row per body: object fields as JSON string columns, the rest native."""
    keys: list[str] = []
    for b in bodies:
        keys += [k for k in b if k not in keys]
    cols = {}
    for k in keys:
        vals = [b.get(k) for b in bodies]
        if k in formats.OBJECT_FIELDS:
            vals = [None if v is None else json.dumps(v) for v in vals]
        cols[k] = vals
    return pa.table(cols)


#: served-model config of the batch tests (qwen3 + qwen3-noparser: quick to load)
QWEN3 = str(Path(__file__).resolve().parents[2] / "tests" / "data" / "models.json")


ROOT = Path(__file__).resolve().parents[2]


def qwen3_bodies() -> list[dict]:
    """Non-streaming bodies of the parity cases served by ``qwen3`` (ok and refused ones)."""
    return [to_requests.nonstream_body(c) for c in nonstream_cases()
            if c["model"] == "qwen3" and not missing_parser(c)]


def write_jsonl(path: Path, bodies: list) -> Path:
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    return path


def run_cli(*args: str) -> int:
    return cli_main(["batch", *args, "--config", QWEN3])


def spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "worker.cli", "batch", *args, "--config", QWEN3,
                             "--no-progress"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def wait_for(pred, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before the kill point: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError("kill point not reached")
        time.sleep(0.02)


#: what a run ended by SIGTERM before its output was written says
TERMINATED = "derender-worker batch: terminated (SIGTERM); no output written"


def terminated_lines(err: str) -> list[str]:
    """Standard error of a run ended by SIGTERM, without the one line an aborted run may add when
    ``Pool.terminate`` is stuck (``runner._terminate``: the run then goes on without it)."""
    return [ln for ln in err.strip().splitlines() if "cpython#96995" not in ln]
