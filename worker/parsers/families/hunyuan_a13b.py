"""Tencent Hunyuan-A13B family: ``--reasoning-parser hunyuan_a13b``, ``--tool-parser
hunyuan_a13b``.

Reasoning (Hunyuan-A13B-Instruct template; vLLM ``hunyuan_a13b``): plain-text markers,
``<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>``: reasoning between ``<think>\\n`` and
``\\n</think>\\n<answer>\\n``, the answer up to ``\\n</answer>`` is content (the marker is
dropped). Output that does not open with ``<think>\\n`` is content (fast/no-think mode).

Example: ``<think>\\nEasy.\\n</think>\\n<answer>\\n42\\n</answer>`` -> reasoning ``Easy.``,
content ``42``.

Tool calls (Hunyuan-A13B template; vLLM ``hunyuan_a13b``): a JSON list in one block,
``<tool_calls>[{"name": "get_weather", "arguments": {"city": "SZ"}}]</tool_calls>``; a block left
open at the end of the output keeps the list's complete call objects (``json_list_prefix``).

``--tool-call-streaming incremental``: each list element's name, then its raw JSON arguments
(``worker.parsers.incremental.LIST_ARGS``).
"""
from worker.parsers.marker import json_call_list, json_list_prefix
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedToolParser
from worker.parsers.think import ThinkSpec
from worker.parsers.think_wrapped import WrappedThinkReasoningParser


@register_reasoning("hunyuan_a13b", "Tencent Hunyuan-A13B-Instruct",
                    "<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer> (text markers)")
class HunyuanA13BReasoningParser(WrappedThinkReasoningParser):
    spec = ThinkSpec(start=("<think>\n",), end=("\n</think>\n<answer>\n",), default_reasoning=False)
    drop = ("\n</answer>",)


@register_tool("hunyuan_a13b", "Tencent Hunyuan-A13B-Instruct", '<tool_calls>[{"name", "arguments"}, …]</tool_calls>')
class HunyuanA13BToolParser(TaggedToolParser):
    starts = ("<tool_calls>",)
    ends = ("</tool_calls>",)
    parse_body = staticmethod(json_call_list)

    def complete_prefix(self, body: str) -> str | None:
        return json_list_prefix(body)  # an open list keeps its complete call objects
