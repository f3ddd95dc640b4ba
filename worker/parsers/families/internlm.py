"""InternLM2 / 2.5 family: ``--tool-parser internlm``.

Format (InternLM2.5 chat template; vLLM ``internlm``): a plugin action, JSON with ``name`` and
``parameters`` between special tokens:

    <|action_start|><|plugin|>
    {"name": "get_weather", "parameters": {"city": "Shanghai"}}<|action_end|>

Text before the action is content.
"""
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedToolParser


@register_tool("internlm", "InternLM2, InternLM2.5 chat",
               '<|action_start|><|plugin|>{"name", "parameters"}<|action_end|>')
class InternLM2ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<|action_start|><|plugin|>",)
    ends = ("<|action_end|>",)
