"""``derender-worker schemas``: regenerate ``schemas/*.schema.json`` from the msgspec Structs
(``python -m schemas`` is the same with ``--check``)."""
from __future__ import annotations

import argparse

from schemas.__main__ import main as schemas_main

HELP = "regenerate schemas/*.schema.json from the msgspec Structs"

__all__ = ["HELP", "add_args", "main"]


def add_args(p: argparse.ArgumentParser) -> None:
    """``schemas`` has no flags of its own."""


def main(args: argparse.Namespace) -> int:
    """Write every schema file, naming each; returns ``python -m schemas``'s exit status."""
    return schemas_main(["--verbose"])
