"""Declarative engine for tool calls wrapped in start/end markers (Hermes ``<tool_call>``,
and families of the same shape). The call body is buffered until its end marker, then parsed by
the spec's ``parse_body``; a body that does not parse, or a call left open at the end of the
output, comes back as content, verbatim (never a call with broken JSON: the parity corpus' rule
"one answer for both modes").

Content rules (coupled vLLM's non-streaming answer, kept split-independent):

* text before the first call is content, except that a whitespace-only stretch before a call is
  dropped (content ``null``), also between calls and after the last call;
* with ``parallel_tool_calls=false`` only the first call is returned;
* JSON bodies (``json_body``; on by default for the JSON body parsers): a call ends at the
  first end marker *outside* a JSON string of the body, found by a small incremental lexer
  (string / escape / nesting depth), so arguments may quote the end marker text (bug-005);
* a call's end marker repeated right after it (only whitespace between:
  ``</tool_call></tool_call>``) counts once, and so does its start marker repeated at the start
  of the body (``<tool_call><tool_call>get_weather</tool_call>``: vLLM's GLM-4.7 test of issue
  60703 drops the phantom opener), the rule "repeated tag" of ``xmlcall.py`` at the block level;
  a malformed block's markers stay in its verbatim content;
* sections (``call_ends`` set: several calls inside one START…END section, e.g. DeepSeek's
  ``<｜tool▁calls▁begin｜>``, Kimi K2's ``<|tool_calls_section_begin|>``): a section left open at
  the end of the output (``finish_reason: "length"``, or a stop token mid-section) keeps its
  complete calls: the body up to the end of the last complete call is parsed as a closed
  section (``complete_prefix``); the cut-off tail after it is dropped, never a call (vLLM's
  non-streaming answer for DeepSeek V3.1 keeps the complete calls too, but sometimes invents a
  call from the tail). A section without a complete call, or whose complete part does not
  parse, keeps the family's rule for an open block (``parse_partial``; default: content).
  Same answer in both modes: the open section is buffered and parsed at ``finish``;
* ``--tool-call-streaming incremental`` (streamed choices only, ``TaggedState.inc``): while a
  block is open, ``incremental.advance`` sends each call's name and argument pieces as they
  become certain (family ``stream_spec``); when the block closes (or the output ends inside
  it) ``incremental.settle`` completes them against this engine's parse of the body. A block
  whose calls started streaming never comes back as content (``worker.parsers.incremental``);
* **bare calls** (``bare_start`` set: Qwen3-Coder and Seed-OSS's ``<function=``): a call may
  stand without the block's start marker (vLLM's ``qwen3coder`` non-streaming fallback, which
  searches the whole output for ``<function=``; bug-210). Here the bare opener starts a block
  anywhere in the text except inside code of the answer: a fenced code block (between backtick
  runs of three or more: each such run toggles the fence) or an inline code span (between
  runs of one or two backticks on the same line). There it is content. The opener stays in the
  body (zero-width marker), the block ends at ``bare_end`` and is parsed by the same
  ``parse_call`` / ``parse_partial``; the block's end marker right after it
  (``<function=…></function></tool_call>``: the wrapper missing only at the start) counts as its
  closer. Limits: ``~~~`` fences, indented code blocks and inline spans running over a newline
  are not seen as code; a bare opener in plain prose is read as a call (as vLLM reads it). Only
  two flags are kept (``fence``, ``inline``); a trailing run of backticks is held back until it
  is complete, so the answer does not depend on how the text was split.
* **quoted regions** (``quote_start`` / ``quote_end`` set: Seed-OSS's ``<seed:think>`` …
  ``</seed:think>``, for ``--tool-parser seed_oss`` without its reasoning parser): outside a
  call block, a region opened by a ``quote_start`` marker is content up to and including its
  ``quote_end`` marker, and no call (wrapped or bare) starts inside it; a region never closed
  stays content to the end of the output. Only a flag is kept (``quoted``) and a possible split
  end marker is held back.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from worker.parsers.base import (
    BodyNeeded,
    Delta,
    RequestContext,
    ToolCallDelta,
    ToolParser,
    dumps_non_ascii,
    find_first,
    hold_back,
    json_loads,
    names_ok,
    surrogates_escaped,
)
from worker.parsers.incremental import LIST_ARGS, NAME_ARGS, ArgStream, JsonArgs, XmlArgs, advance, settle
from worker.parsers.jsonlex import scan_json
from worker.parsers.marker import json_call_list
from worker.parsers.values import is_plain_string, is_string_param
from worker.parsers.xmlcall import strip_newline, typed_value

#: backtick runs and newlines: what moves the code state of the content (``code_state``)
_CODE = re.compile(r"`+|\n")


def code_state(st: TaggedState, t: str) -> None:
    """Advance ``st.fence`` / ``st.inline`` over content text ``t`` (module docstring, "bare
    calls"): a run of three or more backticks toggles the fence (and ends an inline span), a
    run of one or two toggles an inline span outside a fence, a newline ends an inline span."""
    if "`" not in t:
        if st.inline and "\n" in t:
            st.inline = False
        return
    for m in _CODE.finditer(t):
        g = m.group()
        if g == "\n":
            st.inline = False
        elif len(g) >= 3:
            st.fence, st.inline = not st.fence, False
        elif not st.fence:
            st.inline = not st.inline


def trailing_ticks(s: str) -> int:
    """Length of the run of backticks ending ``s`` (held back: the run may still grow)."""
    return len(s) - len(s.rstrip("`"))


class TaggedState(msgspec.Struct, kw_only=True, array_like=True):
    """``in_call``: inside a call body; ``buf``: held-back text or the open call's body;
    ``scan``: offset in ``buf`` already searched for the end marker; ``calls``: calls emitted;
    ``seg_text``: non-whitespace content seen since the last call; ``pending_ws``: whitespace
    not yet emitted; ``marker``: the start marker of the open call."""

    in_call: bool = False
    buf: str = ""
    scan: int = 0
    calls: int = 0
    seg_text: bool = False
    pending_ws: str = ""
    marker: str = ""
    parallel: bool = True
    #: per-function parameter types from the request's tool schemas (``{name: {param: type}}``),
    #: for families whose markup carries untyped values (``TaggedToolParser.param_types``)
    types: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    #: JSON lexer over the open call's body (``json_body``): offset lexed up to, inside a
    #: string, after a backslash in a string, nesting depth
    lex: int = 0
    lex_str: bool = False
    lex_esc: bool = False
    lex_depth: int = 0
    #: the end marker of the call just parsed, while only whitespace followed it: the same
    #: marker repeated there is dropped (``</tool_call></tool_call>``)
    after_end: str = ""
    #: incremental argument streaming (``--tool-call-streaming incremental``; None: whole)
    inc: ArgStream | None = None
    #: the open block was started by the family's ``bare_start`` (no start marker); the content
    #: so far is inside a fenced code block / an inline code span (``code_state``)
    bare: bool = False
    fence: bool = False
    inline: bool = False
    #: characters at the start of the open call's body moved out of the state (``spill``: to
    #: the stream's append-only pieces, ``worker.core.stream``); ``buf`` and the body offsets
    #: (``scan``, ``lex``, ``inc``'s) count from what is left
    spilled: int = 0
    #: characters at the start of the open XML call's sent entries (``inc.args``) moved out of
    #: the state (``spill_args``), and which call (``inc.n``) they belong to
    args_spilled: int = 0
    args_call: int = 0
    #: inside a region of the family's ``quote_start`` … ``quote_end`` (content, never calls)
    quoted: bool = False


def _shift(st: TaggedState, k: int) -> None:
    """Move every offset into the open body by ``-k`` (``k`` characters left / came back at
    its start). Offsets no step reads in the current phase move too, so a round trip is exact."""
    st.scan -= k
    st.lex -= k
    a = st.inc
    if a is not None:
        a.pos -= k
        a.scan -= k
        a.vs -= k


def lex_json(st: TaggedState, s: str, end: int) -> None:
    """Advance the state's JSON lexer over ``s[st.lex:end]`` (string, escape, depth;
    ``jsonlex.scan_json``, a closing bracket at depth 0 ignored)."""
    st.lex, st.lex_str, st.lex_esc, st.lex_depth, _ = scan_json(s, st.lex, end, st.lex_str, st.lex_esc,
                                                                  st.lex_depth)


#: ``json.dumps(x, ensure_ascii=False)`` without building an encoder per call (same options)
_dumps_non_ascii = dumps_non_ascii


def json_name_arguments(body: str) -> list[tuple[str, str]] | None:
    """Parse ``{"name": ..., "arguments"|"parameters": {...}}`` -> ``[(name, arguments JSON)]``;
    None when the body is not such an object. Arguments are re-serialized with
    ``json.dumps(ensure_ascii=False)`` (what vLLM's Hermes parser returns); string arguments
    holding a JSON object are kept as written, any other string is serialized as a string."""
    try:
        obj = json_loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # arguments the model serialized itself: kept when they hold an
        try:  # object, else the string is serialized (vLLM's Hermes tests
            ok = isinstance(json_loads(args), dict)  # ``*_serialized_arguments`` / ``*_bare_string_arguments``)
        except ValueError:
            ok = False
        return [(obj["name"], args if ok else _dumps_non_ascii(args))]
    return [(obj["name"], _dumps_non_ascii(args))]


def json_string_name(raw: str) -> str | None:
    """A call name written as a JSON string's inside (escapes decoded; a lone surrogate kept as
    its escape: ``base.surrogates_escaped``); None when invalid."""
    try:
        v = json.loads('"' + raw + '"')
    except ValueError:
        return None
    return surrogates_escaped(v) if isinstance(v, str) else None


def schema_type(schema: dict[str, Any]) -> Any:
    """The JSON-schema type of one parameter schema: its ``type`` (a string or a list), else the
    types of its ``anyOf`` / ``oneOf`` alternatives as a list (``anyOf [string, null]`` ->
    ``["string", "null"]``: the value ``8080`` stays a string, vLLM's
    ``TestAnyOfTypeCoercion``), else None."""
    t = schema.get("type")
    if t is not None:
        return t
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list):
            out: list[str] = []
            for a in alts:
                at = a.get("type") if isinstance(a, dict) else None
                for x in at if isinstance(at, list) else [at]:
                    if isinstance(x, str) and x not in out:
                        out.append(x)
            return out or None
    return None


def tool_param_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``{function name: {parameter: JSON-schema type}}`` from an OpenAI tool list (the type is
    the schema's ``type``: a string, a list of strings, or None when absent; ``schema_type``)."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        types: dict[str, Any] = {}
        if isinstance(props, dict):
            for k, v in props.items():
                types[k] = schema_type(v) if isinstance(v, dict) else None
        out[fn["name"]] = types
    return out


class TaggedToolParser(ToolParser):
    """Tool parser for ``START body END`` calls; subclasses set ``starts``, ``ends`` and
    ``parse_body`` (body text -> list of ``(name, arguments JSON)`` or None when malformed).

    Hooks for families that need more: ``param_types`` (keep the request's parameter types in
    the state, read by ``parse_call``), ``parse_call(state, body)`` (defaults to
    ``parse_body(body.strip())``), ``parse_partial(state, body)`` (a call left open at the end of
    the output: list of calls to return, ``[]`` to drop the markup, or None (default) to keep it
    as content).

    Incremental streaming (``worker.parsers.incremental``): ``stream_spec`` describes the call
    shape inside a block (``JsonArgs`` / ``XmlArgs``; default: the ``{"name", "arguments"}``
    shape for ``json_name_arguments`` bodies, the list shape for ``json_call_list`` bodies, else
    None: calls go out whole); ``stream_name`` / ``stream_value`` map a raw name / XML value as
    the non-streaming parse does."""

    param_types: ClassVar[bool] = False
    stream_spec: ClassVar[JsonArgs | XmlArgs | None] = None
    #: XML string values streamed as they arrive: their framing (``newline``: one leading and
    #: one trailing newline, ``all``: surrounding whitespace, ``none``) and whether a value
    #: reading ``null`` is JSON null (``values.convert_param``), as ``stream_value`` types them
    stream_strip: ClassVar[str] = "newline"
    stream_null: ClassVar[bool] = True
    #: ``null`` written for a parameter whose schema type is a plain string is JSON null
    #: (``values.convert_param``'s ``string_null``; off: the text ``"null"``)
    string_null: ClassVar[bool] = True
    #: bodies are JSON: an end marker inside a JSON string does not close the call (None:
    #: on when ``parse_body`` is one of the JSON body parsers)
    json_body: ClassVar[bool | None] = None

    #: a one-call block left open at the end of the output whose body parses is a call
    #: (vLLM's Hermes ``test_hermes_parser_non_streaming_tool_call_until_eos``: the model
    #: stopped at EOS instead of writing the end marker); off: the open block stays content
    eos_closes: ClassVar[bool] = False

    #: section families: the marker(s) ending one call inside the START…END section (see the
    #: module docstring); empty for one-call-per-block families
    call_ends: ClassVar[tuple[str, ...]] = ()

    starts: ClassVar[tuple[str, ...]] = ("<tool_call>",)
    ends: ClassVar[tuple[str, ...]] = ("</tool_call>",)
    #: a call opener that may stand without a start marker, and the text ending such a call
    #: (module docstring, "bare calls"; empty: none)
    bare_start: ClassVar[str] = ""
    bare_end: ClassVar[str] = ""
    #: the whitespace between the text and a call block is not content (held until the next
    #: text or block: vLLM's ernie45 / gemma4 parsers strip the content before the calls)
    strip_before_call: ClassVar[bool] = False
    #: a region the output opens with one of ``quote_start`` and closes with one of
    #: ``quote_end`` is content, markers included, and never holds calls (module docstring,
    #: "quoted regions"; empty: none)
    quote_start: ClassVar[tuple[str, ...]] = ()
    quote_end: ClassVar[tuple[str, ...]] = ()
    parse_body: ClassVar[Callable[[str], list[tuple[str, str]] | None]] = staticmethod(json_name_arguments)

    def __init__(self, tok):
        self.tok = tok
        jb = type(self).json_body
        if jb is None:
            jb = type(self).parse_body in (json_name_arguments, json_call_list)
        self._json_body = jb
        spec = type(self).stream_spec
        if spec is None and type(self).parse_call is TaggedToolParser.parse_call:
            spec = {json_name_arguments: NAME_ARGS, json_call_list: LIST_ARGS}.get(type(self).parse_body)
        self.spec = spec
        self._starts = self.starts + ((self.bare_start,) if self.bare_start else ())
        self._openers = self._starts + self.quote_start
        self._longest_end = max(len(e) for e in self.ends)

    @property
    def incremental(self) -> bool:  # type: ignore[override]
        """The family streams arguments incrementally (it has a ``stream_spec``)."""
        return self.spec is not None

    def stream_arguments(self, state: TaggedState) -> None:
        state.inc = ArgStream()

    def stream_name(self, st: TaggedState, raw: str) -> str | None:
        """A call's name from its raw head text (a JSON string's inside for ``JsonArgs``
        heads, a tag attribute or GLM's leading text for ``XmlArgs``), as the non-streaming
        parse reads it; None when it is not a name (the call is then not streamed)."""
        if isinstance(self.spec, JsonArgs):
            return json_string_name(raw)
        name = raw.strip()
        return name if name and not any(c.isspace() or c in "<>{}" for c in name) else None

    def string_param(self, st: TaggedState, name: str, key: str) -> bool:
        """XML parameter ``key`` of call ``name`` is typed as a string whatever its text (but
        ``null`` when ``stream_null``): it may stream before its value closes. Default: the
        request's schema (``values.is_string_param``, the rule ``stream_value`` applies)."""
        fn_types = st.types.get(name)
        known = fn_types is not None and key in fn_types
        return is_string_param(fn_types.get(key) if known else None, known)

    def plain_string(self, st: TaggedState, name: str, key: str) -> bool:
        """XML parameter ``key`` of call ``name`` is its text whatever it reads (``null``
        included): a string parameter (``string_param``) when ``stream_null`` is off, or one
        the schema declares a plain string (``values.is_plain_string``) when ``string_null``
        is off. Such a value may open in the stream before any of its text arrived."""
        if not self.string_param(st, name, key):
            return False
        if not self.stream_null:
            return True
        fn_types = st.types.get(name)
        known = fn_types is not None and key in fn_types
        return not self.string_null and is_plain_string(fn_types.get(key) if known else None, known)

    def stream_value(self, st: TaggedState, name: str, key: str, raw: str) -> Any:
        """The JSON value of XML parameter ``key`` of call ``name`` from its raw text, as the
        non-streaming parse types it (default: one framing newline removed, then the request's
        schema type, ``xmlcall.typed_value`` with the family's ``string_null``)."""
        return typed_value(strip_newline(raw), st.types.get(name), key, self.string_null)

    def initial_state(self, ctx: RequestContext) -> TaggedState:
        return TaggedState(parallel=ctx.parallel_tool_calls is not False,
                           types=tool_param_types(ctx.tools) if self.param_types else {})

    # -- bounded state for an open call of any size (issue 13): the stream core moves the part
    # of the open body no later step reads out of the state, and back before the block closes
    def spill_point(self, st: TaggedState) -> int:
        """How many characters at the start of the open call's body (``buf``) no step reads
        again until the block closes or the output ends (0 outside a call): everything before
        the end-marker search (``scan``), the JSON lexer (``lex``) and the incremental
        streamer's offsets (``inc``: JSON ``pos``; XML ``pos``, ``scan`` and an open value's
        ``vs``; none once it is ``off``). The JSON lexer, which runs only when an end marker is
        found, is first advanced to ``scan`` (resumable: the state a later close reaches is the
        same)."""
        if not st.in_call:
            return 0
        k = st.scan
        if self._json_body:
            if st.lex < k:
                lex_json(st, st.buf, k)
            k = min(k, st.lex)
        a = st.inc
        if a is not None and a.phase != "off":
            if not isinstance(self.spec, XmlArgs):
                k = min(k, a.pos)
            elif a.phase == "value" and a.strv and a.sv:  # a string value streaming: its start
                k = min(k, a.scan, a.vs)  # went out (``pos`` is read again only for a null value)
            else:
                k = min(k, a.pos, a.scan, a.vs) if a.phase == "value" else min(k, a.pos, a.scan)
        return max(0, min(k, len(st.buf)))

    def body_held(self, st: TaggedState) -> int:
        """Characters held in ``buf`` (the open call's body inside a call)."""
        return len(st.buf)

    def spill_args_due(self, st: TaggedState, threshold: int) -> bool:
        """``threshold`` characters of the open call's sent XML entries are held, or some left."""
        return st.inc is not None and (len(st.inc.args) >= threshold or bool(st.args_spilled))

    def args_spilled(self, st: TaggedState) -> bool:
        """Some of the open XML call's sent entries left the state (``spill_args``)."""
        return bool(st.args_spilled)

    def spill_args(self, st: TaggedState, keep: int) -> tuple[str, bool]:
        """Move the open XML call's sent entries (``inc.args``, read again only when the block
        closes: ``incremental.settle``) out of the state but their last ``keep`` characters.
        Returns ``(text, fresh)``: the characters removed (``""``: none) and whether the ones
        removed before belong to a call that is no longer open (the caller drops them)."""
        a = st.inc
        if a is None or not a.open or not isinstance(self.spec, XmlArgs):
            return "", False
        fresh = bool(st.args_spilled) and st.args_call != a.n
        if fresh:
            st.args_spilled = 0
        if len(a.args) <= keep:
            return "", fresh
        k = len(a.args) - keep
        text, a.args = a.args[:k], a.args[k:]
        st.args_spilled += k
        st.args_call = a.n
        return text, fresh

    def unspill_args(self, st: TaggedState, text: str) -> None:
        """Put back what ``spill_args`` removed (``text``: all of it, in order) when its call is
        still the open one (else it is dropped: that call's entries were reset since)."""
        a = st.inc
        if st.args_spilled and a is not None and a.open and st.args_call == a.n:
            if len(text) != st.args_spilled:
                raise ValueError(f"unspill_args: {len(text)} characters given, {st.args_spilled} were spilled")
            a.args = text + a.args
        st.args_spilled = 0

    def spill(self, st: TaggedState, k: int) -> str:
        """Remove the first ``k`` (<= ``spill_point``) characters of the open body from the
        state and return them (the caller keeps them, in order, until ``unspill``)."""
        text, st.buf = st.buf[:k], st.buf[k:]
        _shift(st, k)
        st.spilled += k
        return text

    def unspill(self, st: TaggedState, text: str) -> None:
        """Put back the ``st.spilled`` characters ``spill`` removed (``text``: all of them, in
        order): the state is again what it was without spilling."""
        if len(text) != st.spilled:
            raise ValueError(f"unspill: {len(text)} characters given, {st.spilled} were spilled")
        st.buf = text + st.buf
        _shift(st, -len(text))
        st.spilled = 0

    def parse_call(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        """Calls of one complete block body (None: malformed, the block stays content)."""
        return type(self).parse_body(body.strip())

    def complete_prefix(self, body: str) -> str | None:
        """The part of an open section's ``body`` that a closed section would hold if the output
        had stopped after its last complete call: ``body`` up to the end of the last
        ``call_ends`` marker; None when no call is complete (or the family has no sections).
        O(len(body)), once per output (at ``finish``)."""
        end = -1
        for m in self.call_ends:
            i = body.rfind(m)
            if i >= 0:
                end = max(end, i + len(m))
        return body[:end] if end >= 0 else None

    def parse_partial(self, st: TaggedState, body: str) -> list[tuple[str, str]] | None:
        """Calls of a block left open at the end of the output (see class docstring): the
        complete calls of an open section (``complete_prefix`` parsed by ``parse_call``), or
        None (content) when there are none or they do not parse."""
        prefix = self.complete_prefix(body)
        if prefix is None:
            if self.eos_closes and not self.call_ends:
                return self.parse_call(st, body) or None
            return None
        return self.parse_call(st, prefix) or None

    def _emit(self, st: TaggedState, out: Delta, parsed: list[tuple[str, str]]) -> None:
        for name, args in parsed:
            if st.parallel or st.calls == 0:
                out.tool_calls.append(ToolCallDelta(index=st.calls, name=name, arguments=args))
                st.calls += 1
        st.seg_text = False
        st.pending_ws = ""

    def _text(self, st: TaggedState, out: Delta, t: str, code: bool = True) -> None:
        """Content text ``t`` (``code``: it moves the answer's code state, ``code_state``)."""
        if not t:
            return
        if self.bare_start and code:  # where a bare opener may start a call (module docstring)
            code_state(st, t)
        if st.seg_text and not self.strip_before_call:
            out.content += t
        elif t.isspace():
            st.pending_ws += t
        elif self.strip_before_call:  # trailing whitespace held (the class attribute)
            t = st.pending_ws + t
            core = t.rstrip()
            out.content += core
            st.pending_ws = t[len(core):]
            st.seg_text = True
        else:
            out.content += st.pending_ws + t
            st.pending_ws = ""
            st.seg_text = True

    def _repeated_start(self, st: TaggedState, body: str) -> str:
        """``body`` without the block's start marker repeated at its start (whitespace between:
        ``<tool_call><tool_call>name…``), moved to ``st.marker`` so a block that does not parse
        is still content verbatim; a bare block's body is returned as it is."""
        m = st.marker
        while m:
            rest = body.lstrip()
            if not rest.startswith(m):
                break
            st.marker += body[:len(body) - len(rest) + len(m)]
            body = rest[len(m):]
        return body

    def _close(self, st: TaggedState, out: Delta, body: str, end: str) -> None:
        if st.spilled or st.args_spilled:
            raise BodyNeeded
        body = self._repeated_start(st, body)
        # a stray start marker's end after a bare call counts as its closer
        end_after = self.ends[0] if st.bare else end
        try:
            parsed = self.parse_call(st, body)  # reads ``st.bare``
        except Exception:  # noqa: BLE001 - bad markup never raises
            parsed = None
        st.bare = False
        if not names_ok(parsed):  # a nameless call is malformed markup
            parsed = None
        if st.inc is not None and st.inc.n:
            self._settle(st, out, body, parsed)
            st.after_end = end_after
            return
        if parsed is None:
            self._text(st, out, st.marker + body + end)
            return
        self._emit(st, out, parsed)
        st.after_end = end_after

    def _settle(self, st: TaggedState, out: Delta, body: str, parsed: list[tuple[str, str]] | None) -> None:
        """Finish a block whose calls started streaming (``incremental.settle``): no content."""
        advance(self, st, out, body, len(body))
        settle(self, st, out, parsed)
        st.seg_text = False
        st.pending_ws = ""
    def feed(self, state: TaggedState, text: str, token_ids: list[int]) -> Delta:
        out = Delta()
        st = state
        st.buf += text
        while st.buf:
            if not st.in_call:
                s = st.buf
                if st.after_end:  # a repeated end marker after a parsed call counts once
                    k = len(s) - len(s.lstrip())
                    self._text(st, out, s[:k])
                    s = st.buf = s[k:]
                    if s.startswith(st.after_end):
                        st.buf = s[len(st.after_end):]
                        continue
                    if st.after_end.startswith(s):  # empty, or a prefix of the marker: wait
                        return out
                    st.after_end = ""
                if st.quoted:  # a quoted region: content up to its end marker
                    if not self._quoted(st, out, s):
                        return out
                    continue
                i, m = find_first(s, self._openers)
                if i < 0:
                    keep = hold_back(s, self._openers)
                    if self.bare_start:  # a backtick run may still grow into a fence
                        keep = max(keep, trailing_ticks(s))
                    self._text(st, out, s[: len(s) - keep])
                    st.buf = s[len(s) - keep:]
                    return out
                self._text(st, out, s[:i])
                if m in self.quote_start and m not in self._starts:
                    self._text(st, out, m, code=False)
                    st.quoted, st.buf = True, s[i + len(m):]
                    continue
                bare = m == self.bare_start and m not in self.starts
                if bare and (st.fence or st.inline):  # a bare opener inside the answer's code
                    self._text(st, out, m)
                    st.buf = s[i + len(m):]
                    continue
                if not st.seg_text:
                    st.pending_ws = ""
                body = s[i:] if bare else s[i + len(m):]  # a bare opener stays in the body
                st.in_call, st.marker, st.bare, st.buf, st.scan = True, "" if bare else m, bare, body, 0
                st.lex, st.lex_str, st.lex_esc, st.lex_depth = 0, False, False, 0
                if st.inc is not None:
                    st.inc = ArgStream()
                continue
            s = st.buf
            if st.bare:
                ends, longest = (self.bare_end,), len(self.bare_end)
            else:
                ends, longest = self.ends, self._longest_end
            j, e = find_first(s[st.scan:], ends)
            if j < 0:
                st.scan = max(0, len(s) - longest + 1)
                if st.inc is not None:  # incremental: what can no longer be the end marker
                    advance(self, st, out, s, len(s) - hold_back(s, ends))
                return out
            j += st.scan
            if self._json_body:
                lex_json(st, s, j)
                if st.lex_str and st.lex_depth > 0:  # the marker is text inside a JSON string
                    st.scan = j + 1
                    continue
            st.in_call, st.buf, st.scan = False, s[j + len(e):], 0
            self._close(st, out, s[:j], e)
        return out

    def _quoted(self, st: TaggedState, out: Delta, s: str) -> bool:
        """Read ``s`` (``st.buf``) inside a quoted region: the text up to and including its end
        marker is content (not code for ``code_state``) and the region ends (True); without
        one, the text but a possible split end marker is content and stays so (False)."""
        j, e = find_first(s, self.quote_end)
        if j < 0:
            keep = hold_back(s, self.quote_end)
            self._text(st, out, s[: len(s) - keep], code=False)
            st.buf = s[len(s) - keep:]
            return False
        self._text(st, out, s[: j + len(e)], code=False)
        st.quoted, st.buf = False, s[j + len(e):]
        return True

    def finish(self, state: TaggedState) -> Delta:
        out = Delta()
        st = state
        if st.in_call and (st.spilled or st.args_spilled):
            raise BodyNeeded
        rest, st.buf = st.buf, ""
        if st.in_call:
            st.in_call = False
            rest = self._repeated_start(st, rest)
            try:
                parsed = self.parse_partial(st, rest)  # reads ``st.bare``
            except Exception:  # noqa: BLE001
                parsed = None
            st.bare = False
            if not names_ok(parsed):
                parsed = None
            if st.inc is not None and st.inc.n:
                self._settle(st, out, rest, parsed)
            elif parsed is None:
                self._text(st, out, st.marker + rest)
            elif parsed:
                self._emit(st, out, parsed)
            else:
                st.pending_ws = ""
        else:
            self._text(st, out, rest)
        if st.calls == 0 and st.pending_ws:
            out.content += st.pending_ws
        st.pending_ws = ""
        return out


