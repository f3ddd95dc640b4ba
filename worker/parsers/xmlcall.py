"""Engine for XML-parameter tool-call bodies: GLM-4.5/4.7's ``NAME<arg_key>k</arg_key>
<arg_value>v</arg_value>``, Qwen3-Coder / Seed-OSS's ``<function=NAME><parameter=k>v</parameter>
</function>``, MiniMax-M2 / Step-3's ``<invoke name="NAME"><parameter name="k">v</parameter>
</invoke>`` (tag prefix per family). A family describes its tags once (``XmlFormat``) and
``read_calls`` walks a call body over them; parameter values are raw text typed by the
request's JSON schema with ``worker.parsers.values.convert_param`` (vLLM's
``_convert_param_value`` rules: a parameter the schema does not declare stays a string), or by
the family's own rule (GLM).

Malformed markup that is still unambiguous is recovered, by three rules (the only ones):

* **repeated tag**: the same tag written twice in a row, only whitespace between
  (``<arg_key>path</arg_key></arg_key>``, ``<arg_key><arg_key>path``, ``</parameter>
  </parameter>``), counts once;
* **implied opening tag**: an opening tag that carries nothing (GLM's ``<arg_key>`` and
  ``<arg_value>``) may be missing when its closing tag is there: the text between the previous
  tag and that closing tag is the key or value (``<arg_key>q</arg_key>text</arg_value>``).
  Opening tags that carry the call name or the parameter key (``<function=NAME>``,
  ``<parameter=K>``, ``<invoke name="N">``, ``<parameter name="K">``) are never implied;
* **implied closing tag** (in a block whose end marker arrived): an element whose closing tag
  is missing ends at the next tag that can only follow it: a value at the next parameter or
  key, a key at its value, a call at the next call or at the end of the block
  (``<function=f><parameter=a>1</parameter></tool_call>``).

Anything else (text where only tags may be, a key without value, a closing tag of an element
that is not open, an empty name or key) makes the body unreadable: None, and the block stays
content, verbatim. Sources: vLLM's GLM fixes for the same outputs (pull requests #54971:
repeated ``arg_key`` tags must not leak into the key; #49249 / #51364 and issue #49248: a missing
``<arg_value>`` with its ``</arg_value>`` present; #47190: a missing first ``<arg_key>``), and
vLLM's ``qwen3coder`` parser, which already takes a call without ``</function>`` and a
parameter without ``</parameter>``. Work is one regex scan of the body (the body is complete,
this runs once per call block).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from worker.parsers.values import convert_param, dumps_args, loads_json


def json_or_text(text: str) -> Any:
    """``text`` decoded as JSON (integers exact, ``loads_json``) when it is JSON, else ``text``."""
    try:
        return loads_json(text)
    except ValueError:
        return text


def typed_value(raw: str, fn_types: dict[str, Any] | None, key: str, string_null: bool = True) -> Any:
    """``raw`` typed by the schema type of parameter ``key`` (``fn_types``: the function's
    ``{param: type}``, None when the function is not declared; ``string_null``: as
    ``values.convert_param``)."""
    known = fn_types is not None and key in fn_types
    return convert_param(raw, fn_types.get(key) if known else None, known, string_null)


def strip_newline(v: str) -> str:
    """Drop one leading and one trailing newline (templates put values on their own lines)."""
    if v.startswith("\n"):
        v = v[1:]
    if v.endswith("\n"):
        v = v[:-1]
    return v


@dataclass(frozen=True)
class XmlFormat:
    """The tags of one XML-parameter format, as regular expressions (a group named ``a``
    captures the call name in ``call_open`` and the parameter key in ``value_open``).

    ``call_open``/``call_close``: one call (None: the body is one call whose name is given,
    GLM); ``key_open``/``key_close``: a key element before each value (GLM; None when the key
    is an attribute of ``value_open``); ``value_open``/``value_close``: one parameter value.
    ``lenient``: text outside any element is ignored instead of making the body unreadable
    (vLLM's ``qwen3coder`` finds its tags with ``findall``)."""

    value_open: str
    value_close: str
    call_open: str | None = None
    call_close: str | None = None
    key_open: str | None = None
    key_close: str | None = None
    lenient: bool = False
    _re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        alts = []
        for kind in ("call_open", "call_close", "key_open", "key_close", "value_open", "value_close"):
            pat = getattr(self, kind)
            if pat is not None:
                alts.append(f"(?P<{kind}>" + pat.replace("(?P<a>", f"(?P<{kind}_a>") + ")")
        object.__setattr__(self, "_re", re.compile("|".join(alts)))

    def tags(self, body: str) -> list[tuple[str, str | None, int, int]]:
        """``(kind, attribute, start, end)`` of every tag in ``body``, repeated tags dropped
        (rule "repeated tag")."""
        out: list[tuple[str, str | None, int, int]] = []
        for m in self._re.finditer(body):
            kind = m.lastgroup or ""
            if kind.endswith("_a"):
                kind = kind[:-2]
            attr = m.groupdict().get(kind + "_a")
            if out and out[-1][:2] == (kind, attr) and not body[out[-1][3]:m.start()].strip():
                out[-1] = (kind, attr, out[-1][2], m.end())
                continue
            out.append((kind, attr, m.start(), m.end()))
        return out


#: one call read by ``read_calls``: its name and ``[(key, raw value)]`` in order
RawCall = tuple[str, list[tuple[str, str]]]


def read_calls(fmt: XmlFormat, body: str, name: str | None = None, complete: bool = True
               ) -> list[RawCall] | None:
    """The calls of a block body in format ``fmt`` (module docstring: the grammar and the
    recovery rules). ``name``: the call's name for formats without call tags (the body is then
    that call's parameters). ``complete``: the block's end marker arrived; otherwise (a block
    cut off at the end of the output) nothing is implied at the end: a value or key without its
    closing tag is dropped and the open call keeps its complete parameters. None when the body
    is unreadable or holds no call."""
    calls: list[RawCall] = []
    cur: RawCall = (name or "", [])
    state = "call" if name is not None else "out"  # out | call | key | after_key | value
    glm = fmt.key_open is not None
    key = ""
    pos = 0  # where the text after the last consumed tag starts
    tags = fmt.tags(body)

    def free(a: int) -> bool:  # the text before a tag may stand outside any element
        return fmt.lenient or not body[pos:a].strip()

    i = 0
    while i < len(tags):
        kind, attr, a, b = tags[i]
        if state == "value":
            if kind != "value_close" and kind not in ("value_open", "key_open", "call_open", "call_close"):
                return None
            cur[1].append((key, body[pos:a]))
            state = "call"
            if kind != "value_close":  # implied closing tag: the tag is read again in "call"
                pos = a
                continue
        elif state == "key":
            if kind not in ("key_close", "value_open"):  # value_open: implied </key>
                return None
            key = body[pos:a].strip()
            if not key:
                return None
            state = "after_key"
            if kind == "value_open":
                pos = a
                continue
        elif state == "after_key":
            if kind == "value_open" and not body[pos:a].strip():
                state = "value"
            elif kind == "value_close":  # implied opening tag of the value
                cur[1].append((key, body[pos:a]))
                state = "call"
            else:
                return None
        elif state == "call":
            if kind == "value_open" and not glm and free(a) and (attr or "").strip():
                key, state = attr.strip(), "value"
            elif kind == "key_open" and free(a):
                state = "key"
            elif kind == "key_close" and glm:  # implied opening tag of the key
                key = body[pos:a].strip()
                if not key:
                    return None
                state = "after_key"
            elif kind in ("call_close", "call_open") and free(a):
                calls.append(cur)
                state = "out"
                if kind == "call_open":  # implied closing tag of the call
                    pos = a
                    continue
            else:
                return None
        elif kind == "call_open" and free(a) and (attr or "").strip():  # state "out"
            cur, state = (attr.strip(), []), "call"
        else:
            return None
        pos = b
        i += 1
    if state == "value" and complete:
        cur[1].append((key, body[pos:]))  # implied closing tag at the end of the block
        pos = len(body)
    elif state in ("key", "after_key") and complete:
        return None
    elif complete and not free(len(body)):
        return None
    if state != "out":
        calls.append(cur)  # implied closing tag of the call (or the open call, cut off)
    return calls or None


def typed_args(params: list[tuple[str, str]], fn_types: dict[str, Any] | None, strip: str = "newline",
               string_null: bool = True) -> str:
    """Arguments JSON of raw ``(key, value)`` pairs typed by the function's schema types
    (``typed_value``, ``string_null`` as there); ``strip``: ``"newline"`` (one leading/trailing
    newline, the templates' framing), ``"all"`` (surrounding whitespace) or ``"none"``. A
    repeated key keeps its last value (``json.loads`` semantics)."""
    args: dict[str, Any] = {}
    for key, raw in params:
        v = strip_newline(raw) if strip == "newline" else raw.strip() if strip == "all" else raw
        args[key] = typed_value(v, fn_types, key, string_null)
    return dumps_args(args)


@functools.cache
def invoke_format(invoke: str, param: str) -> XmlFormat:
    """``<{invoke} name="N"><{param} name="K">V</{param}></{invoke}>`` (MiniMax-M2 ``invoke``/
    ``parameter``, Step-3 ``steptml:invoke``/``steptml:parameter``)."""
    i, p = re.escape(invoke), re.escape(param)
    return XmlFormat(call_open=r'<' + i + r'\s+name="(?P<a>[^"]*)"\s*>', call_close=r"</" + i + r">",
                     value_open=r'<' + p + r'\s+name="(?P<a>[^"]*)"\s*>', value_close=r"</" + p + r">")


def parse_invokes(body: str, invoke: str, param: str, types: dict[str, dict[str, Any]],
                  strip_values: bool = False) -> list[tuple[str, str]] | None:
    """Calls in ``body``: ``<{invoke} name="N"> <{param} name="K">V</{param}> ... </{invoke}>``
    repeated, only whitespace between/around them; values typed by ``types`` (``{function:
    {param: type}}``; a value loses one leading/trailing newline, or all surrounding whitespace
    with ``strip_values``). None when unreadable (``read_calls`` rules; the block is content)."""
    calls = read_calls(invoke_format(invoke, param), body)
    if calls is None:
        return None
    return [(n, typed_args(ps, types.get(n), "all" if strip_values else "newline")) for n, ps in calls]


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
    """``text`` re-serialized when it is a JSON object (``json.dumps``, non-ASCII kept, integers
    exact: ``loads_json``/``dumps_args``), else None."""
    try:
        obj = loads_json(text)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    return dumps_args(obj)
