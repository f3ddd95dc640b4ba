"""Mistral reasoning family (Magistral): ``--reasoning-parser mistral``.

Format (Magistral system prompt / mistral-common ``[THINK]`` control tokens; vLLM ``mistral``
reasoning parser): the thinking block is wrapped in the control tokens ``[THINK]`` …
``[/THINK]``; text outside the block is content, and output with no ``[THINK]`` is all content.
An unterminated block is reasoning to the end; a stray ``[/THINK]`` with no open block is
dropped from the content (vLLM's case "EOT without BOT").

Example: ``[THINK]2+2 is 4.[/THINK]The answer is 4.`` -> reasoning ``2+2 is 4.``, content
``The answer is 4.``

Vocabulary: the parser works on the decoded text (special tokens kept), so it is checked with
the markers added as special tokens to a test tokenizer, not on Magistral's own ids: no registry
package ships a Magistral tokenizer. mistral-common 1.13.1 ships seven tokenizer files
(``data/``: ``tokenizer.model.v1``, ``mistral_instruct_tokenizer_240216.model.v2``,
``…_240323.model.v3``, ``…_241114.model.v7`` / ``.v7m1``, ``tekken_240718.json``,
``tekken_240911.json``), none with ``[THINK]``/``[/THINK]``: the SentencePiece ones have
``[control_N]`` pieces there, the two Tekken files are version v3 with 1000 special slots
(``<SPECIAL_N>`` beyond the named ones) and ``get_special_token("[THINK]")`` raises.
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
