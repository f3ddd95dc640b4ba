"""vLLM's Responses-stream rules that are not the shared parsers' (chat streams keep ours):
the argument-delta rule of JSON tool calls (``llama3_json`` / ``llama4_json``), and two rules of
vLLM 0.32's parser engine (``ENGINE_PARSERS``, below ``final_rest``): a call cut by the end of
the output keeps its arguments as streamed, and with ``tool_choice: none`` call markup is held
and delivered in one delta at the message's close (the reference's R6).

**llama3_json / llama4_json.**

vLLM's ``Llama3JsonToolParser.extract_tool_calls_streaming``
(``vllm/entrypoints/openai/tool_parsers/llama_tool_parser.py``) does not stream the argument
text as generated: at every engine output it parses the call so far with
``partial_json_parser`` (``Allow.ALL``), takes ``json.dumps(arguments)`` of the previous and
of the current partial parse, and sends

* nothing while the current arguments are empty (``if cur_arguments:``: so ``{}`` is never
  streamed; the reference's R6 then delivers it as one delta at the close),
* nothing while the previous arguments are empty (the first key's opening quote waits for
  the first character of its value),
* otherwise ``find_common_prefix(prev_json, cur_json)[sent:]`` (a string value lags by one
  engine output: ``{"city": "`` is sent when ``L`` arrives, ``L`` when ``yon`` arrives),
* and, once the call's JSON is complete, ``cur_json[sent:]``.

vLLM's non-streaming path returns ``json.dumps(arguments)`` of the parsed call, and a call cut
mid-arguments ends with its auto-closed partial parse (``{"city": "Pa"}`` for the tokens
``{"city": "Pa``: the reference keeps it, README "not corrected"), so at the close of the item
:func:`final_rest` sends what the stream still lacks of ``json.dumps(partial_parse(raw))``:
one source for both modes (the non-streaming path feeds the whole text at once and gets that
value from the close alone).

Completeness is judged on the arguments value (vLLM judges the whole ``{"name",
"parameters"}`` object, which closes one ``}`` later: the same engine output for the cases
where both braces are one token). Cost: two partial parses of the call's raw arguments per
engine output (as vLLM), O(arguments) per step, so O(arguments^2) per call: bounded by
``SHAPE_LIMIT``: once the raw arguments are longer, nothing more is sent until the close,
which sends the rest in one delta (one parse). The raw text is kept in the open item's state
(``OpenItem.raw``, as the llama3_json parser state keeps the whole body).
"""
from __future__ import annotations

import json
from typing import Any

import partial_json_parser
from partial_json_parser.core.options import Allow

from worker.parsers.base import surrogates_escaped

__all__ = ["SHAPED_PARSERS", "SHAPE_LIMIT", "ENGINE_PARSERS", "step", "final_rest", "cut_call_rest",
           "held_marker_ids"]

#: raw argument characters up to which each engine output is shaped (two partial parses of at
#: most this much per step: ~0.3 ms here); past it the rest goes out at the close
SHAPE_LIMIT = 2048

#: tool parsers whose vLLM streaming parser is ``Llama3JsonToolParser`` (vLLM registers
#: ``llama3_json`` and ``llama4_json`` on that class)
SHAPED_PARSERS = frozenset({"llama3_json", "llama4_json"})

_NONE = object()


def _parse(raw: str) -> Any:
    """``partial_json_parser.loads(raw, Allow.ALL)``, or ``_NONE`` when it cannot be parsed
    (malformed JSON: vLLM sends nothing for that output)."""
    if not raw:
        return _NONE
    try:
        return partial_json_parser.loads(raw, Allow.ALL)
    except Exception:  # noqa: BLE001 - any parser failure means "nothing to send" (vLLM: return None)
        return _NONE


def _complete(raw: str) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


def _dumps(obj: Any) -> str | None:
    try:
        return surrogates_escaped(json.dumps(obj, ensure_ascii=False))
    except (ValueError, TypeError, RecursionError):  # a value json cannot write: nothing to send
        return None


def _common_prefix(a: str, b: str) -> str:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return a[:i]


