"""Typing of tool-call parameter values written as raw text (XML-style markup: Qwen3-Coder's
``<parameter=P>``, DeepSeek's DSML ``<parameter name=P string="false">``), following vLLM's
``_convert_param_value``: the request's JSON-schema type of the parameter decides.

* ``null`` (any case) -> None (``string_null=False``: not for a parameter whose schema type is
  a string (``is_plain_string``), which keeps the text, as vLLM 0.32's parser engine types it:
  ``coerce_to_schema_type`` makes ``null`` JSON null only where the schema admits null);
* no schema entry (unknown parameter or function) -> the string;
* ``string``/``str``/``text``/``varchar``/``char``/``enum`` -> the string;
* ``integer``/``int``/``uint``/``long``/``short``/``unsigned`` -> int, else the string;
* ``number``/``num``/``float`` -> an integer literal stays that exact integer (any size: a
  float round trip would turn ``9223372036854775807`` into ``…808``, bug-114); another number
  spelling -> int when integral, else float (normalised, as vLLM); else the string;
* ``boolean``/``bool``/``binary`` -> ``value.lower() == "true"``;
* ``object``/``array``/``dict``/``list`` and anything else -> JSON, else the string.

Integers are exact at any size, also inside JSON values (``loads_json``): CPython's ``int()``
refuses literals over ``sys.get_int_max_str_digits()`` digits (4300, its guard against quadratic
conversion), so such a literal is kept as its text (``JsonInt``) and written back verbatim as a
JSON number by ``dumps_args``.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

_STRING = ("string", "str", "text", "varchar", "char", "enum")
_INT = ("int", "uint", "long", "short", "unsigned")
_NUM = ("num", "float")
_BOOL = ("boolean", "bool", "binary")


_INT_LITERAL = re.compile(r"\s*[+-]?[0-9]+\s*")


class JsonInt:
    """An integer literal too long for ``int()`` (see module docstring), kept as its JSON text
    (``text``: optional ``-`` then digits). ``dumps_args`` writes it as a bare JSON number."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonInt) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"JsonInt({self.text!r})"


def exact_int(literal: str) -> int | JsonInt:
    """The integer of a decimal integer literal (``[+-]digits``, surrounding whitespace allowed),
    exact at any size. Raises ``ValueError`` when ``literal`` is not one."""
    if not _INT_LITERAL.fullmatch(literal):
        raise ValueError(f"not an integer literal: {literal[:40]!r}")
    try:
        return int(literal)
    except ValueError:  # over int()'s digit limit: keep the text (canonical: no '+', no spaces)
        t = literal.strip().lstrip("+")
        neg = t.startswith("-")
        digits = t.lstrip("-").lstrip("0") or "0"
        return JsonInt(("-" if neg and digits != "0" else "") + digits)


def loads_json(text: str) -> Any:
    """``json.loads`` with integers exact at any size (``JsonInt`` past ``int()``'s limit).
    Raises ``ValueError`` when ``text`` is not JSON."""
    return json.loads(text, parse_int=exact_int)


def _type_name(t: Any) -> str | None:
    if isinstance(t, list):  # ["integer", "null"] -> "integer"
        t = next((x for x in t if isinstance(x, str) and x != "null"), None)
    return t.strip().lower() if isinstance(t, str) else None


def is_string_param(param_type: Any, known: bool = True) -> bool:
    """True when ``convert_param(value, param_type, known)`` is ``value`` itself for every value
    but ``null`` (an undeclared parameter, or a string-like schema type): such a value can be
    streamed as a JSON string before it ends (``worker.parsers.incremental``)."""
    return not known or _type_name(param_type) in _STRING


def is_plain_string(param_type: Any, known: bool = True) -> bool:
    """True when the parameter is declared with one string-like schema type (``"string"``,
    ``"enum"``, ...; not a list of types such as ``["string", "null"]``): with
    ``convert_param(..., string_null=False)`` its value is its text whatever it reads."""
    return known and isinstance(param_type, str) and param_type.strip().lower() in _STRING


def convert_param(value: str, param_type: Any, known: bool = True, string_null: bool = True) -> Any:
    """The JSON value of raw parameter text ``value`` for schema type ``param_type``
    (``known``: the parameter is declared in the function's schema; ``string_null``: ``null``
    is JSON null also for a plain string parameter, see the module docstring)."""
    if value.lower() == "null" and (string_null or not is_plain_string(param_type, known)):
        return None
    if not known:
        return value
    t = _type_name(param_type)
    if t is None:
        try:
            return loads_json(value)
        except ValueError:
            return value
    if t in _STRING:
        return value
    if t.startswith(_INT):
        try:
            return int(value)
        except ValueError:
            try:
                return exact_int(value)  # an integer over int()'s digit limit
            except ValueError:
                return value
    if t.startswith(_NUM) or t == "number":
        if _INT_LITERAL.fullmatch(value):
            return exact_int(value)
        try:
            f = float(value)
        except ValueError:
            return value
        if math.isfinite(f) and f == int(f):
            return int(f)
        return f
    if t in _BOOL:
        return value.lower() == "true"
    try:
        return loads_json(value)
    except ValueError:
        return value


class _HasJsonInt(Exception):
    pass


def _no_default(o: Any) -> Any:
    if isinstance(o, JsonInt):
        raise _HasJsonInt
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _encode(v: Any) -> str:
    if isinstance(v, JsonInt):
        return v.text
    if isinstance(v, dict):
        return "{" + ", ".join(json.dumps(k, ensure_ascii=False) + ": " + _encode(x) for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_encode(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


def dumps_args(params: Any) -> str:
    """Arguments JSON text as vLLM's parsers serialize it (``json.dumps``, non-ASCII kept), with
    ``JsonInt`` values written as their exact digits."""
    try:
        return json.dumps(params, ensure_ascii=False, default=_no_default)
    except _HasJsonInt:
        return _encode(params)
