"""The package layout the project keeps (issue 17): no import cycle in ``worker`` and
``schemas`` (module-level and function-level imports alike), function-level imports only to
defer a heavy or optional dependency (each says so in a ``# deferred: ...`` comment), and the
command line's entry points: ``derender-worker`` = ``python -m worker.cli``, and the older
``python -m`` forms still answer."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.harness.cli import REPO
from tests.harness.syntax import parse_all

PACKAGES = ("worker", "schemas")
#: function-level imports in modules another branch is rewriting (issue 17's Kafka half); they
#: go with that rewrite. A new entry here needs a reason as good as that one.
PENDING = {
    ("worker/transport/consumer.py", "worker.state"), ("worker/transport/consumer.py", "worker.state.redis_store"),
    ("worker/transport/streams.py", "worker.state"), ("worker/transport/streams.py", "worker.transport.outage"),
    ("worker/transport/streams.py", "aiokafka.errors"), ("worker/transport/jobs.py", "worker.core.service"),
}


def _modules() -> dict[str, ast.Module]:
    paths = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    out = {}
    for p, tree in zip(paths, parse_all(paths), strict=True):
        name = ".".join(p.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = (p, tree)
    return out


def _targets(mod: str, path, node, mods) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = mod.split(".")
        if node.level:
            base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [target] + [f"{target}.{a.name}" for a in node.names]
    out = set()
    for t in names:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        if t and t != mod and not mod.startswith(t + "."):
            out.add(t)
    return out


def test_no_import_cycle():
    mods = _modules()
    edges = {m: set() for m in mods}
    for m, (path, tree) in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[m] |= _targets(m, path, node, mods)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m, path):
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10000)
    try:
        for m in sorted(mods):
            if m not in state:
                visit(m, [m])
    finally:  # the process-wide limit is other tests' business (deep-JSON bounds depend on it)
        sys.setrecursionlimit(limit)


def test_function_level_imports_say_why():
    bad = []
    for _, (path, tree) in _modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        rel = str(path.relative_to(REPO))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (rel, mod) in PENDING:
                    continue
                above = "\n".join(lines[max(0, node.lineno - 5):node.lineno])
                if "# deferred:" not in above:
                    bad.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, "function-level imports without a '# deferred: <why>' comment:\n" + "\n".join(bad)


@pytest.mark.parametrize("argv,usage", [
    (["-m", "worker.cli", "--help"], "usage: derender-worker"),
    (["-m", "worker.transport.run", "--help"], "usage: derender-worker run"),
    (["-m", "worker.bench", "--help"], "usage: derender-worker bench"),
    (["-m", "worker.bench_kafka", "--help"], "usage: derender-worker bench kafka"),
    (["-m", "worker.bench_batch", "--help"], "usage: derender-worker bench batch"),
    (["-m", "worker.bench_stream", "--help"], "usage: derender-worker bench stream"),
    (["-m", "worker.bench_parsers", "--help"], "usage: derender-worker bench parsers"),
    (["-m", "worker.bench_responses", "--help"], "usage: derender-worker bench responses"),
    (["-m", "worker.bench.stream", "--help"], "usage: derender-worker bench stream"),
])
def test_python_m_forms_answer(argv, usage):
    p = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert p.returncode == 0 and p.stdout.startswith(usage), (p.returncode, p.stdout[:200], p.stderr[-500:])


def test_bench_suites_and_the_kafka_alias():
    from worker.cli import parse_args
    assert parse_args(["bench"])[0].suite is None  # bare bench = core
    args, _ = parse_args(["bench", "--kafka", "--rate", "5"])
    assert args.kafka and args.rate == 5.0
    for suite in ("core", "kafka", "batch", "stream", "parsers", "responses"):
        assert parse_args(["bench", suite])[0].suite == suite
    args, _ = parse_args(["bench", "--tokens", "99", "kafka", "--rate", "7"])  # flags before and after
    assert (args.tokens, args.rate) == (99, 7.0)


def test_no_test_module_imports_another():
    """Shared test code lives in ``tests/harness`` (and ``tests/parity.py``); a test module
    never imports another (its tests would be collected twice and its fixtures leak)."""
    bad = []
    paths = sorted((REPO / "tests").rglob("test_*.py"))
    for path, tree in zip(paths, parse_all(paths), strict=True):
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{path.relative_to(REPO)}: {n}" for n in names
                    if n.rsplit(".", 1)[-1].startswith("test_") and n.startswith("tests.")]
    assert not bad, bad
