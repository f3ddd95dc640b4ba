"""What this build is: the package version and the stream-state formats it reads and writes, for
``derender-worker --version`` and the ``derender_build_info`` metric (Prometheus' ``*_build_info``
convention: one series at 1, the facts as labels). During a rolling upgrade these tell which
release each worker runs (docs/delivery.md, "Rolling upgrades across releases")."""
from __future__ import annotations

from importlib import metadata

from worker.state.formats import CURRENT, FORMATS

__all__ = ["version", "state_formats_read", "version_line"]

#: the distribution name in pyproject.toml
DIST = "derender-worker"


def version() -> str:
    """The installed distribution's version (PEP 440 string), or ``"unknown"`` when the package
    runs from a tree that was never installed."""
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return "unknown"


def state_formats_read() -> str:
    """The stream-state formats this release reads, ascending, comma separated (e.g. ``"6"``)."""
    return ",".join(str(f) for f in sorted(FORMATS))


def version_line() -> str:
    """One line for ``--version``: ``derender-worker <version> (stream state format <CURRENT>;
    reads <formats>)``."""
    return f"{DIST} {version()} (stream state format {CURRENT}; reads {state_formats_read()})"
