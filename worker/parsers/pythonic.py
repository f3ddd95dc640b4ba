"""Pythonic tool calls: the output is a Python list of calls with keyword arguments,
``[get_weather(city="Paris", unit="c"), get_time(tz="CET")]`` (vLLM ``pythonic``,
``llama4_pythonic``, ``olmo3`` parsers; Llama 3.2/4, ToolACE, Olmo 3 chat templates).

Engine: ``MarkerToolParser`` with ``at_start`` (the list is the whole output: its first
non-whitespace text is the opening marker, e.g. ``[`` or a wrapper token) and a parser built on
Python's ``ast`` (no evaluation: ``ast.literal_eval`` on each argument value). Anything that is
not a list of ``name(kw=literal, ...)`` calls (positional arguments, trailing text) comes back as
content, verbatim. Within such a list (vLLM's newer pythonic tests), a call with a value JSON
cannot hold (a name, bytes, ``1e999``) is dropped and its siblings kept; a list that does not
parse (a broken quote in one call) keeps the calls of the pieces between calls that do; with no
call left it is content.

Prose before the list (``after_text``, bug-016): a ``[`` later in the output opens the list
when it is followed by ``name(`` with ``name`` a declared tool; the prose is content.

Options a family sets: ``wrappers`` (start marker -> end marker that closes the body, e.g.
Llama 4's ``<|python_start|>``/``<|python_end|>``), ``newline_calls`` (the body is one call per
line without brackets, Olmo 3) and ``json_literals`` (``true``/``false``/``null`` accepted as
values, Olmo 3).

A wrapper section that never closed (``finish_reason: "length"``) keeps its complete calls, as
the tagged engine's sections do (``open_section``): the longest prefix of the list that ends
with a call's closing ``)`` and parses (the last ``_MAX_CUTS`` candidates, from the end), or
for one-call-per-line bodies every line but a last one that does not parse; the cut-off call is
dropped, never a call. Nothing complete: content, verbatim.
"""
from __future__ import annotations

import ast
import json
import re
import threading
from typing import Any, ClassVar

from worker.parsers.marker import MarkerToolParser

_JSON_NAMES = {"true": True, "false": False, "null": None}
_CALL_HEAD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\()?")
_HEAD_MAX = 256
#: candidate cut points (a call's ``)``) tried for an open wrapper section, from the end
_MAX_CUTS = 64


def _value(node: ast.AST, json_literals: bool) -> Any:
    if json_literals:
        if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
            return _JSON_NAMES[node.id]
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [_value(e, True) for e in node.elts]
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise ValueError("dict unpacking")
            return {_value(k, True): _value(v, True) for k, v in zip(node.keys, node.values, strict=True)}
    v = ast.literal_eval(node)
    if isinstance(v, (tuple, set)):
        v = list(v)
    return v


#: CPython 3.11's AST constructor keeps its recursion counter in per-interpreter state: two
#: threads in ``ast.parse`` at once (the worker's thread executor) can make one of them raise
#: SystemError "AST constructor recursion depth mismatch" (cpython gh-106905), which would turn a
#: valid call list into text; one parse at a time per process.
_AST_LOCK = threading.Lock()


#: a call's closing parenthesis before the next call of the list (``_salvage`` split points)
_CALL_SPLIT = re.compile(r"\)\s*,")


def _call_args(call: ast.Call, json_literals: bool) -> str | None:
    """The JSON arguments of one well-formed call, or None when a value is not a literal JSON
    can hold (bytes, ``1e999``, a name): vLLM's newer tests drop that call, not its siblings
    (``test_bad_sibling_call_does_not_drop_good_calls``, ``test_non_finite_argument_rejected``;
    ``Infinity`` is not JSON)."""
    try:
        args = {kw.arg: _value(kw.value, json_literals) for kw in call.keywords}
        return json.dumps(args, ensure_ascii=False, allow_nan=False)
    except Exception:  # noqa: BLE001  (ValueError, TypeError, RecursionError ...)
        return None


def _calls_of(src: str, json_literals: bool) -> list[tuple[str, str]] | None:
    """Calls of a list that parses (a call with a value JSON cannot hold dropped); None when
    ``src`` is not a list of ``name(kw=...)`` calls or no call is left. Raises SyntaxError."""
    with _AST_LOCK:
        tree = ast.parse(src.strip(), mode="eval")
    lst = tree.body
    if not isinstance(lst, ast.List) or not lst.elts:
        return None
    out = []
    for call in lst.elts:
        if not isinstance(call, ast.Call) or call.args or not isinstance(call.func, ast.Name) or \
                any(kw.arg is None for kw in call.keywords):
            return None
        args = _call_args(call, json_literals)
        if args is not None:
            out.append((call.func.id, args))
    return out or None


