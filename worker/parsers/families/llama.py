"""Llama 3.1/3.2/3.3 family: ``--tool-parser llama3_json``.

Format (Llama 3.1 model card, JSON-based tool calling, and its chat template; vLLM
``llama_tool_parser``): the assistant answers a call with a JSON object
``{"name": ..., "parameters": {...}}``, optionally after the ``<|python_tag|>`` special token;
several calls are separated by ``;`` (or stand one per line: vLLM 0.33's
``test_extract_tool_calls_streaming_parallel_separators``). ``"arguments"`` is accepted for
``"parameters"``; an object with neither is not a call (``*_missing_parameters_and_arguments_key``).

Parity rules (README rule d): vLLM's non-streaming parser extracts the JSON call wherever it
starts, so text before a complete call is dropped and the call returned
(``llama3-tool-content-before-v0``); an incomplete or invalid call leaves the whole output as
content (``llama3-tool-malformed-v0``). Hence, with tools in play, the output is held and
parsed at the end (``JsonTailToolParser.hold_all``). Prose after the call chain is the
assistant's content (bug-013: vLLM required the whole rest to be JSON and lost the call).

``--tool-call-streaming incremental`` (``worker.parsers.incremental``): when the output opens with
a call (``<|python_tag|>`` optional), its name goes out once ``{"name": "…", "parameters": {``
arrived, then the raw JSON arguments; an output with prose first keeps the whole parse.
"""
from __future__ import annotations

import json

from worker.parsers.incremental import NAME_ARGS_HEAD, JsonArgs
from worker.parsers.jsontail import JsonTailToolParser, call_of
from worker.parsers.registry import register_tool

_PYTHON_TAG = "<|python_tag|>"
_MAX_STARTS = 32
_DECODER = json.JSONDecoder()


def _chain(text: str, i: int) -> tuple[list[tuple[str, str]], int] | None:
    """``call; call; ...`` starting at ``text[i] == "{"`` -> (calls, end offset of the last
    call); None unless every segment is a call."""
    calls = []
    n = len(text)
    while True:
        try:
            obj, j = _DECODER.raw_decode(text, i)
        except ValueError:
            return None
        if not isinstance(obj, dict) or ("parameters" not in obj and "arguments" not in obj):
            return None  # vLLM: a call names its arguments (``*_missing_parameters_and_arguments_key``)
        c = call_of(obj)
        if c is None:
            return None
        calls.append(c)
        end = j
        k = j
        while j < n and text[j].isspace():
            j += 1
        newline = "\n" in text[k:j]
        if j < n and text[j] == ";":
            j += 1
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j] == "{":
                i = j
                continue
        elif newline and j < n and text[j] == "{":  # calls one per line (vLLM's separators test)
            i = j
            continue
        return calls, end


def parse_llama_output(text: str) -> list[tuple[str, str]] | None:
    """Calls in a Llama 3 output: after ``<|python_tag|>`` if present, else from the first
    ``{`` that starts a call chain (a bounded number of candidates)."""
    return parse_llama_calls(text)[0]


def parse_llama_calls(text: str) -> tuple[list[tuple[str, str]] | None, str]:
    """``(calls, text after the call chain)`` of a Llama 3 output (``parse_llama_output``); the
    trailing text is ``""`` when it is only whitespace."""
    k = text.find(_PYTHON_TAG)
    if k >= 0:
        text = text[k + len(_PYTHON_TAG):]
    pos = 0
    for _ in range(_MAX_STARTS):
        i = text.find("{", pos)
        if i < 0:
            return None, ""
        found = _chain(text, i)
        if found and found[0]:
            calls, end = found
            rest = text[end:]
            return calls, (rest if rest.strip() else "")
        pos = i + 1
    return None, ""


@register_tool("llama3_json", "Llama 3.1/3.2/3.3", '<|python_tag|>? {"name", "parameters"}; …')
class Llama3JsonToolParser(JsonTailToolParser):
    """Llama 3 JSON calls (whole output parsed at the end)."""

    hold_all = True
    #: incremental streaming: a call opening the output (after ``<|python_tag|>`` if any), then
    #: ``; {...}`` calls; prose first -> the output is parsed whole at the end
    stream_spec = JsonArgs(head=r"\s*(?:<\|python_tag\|>)?" + NAME_ARGS_HEAD,
                           next=r"\s*\}[^\S\n]*(?:;|\n)" + NAME_ARGS_HEAD)

    def parse_body(self, body: str) -> list[tuple[str, str]] | None:
        return parse_llama_output(body)

    def parse_calls(self, body: str) -> tuple[list[tuple[str, str]] | None, str]:
        return parse_llama_calls(body)
