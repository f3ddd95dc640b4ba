"""Baidu ERNIE 4.5 family: ``--reasoning-parser ernie45``, ``--tool-parser ernie45``.

Reasoning (ERNIE-4.5-21B-A3B-Thinking template; vLLM ``ernie45``): reasoning up to
``</think>`` (``<think>`` optional, no end -> all reasoning); the answer may be wrapped as
``\\n\\n<response>\\n…\\n</response>\\n``: the wrapper tags are dropped and the newlines right
after ``</think>`` / around the wrapper are trimmed.

Example: ``abc\\n</think>\\n\\n<response>\\ndef\\n</response>\\n`` -> reasoning ``abc\\n``,
content ``def``.

Tool calls (ERNIE 4.5 template; vLLM ``ernie45``): Hermes-like JSON blocks,
``<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Beijing"}}\\n</tool_call>``.
"""
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedToolParser
from worker.parsers.think import ThinkSpec
from worker.parsers.think_wrapped import WrappedThinkReasoningParser


@register_reasoning("ernie45", "ERNIE-4.5 Thinking (21B-A3B-Thinking, VL Thinking)",
                    "…</think> then optional <response>…</response> wrapper")
class Ernie45ReasoningParser(WrappedThinkReasoningParser):
    needs_special_tokens = True
    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True)
    drop = ("<response>\n", "\n</response>\n", "\n</response>", "<response>", "</response>")
    lstrip = "\n"


@register_tool("ernie45", "ERNIE-4.5 (A3B / A47B, Thinking)", '<tool_call>{"name", "arguments"}</tool_call>',
               "a block open at the end of the output whose JSON is complete (vLLM's Hermes test `tool_call_until_eos`)")
class Ernie45ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<tool_call>",)
    ends = ("</tool_call>",)
    #: Hermes-like: a block open at EOS whose JSON is complete is a call
    eos_closes = True
    strip_before_call = True  # vLLM's test_extract_tool_calls[tool_call_with_content_before]
