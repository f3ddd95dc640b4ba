"""Qwen3 family: ``--reasoning-parser qwen3`` and ``--tool-parser hermes``.

Format (Qwen3 chat template, hybrid thinking): the assistant turn is ``<think>\\n...\\n</think>\\n\\n``
then the answer; ``enable_thinking=false`` makes the template emit an empty closed block in the
prompt, so the output is all content. vLLM 0.32's ``qwen3`` parser treats output without
``</think>`` as reasoning when thinking is on (Qwen3-2507 templates pre-open ``<think>``), and a
``<tool_call>`` emitted straight from the thinking block ends the reasoning (the call is content
for the tool parser) — unless the output opened the block with ``<think>``: then only
``</think>`` ends it, so tool-call text quoted while reasoning stays reasoning (bug-029).
Tool calls (Hermes format): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
one block per call.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): a Hermes call's name goes
out once ``{"name": "…", "arguments": {`` has arrived (``"name"`` first, as the template writes
it; other key orders go out whole), then the arguments' raw JSON text, whitespace at its end held
until text follows (vLLM 0.32's ``Hermes2ProToolParser`` diffs the stripped call body:
``"limit":`` then `` 3``; ``JsonArgs.hold_ws``).
"""
from worker.parsers.base import Delta
from worker.parsers.incremental import NAME_ARGS_HEAD, JsonArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec


@register_reasoning("qwen3", "Qwen3, Qwen3-2507 thinking, QwQ", "<think>…</think>, output without </think> is reasoning")
class Qwen3ReasoningParser(ThinkReasoningParser):
    """Qwen3 reasoning: ``<think>`` optional at the start, reasoning until ``</think>``."""

    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True,
                     turn_token="<|im_start|>", implicit_end=("<tool_call>",), explicit_needs_end=True,
                     hold_implicit=True, implicit_close=("</tool_call>",))


@register_tool("hermes", "Qwen2.5/Qwen3, Hermes 2/3, many fine-tunes", '<tool_call>{"name", "arguments"}</tool_call>',
               "a block open at the end of the output whose JSON is complete (vLLM's Hermes test `tool_call_until_eos`)")
class HermesToolParser(TaggedToolParser):
    """Hermes / Qwen tool calls: one JSON object per ``<tool_call>`` block."""

    starts = ("<tool_call>",)
    ends = ("</tool_call>",)
    #: a block open at EOS whose JSON is complete is a call (``TaggedToolParser.eos_closes``)
    eos_closes = True
    #: the ``{"name", "arguments"}`` head, trailing whitespace held (module docstring)
    stream_spec = JsonArgs(head=NAME_ARGS_HEAD, hold_ws=True)
    #: held whitespace before the first call is its own delta when text follows (``feed``)
    streams_leading_ws = True

    def feed(self, state: TaggedState, text: str, token_ids: list[int]) -> Delta:
        """``TaggedToolParser.feed``, plus ``Delta.content_break`` where whitespace held from
        earlier steps before the first call is released with this step's text: vLLM 0.32's
        ``Hermes2ProToolParser.extract_tool_calls_streaming`` returns each step's text as
        content while no ``<tool_call>`` has started, so that whitespace was its own delta
        (``"\\n\\n"`` after ``</think>``: Messages ``qwen3-thinking-tool-use``). Held, it is
        still dropped when a call follows (the chat reference's rule "one answer", content null)."""
        carried = state.pending_ws if not (state.seg_text or state.in_call or state.calls) else ""
        out = super().feed(state, text, token_ids)
        if (carried and not out.tool_calls and state.calls == 0 and len(out.content) > len(carried)
                and out.content.startswith(carried)):
            out.content_break = len(carried)
        return out
