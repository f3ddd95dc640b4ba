"""DeepSeek families: ``--reasoning-parser deepseek_v3`` + ``--tool-parser deepseek_v31``
(DeepSeek V3.1 / V3.2 hybrid thinking) and ``--reasoning-parser deepseek_v4`` +
``--tool-parser deepseek_v4`` (DeepSeek V4, DSML tool calls).

Formats (DeepSeek V3.1 model card and ``tool_chat_template_deepseekv31.jinja``; DeepSeek V4's
encoder shipped with vLLM ``--tokenizer-mode deepseek_v4``; vLLM's ``deepseek_v3`` /
``deepseek_v4`` reasoning parsers and ``deepseekv31`` / ``deepseekv4`` tool parsers):

* reasoning: ``...</think>answer``. The template ends the generation prompt with ``<think>``
  (thinking) or ``</think>`` (non-thinking), so the output starts inside the block and only
  ``</think>`` shows up. ``deepseek_v3`` is vLLM's switch: R1 behaviour (output without
  ``</think>`` is reasoning) only when ``chat_template_kwargs`` has ``thinking: true`` (or
  ``enable_thinking: true``), else the identity parser (all content, whatever the prompt).
  vLLM's ``deepseek_v3`` wrapper reports ``reasoning_tokens`` 0 (it does not forward the
  count); ``deepseek_v4`` counts them. ``deepseek_v4`` thinks by default: ``thinking: false`` (or a prompt whose assistant turn
  closed the block with ``</think>``) starts in content; a DSML tool-call block ends the
  reasoning (vLLM's V4 parser hands it to the tool parser as content).
* V3.1 tool calls: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON args}
  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``; arguments are returned as written (must be JSON).
  A block left open at the end (``finish_reason: "length"``) keeps its complete calls (vLLM's
  answer) and drops the cut-off call after them; with no complete call it is dropped, no call,
  no content (``dsv31-tool-malformed-v0``).
* V4 tool calls (DSML, same grammar as V3.2 inside a ``tool_calls`` fence)::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

  ``string="true"`` values are strings; others are typed by the request schema, else JSON
  (``worker.parsers.values``). ``<dsml:``/``</dsml:`` (single tokens in the V4 vocab) are
  accepted as the same tag prefix. A block left open keeps the complete invokes and, for the
  open invoke, its complete parameters (``dsv4-tool-malformed-v0``). With ``tool_choice:
  "none"`` coupled V4 serving still removes the DSML block from the content (no call), see
  ``dsv4-tool-choice-none-v0``.

  Recoveries (both modes, every chunking, also ``--tool-call-streaming incremental``, where
  DSML calls go out whole when the block closes):

  - **V3.2 block name**: the fence may be ``<｜DSML｜function_calls>`` (DeepSeek V3.2's name,
    which V4 models sometimes write, bug-209) instead of ``<｜DSML｜tool_calls>``; the invokes
    inside are parsed the same way, and the block ends the reasoning as ``tool_calls`` does.
    This follows SGLang's fix (PR 40237 for issue 40236). **Departs from vLLM**: vLLM's
    ``DeepSeekV4ToolParser`` (``vllm/tool_parsers/deepseekv4_tool_parser.py``) subclasses the
    V3.2 parser and only replaces its start/end tokens with ``<｜DSML｜tool_calls>`` /
    ``</｜DSML｜tool_calls>``, and its state-machine parser (``vllm/parser/deepseek_v4.py``) has
    ``<｜DSML｜tool_calls>`` as its only tool-start terminal (``function_calls`` is listed there
    only among the tag prefixes held back while streaming), so in vLLM a ``function_calls``
    block stays content. A block is closed by either fence's end marker (the invoke grammar is
    the same);
  - **missing ``</｜DSML｜parameter>``** (bug-202, vLLM PR 54838, which applies it to V3.2 as
    well; so does ``deepseek_v32`` here, same ``parse_dsml_body``): a value ends where the next
    ``<｜DSML｜parameter`` opens, and the last value of a closed invoke at its
    ``</｜DSML｜invoke>``; a value closed that way loses one trailing newline (the encoder's
    layout between elements; vLLM's ``_PARAM_RE`` in ``vllm/parser/deepseek_v4.py`` keeps it, and
    drops a last value whose closer is missing: both departures keep the value the model wrote
    without the markup's layout). In a block cut off at the end of the output the open invoke's
    last value without closer is dropped (only complete parameters are kept, as before)
    (``dsml_param_values``). Likewise an invoke without ``</｜DSML｜invoke>`` ends where the
    next invoke opens, or at the end of a closed block (``parse_dsml_body``; the rule "implied
    closing tag" of ``xmlcall.py``).

  - **orphan invokes** (vLLM 0.33 ``TestMissingToolCallsWrapper``, V3.2's
    ``TestMissingFunctionCallsWrapper``; ``deepseek_v32`` the same): an
    ``<｜DSML｜invoke …>…</｜DSML｜invoke>`` without the block's fence is a call, one block per
    invoke (the tagged engine's bare calls: not inside the answer's code; the fence's end
    marker right after it counts as its closer); several in a row, after a fenced block, split
    across deltas, with content after them. An orphan invoke cut off at the end of the output
    stays content;
  - **missing ``string=``** (vLLM 0.33 ``TestMissingStringAttribute``): a parameter tag without
    the attribute is read as ``string="false"`` (typed by the schema, else JSON, else its text),
    never dropped.

  Parameter values (both DSML families, vLLM 0.33 ``deepseek_v32`` tests): the request's schema
  types a ``string="true"`` value too when it declares a non-string type (``42`` -> 42, an
  object's JSON -> the object); ``null`` written for a parameter declared a plain (non-nullable)
  string is the text ``"null"``.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): V3.1 calls stream (name
once ``<｜tool▁sep｜>{`` arrives, then the raw JSON arguments); V4's DSML calls go out whole.
"""
from __future__ import annotations

