"""Mistral reasoning family (Magistral): ``--reasoning-parser mistral``.

Format (Magistral system prompt / mistral-common ``[THINK]`` control tokens; vLLM ``mistral``
reasoning parser): the thinking block is wrapped in the control tokens ``[THINK]`` …
``[/THINK]``; text outside the block is content, and output with no ``[THINK]`` is all content.
An unterminated block is reasoning to the end; a stray ``[/THINK]`` with no open block is
dropped from the content (vLLM's case "EOT without BOT").

Example: ``[THINK]2+2 is 4.[/THINK]The answer is 4.`` -> reasoning ``2+2 is 4.``, content
``The answer is 4.``
"""
from worker.parsers.registry import register_reasoning
from worker.parsers.think import ThinkSpec
from worker.parsers.think_wrapped import WrappedThinkReasoningParser


@register_reasoning("mistral", "Magistral Small/Medium, Mistral models with [THINK] tokens",
                    "[THINK]…[/THINK] control tokens, content outside")
class MistralReasoningParser(WrappedThinkReasoningParser):
    """``[THINK]`` opens reasoning (anywhere in content), ``[/THINK]`` closes it."""

    needs_special_tokens = True
    spec = ThinkSpec(start=("[THINK]",), end=("[/THINK]",), default_reasoning=False,
                     start_anywhere=True)
    drop = ("[/THINK]",)
