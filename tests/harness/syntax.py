"""Syntax trees of source files for the layout tests, parsed in a fresh interpreter."""
from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

_PARSE = ("import ast, pickle, sys; sys.stdout.buffer.write(pickle.dumps("
          "[ast.parse(open(p, encoding='utf-8').read(), p) for p in sys.argv[1:]]))")


def parse_all(paths: list[Path]) -> list[ast.Module]:
    """The syntax trees of ``paths`` (same order), parsed in a fresh interpreter and unpickled
    here: CPython 3.11's AST constructor keeps its recursion counter in per-interpreter state, so
    a thread an earlier test left running that parses at the same moment makes ``ast.parse`` in
    the test process raise SystemError "recursion depth mismatch" (cpython gh-106905)."""
    out = subprocess.run([sys.executable, "-c", _PARSE, *map(str, paths)], capture_output=True, check=True)
    return pickle.loads(out.stdout)
