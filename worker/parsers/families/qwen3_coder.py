"""Qwen3-Coder family: ``--tool-parser qwen3_coder`` (and ``qwen3_xml``, the same format).

Format (Qwen3-Coder model card and chat template; vLLM ``qwen3coder_tool_parser`` /
``qwen3xml_tool_parser``): one XML-ish block per call, parameter values as raw text::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value loses one leading and one trailing newline; it is typed by the request's JSON schema of
that parameter (``worker.parsers.values``: strings stay strings, numbers/booleans/objects are
parsed). Reasoning uses the ``qwen3`` parser (``<think>``; the call ends the reasoning block).

Parity rules (corpus ``coder-*``): a block without ``<function=NAME>`` is content; a block left
open at the end of the output (``coder-tool-malformed-v0``) returns the call with only the
parameters whose ``</parameter>`` arrived (README rule d, coupled's non-stream answer).

Malformed but unambiguous markup (``worker.parsers.xmlcall`` rules): a repeated tag counts once
(``</parameter></parameter>``), a missing ``</parameter>`` or ``</function>`` in a closed block is
implied by the next tag; a missing ``<parameter=K>`` or ``<function=NAME>`` cannot be implied (the
key or name is unknown): its orphan closing tag leaves the block as content. Plain text between
the tags is ignored, as vLLM's ``qwen3coder`` parser does.

**Call without the ``<tool_call>`` wrapper** (bug-210): Qwen3-Coder sometimes writes the
``<function=NAME>…</function>`` call bare. vLLM's non-streaming ``qwen3coder`` parser searches the
whole output for ``<function=`` when no ``<tool_call>`` block matches; here the same output is a
call in both modes (and with incremental streaming), by the tagged engine's "bare calls" rule
(``worker.parsers.tagged``): a bare ``<function=`` opens a call anywhere in the answer except
inside its code: a fenced code block (backtick runs of three or more) or an inline code span
(single or double backticks on one line); there it stays content. The call ends at
``</function>``; a ``</tool_call>`` right after it (wrapper missing only at the start) is its
closer; a name holding whitespace, quotes, braces or angle brackets (``<function={{ tc.name }}>``,
a template in prose) leaves a bare call as content, as vLLM's ``_is_valid_function_name``
rejects such names; a wrapper missing only at the end (``<tool_call><function=…></function>`` and the output
ends) keeps the call, as any block left open does here. Limits: ``~~~`` fences, indented code and
inline spans over a newline are not seen as code; a bare ``<function=`` in plain prose is read as
a call, as vLLM reads it. What vLLM does (``vllm/tool_parsers/qwen3coder_tool_parser.py``,
``_get_function_calls`` / ``extract_tool_calls``): with no ``<tool_call>`` block the whole output
is taken as one block, so only its first ``<function=`` is read, wherever it is (also inside a
code block), and the content is the text before it (text after the call is dropped); its
streaming parser has no fallback (the same output streams as content). Departures here, to
keep one answer for both modes: every bare call is read (each is its own block), the text
around them stays content, and a ``<function=`` inside the answer's code stays content.

``null`` (any case) is JSON null, except for a parameter whose schema type is one string type
(``"string"``, not ``["string", "null"]``): that keeps the text ``"null"``, as vLLM 0.32 types it
(its ``qwen3_coder`` / ``qwen3_xml`` parser is the parser engine's ``Qwen3Parser``,
``vllm/frontend/processing/parser/qwen3.py``; ``_fix_arg_types`` -> ``coerce_to_schema_type`` makes
``null`` JSON null only where the schema admits null). Undeclared parameters: JSON null, as before.

``--tool-call-streaming incremental`` (``worker.parsers.incremental``, ``XmlArgs.safe_prefix``:
vLLM 0.32's engine rule, ``ParserEngine._safe_arg_prefix``): the name goes out with
``<function=NAME>``; a plain string parameter's key with its opening quote as soon as
``<parameter=K>`` is complete (``{"ticker": "``), its value as it arrives (one framing newline
held at each end), its closing quote with what follows (``", "exchange": "``, ``"}``); any other
parameter (typed JSON) when its ``</parameter>`` arrives; ``}`` with ``</function>``. A call cut off
after its name keeps the parameters that went out, object closed (a Responses stream leaves it
as streamed, as vLLM does: ``worker.core.responses.argshape``).
"""
from __future__ import annotations

