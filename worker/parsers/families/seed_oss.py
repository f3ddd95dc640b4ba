"""ByteDance Seed-OSS family: ``--reasoning-parser seed_oss``, ``--tool-parser seed_oss``.

Reasoning (Seed-OSS-36B chat template; vLLM ``seed_oss``): ``<seed:think>…</seed:think>``, the
opener optional, no end -> all reasoning (budget reflections such as
``<seed:cot_budget_reflect>…</seed:cot_budget_reflect>`` stay inside the reasoning text).

Tool calls (Seed-OSS template; vLLM ``seed_oss``): one block per call, XML with the name in the
tag:

    <seed:tool_call>
    <function=get_weather>
    <parameter=location>
    Paris
    </parameter>
    </function>
    </seed:tool_call>

the inner grammar is Qwen3-Coder's, so the body is parsed by ``qwen3_coder.parse_coder_body``
(one leading/trailing newline around a value removed, values typed by the request's schema).

**Call without the ``<seed:tool_call>`` wrapper**: the same rule as Qwen3-Coder (bug-210's kind;
``qwen3_coder`` module docstring, ``worker.parsers.tagged`` "bare calls"): a bare
``<function=NAME>…</function>`` outside the answer's code (fenced block or inline span) is a
call, in both modes; a ``</seed:tool_call>`` right after it is its closer. **This
departs from vLLM**: vLLM's ``seed_oss`` parser (``vllm/tool_parsers/seed_oss_tool_parser.py``)
has no such fallback (it needs ``<seed:tool_call>``), so there the bare call stays content. We
apply it because the inner grammar is Qwen3-Coder's and the model drops the wrapper the same
way. A bare call cut off at the end of the output stays content (Seed-OSS's rule for an open
block).

**A think block seen by the tool parser** (``--tool-parser seed_oss`` without ``--reasoning-parser
seed_oss``, or a second block in the content): ``<seed:think>`` … ``</seed:think>`` is content,
markers included, and a call written inside it (the model quoting the call format while it
reasons) is not a call (vLLM's ``seed_oss`` tool parser skips the think block:
``test_extract_tool_calls[tool_call_unlimited_thinking_budget]`` and its streaming twin;
``worker.parsers.tagged`` "quoted regions"). A block never closed stays content to the end, as
vLLM's streaming parser answers (its non-streaming one reads calls there); a ``</seed:think>``
with no opener in the output (a prompt that opened the block) ends nothing.

``--tool-call-streaming incremental``: as Qwen3-Coder (same tags, ``worker.parsers.incremental``).
"""
from worker.parsers.families.qwen3_coder import CODER_FORMAT, parse_coder_body, plausible_calls
from worker.parsers.incremental import XmlArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec


@register_reasoning("seed_oss", "ByteDance Seed-OSS-36B",
                    "<seed:think>…</seed:think>, opener optional, no end = all reasoning")
class SeedOssReasoningParser(ThinkReasoningParser):
    needs_special_tokens = True
    spec = ThinkSpec(start=("<seed:think>",), end=("</seed:think>",), default_reasoning=True,
                     turn_token="<seed:bos>")


@register_tool("seed_oss", "ByteDance Seed-OSS-36B",
               "<seed:tool_call><function=f><parameter=k>v</parameter></function></seed:tool_call>",
               "`<function=…>` without the `<seed:tool_call>` wrapper, outside the answer's code "
               "(not in vLLM)")
class SeedOssToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<seed:tool_call>",)
    ends = ("</seed:tool_call>",)
    bare_start = "<function="  # a call without the wrapper (module docstring)
    bare_end = "</function>"
    quote_start = ("<seed:think>",)  # a think block seen by the tool parser (module docstring)
    quote_end = ("</seed:think>",)
    param_types = True
    stream_spec = XmlArgs(CODER_FORMAT)  # incremental streaming: Qwen3-Coder's tags

    def parse_call(self, st: TaggedState, body: str):
        calls = parse_coder_body(body, st.types, complete=True)
        return plausible_calls(calls) if st.bare else calls
