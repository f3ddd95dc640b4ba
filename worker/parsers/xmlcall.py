"""Helpers for XML-ish call bodies: ``<invoke name="f"><parameter name="k">v</parameter></invoke>``
with a family-specific tag prefix (MiniMax-M2 ``invoke``/``parameter``, Step3
``steptml:invoke``/``steptml:parameter``), used by ``TaggedToolParser`` families whose start/end
markers wrap the whole block (``param_types = True``: the request's schema types are in the
state). Parameter values are raw text typed by the request's JSON schema with
``worker.parsers.values.convert_param`` (vLLM's ``_convert_param_value`` rules: a parameter the
schema does not declare stays a string).
"""
from __future__ import annotations

import json
import re
from typing import Any

from worker.parsers.values import convert_param


def json_or_text(text: str) -> Any:
    """``text`` decoded as JSON when it is JSON, else ``text`` itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def typed_value(raw: str, fn_types: dict[str, Any] | None, key: str) -> Any:
    """``raw`` typed by the schema type of parameter ``key`` (``fn_types``: the function's
    ``{param: type}``, None when the function is not declared)."""
    known = fn_types is not None and key in fn_types
    return convert_param(raw, fn_types.get(key) if known else None, known)


def strip_newline(v: str) -> str:
    """Drop one leading and one trailing newline (templates put values on their own lines)."""
    if v.startswith("\n"):
        v = v[1:]
    if v.endswith("\n"):
        v = v[:-1]
    return v


def parse_invokes(body: str, invoke: str, param: str, types: dict[str, dict[str, Any]],
                  strip_values: bool = False) -> list[tuple[str, str]] | None:
    """Calls in ``body``: ``<{invoke} name="N"> <{param} name="K">V</{param}> ... </{invoke}>``
    repeated, only whitespace between/around them; values typed by ``types`` (``{function:
    {param: type}}``; a value loses one leading/trailing newline, or all surrounding whitespace
    with ``strip_values``). None when anything else is there (malformed: the block is content)."""
    inv_re = re.compile(r'\s*<' + re.escape(invoke) + r'\s+name="([^"]*)"\s*>(.*?)</' + re.escape(invoke) + r'>\s*',
                        re.DOTALL)
    par_re = re.compile(r'\s*<' + re.escape(param) + r'\s+name="([^"]*)"\s*>(.*?)</' + re.escape(param) + r'>\s*',
                        re.DOTALL)
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        m = inv_re.match(body, pos)
        if not m:
            return None
        name, inner = m.group(1), m.group(2)
        fn_types = types.get(name)
        args: dict[str, Any] = {}
        p = 0
        while p < len(inner):
            pm = par_re.match(inner, p)
            if not pm:
                if inner[p:].strip():
                    return None
                break
            raw = pm.group(2).strip() if strip_values else strip_newline(pm.group(2))
            key = pm.group(1)
            args[key] = typed_value(raw, fn_types, key)
            p = pm.end()
        out.append((name, json.dumps(args, ensure_ascii=False)))
        pos = m.end()
    return out or None


def match_all(pattern: re.Pattern[str], body: str) -> list[re.Match[str]] | None:
    """Consecutive matches of ``pattern`` covering ``body`` (whitespace allowed between and
    around them); None when anything else is in the body or nothing matched."""
    out = []
    pos, n = 0, len(body)
    while True:
        while pos < n and body[pos].isspace():
            pos += 1
        if pos >= n:
            break
        m = pattern.match(body, pos)
        if not m or m.end() == pos:
            return None
        out.append(m)
        pos = m.end()
    return out or None


def json_args(text: str) -> str | None:
    """``text`` re-serialized when it is a JSON object (``json.dumps``, non-ASCII kept), else None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    return json.dumps(obj, ensure_ascii=False)
