"""DeepSeek-R1 family: ``--reasoning-parser deepseek_r1``.

Format (DeepSeek-R1 / R1-0528 / R1-Distill chat templates; vLLM ``deepseek_r1`` reasoning
parser, SGLang ``deepseek-r1``): the reasoning comes first and ends with ``</think>``; the
``<think>`` opener is optional (the R1-0528 template puts ``<think>\\n`` in the prompt, older R1
emits it). Output without ``</think>`` is all reasoning (the model was cut off while thinking).

Example: ``<think>\\nCompare 9.11 and 9.9 ...\\n</think>\\n\\n9.9 is larger.`` -> reasoning
``\\nCompare 9.11 and 9.9 ...\\n``, content ``\\n\\n9.9 is larger.``
"""
from worker.parsers.registry import register_reasoning
from worker.parsers.think import ThinkReasoningParser, ThinkSpec


@register_reasoning("deepseek_r1", "DeepSeek-R1, R1-0528, R1-Distill, QwQ-32B",
                    "<think>…</think>, <think> optional, no </think> = all reasoning")
class DeepSeekR1ReasoningParser(ThinkReasoningParser):
    """R1: reasoning until ``</think>``; prompt tail ``<｜Assistant｜><think>`` pre-opens it."""

    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True,
                     turn_token="<｜Assistant｜>")