def step(prev_raw: str, raw: str, sent: int) -> str:
    """The argument delta vLLM sends for one engine output (module docstring).

    ``prev_raw``: the call's raw argument text before this output; ``raw``: after it;
    ``sent``: characters of arguments already sent. Returns the text to send ("" for none).
    Past ``SHAPE_LIMIT`` raw characters: "" (the close sends the rest). Never raises."""
    if len(raw) > SHAPE_LIMIT:
        return ""
    cur = _parse(raw)
    if cur is _NONE or not cur:
        return ""
    cur_json = _dumps(cur)
    if cur_json is None:
        return ""
    if _complete(raw):
        return cur_json[sent:]
    prev = _parse(prev_raw)
    if prev is _NONE or not prev:
        return ""
    prev_json = _dumps(prev)
    if prev_json is None or prev_json == cur_json:
        return ""
    return _common_prefix(prev_json, cur_json)[sent:]


def final_rest(raw: str, sent_text: str) -> str:
    """What the stream still lacks at the item's close: ``json.dumps(partial_parse(raw))``
    minus ``sent_text`` when that is a prefix of it; "" when the raw text does not parse or
    the sent text is not a prefix (the arguments then stay what was sent). Raw text that does
    not parse at all goes out as it is (as the unshaped stream would send it). Never raises."""
    obj = _parse(raw)
    full = None if obj is _NONE else _dumps(obj)
    if full is None:
        return raw[len(sent_text):] if raw.startswith(sent_text) else ""
    return full[len(sent_text):] if full.startswith(sent_text) else ""


# ------------------------------------------------------------------ vLLM 0.32 parser engine ---
#: tool parsers that vLLM 0.32 runs on its parser engine (``vllm/frontend/processing/parser/
#: engine/parser_engine.py``; the registry maps ``qwen3_coder`` / ``qwen3_xml`` to
#: ``Qwen3EngineToolParser`` and ``mistral`` to ``MistralToolParser(MistralParserToolAdapter)``),
#: where a Responses stream differs from our chat stream in two ways:
#:
#: * **a cut call stays as streamed**: the engine's ``finish()`` emits no ``TOOL_CALL_END`` for a
#:   call the output ended in, so nothing closes its arguments (``{"city": "Par`` for the tokens
#:   ``<parameter=city>\nPar``; the reference keeps it, README "not corrected"): the argument
#:   pieces the parsers' ``finish`` adds to a call that was already open are dropped
#:   (``cut_call_rest``; our chat stream closes the object, ``worker.parsers.incremental``);
#: * **tool_choice none**: ``ParserEngine._check_skip_tool_parsing`` sets
#:   ``_suppress_tool_calls`` when ``tool_choice == "none"`` and tools are given, so the engine
#:   still consumes the call markup and drops it: the stream sends nothing from the call marker
#:   on, while the non-streaming answer keeps the text. The reference's R6 ("the stream dropped a
#:   whole message ...: the expected stream delivers that message, one delta with the full
#:   text") makes that the text from the marker on, held and sent as one delta when the message
#:   closes (``held_marker_ids``: the family's call marker tokens; the builder holds).
ENGINE_PARSERS = frozenset({"qwen3_coder", "qwen3_xml", "mistral"})


def cut_call_rest(tool_calls: list, open_index: int) -> list:
    """``tool_calls`` of the parsers' ``finish`` delta without the argument pieces of call
    ``open_index`` (the call open when the output ended: ``ENGINE_PARSERS`` leave it as
    streamed); calls that start there (a name) are kept."""
    return [tc for tc in tool_calls if tc.name is not None or tc.index != open_index]


def held_marker_ids(tool_parser: Any, token_to_id) -> list[int]:
    """Token ids of the call markers of ``tool_parser`` (``markers`` of a jsontail family,
    ``starts`` of a tagged one) that are single tokens (``token_to_id``: the tokenizer's);
    an output step holding one of them starts the held text (``ENGINE_PARSERS``, tool_choice
    none)."""
    names = tuple(getattr(tool_parser, "markers", ())) + tuple(getattr(tool_parser, "starts", ()))
    return sorted({i for i in (token_to_id(m) for m in names) if i is not None})