import re
from typing import Any

from worker.parsers.base import RequestContext
from worker.parsers.incremental import JsonArgs
from worker.parsers.registry import register_reasoning, register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.think import ThinkReasoningParser, ThinkSpec, ThinkState
from worker.parsers.values import convert_param, dumps_args, is_string_param, loads_json

#: DeepSeek V4's DSML block openers / closers: its own ``tool_calls`` fence and the V3.2 name
#: ``function_calls`` (SGLang's fix for the same model output, bug-209; module docstring)
V4_STARTS = ("<｜DSML｜tool_calls>", "<dsml:tool_calls>", "<｜DSML｜function_calls>", "<dsml:function_calls>")
V4_ENDS = ("</｜DSML｜tool_calls>", "</dsml:tool_calls>", "</｜DSML｜function_calls>", "</dsml:function_calls>")


#: an invoke standing without its block's fence (V3.2 ``function_calls``, V4 ``tool_calls``):
#: the tagged engine's bare opener and its end (module docstring, "orphan invokes")
BARE_INVOKE = "<｜DSML｜invoke"
BARE_INVOKE_END = "</｜DSML｜invoke>"


# ----------------------------------------------------------------------------- reasoning ---
def _thinking_requested(ctx: RequestContext) -> bool:
    kw = ctx.chat_template_kwargs or {}
    return bool(kw.get("thinking")) or bool(kw.get("enable_thinking"))


@register_reasoning("deepseek_v3", "DeepSeek V3.1/V3.2 (hybrid thinking)",
                    "…</think>; R1 rules with thinking=true, else all content")
class DeepSeekV3ReasoningParser(ThinkReasoningParser):
    """R1-style ``<think>`` parsing when the request turned thinking on, identity otherwise."""

    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True)

    def _count(self, st: ThinkState, token_ids: list[int]) -> int:
        # vLLM's deepseek_v3 wrapper does not forward count_reasoning_tokens: usage reports 0
        # (dsv31-thinking-* cases)
        return 0

    def initial_state(self, ctx: RequestContext) -> ThinkState:
        if _thinking_requested(ctx):
            return ThinkState(mode="start", tok_reasoning=True)
        return ThinkState(mode="content", tok_reasoning=False)


