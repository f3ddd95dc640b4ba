"""Typing of tool-call parameter values written as raw text (XML-style markup: Qwen3-Coder's
``<parameter=P>``, DeepSeek's DSML ``<parameter name=P string="false">``), following vLLM's
``_convert_param_value``: the request's JSON-schema type of the parameter decides.

* ``null`` (any case) -> None;
* no schema entry (unknown parameter or function) -> the string;
* ``string``/``str``/``text``/``varchar``/``char``/``enum`` -> the string;
* ``integer``/``int``/``uint``/``long``/``short``/``unsigned`` -> int, else the string;
* ``number``/``num``/``float`` -> int when integral, else float; else the string;
* ``boolean``/``bool``/``binary`` -> ``value.lower() == "true"``;
* ``object``/``array``/``dict``/``list`` and anything else -> JSON, else the string.
"""
from __future__ import annotations

import json
import math
from typing import Any

_STRING = ("string", "str", "text", "varchar", "char", "enum")
_INT = ("int", "uint", "long", "short", "unsigned")
_NUM = ("num", "float")
_BOOL = ("boolean", "bool", "binary")


def _type_name(t: Any) -> str | None:
    if isinstance(t, list):  # ["integer", "null"] -> "integer"
        t = next((x for x in t if isinstance(x, str) and x != "null"), None)
    return t.strip().lower() if isinstance(t, str) else None


def convert_param(value: str, param_type: Any, known: bool = True) -> Any:
    """The JSON value of raw parameter text ``value`` for schema type ``param_type``
    (``known``: the parameter is declared in the function's schema)."""
    if value.lower() == "null":
        return None
    if not known:
        return value
    t = _type_name(param_type)
    if t is None:
        try:
            return json.loads(value)
        except ValueError:
            return value
    if t in _STRING:
        return value
    if t.startswith(_INT):
        try:
            return int(value)
        except ValueError:
            return value
    if t.startswith(_NUM) or t == "number":
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
        return json.loads(value)
    except ValueError:
        return value


def dumps_args(params: dict[str, Any]) -> str:
    """Arguments JSON text as vLLM's parsers serialize it (``json.dumps``, non-ASCII kept)."""
    return json.dumps(params, ensure_ascii=False)