from typing import Any

from worker.parsers.incremental import XmlArgs
from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.xmlcall import XmlFormat, read_calls, typed_args

#: Qwen3-Coder's tags; ``lenient``: text outside the tags is ignored (vLLM's ``findall``)
CODER_FORMAT = XmlFormat(call_open=r"<function=(?P<a>[^>]*)>", call_close=r"</function>",
                         value_open=r"<parameter=(?P<a>[^>]*)>", value_close=r"</parameter>", lenient=True)


#: characters a function name never holds (vLLM's ``_is_valid_function_name``: a template such
#: as ``<function={{ tc.name }}>`` written in an answer is not a call)
_NOT_IN_NAME = frozenset('{}<>"\' \t\n\r')


def plausible_calls(calls: list[tuple[str, str]] | None) -> list[tuple[str, str]] | None:
    """``calls`` when every name is a plausible function name, else None (content): applied to
    bare calls (no wrapper), where a ``<function=`` may be a template or pseudo-XML in prose."""
    if calls is None or any(_NOT_IN_NAME.intersection(name) for name, _ in calls):
        return None
    return calls


def parse_coder_body(body: str, types: dict[str, dict[str, Any]], complete: bool, string_null: bool = True
                     ) -> list[tuple[str, str]] | None:
    """``[(name, arguments JSON)]`` of the ``<function=NAME>...`` calls of one block body
    (``xmlcall.read_calls`` with ``CODER_FORMAT``: a missing ``</parameter>`` or ``</function>``
    is implied in a closed block, repeated tags count once). ``complete``: the block was
    closed; otherwise the open call keeps its complete parameters only; ``string_null``: as
    ``values.convert_param``. None when there is no ``<function=NAME>`` tag or the body is
    unreadable."""
    calls = read_calls(CODER_FORMAT, body, complete=complete)
    if calls is None:
        return None
    return [(name, typed_args(params, types.get(name), string_null=string_null)) for name, params in calls]


_BARE_NOTE = ("`<function=…>` without the `<tool_call>` wrapper, outside the answer's code "
              "(vLLM's non-streaming fallback, here in both modes)")


@register_tool("qwen3_coder", "Qwen3-Coder", "<tool_call><function=NAME><parameter=P>V</parameter></function></tool_call>",
               _BARE_NOTE)
class Qwen3CoderToolParser(TaggedToolParser):
    """Qwen3-Coder XML calls, values typed by the request's tool schemas."""

    starts = ("<tool_call>",)
    ends = ("</tool_call>",)
    #: a call without the wrapper (module docstring; ``tagged`` "bare calls")
    bare_start = "<function="
    bare_end = "</function>"
    param_types = True
    #: ``null`` for a plain string parameter stays text (module docstring, vLLM 0.32's engine)
    string_null = False
    #: incremental streaming: the name at ``<function=NAME>``, string values as they arrive
    #: with vLLM 0.32's delta boundaries (module docstring; ``worker.parsers.incremental``)
    stream_spec = XmlArgs(CODER_FORMAT, safe_prefix=True)
    #: vLLM 0.32's parser engine: leading whitespace-only content joins the next text
    defers_leading_ws = True

    def parse_call(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        calls = parse_coder_body(body, st.types, complete=True, string_null=self.string_null)
        return plausible_calls(calls) if st.bare else calls

    def parse_partial(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        calls = parse_coder_body(body, st.types, complete=False, string_null=self.string_null)
        return plausible_calls(calls) if st.bare else calls


@register_tool("qwen3_xml", "Qwen3-Coder", "same format as qwen3_coder", _BARE_NOTE)
class Qwen3XmlToolParser(Qwen3CoderToolParser):
    """``qwen3_xml``: vLLM's streaming-XML variant of the same Qwen3-Coder format."""
