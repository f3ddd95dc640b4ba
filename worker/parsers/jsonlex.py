"""A resumable JSON lexer: how far a JSON value in a text has got (inside a string, after a
backslash, nesting depth), advanced over each delta only (no re-scan of text already lexed).

Shared by the tagged engine (``tagged.lex_json``: where a call body's JSON ends, so that an end
marker inside a JSON string does not end the call) and the incremental argument streamer
(``incremental._lex_object``: where the arguments object closes). Rule source: RFC 8259 strings
(``"`` ends a string unless escaped by ``\\``) and structure (``{``/``[`` open, ``}``/``]`` close).
"""
from __future__ import annotations

import re
from itertools import accumulate

__all__ = ["scan_json"]

_STR_STOP = re.compile(r'["\\]')
_OUT_STOP = re.compile(r'["{}\[\]]')
#: inside a string: everything up to its closing quote (not included), a backslash with nothing
#: after it, or the end
_STR_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)
#: outside strings: text without quotes and complete strings, up to a string that does not
#: close (its opening quote not included) or the end
_SPAN = re.compile(r'(?:[^"]+|"[^"\\]*(?:\\.[^"\\]*)*")*', re.S)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r'[^{}\[\]]+')
_STEP = {"{": 1, "[": 1, "}": -1, "]": -1}


def _depth(span: str, depth: int, clamp: bool) -> int:
    """Nesting depth after ``span`` (text outside strings and complete strings only), from
    ``depth``; ``clamp``: a closing bracket at depth 0 leaves it at 0. Counts brackets with
    C-level ``str.count`` once strings are removed; with ``clamp``, when the depth could reach 0,
    the clamped walk ``d = max(0, d + step)`` ends at ``S + max(depth, -min prefix sum of S)``
    (Lindley's recursion), its prefix sums taken by ``itertools.accumulate``."""
    if '"' in span:  # (complete strings only)
        span = _STRING.sub("", span)
    closes = span.count("}") + span.count("]")
    delta = span.count("{") + span.count("[") - closes
    if not clamp or closes <= depth:
        return depth + delta
    low = min(accumulate(map(_STEP.__getitem__, _NOT_BRACKET.sub("", span))))
    return delta + max(depth, -low)


def scan_json(s: str, i: int, end: int, ins: bool, esc: bool, depth: int, *, clamp: bool = True,
              stop_at_close: bool = False) -> tuple[int, bool, bool, int, bool]:
    """Lex ``s[i:end]`` from the state (``ins``: inside a string, ``esc``: the previous character
    was a backslash inside it, ``depth``: open ``{``/``[`` outside strings) and return
    ``(i, ins, esc, depth, closed)``. ``clamp``: a closing bracket at depth 0 leaves the depth at
    0 (else it goes negative). ``stop_at_close``: stop just after the closing bracket that brings
    the depth to 0 or below (``closed`` True, ``i`` just after it); otherwise ``i == end`` and
    ``closed`` is False. Runs in O(end - i): without ``stop_at_close`` in a few C-level regex
    and count passes (``_STR_BODY`` / ``_SPAN`` / ``_depth``, no Python step per character or
    per string), with it by regex jumps between significant characters."""
    if not stop_at_close:
        if ins and esc and i < end:
            esc, i = False, i + 1
        if s.find("\\", i, end) < 0:  # no escapes: every quote toggles (split at the quotes)
            if i >= end:
                return i, ins, esc, depth, False
            parts = s[i:end].split('"')
            outside = parts[1::2] if ins else parts[0::2]
            if len(parts) > 1:
                depth = _depth("".join(outside), depth, clamp)
            elif not ins:
                depth = _depth(parts[0], depth, clamp)
            return end, ins != (len(parts) % 2 == 0), False, depth, False
        while i < end:  # at most: the open string's rest, a span, a string left open
            if ins:
                if esc:
                    esc, i = False, i + 1
                    continue
                k = _STR_BODY.match(s, i, end).end()
                if k == end:
                    return end, True, False, depth, False
                if s[k] == "\\":  # the last character: the escaped one comes later
                    return end, True, True, depth, False
                ins, i = False, k + 1
                continue
            k = _SPAN.match(s, i, end).end()
            if k > i:
                depth = _depth(s[i:k], depth, clamp)
            if k == end:
                return end, False, False, depth, False
            ins, i = True, k + 1  # a string that does not close before ``end``
        return i, ins, esc, depth, False
    closed = False
    while i < end:
        if ins:
            if esc:
                esc, i = False, i + 1
                continue
            m = _STR_STOP.search(s, i, end)
            if m is None:
                i = end
                break
            i = m.end()
            if m.group() == "\\":
                esc = True
            else:
                ins = False
        else:
            m = _OUT_STOP.search(s, i, end)
            if m is None:
                i = end
                break
            i = m.end()
            c = m.group()
            if c == '"':
                ins = True
            elif c in "{[":
                depth += 1
            else:
                if depth > 0 or not clamp:
                    depth -= 1
                if stop_at_close and depth <= 0:
                    closed = True
                    break
    return i, ins, esc, depth, closed
