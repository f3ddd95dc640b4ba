"""The ``derender-worker`` console entry point as a subprocess (``python -m worker.cli`` with this
tree on ``PYTHONPATH`` and no inherited ``DERENDER_*`` variable), and the check that a startup
mistake is exactly one stderr line and exit status 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QWEN3 = str(REPO / "tests" / "data" / "tokenizers" / "qwen3")


def cli(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m worker.cli *argv``; ``env`` adds variables to a copy of this environment
    without its ``DERENDER_*`` ones. Returns the finished process (text stdout/stderr)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_")}
    e["PYTHONPATH"] = str(REPO)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "worker.cli", *argv], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert exit status 2, exactly one non-blank stderr line containing every ``needle``, and
    no traceback; returns that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in proc.stderr
    return lines[0]
