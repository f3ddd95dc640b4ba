"""A resumable JSON lexer: how far a JSON value in a text has got (inside a string, after a
backslash, nesting depth), advanced over each delta only (no re-scan of text already lexed).

Shared by the tagged engine (``tagged.lex_json``: where a call body's JSON ends, so that an end
marker inside a JSON string does not end the call) and the incremental argument streamer
(``incremental._lex_object``: where the arguments object closes). Rule source: RFC 8259 strings
(``"`` ends a string unless escaped by ``\\``) and structure (``{``/``[`` open, ``}``/``]`` close).
"""
from __future__ import annotations

import re

__all__ = ["scan_json"]

_STR_STOP = re.compile(r'["\\]')
_OUT_STOP = re.compile(r'["{}\[\]]')


def scan_json(s: str, i: int, end: int, ins: bool, esc: bool, depth: int, *, clamp: bool = True,
              stop_at_close: bool = False) -> tuple[int, bool, bool, int, bool]:
    """Lex ``s[i:end]`` from the state (``ins``: inside a string, ``esc``: the previous character
    was a backslash inside it, ``depth``: open ``{``/``[`` outside strings) and return
    ``(i, ins, esc, depth, closed)``. ``clamp``: a closing bracket at depth 0 leaves the depth at
    0 (else it goes negative). ``stop_at_close``: stop just after the closing bracket that brings
    the depth to 0 or below (``closed`` True, ``i`` just after it); otherwise ``i == end`` and
    ``closed`` is False. Runs in O(end - i) with regex jumps between significant characters."""
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
