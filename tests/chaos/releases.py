"""The release a rolling upgrade rolls from (and a rollback rolls back to), checked out as a
detached ``git worktree`` of the repository the tests run in (``tests/chaos/rolling.py``).

``PREVIOUS_RELEASE`` is the one place that names it: each release bumps it to the commit of the
previous release's main (the release that may still be running when this one is deployed).
``CHAOS_PREVIOUS_RELEASE=<commit>`` overrides it for a manual probe (for example an older main
whose stream state format differs), never in CI."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.chaos.harness import REPO

#: the previous release's main (full hash); bumped by every release to the main it replaces
PREVIOUS_RELEASE = "e8f2be210e273f8a3494de24a420e7e56c723341"

#: every earlier release that may share a pool's Redis with this one (full hash -> the directory
#: of its golden stream state under ``tests/data/golden_state/``, written by a real worker of it),
#: oldest first: this release reads what each wrote, and each reads what this release writes, run
#: by its own code (``tests/test_state_golden.py``). A release adds its main here when it
#: becomes a previous release; an entry goes only with a documented end of that release's support
#: (docs/delivery.md, "Rolling upgrades across releases").
EARLIER_RELEASES = {
    "e8f2be210e273f8a3494de24a420e7e56c723341": "v6",
    "638fca13a0d23db739545eea87908847f1729dc6": "v6-638fca1",
}

#: per earlier release (``EARLIER_RELEASES``), the body fields that tell the record kinds added
#: since it (issue 26: Anthropic Messages, added by 638fca1). That release has no such kind and
#: answers these records with a 400, so a roll's load from or back to it leaves them out: a new
#: kind is served once the roll completes, and a rollback ends it (docs/delivery.md, "Rolling
#: upgrades across releases").
NEW_KIND_FIELDS_SINCE = {
    "e8f2be210e273f8a3494de24a420e7e56c723341": ("messages_request",),
    "638fca13a0d23db739545eea87908847f1729dc6": (),
}
#: the same for ``PREVIOUS_RELEASE``
NEW_KIND_FIELDS = NEW_KIND_FIELDS_SINCE[PREVIOUS_RELEASE]


class NotAGitCheckout(RuntimeError):
    """The tests do not run in a git checkout (an sdist, an unpacked archive): there is no
    previous release to check out, so the rolling scenarios cannot run (a skip, with this reason)."""


def previous_serves(value: bytes, release: str | None = None) -> bool:
    """Whether the earlier ``release`` (full hash; default ``PREVIOUS_RELEASE``) serves a record
    whose value is the JSON body ``value``: it carries no field of a kind added since
    (``NEW_KIND_FIELDS_SINCE``; a commit not listed there: ``NEW_KIND_FIELDS``)."""
    fields = NEW_KIND_FIELDS_SINCE.get(release or PREVIOUS_RELEASE, NEW_KIND_FIELDS)
    body = json.loads(value)
    return not (isinstance(body, dict) and any(f in body for f in fields))


def previous_release() -> str:
    """The commit to roll from / back to: ``CHAOS_PREVIOUS_RELEASE`` when set, else ``PREVIOUS_RELEASE``."""
    return os.environ.get("CHAOS_PREVIOUS_RELEASE") or PREVIOUS_RELEASE


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=check, timeout=120)


def resolve(commit: str) -> str:
    """Full hash of ``commit`` in the repository of the tests.

    Raises ``NotAGitCheckout`` (no git, or not a checkout) and ``AssertionError`` (the commit is
    not in this clone: a shallow or partial clone, or a hash that was never on main)."""
    if shutil.which("git") is None:
        raise NotAGitCheckout("git not installed: cannot check out the previous release")
    top = _git("rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO:
        raise NotAGitCheckout(f"{REPO} is not a git checkout (sdist?): no previous release to roll from")
    r = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
    assert r.returncode == 0, (
        f"the previous release {commit} (tests/chaos/releases.py PREVIOUS_RELEASE) is not in this clone "
        f"of {REPO}: a shallow clone? (git fetch --unshallow) or a commit that is not on main")
    return r.stdout.strip()


@contextlib.contextmanager
def release_tree(commit: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``commit`` in a temporary folder (its ``worker`` package
    runs with ``PYTHONPATH`` and the working directory set to it); removed afterwards.

    Raises as ``resolve``; ``subprocess.CalledProcessError`` when git cannot add the worktree."""
    full = resolve(commit)
    tmp = Path(tempfile.mkdtemp(prefix="chaos-release-"))
    tree = tmp / full[:12]
    try:
        _git("worktree", "add", "--detach", str(tree), full)
        yield tree
    finally:
        _git("worktree", "remove", "--force", str(tree), check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        _git("worktree", "prune", check=False)
