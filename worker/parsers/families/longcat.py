"""Meituan LongCat-Flash family: ``--tool-parser longcat``.

Format (LongCat-Flash-Chat template; vLLM ``longcat``, Hermes-derived): one JSON object per
block, ``<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Beijing"}}</longcat_tool_call>``.
"""
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedToolParser


@register_tool("longcat", "Meituan LongCat-Flash-Chat / Thinking",
               '<longcat_tool_call>{"name", "arguments"}</longcat_tool_call>',
               "a block open at the end of the output whose JSON is complete (vLLM's Hermes test `tool_call_until_eos`)")
class LongcatToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<longcat_tool_call>",)
    ends = ("</longcat_tool_call>",)
    #: Hermes-derived: a block open at EOS whose JSON is complete is a call
    eos_closes = True
