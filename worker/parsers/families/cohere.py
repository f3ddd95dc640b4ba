"""Cohere Command A Reasoning family: ``--reasoning-parser cohere_command3``.

Format (Command A Reasoning chat template; vLLM ``cohere_command3`` reasoning parser, which
delegates to Cohere's ``cohere_melody`` filter): reasoning in ``<|START_THINKING|>`` …
``<|END_THINKING|>`` (special tokens), the answer in ``<|START_RESPONSE|>`` …
``<|END_RESPONSE|>``; the response markers are not content. Without ``<|START_THINKING|>`` the
output is content (an explicit start is required).

Example: ``<|START_THINKING|>Check units.<|END_THINKING|><|START_RESPONSE|>5 km.<|END_RESPONSE|>``
-> reasoning ``Check units.``, content ``5 km.``
"""
from worker.parsers.registry import register_reasoning
from worker.parsers.think import ThinkSpec
from worker.parsers.think_wrapped import WrappedThinkReasoningParser


@register_reasoning("cohere_command3", "Cohere Command A Reasoning (Command 3)",
                    "<|START_THINKING|>…<|END_THINKING|> then <|START_RESPONSE|>…<|END_RESPONSE|>")
class CohereCommand3ReasoningParser(WrappedThinkReasoningParser):
    """Reasoning block, then response markers dropped from the content."""

    needs_special_tokens = True
    spec = ThinkSpec(start=("<|START_THINKING|>",), end=("<|END_THINKING|>",), default_reasoning=False,
                     turn_token="<|START_OF_TURN_TOKEN|>")
    drop = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
