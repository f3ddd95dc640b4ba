"""Print the markdown table of every registered parser (``python -m worker.parsers.table``):
name, kind, model families, format, streaming-ready, recovered malformations. Generated from ``registry.DOCS`` (filled by
the ``register_*`` decorators), so it lists exactly what ``worker.parsers`` registers; the docs page
``docs/parsers.md`` includes its output (``--update`` rewrites it there; ``--update FILE`` in any
other markdown file holding the BEGIN/END comments).
"""
from __future__ import annotations

import sys
from pathlib import Path

from worker.parsers import REASONING_PARSERS, TOOL_PARSERS
from worker.parsers.base import ReasoningParser, ToolParser
from worker.parsers.registry import DOCS


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ").strip() or "—"


def _code(s: str) -> str:
    """``s`` as an inline code span (markers such as ``<think>`` must not render as HTML);
    ``|`` escaped for the table; a longer fence when ``s`` itself holds backticks."""
    s = _cell(s)
    if s == "—":
        return s
    fence = "``" if "`" in s else "`"
    return f"{fence} {s} {fence}" if fence == "``" else f"`{s}`"


def _streaming(cls: type) -> str:
    """Every registered parser is an incremental state machine (``feed``/``finish`` over text
    deltas with a msgspec state); "yes" when the class implements both itself or by an engine."""
    base = ReasoningParser if issubclass(cls, ReasoningParser) else ToolParser
    ok = cls.feed is not base.feed and cls.finish is not base.finish
    return "yes" if ok else "no"


def rows() -> list[tuple[str, str, str, str, str, str]]:
    """``(name, kind, families, format, streaming, recoveries)`` sorted by kind then name."""
    out = []
    for (kind, name), (families, fmt, recovers) in DOCS.items():
        cls = (REASONING_PARSERS if kind == "reasoning" else TOOL_PARSERS).get(name)
        if cls is None:
            continue
        out.append((name, kind, families, fmt, _streaming(cls), recovers))
    out.sort(key=lambda r: (r[1], r[0]))
    return out


def markdown() -> str:
    lines = ["| name | kind | model families | format | streaming-ready | also recovers |",
             "|---|---|---|---|---|---|"]
    for name, kind, families, fmt, streaming, recovers in rows():
        lines.append(f"| `{name}` | {kind} | {_cell(families)} | {_code(fmt)} | {streaming} | {_cell(recovers)} |")
    lines.append("")
    lines.append("`--reasoning-parser none`/`identity` and `--tool-parser none` (or no flag) run no parser: "
                 "the output is all content.")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- BEGIN parser table (python -m worker.parsers.table) -->\n", "<!-- END parser table -->"
#: the page that holds the table, relative to the repository root (the default of ``--update``)
DOC_PAGE = "docs/parsers.md"


def update(path: str) -> None:
    """Rewrite the table between the BEGIN/END comments of the markdown file ``path``."""
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    i, j = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc[:i] + markdown() + doc[j:])


def main() -> None:
    """Print the table; ``--update [FILE]`` rewrites it inside FILE (default: ``DOC_PAGE`` of the
    checkout this module lives in, ``docs/parsers.md``, whatever the current directory)."""
    if len(sys.argv) in (2, 3) and sys.argv[1] == "--update":
        update(sys.argv[2] if len(sys.argv) == 3 else str(Path(__file__).resolve().parents[2] / DOC_PAGE))
        return
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
