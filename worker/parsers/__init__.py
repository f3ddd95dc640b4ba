"""Parser stack: reasoning and tool-call parsers behind one registry keyed by vLLM's CLI names.

See ``AGENTS.md`` in this package for the layout, invariants and where fixes go.
"""
from worker.parsers import families  # noqa: F401  (registers every family)
from worker.parsers.registry import REASONING_PARSERS, TOOL_PARSERS, make_reasoning_parser, make_tool_parser

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "make_reasoning_parser", "make_tool_parser"]