@register_reasoning("deepseek_v4", "DeepSeek V4", "…</think>; thinking by default; DSML block ends reasoning")
class DeepSeekV4ReasoningParser(ThinkReasoningParser):
    """DeepSeek V4: reasoning until ``</think>`` (or a DSML tool-call block)."""

    spec = ThinkSpec(start=("<think>",), end=("</think>",), default_reasoning=True,
                     turn_token="<｜Assistant｜>", implicit_end=V4_STARTS)


# ------------------------------------------------------------------------------ V3.1 tools ---
_V31_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)


_V31_HEAD = r"\s*<｜tool▁call▁begin｜>(?P<name>[^<]*?)<｜tool▁sep｜>\s*\{"


def parse_v31_body(body: str) -> list[tuple[str, str]] | None:
    """Calls of a complete ``<｜tool▁calls▁begin｜>`` block; None when one is malformed."""
    calls = []
    for name, args in _V31_CALL.findall(body):
        name = name.strip()
        try:
            loads_json(args)
        except ValueError:
            return None
        if not name:
            return None
        calls.append((name, args.strip()))
    return calls or None


@register_tool("deepseek_v31", "DeepSeek V3.1/V3.2",
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…")
class DeepSeekV31ToolParser(TaggedToolParser):
    """DeepSeek V3.1 calls: the whole ``tool▁calls`` block, JSON arguments as written."""

    starts = ("<｜tool▁calls▁begin｜>",)
    ends = ("<｜tool▁calls▁end｜>",)
    call_ends = ("<｜tool▁call▁end｜>",)
    #: incremental streaming: the name once ``<｜tool▁sep｜>{`` arrives, then the arguments'
    #: raw JSON (``worker.parsers.incremental``)
    stream_spec = JsonArgs(head=_V31_HEAD, next=r"\s*<｜tool▁call▁end｜>" + _V31_HEAD)

    def parse_call(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        return parse_v31_body(body)

    def stream_name(self, st: TaggedState, raw: str) -> str | None:
        return raw.strip() or None

    def parse_partial(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        # unterminated block: its complete calls; nothing complete -> dropped (coupled
        # non-stream answer, dsv31-tool-malformed-*)
        calls = super().parse_partial(st, body)
        return calls if calls is not None else []


# -------------------------------------------------------------------------------- V4 tools ---
_O = r"<(?:｜DSML｜|dsml:)"
_C = r"</(?:｜DSML｜|dsml:)"
_INVOKE_OPEN = re.compile(_O + r'invoke\s+name="([^"]+)"\s*>')
_INVOKE_CLOSE = re.compile(_C + r"invoke>")
_PARAM_OPEN = re.compile(_O + r'parameter\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>')
_PARAM_CLOSE = re.compile(_C + r"parameter>")


def dsml_param_values(text: str, complete: bool = True) -> list[tuple[str, bool, str]]:
    """``[(name, string="true", raw value)]`` of the DSML parameters in one invoke's inner text.

    A value ends at its ``</｜DSML｜parameter>``, or, when that closer is missing, where the next
    ``<｜DSML｜parameter`` opens (vLLM PR 54838, bug-202: the missing closer no longer swallows
    the next parameter); the last one also ends at the end of ``text`` when ``complete`` (the
    invoke's ``</｜DSML｜invoke>`` arrived: the rule "implied closing tag" of ``xmlcall.py``). A
    value closed by implication loses one trailing newline (the encoder's layout between two
    elements). Text between parameters is ignored. O(len(text))."""
    out: list[tuple[str, bool, str]] = []
    opens = list(_PARAM_OPEN.finditer(text))
    for k, m in enumerate(opens):
        nxt = opens[k + 1].start() if k + 1 < len(opens) else len(text)
        close = _PARAM_CLOSE.search(text, m.end(), nxt)
        if close is not None:
            raw = text[m.end():close.start()]
        elif k + 1 < len(opens) or complete:
            raw = text[m.end():nxt]
            raw = raw[:-1] if raw.endswith("\n") else raw
        else:  # the cut-off last value of an open invoke: dropped
            break
        out.append((m.group(1), m.group(2) == "true", raw))  # no ``string=``: typed as "false"
    return out


def _dsml_params(text: str, fn_types: dict[str, Any] | None, complete: bool = True) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pname, is_str, raw in dsml_param_values(text, complete):
        ptype = fn_types.get(pname) if fn_types is not None else None
        if is_str and (ptype is None or is_string_param(ptype)):
            params[pname] = raw
        elif ptype is not None:  # the schema decides, also for string="true" (42 -> 42)
            params[pname] = convert_param(raw, ptype, string_null=False)
        elif is_str:
            params[pname] = raw
        else:
            try:
                params[pname] = loads_json(raw)
            except ValueError:
                params[pname] = raw
    # vLLM's repair: a lone undeclared "arguments"/"input" wrapper holding the real parameters
    allowed = set(fn_types or ())
    for wrapper in ("arguments", "input"):
        if set(params) == {wrapper} and wrapper not in allowed:
            inner = params[wrapper]
            if isinstance(inner, str):
                try:
                    inner = loads_json(inner)
                except ValueError:
                    break
            if isinstance(inner, dict) and set(inner) <= allowed:
                params = inner
    return params


def parse_dsml_body(body: str, types: dict[str, dict[str, Any]], complete: bool
                    ) -> list[tuple[str, str]] | None:
    """Calls of a DSML block body (``tool_calls`` / ``function_calls``). An invoke ends at its
    ``</｜DSML｜invoke>``, or, when that closer is missing, where the next invoke opens or (the
    block's end marker arrived: ``complete``) at the end of the body: the rule "implied closing
    tag" of ``xmlcall.py``. In a block cut off at the end of the output (``complete`` False) the
    last invoke without closer keeps its complete parameters. Parameters: ``dsml_param_values``.
    None when there is no named invoke."""
    calls = []
    opens = list(_INVOKE_OPEN.finditer(body))
    for k, m in enumerate(opens):
        last = k + 1 == len(opens)
        nxt = len(body) if last else opens[k + 1].start()
        end = _INVOKE_CLOSE.search(body, m.end(), nxt)
        inner = body[m.end():end.start() if end is not None else nxt]
        closed = end is not None or not last or complete
        calls.append((m.group(1).strip(), dumps_args(_dsml_params(inner, types.get(m.group(1).strip()), closed))))
    return calls or None


@register_tool("deepseek_v4", "DeepSeek V4", '<｜DSML｜tool_calls><｜DSML｜invoke name=…><｜DSML｜parameter …>',
               "the V3.2 fence `function_calls` (SGLang PR 40237; not in vLLM); a parameter without its closer "
               "ends at the next parameter or the invoke's end (vLLM PR 54838); invokes without the fence; a "
               "parameter without `string=` (vLLM 0.33 tests)")
class DeepSeekV4ToolParser(TaggedToolParser):
    """DeepSeek V4 DSML calls (one fenced block, one or more invokes)."""

    starts = V4_STARTS
    ends = V4_ENDS
    param_types = True
    strips_markup_when_off = True
    #: an invoke without the ``tool_calls`` fence is a call (module docstring, "orphan invokes")
    bare_start = BARE_INVOKE
    bare_end = BARE_INVOKE_END

    def parse_call(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        return parse_dsml_body(body, st.types, complete=True)

    def parse_partial(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        if st.bare:  # an orphan invoke cut off at the end of the output: content
            return None
        return parse_dsml_body(body, st.types, complete=False)
