"""NVIDIA Nemotron 3 family: ``--reasoning-parser nemotron_v3``.

Format (Nemotron-3 Nano chat template; vLLM ``nemotron_v3``: the ``deepseek_r1`` rules plus a
thinking-off switch, on vLLM's parser engine with ``strip_trailing_reasoning_whitespace``):
reasoning up to ``</think>`` (``<think>`` optional, the template opens it), output without
``</think>`` is reasoning; a ``<tool_call>`` (Nemotron 3 writes Qwen3-Coder-format calls) ends a
reasoning the template opened, and in a block the output opened with ``<think>`` it is held as
Qwen3's is (``families/qwen3.py``: quoted if ``</think>`` follows, bug-029; a call at the output's
end; vLLM main's parser engine, ``tests/parser/engine/test_nemotron_v3.py``); with
``chat_template_kwargs.enable_thinking=false`` the template
closes an empty block in the prompt and the whole output is content. The template writes the
reasoning as ``<think>\\n…\\n</think>\\n``: the newline before ``</think>`` is framing, so the
reasoning loses its trailing whitespace (``str.rstrip``, as vLLM; the leading newline stays,
the content is untouched).

Example: ``<think>\\nUser greets.\\n</think>\\nHello!`` -> reasoning ``\\nUser greets.``,
content ``\\nHello!``
"""
from worker.parsers.registry import register_reasoning
from worker.parsers.think import ThinkReasoningParser, ThinkSpec


@register_reasoning("nemotron_v3", "NVIDIA Nemotron 3 (Nano) reasoning models",
                    "<think>…</think> (R1 rules), <tool_call> ends it; enable_thinking=false -> all content")
class NemotronV3ReasoningParser(ThinkReasoningParser):
    """R1 rules; ``enable_thinking=false`` starts in content (base ``initial_state``); trailing
    reasoning whitespace dropped."""

    needs_special_tokens = True
    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True,
                     turn_token="<|im_start|>", strip_trailing_ws=True, implicit_end=("<tool_call>",),
                     explicit_needs_end=True, hold_implicit=True, implicit_close=("</tool_call>",))
