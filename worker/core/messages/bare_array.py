"""Mistral's ``tool_choice: any`` / named tool: the output is a bare JSON array of calls, streamed.

vLLM 0.32 constrains HF-mode Mistral under a required or named ``tool_choice`` to the JSON
schema of a bare array ``[{"name": ..., "arguments": {...}}]`` (``MistralParser.
_build_guided_schema_pre_v11``; no ``[TOOL_CALLS]`` token) and streams each call's arguments as
they are generated (the reference's ``mistral-7b-v0.3-tool-choice-any``: ``{"city":``,
`` "Lyon"``, ``}``), where our shared stack parses that JSON only at the end (one delta). The
rule, as vLLM's required-choice streaming applies it: a call opens (its name and first
argument text) once text follows ``"arguments":`` (or ``"parameters":``) and whitespace in its
object; from then on every character of the arguments is streamed, the object's own closing
brace, the commas between objects and the array's brackets are not (brace level counted
outside JSON strings). Text that never opens a call is returned as content at the end.

The scan keeps only the current object's text until its call opens (the name's bounded
prefix) and a few counters after: O(1) state per open call.
"""
from __future__ import annotations

import json
import re

import msgspec

from worker.parsers.base import Delta, ToolCallDelta

__all__ = ["ArrayScan", "scan", "finish"]

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
#: characters of an object's head kept before its call opens (name + key); a longer head never opens
HEAD_LIMIT = 4096


class ArrayScan(msgspec.Struct, kw_only=True, array_like=True):
    """The scan's state: ``level`` (brace depth outside strings), ``in_str`` / ``esc`` (inside a
    JSON string / after a backslash), ``open`` (the current object's call is open), ``calls``
    (calls opened), ``head`` (the current object's text before its call opened), ``rest``
    (text that opened no call: content at the end)."""

    level: int = 0
    in_str: bool = False
    esc: bool = False
    open: bool = False
    calls: int = 0
    head: str = ""
    rest: str = ""


def _name(raw: str) -> str | None:
    """A call head's JSON-escaped name, decoded; None when it is no JSON string (a raw control
    character, a bad escape) or escapes a lone surrogate the reply could not encode: the object
    opens no call (its text stays content) instead of a 500."""
    try:
        name = json.loads('"' + raw + '"')
        name.encode("utf-8")
    except ValueError:  # (JSONDecodeError and UnicodeEncodeError are ValueErrors)
        return None
    return name


def scan(s: ArrayScan, text: str) -> Delta:
    """One step's text -> the call fragments it streams (module docstring)."""
    out: dict[int, ToolCallDelta] = {}
    for ch in text:
        if s.esc:
            s.esc = False
        elif s.in_str:
            if ch == "\\":
                s.esc = True
            elif ch == '"':
                s.in_str = False
        elif ch == '"':
            s.in_str = True
        elif ch == "{":
            s.level += 1
        elif ch == "}":
            s.level -= 1
        if not s.open:
            if s.level == 0 and not s.head:
                if ch not in "[], \n\t\r":
                    s.rest += ch
                continue
            s.head += ch
            m = _HEAD.match(s.head)
            name = _name(m.group(1)) if m and len(s.head) > m.end() else None
            if name is not None:
                s.open = True
                out[s.calls] = ToolCallDelta(index=s.calls, name=name, arguments=s.head[m.end():])
                s.head = ""
            elif s.level <= 0 or len(s.head) > HEAD_LIMIT:  # an object that is not a call
                s.rest += s.head
                s.head, s.level = "", 0
            continue
        if s.level == 0:  # the call object's closing brace
            s.open = False
            s.calls += 1
            continue
        tc = out.get(s.calls)
        if tc is None:
            tc = out[s.calls] = ToolCallDelta(index=s.calls)
        tc.arguments += ch
    return Delta(tool_calls=list(out.values()))


def finish(s: ArrayScan) -> Delta:
    """The end of the output: text that opened no call, as content (only when no call opened)."""
    text = s.rest + s.head
    s.rest = s.head = ""
    return Delta(content=text if s.calls == 0 and not s.open else "")
