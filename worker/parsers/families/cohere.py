"""Cohere Command A Reasoning family: ``--reasoning-parser cohere_command3``.

Format (Command A Reasoning chat template; vLLM ``cohere_command3`` reasoning parser, which
delegates to Cohere's ``cohere_melody`` filter): reasoning in ``<|START_THINKING|>`` …
``<|END_THINKING|>`` (special tokens), the answer in ``<|START_RESPONSE|>`` …
``<|END_RESPONSE|>``; the response markers are not content. Without ``<|START_THINKING|>`` the
output is content (an explicit start is required).

Whitespace (Cohere's ``cohere_melody`` filter, ``cmd3``, which vLLM's parser runs since after
0.33: ``tests/reasoning/test_cohere_command_reasoning_parser.py``): the reasoning's leading and
trailing whitespace is framing and dropped; so is the content's whitespace right before
``<|START_RESPONSE|>`` / ``<|END_RESPONSE|>`` or the end of the output (the ``"\n"`` between
the blocks). Whitespace at the start of the response is kept, as melody keeps it. Text after
``<|END_RESPONSE|>`` stays content (melody drops it; no vLLM test has it).

**Departs from vLLM**: melody also turns Cohere's citation markup ``<co>text</co: 0:[1]>`` into
citation objects beside the text; the OpenAI reply has no field for them, so here the markup
stays in the text, verbatim (``docs/parsers.md``, deviations).

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
    strip_reasoning = True  # framing whitespace (module docstring)
    rstrip_content = True
