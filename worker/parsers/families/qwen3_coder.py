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
"""
from __future__ import annotations

from typing import Any

from worker.parsers.registry import register_tool
from worker.parsers.tagged import TaggedState, TaggedToolParser
from worker.parsers.values import convert_param, dumps_args

_FN = "<function="
_FN_END = "</function>"
_P = "<parameter="
_P_END = "</parameter>"


def _strip_nl(v: str) -> str:
    if v.startswith("\n"):
        v = v[1:]
    if v.endswith("\n"):
        v = v[:-1]
    return v


def parse_coder_body(body: str, types: dict[str, dict[str, Any]], complete: bool
                     ) -> list[tuple[str, str]] | None:
    """``(name, arguments JSON)`` of one ``<function=NAME>...`` body. ``complete``: the block
    was closed (``</function>`` required); otherwise keep the complete parameters only.
    None when there is no complete ``<function=NAME>`` tag."""
    i = body.find(_FN)
    if i < 0:
        return None
    j = body.find(">", i + len(_FN))
    if j < 0:
        return None
    name = body[i + len(_FN):j].strip()
    if not name:
        return None
    rest = body[j + 1:]
    k = rest.find(_FN_END)
    if k >= 0:
        rest = rest[:k]
    elif complete:
        return None
    fn_types = types.get(name)
    params: dict[str, Any] = {}
    pos = 0
    while True:
        a = rest.find(_P, pos)
        if a < 0:
            break
        b = rest.find(">", a + len(_P))
        if b < 0:
            break
        pname = rest[a + len(_P):b].strip()
        c = rest.find(_P_END, b + 1)
        if c < 0:
            if not complete:
                break  # cut-off parameter: dropped
            # a closed block tolerates a missing </parameter> (value runs to the next one)
            nxt = rest.find(_P, b + 1)
            c_end = nxt if nxt >= 0 else len(rest)
            raw, pos = rest[b + 1:c_end], c_end
        else:
            raw, pos = rest[b + 1:c], c + len(_P_END)
        known = fn_types is not None and pname in fn_types
        params[pname] = convert_param(_strip_nl(raw), fn_types.get(pname) if known else None, known)
    return [(name, dumps_args(params))]


@register_tool("qwen3_coder", "Qwen3-Coder", "<tool_call><function=NAME><parameter=P>V</parameter></function></tool_call>")
class Qwen3CoderToolParser(TaggedToolParser):
    """Qwen3-Coder XML calls, values typed by the request's tool schemas."""

    starts = ("<tool_call>",)
    ends = ("</tool_call>",)
    param_types = True

    def parse_call(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        return parse_coder_body(body, st.types, complete=True)

    def parse_partial(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        return parse_coder_body(body, st.types, complete=False)


@register_tool("qwen3_xml", "Qwen3-Coder", "same format as qwen3_coder")
class Qwen3XmlToolParser(Qwen3CoderToolParser):
    """``qwen3_xml``: vLLM's streaming-XML variant of the same Qwen3-Coder format."""
