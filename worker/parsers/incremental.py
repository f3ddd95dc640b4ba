"""Incremental tool-call streaming (``--tool-call-streaming incremental``) for the tagged and
jsontail engines (``tagged.py``, ``jsontail.py``: they call ``advance`` / ``settle``).

With ``whole`` (the default) a call reaches a streaming client in one delta when its block
closes, and the stream equals the non-streaming answer. With ``incremental`` a streamed choice
sends, in OpenAI's / vLLM's streaming shape, a call's first fragment ``{index, name, arguments:
""}`` (the stream core adds ``id`` and ``type: "function"``) as soon as the name is known, then
``{index, arguments: "..."}`` pieces as the arguments are generated:

* **JSON-argument formats** (``JsonArgs``: Hermes and the other ``{"name", "arguments"}`` blocks,
  Hunyuan / Jamba lists, Kimi K2, DeepSeek V3 / V3.1, Mistral, Llama 3 JSON, Phi-4-mini,
  Granite-20B-FC): the arguments object's raw text as the
  model writes it, from its ``{`` to its matching ``}`` (a small JSON lexer finds that brace).
  The name goes out once the call's head (everything up to the arguments' ``{``) has matched the
  family's head pattern, matched with ``regex``'s partial matching, so text that could still
  turn out not to be a call (a head that stops matching) is never announced;
* **XML-parameter formats** (``XmlArgs``: Qwen3-Coder / qwen3_xml, Seed-OSS, GLM-4.5/4.7,
  MiniMax-M2, Step-3): the JSON object being built: ``{"k": v``, then ``, "k2": v2``, then ``}``
  when the call closes. A parameter whose value the request's schema makes a string (or that
  the schema does not declare; the family's ``string_param``) streams as its value arrives
  (``{"path": "src/a.py", "content": "def f():\n  ...``), holding back only what may still be a
  tag, the template's framing whitespace around the value (``stream_strip``) and a value that
  may still read ``null`` (JSON null for every type, ``values.convert_param``); any other
  parameter goes out when its closing tag arrives (its JSON type is known only then). The name
  goes out with the call's opening tag (GLM: with the first ``<arg_key>`` after the name).

Held back: only the text that may still be the block's end marker (``hold_back``) or a tag, a
head that is not complete yet, the held parts of an XML string value above, and a non-string
XML value until it closes; where a family follows vLLM 0.32's delta boundaries, also trailing
whitespace of JSON arguments (``JsonArgs.hold_ws``, hermes) and a closed XML string's quote until
what follows it (``XmlArgs.safe_prefix``, qwen3_coder: a plain string value then opens with its
key at its opening tag). Per step the work is on the new text (tag / lexer scans resume where
they stopped, at most ``MAX_TAG`` characters back; a head is re-matched from its start, bounded
by ``MAX_HEAD`` characters). The state (``ArgStream``, in the engine's msgpack state) holds
offsets into the open block's body, which the engine buffers anyway, and the XML entries sent
for the open call: bounded by that call.

When the block closes, the engine's non-streaming parse of the whole body (the ``whole`` answer)
settles what the stream still owes (``settle``): the calls it has not started go out whole, the
open XML call gets the parameters the stream did not send (or sent with another value: the
later key wins in a JSON object) and its ``}``. For every well-formed output the joined
argument fragments of each call parse to the same JSON as the non-streaming arguments, under any
chunking (``tests/test_tool_streaming.py``).

Malformed or truncated after the name went out (what the client gets, by design):

* the call stays a call (its name cannot be taken back) and its markup is never re-sent as
  content, also when the non-streaming answer turns the block into content;
* XML formats: it keeps the parameters that went out (a string value cut off keeps the text
  that went out), and its arguments object is closed (``"`` / ``}``): valid JSON; parameters of
  the non-streaming answer not yet sent, or sent with another value, are added (the later key
  wins) when the block parses at all;
* JSON formats: its arguments are the raw text that went out, which is not complete JSON when
  the model stopped inside the object (``finish_reason: "length"``): OpenAI's own streams end
  the same way on a length cut;
* ``finish_reason`` is the engine's (``length`` stays ``length``; a natural stop with a call
  sent becomes ``tool_calls``, as for every call).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import regex

from worker.parsers.base import Delta, ToolCallDelta
from worker.parsers.jsonlex import scan_json
from worker.parsers.values import dumps_args, loads_json
from worker.parsers.xmlcall import XmlFormat

__all__ = ["ArgStream", "JsonArgs", "XmlArgs", "MAX_HEAD", "MAX_TAG", "advance", "settle"]

#: longest call head (text before the arguments) waited for; a longer one is not streamed (the
#: call then goes out whole when its block closes)
MAX_HEAD = 512


class ArgStream(msgspec.Struct, kw_only=True, array_like=True):
    """Per-choice state of the incremental streamer over the open block's body (reset per
    block). ``phase``: ``start`` (before the first call), ``next`` (after a call's arguments),
    ``args`` (inside raw JSON arguments), ``call`` / ``key`` / ``after_key`` / ``value`` (XML),
    ``off`` (the rest of the block goes out at its close). ``pos``: body offset consumed;
    ``scan``: where the next tag search resumes; ``n``: calls started in this block; ``open``:
    the last one's arguments are not closed; ``name``: its name; ``args``: XML entries sent for
    it; ``key``: the XML key being read; ``depth``/``ins``/``esc``: JSON lexer; ``vs``: for
    JSON arguments held back by ``JsonArgs.hold_ws``, the body offset sent up to; ``held``:
    argument text that goes out with what follows (``XmlArgs.safe_prefix``: a closed string
    value's quote); ``plain``: the open XML value went out from its opening tag."""

    phase: str = "start"
    pos: int = 0
    scan: int = 0
    n: int = 0
    open: bool = False
    name: str = ""
    args: str = ""
    key: str = ""
    #: the open XML value is a certain string (streamed as it arrives), its ``"key": "`` went
    #: out, body offset of its text not sent yet, its leading framing was stripped
    strv: bool = False
    sv: bool = False
    vs: int = 0
    lead: bool = False
    depth: int = 0
    ins: bool = False
    esc: bool = False
    held: str = ""
    plain: bool = False


@dataclass(frozen=True)
class JsonArgs:
    """A JSON-argument format: ``head`` (regular expression, ``regex`` syntax, group ``name``)
    matches from the start of the block body up to and including the arguments' opening ``{``;
    ``next`` (optional) matches from just after a call's closing ``}`` up to the next call's
    ``{`` (several calls per block); ``hold_ws``: whitespace at the end of the arguments so
    far is held until text follows it (or the object closes), as vLLM's Hermes parser strips
    the call body before diffing (``tc_json = raw.strip()``, Hermes2ProToolParser's
    ``_extract_tool_call_jsons``): ``"limit": `` + ``3`` goes out as ``"limit":`` + `` 3``."""

    head: str
    next: str | None = None
    hold_ws: bool = False
    _head: Any = field(init=False, repr=False, compare=False)
    _next: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_head", regex.compile(self.head, regex.S))
        object.__setattr__(self, "_next", regex.compile(self.next, regex.S) if self.next else None)


@dataclass(frozen=True)
class XmlArgs:
    """An XML-parameter format: its tags (``xmlcall.XmlFormat``); ``named``: the body is one
    call whose name is the text before the first tag (GLM); ``outside``: text between calls is
    allowed (framing such as Step-3's ``<｜tool_call_begin｜>function<｜tool_sep｜>``);
    ``safe_prefix``: vLLM 0.32's parser-engine delta rule (``ParserEngine._compute_arg_delta``
    / ``_safe_arg_prefix``, vllm/frontend/processing/parser/engine/parser_engine.py: per step
    it sends what the arguments JSON gained up to its last value, a plain string value
    unterminated): a value the family types as its text (``plain_string``) opens with its key
    (``{"k": "``) as soon as its opening tag is complete, its text follows as it arrives
    (framing newlines held), and its closing quote goes out with what follows it (``", "k2":
    "``, ``"}``). Any other value goes out at its closing tag, with the quote held before it
    (vLLM sends such a value's key at its opening tag and the value with what follows it: not
    reproduced, so that a call cut inside it never holds a key without a value)."""

    fmt: XmlFormat
    named: bool = False
    outside: bool = False
    safe_prefix: bool = False


#: the ``{"name": ..., "arguments"|"parameters": {`` head of Hermes-style bodies
NAME_ARGS_HEAD = r'\s*\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*\{'
#: a JSON call object inside a list (Hunyuan-A13B, Jamba): first element, then the next ones
LIST_ARGS = JsonArgs(head=r"\s*\[" + NAME_ARGS_HEAD, next=r"\s*\}\s*," + NAME_ARGS_HEAD)
NAME_ARGS = JsonArgs(head=NAME_ARGS_HEAD)


def _send(out: Delta, index: int, text: str) -> None:
    """Append an argument piece for call ``index``, joined to this step's last piece of it."""
    if not text:
        return
    last = out.tool_calls[-1] if out.tool_calls else None
    if last is not None and last.index == index and last.name is None:
        last.arguments += text
    else:
        out.tool_calls.append(ToolCallDelta(index=index, arguments=text))


def _start(st: Any, a: ArgStream, out: Delta, name: str) -> bool:
    """Announce a new call (its first fragment: name, empty arguments); False when
    ``parallel_tool_calls=false`` already let one call out (the rest of the block is off), or
    when the name is blank (``base.names_ok``: such a block is malformed, never announced)."""
    if (not st.parallel and st.calls > 0) or not name.strip():
        return False
    out.tool_calls.append(ToolCallDelta(index=st.calls, name=name, arguments=""))
    st.calls += 1
    a.n += 1
    a.open, a.name, a.args = True, name, ""
    return True


def _lex_object(a: ArgStream, body: str, limit: int) -> bool:
    """Advance the JSON lexer from ``a.pos`` (at or inside the arguments object) towards
    ``limit``; True (``a.pos`` just after it) when the object's closing brace was reached."""
    a.pos, a.ins, a.esc, a.depth, closed = scan_json(body, a.pos, limit, a.ins, a.esc, a.depth, clamp=False,
                                                     stop_at_close=True)
    return closed


def _json(p: Any, st: Any, a: ArgStream, spec: JsonArgs, out: Delta, body: str, limit: int) -> None:
    while a.phase != "off":
        if a.phase in ("start", "next"):
            pat = spec._head if a.phase == "start" else spec._next
            m = pat.match(body, a.pos, limit, partial=True) if pat is not None else None
            if m is None:
                a.phase = "off"
                return
            if m.partial:
                if limit - a.pos > MAX_HEAD:
                    a.phase = "off"
                return
            name = p.stream_name(st, m.group("name"))
            if name is None or not _start(st, a, out, name):
                a.phase = "off"
                return
            a.pos, a.depth, a.ins, a.esc = m.end() - 1, 0, False, False  # at the arguments' "{"
            a.vs = a.pos
            a.phase = "args"
        else:  # args
            closed = _lex_object(a, body, limit)
            piece = body[a.vs:a.pos]
            if spec.hold_ws and not closed:
                piece = piece.rstrip()
            _send(out, st.calls - 1, piece)
            a.vs += len(piece)
            if not closed:
                return
            a.open, a.phase = False, "next"


#: longest tag the streamer waits for (a value holding a ``<`` and no ``>`` after it is not
#: searched again from that ``<`` beyond this; a longer tag is then met by ``settle``)
MAX_TAG = 256


def _resume(body: str, scan: int, limit: int) -> int:
    """Where the next tag search starts after finding none in ``body[scan:limit]``: the first
    ``<`` after the last ``>`` (a tag ends with ``>``, so no tag starts before that), at most
    ``MAX_TAG`` characters back (per-step work stays O(delta + MAX_TAG))."""
    k = body.rfind(">", scan, limit)
    j = body.find("<", max(k + 1, scan, limit - MAX_TAG), limit)
    return j if j >= 0 else limit


def _string_piece(p: Any, a: ArgStream, body: str, end: int, final: bool) -> str | None:
    """JSON text for the open string value's text ``body[a.vs:end]`` (``final``: its closing
    tag is at ``end``): framing stripped (``p.stream_strip``: ``newline`` one leading/trailing
    newline, ``all`` surrounding whitespace, ``none``), trailing framing held back, the value
    held while it may still read ``null`` (``p.stream_null``). Returns None at ``final`` when
    the value is ``null`` (nothing of it went out). Advances ``a.vs``."""
    mode = p.stream_strip
    text = body[a.vs:end]
    if not a.lead:
        if mode == "newline":
            if not text and not final:
                return ""
            if text.startswith("\n"):
                a.vs += 1
                text = text[1:]
        elif mode == "all":
            k = len(text) - len(text.lstrip())
            a.vs += k
            text = text[k:]
            if not text and not final:
                return ""
        a.lead = True
    if mode == "newline" and text.endswith("\n"):
        text = text[:-1]  # framing at the end, or held back until the next text
    elif mode == "all":
        text = text.rstrip()
    out = ""
    if not a.sv:
        if p.stream_null and len(text) <= 4 and "null".startswith(text.lower()):
            if not final:
                return ""
            if text.lower() == "null":
                return None
        out = (", " if a.args else "{") + dumps_args(a.key) + ': "'
        a.sv = True
    a.vs += len(text)
    out += dumps_args(text)[1:-1]
    if final and not a.plain:  # a plain value's quote is held by the caller (XmlArgs.safe_prefix)
        out += '"'
    return out


def _tag(fmt: XmlFormat, m: re.Match[str]) -> tuple[str, str | None]:
    kind = m.lastgroup or ""
    if kind.endswith("_a"):
        kind = kind[:-2]
    return kind, m.groupdict().get(kind + "_a")


def _xml(p: Any, st: Any, a: ArgStream, spec: XmlArgs, out: Delta, body: str, limit: int) -> None:
    fmt = spec.fmt
    while a.phase != "off":
        m = fmt._re.search(body, a.scan, limit)
        if m is None:
            a.scan = _resume(body, a.scan, limit)
            break
        kind, attr = _tag(fmt, m)
        gap = body[a.pos:m.start()]
        ws = not gap.strip()
        ph = a.phase
        nxt = "off"
        if ph == "start" and spec.named:
            name = p.stream_name(st, gap) if kind == "key_open" else None
            if name is not None and _start(st, a, out, name):
                nxt = "key"
        elif ph in ("start", "next"):
            if kind == "call_open" and (ws or spec.outside or fmt.lenient):
                name = p.stream_name(st, attr or "")
                if name is not None and _start(st, a, out, name):
                    nxt = "call"
        elif ph == "call":
            free = ws or fmt.lenient
            if kind == "value_open" and fmt.key_open is None and free and (attr or "").strip():
                a.key, nxt = attr.strip(), "value"
                _open_value(p, st, a, m.end())
            elif kind == "key_open" and free:
                nxt = "key"
            elif kind == "call_close" and free:
                _emit(out, st, a, "}" if a.args or a.held else "{}")
                a.open, a.args, nxt = False, "", "next"
        elif ph == "key":
            if kind == "key_close" and gap.strip():
                a.key, nxt = gap.strip(), "after_key"
        elif ph == "after_key":
            if kind == "value_open" and ws:
                nxt = "value"
                _open_value(p, st, a, m.end())
        elif ph == "value" and kind == "value_close":
            piece = _string_piece(p, a, body, m.start(), True) if a.strv else None
            if piece is None:
                entry = dumps_args({a.key: p.stream_value(st, a.name, a.key, gap)})[1:-1]
                piece = (", " if a.args or a.held else "{") + entry
            _emit(out, st, a, piece)
            if a.plain:
                a.held = '"'  # goes out with what follows (XmlArgs.safe_prefix)
            a.strv = a.sv = a.plain = False
            nxt = "call"
        if nxt == "off" and a.sv:  # a string value cut by an unexpected tag: close it
            _emit(out, st, a, '"')
            a.strv = a.sv = a.plain = False
        if nxt == "value" and a.plain:  # XmlArgs.safe_prefix: the value opens at once
            _emit(out, st, a, (", " if a.args or a.held else "{") + dumps_args(a.key) + ': "')
        a.phase = nxt
        a.pos = a.scan = m.end()
    if a.phase == "value" and a.strv:  # no tag in the rest: the string value so far
        piece = _string_piece(p, a, body, a.scan, False)
        if piece:
            _emit(out, st, a, piece)


def _emit(out: Delta, st: Any, a: ArgStream, text: str) -> None:
    """Send ``text`` for the open call after the held text (``a.held``), both recorded in
    ``a.args``."""
    text = a.held + text
    a.held = ""
    _send(out, st.calls - 1, text)
    a.args += text


def _open_value(p: Any, st: Any, a: ArgStream, start: int) -> None:
    """A value of ``a.key`` opens at ``start``: streamed as it arrives when it is a string;
    with ``XmlArgs.safe_prefix`` a plain string's key goes out at once (``a.plain``, sent by
    the caller)."""
    a.strv = bool(p.string_param(st, a.name, a.key))
    a.plain = a.strv and p.spec.safe_prefix and bool(p.plain_string(st, a.name, a.key))
    a.sv, a.vs, a.lead = a.plain, start, False


def advance(p: Any, st: Any, out: Delta, body: str, limit: int) -> None:
    """Stream what ``body[:limit]`` (the open block's body, ``limit`` excluding text that may
    still be the end marker) adds to the calls of parser ``p`` (its ``spec``,
    ``stream_name``, ``stream_value``); fragments are appended to ``out``."""
    a = st.inc
    if a is None or a.phase == "off":
        return
    spec = p.spec
    if isinstance(spec, JsonArgs):
        _json(p, st, a, spec, out, body, limit)
    else:
        _xml(p, st, a, spec, out, body, limit)


def settle(p: Any, st: Any, out: Delta, parsed: list[tuple[str, str]] | None) -> None:
    """The block closed (or the output ended inside it) after ``st.inc.n`` > 0 calls started:
    complete them against ``parsed`` (the non-streaming answer for the block: ``(name,
    arguments JSON)`` list, None when it would be content) as the module docstring says, then
    reset the streamer for the next block."""
    a = st.inc
    xml = isinstance(p.spec, XmlArgs)
    if a.open and xml:
        j = a.n - 1
        if a.sv:  # the output ended inside a string value: the text that went out, closed
            _emit(out, st, a, '"')
            a.sv = False
        elif a.held:
            _emit(out, st, a, "")
        tail = "}" if a.args else "{}"
        if parsed and j < len(parsed):
            try:
                want = loads_json(parsed[j][1])
                got = loads_json(a.args + "}") if a.args else {}
            except ValueError:
                want = got = None
            if isinstance(want, dict) and isinstance(got, dict) and want != got:
                fix = ", ".join(dumps_args({k: v})[1:-1] for k, v in want.items()
                                if k not in got or got[k] != v)
                if fix:
                    tail = (", " if a.args else "{") + fix + "}"
        _send(out, st.calls - 1, tail)
    rest = parsed[a.n:] if parsed else []
    for name, args in rest:
        if st.parallel or st.calls == 0:
            out.tool_calls.append(ToolCallDelta(index=st.calls, name=name, arguments=args))
            st.calls += 1
    st.inc = ArgStream()
