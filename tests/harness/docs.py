"""The user-facing documentation as the tests read it: ``README.md`` (first screen, what it is, a
tour, links) and the topic pages under ``docs/`` that hold the reference (index ``docs/README.md``).

``page(name)`` is one page's text (``"README.md"`` is the repository's README, anything else a file
of ``docs/``); ``headings(text)`` the markdown headings outside fenced code blocks; ``slug(title)``
GitHub's anchor for a heading (lower case, punctuation other than ``-``/``_`` dropped, spaces to
``-``: the rule github.com applies to rendered markdown headings); ``links(text)`` the relative
link targets ``(path, anchor)`` of a page (``http(s)://`` and ``mailto:`` left out)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def page(name: str) -> str:
    """Text of ``README.md`` (``name == "README.md"``) or of ``docs/<name>``; ``FileNotFoundError``
    when the page does not exist."""
    path = REPO / name if name == "README.md" else DOCS / name
    return path.read_text(encoding="utf-8")


def headings(text: str) -> list[str]:
    """Heading titles of markdown ``text`` (``#`` .. ``######`` lines outside ``` fences)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(m.group(1).strip())
    return out


def slug(title: str) -> str:
    """GitHub's anchor of a heading title (e.g. ``Reliability: the chaos suite`` ->
    ``reliability-the-chaos-suite``)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def links(text: str) -> list[tuple[str, str]]:
    """Relative link targets of ``text``'s ``[label](target)`` links outside code fences, as
    ``(path, anchor)``; path ``""`` for an anchor into the same page."""
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        out.append((path, anchor))
    return out
