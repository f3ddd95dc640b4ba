"""MiniMax-M2 family: ``--reasoning-parser minimax_m2`` / ``minimax_m2_append_think``,
``--tool-parser minimax_m2``.

Reasoning (MiniMax-M2 chat template; vLLM ``minimax_m2``, on vLLM's parser engine with
``strip_trailing_reasoning_whitespace``): the generation prompt already opens ``<think>\\n``, so
the output is reasoning up to ``</think>`` and content after it (a leading ``<think>`` is
tolerated); no ``</think>`` -> all reasoning. The template frames the block as
``<think>\\n…\\n</think>\\n\\n``: the reasoning loses its trailing whitespace (``str.rstrip``, as
vLLM), the content is untouched: ``R\\n</think>\\n\\nA`` -> reasoning ``R``, content ``\\n\\nA``.
``minimax_m2_append_think`` instead keeps everything as content with ``<think>`` put back in
front, for clients that want the interleaved thinking text verbatim: ``a</think>b`` -> content
``<think>a</think>b``.

Tool calls (MiniMax-M2 template; vLLM/SGLang ``minimax_m2``): XML invokes in one block:

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Shanghai</parameter>
    </invoke>
    </minimax:tool_call>

several ``<invoke>`` per block allowed; values are typed by the request's tool schema
(``worker.parsers.values``; undeclared parameters stay strings). A block left open at the end of
the output keeps its complete invokes (``TaggedToolParser.call_ends``: ``</invoke>``), the
cut-off invoke after them is dropped.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): each invoke's name goes
out with ``<invoke name=…>``, a string parameter's value as it
arrives, any other parameter when its ``</parameter>`` arrives, ``}`` with
``</invoke>``; a cut-off invoke whose name went out keeps the parameters that went out.
"""
import msgspec

from worker.parsers.base import Delta, ReasoningParser, RequestContext
from worker.parsers.incremental import XmlArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec
from worker.parsers.xmlcall import invoke_format, parse_invokes


@register_reasoning("minimax_m2", "MiniMax-M2, MiniMax-M2.1",
                    "prompt pre-opens <think>; reasoning until </think>")
class MiniMaxM2ReasoningParser(ThinkReasoningParser):
    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True,
                     turn_token="]~b]", strip_trailing_ws=True)


class AppendThinkState(msgspec.Struct, kw_only=True, array_like=True):
    """``started``: the ``<think>`` prefix was emitted; ``buf``: held-back start of output."""

    started: bool = False
    buf: str = ""


@register_reasoning("minimax_m2_append_think", "MiniMax-M2 (thinking kept in content)",
                    "all content, <think> prepended to the output")
class MiniMaxM2AppendThinkReasoningParser(ReasoningParser):
    """Everything is content; the output gets the template's ``<think>`` back in front unless it
    already starts with it."""

    def __init__(self, tok):
        self.tok = tok

    def initial_state(self, ctx: RequestContext) -> AppendThinkState:
        return AppendThinkState()

    def feed(self, state: AppendThinkState, text: str, token_ids: list[int]) -> Delta:
        if state.started:
            return Delta(content=text)
        s = state.buf + text
        if len(s) < len("<think>") and "<think>".startswith(s):
            state.buf = s
            return Delta()
        state.started, state.buf = True, ""
        return Delta(content=s if s.startswith("<think>") else "<think>" + s)

    def finish(self, state: AppendThinkState) -> Delta:
        if state.started:
            return Delta()
        s, state.buf = state.buf, ""
        state.started = True
        return Delta(content=s if s.startswith("<think>") else "<think>" + s)


@register_tool("minimax_m2", "MiniMax-M2, MiniMax-M2.1",
               '<minimax:tool_call><invoke name="f"><parameter name="k">v</parameter></invoke></minimax:tool_call>')
class MiniMaxM2ToolParser(TaggedToolParser):
    needs_special_tokens = True
    starts = ("<minimax:tool_call>",)
    ends = ("</minimax:tool_call>",)
    call_ends = ("</invoke>",)
    param_types = True
    #: incremental streaming: the name at ``<invoke name=…>``, each parameter at its
    #: ``</parameter>`` (``worker.parsers.incremental``)
    stream_spec = XmlArgs(invoke_format("invoke", "parameter"))

    def parse_call(self, st: TaggedState, body: str):
        return parse_invokes(body.strip(), "invoke", "parameter", st.types)