def _salvage(src: str, json_literals: bool) -> list[tuple[str, str]] | None:
    """The calls of a ``[...]`` list that does not parse as a whole (a broken quote in one
    call): each piece between a call's ``)`` and the next ``,`` at most ``_MAX_CUTS`` pieces,
    parsed on its own; the pieces that are calls are kept (vLLM's newer
    ``test_good_call_survives_unparsable_sibling``); None when none is."""
    body = src.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    inner = body[1:-1]
    pieces, pos = [], 0
    for m in _CALL_SPLIT.finditer(inner):
        pieces.append(inner[pos:m.start() + 1])
        pos = m.end()
        if len(pieces) >= _MAX_CUTS:
            return None
    pieces.append(inner[pos:])
    if len(pieces) < 2:
        return None
    out = []
    for piece in pieces:
        try:
            calls = _calls_of("[" + piece + "]", json_literals)
        except Exception:  # noqa: BLE001
            calls = None
        out.extend(calls or ())
    return out or None


def parse_pythonic_list(src: str, json_literals: bool = False) -> list[tuple[str, str]] | None:
    """``[f(a=1), g(b="x")]`` -> ``[("f", '{"a": 1}'), ("g", '{"b": "x"}')]``; None when ``src``
    is not such a list. A call whose values JSON cannot hold is dropped (``_call_args``); a list
    that does not parse keeps the calls of its pieces that do (``_salvage``). Never raises."""
    try:
        return _calls_of(src, json_literals)
    except SyntaxError:
        return _salvage(src, json_literals)
    except Exception:  # noqa: BLE001  (ValueError, RecursionError, TypeError ...)
        return None


class PythonicToolParser(MarkerToolParser):
    """Whole-output pythonic call list (module docstring)."""

    markers: ClassVar[tuple[str, ...]] = ("[",)
    at_start: ClassVar[bool] = True
    #: start marker -> end marker closing the body (the body is the text between them)
    wrappers: ClassVar[dict[str, str]] = {}
    newline_calls: ClassVar[bool] = False
    json_literals: ClassVar[bool] = False
    after_text: ClassVar[bool] = True

    def confirm_start(self, st, marker: str, rest: str) -> bool | None:
        """After prose, ``[`` opens the list only before ``name(`` of a declared tool; a
        wrapper marker always opens it."""
        if marker != "[":
            return True
        m = _CALL_HEAD.match(rest)
        if m is None:
            return None if not rest.strip() and len(rest) < _HEAD_MAX else False
        if m.group(2):
            return m.group(1) in st.names
        return None if m.end() == len(rest) and len(rest) < _HEAD_MAX else False

    def parse(self, marker: str, body: str) -> list[tuple[str, str]] | None:
        body = body.strip()
        end = self.wrappers.get(marker)
        if end is not None:
            if not body.endswith(end):
                return self.open_section(body)
            body = body[: len(body) - len(end)].strip()
        elif marker == "[":
            body = "[" + body
        if self.newline_calls and not body.startswith("["):
            lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
            body = "[" + ", ".join(lines) + "]"
        return parse_pythonic_list(body, self.json_literals)

    def open_section(self, body: str) -> list[tuple[str, str]] | None:
        """The complete calls of a wrapper section cut off before its end marker (module
        docstring); None when there is none. Runs once, at the end of the output: at most
        ``_MAX_CUTS`` + 2 parses of the body."""
        if self.newline_calls and not body.startswith("["):
            lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
            for n in (len(lines), len(lines) - 1):  # the last line may be a cut-off call
                if n > 0:
                    calls = parse_pythonic_list("[" + ", ".join(lines[:n]) + "]", self.json_literals)
                    if calls is not None:
                        return calls
            return None
        calls = parse_pythonic_list(body, self.json_literals)  # the list closed, the wrapper not
        if calls is not None:
            return calls
        i = len(body)
        for _ in range(_MAX_CUTS):
            i = body.rfind(")", 0, i)
            if i < 0:
                break
            calls = parse_pythonic_list(body[: i + 1] + "]", self.json_literals)
            if calls is not None:
                return calls
        return None
