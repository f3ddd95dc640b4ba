"""One registry of parsers keyed by vLLM's public CLI names (``--reasoning-parser NAME``,
``--tool-parser NAME``). Families register themselves in ``worker/parsers/families/*.py``;
importing ``worker.parsers`` loads them all.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.parsers.base import ReasoningParser, ToolParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}
TOOL_PARSERS: dict[str, type[ToolParser]] = {}
#: human-readable facts per parser name, for the docs/parsers.md table: (families, format, recoveries)
DOCS: dict[tuple[str, str], tuple[str, str, str]] = {}


def register_reasoning(name: str, families: str = "", fmt: str = "") -> Callable[[type], type]:
    """Class decorator: register a ``ReasoningParser`` subclass under ``name``."""

    def deco(cls: type) -> type:
        cls.name = name
        REASONING_PARSERS[name] = cls
        DOCS[("reasoning", name)] = (families, fmt, "")
        return cls

    return deco


def register_tool(name: str, families: str = "", fmt: str = "", recovers: str = "") -> Callable[[type], type]:
    """Class decorator: register a ``ToolParser`` subclass under ``name``. ``recovers``: the
    malformed markup the family turns into calls beyond its format (docs/parsers.md table; the family
    docstring gives the rule and its source), empty when none is specific to it."""

    def deco(cls: type) -> type:
        cls.name = name
        TOOL_PARSERS[name] = cls
        DOCS[("tool", name)] = (families, fmt, recovers)
        return cls

    return deco


def make_reasoning_parser(name: str | None, tok: Any) -> ReasoningParser | None:
    """Instantiate the reasoning parser ``name`` for tokenizer ``tok`` (None -> None).
    Raises ``ValueError`` for an unknown name (listing the known ones)."""
    if not name or name in ("none", "identity"):
        return None
    try:
        return REASONING_PARSERS[name](tok)
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}") from None


def make_tool_parser(name: str | None, tok: Any) -> ToolParser | None:
    """Instantiate the tool parser ``name`` for tokenizer ``tok`` (None -> None).
    Raises ``ValueError`` for an unknown name."""
    if not name or name == "none":
        return None
    try:
        return TOOL_PARSERS[name](tok)
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(TOOL_PARSERS))}") from None
