"""AllenAI Olmo 3 family: ``--reasoning-parser olmo3``, ``--tool-parser olmo3``.

Reasoning (Olmo-3 Think chat template; vLLM ``olmo3``): ``<think>…</think>`` written with
ordinary vocabulary pieces (not special tokens, matched in text); the opener is optional (some
templates hard-code it in the prompt); reasoning runs to the first ``</think>``. Output without
``</think>`` is reasoning, as vLLM's streaming path classifies it (its non-streaming regex would
call it content; one answer for both modes here). ``reasoning_tokens`` is 0 unless ``</think>``
is a single vocabulary token.

Tool calls (Olmo 3 template; vLLM ``olmo3``): pythonic calls, one per line, in
``<function_calls>…</function_calls>``, JSON literals allowed as values:

    <function_calls>
    get_weather(city="Paris", metric=true)
    get_time(tz=null)
    </function_calls>

A section cut off before ``</function_calls>`` keeps its complete lines' calls
(``PythonicToolParser.open_section``); a cut-off last line is dropped.
"""
from worker.parsers.pythonic import PythonicToolParser
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.think import ThinkReasoningParser, ThinkSpec


@register_reasoning("olmo3", "AllenAI Olmo 3 Think", "<think>…</think> in plain text, opener optional")
class Olmo3ReasoningParser(ThinkReasoningParser):
    """Text-level markers: when ``</think>`` is not one token of the vocabulary the id-level
    count cannot see the block end, so ``reasoning_tokens`` is reported as 0 rather than
    counting the answer too."""

    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True)

    def _count(self, st, token_ids: list[int]) -> int:
        return super()._count(st, token_ids) if self.end_ids else 0


@register_tool("olmo3", "AllenAI Olmo 3", "<function_calls>\\nf(a=1)\\ng(b=true)\\n</function_calls> (pythonic, one per line)")
class Olmo3ToolParser(PythonicToolParser):
    markers = ("<function_calls>",)
    wrappers = {"<function_calls>": "</function_calls>"}
    newline_calls = True
    json_literals = True
