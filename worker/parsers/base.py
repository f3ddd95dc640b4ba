"""Parser abstraction shared by the non-streaming and streaming paths.

A parser is an incremental state machine over decoded text deltas (special tokens preserved where
the parser needs them) and their token ids. Parser *objects* are immutable, built once per served
model (they hold resolved marker strings and token ids); all per-sequence data lives in a small
msgspec ``State`` value, so a stream can be checkpointed after any chunk (``msgspec`` encode) and
resumed on another process with identical output. The non-streaming result is the same machine run
over the whole output as one delta, then ``finish``-ed.

Invariants every parser keeps (tests check them over the corpus):

* work per ``feed`` is O(len(delta) + longest marker): no re-scan of earlier text;
* the final reasoning / content / tool calls do not depend on how the output was split;
* bad markup never raises: it falls back to content.
"""
from __future__ import annotations

import json
import re
from json import encoder as _json_encoder
from typing import Any, ClassVar

import msgspec


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A tool-call fragment: ``index`` (0-based position of the call in this choice), ``name``
    (on the call's first fragment only) and an ``arguments`` JSON-text fragment."""

    index: int
    name: str | None = None
    arguments: str = ""


class Delta(msgspec.Struct, kw_only=True):
    """What one parser step emits: reasoning text, content text, tool-call fragments, and the
    number of input tokens classified as reasoning (``reasoning_tokens``, for usage).
    ``content_break``: how many characters at the start of ``content`` are whitespace an
    earlier step produced and the parser held (0: none); where vLLM streams them as their own
    delta, event-list APIs (Responses, Messages) send them as one (docs/parsers.md,
    "Whitespace before the first call"); chat joins them. Never persisted."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = msgspec.field(default_factory=list)
    reasoning_tokens: int = 0
    content_break: int = 0

    def extend(self, other: Delta) -> Delta:
        """Append ``other`` to this delta in place (text concatenated, calls appended); returns self."""
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.reasoning_tokens += other.reasoning_tokens
        return self


class RequestContext(msgspec.Struct, kw_only=True):
    """The request semantics parsers read, taken from the OpenAI request (``chat_request``).

    ``tools``: OpenAI tool list or None; ``tool_choice``: ``"none"|"auto"|"required"`` or the
    named-function dict; ``chat_template_kwargs``: e.g. ``{"enable_thinking": False}``;
    ``prompt_token_ids``: the rendered prompt (initial parser state may come from its tail)."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None

    def thinking_disabled(self) -> bool:
        """True when the request turned thinking off via ``chat_template_kwargs``
        (``enable_thinking: false`` for Qwen3/GLM style templates, ``thinking: false`` for
        DeepSeek style templates)."""
        kw = self.chat_template_kwargs or {}
        return kw.get("enable_thinking") is False or kw.get("thinking") is False

    def named_tool(self) -> str | None:
        """The function name of a named ``tool_choice``, else None."""
        tc = self.tool_choice
        if isinstance(tc, dict):
            fn = tc.get("function") or {}
            name = fn.get("name") if isinstance(fn, dict) else None
            return name if isinstance(name, str) else None
        return None


class Parser:
    """What every parser implements. ``name`` is the CLI name (set by the registry);
    ``needs_special_tokens``: the parser must see special tokens in the text (forces
    skip_special_tokens=False, as vLLM's ``adjust_request``).

    ``initial_state(ctx)`` -> a fresh msgspec state for one choice; ``feed(state, text,
    token_ids)`` -> the ``Delta`` for one text delta (mutates ``state``); ``finish(state)`` ->
    the ``Delta`` that flushes held-back text at the end of the output."""

    name: ClassVar[str] = ""
    needs_special_tokens: ClassVar[bool] = False
    #: the parser reads the token ids, not the text: the stack feeds a tool parser every step's
    #: ids even when the reasoning parser passed it no content (gpt-oss on its own vocabulary)
    reads_ids: bool = False
    #: the parser wants the final stop token id that vLLM leaves out of the text (the core
    #: passes the ids before that trimming)
    wants_stop_token: bool = False

    def initial_state(self, ctx: RequestContext) -> Any:
        raise NotImplementedError

    def feed(self, state: Any, text: str, token_ids: list[int]) -> Delta:
        raise NotImplementedError

    def finish(self, state: Any) -> Delta:
        raise NotImplementedError


class ReasoningParser(Parser):
    """Splits output text into ``reasoning`` and ``content`` (``--reasoning-parser NAME``): its
    deltas set only ``reasoning``, ``content`` and ``reasoning_tokens``."""

    #: token ids that start the reasoning (``<think>``); empty when the parser has none
    start_ids: frozenset[int] = frozenset()
    #: token ids that end the reasoning (``</think>``); empty when the parser has none
    end_ids: frozenset[int] = frozenset()

    def answering(self, state: Any) -> bool:
        """Whether the output is past its reasoning in ``state`` (False: still reasoning, or
        the parser does not tell)."""
        return False


class ToolParser(Parser):
    """Extracts tool calls from content text (``--tool-parser NAME``): its deltas set only
    ``content`` and ``tool_calls``. Malformed or unterminated calls come back as content."""

    #: shape of tool call ids clients expect: ``"chatcmpl-tool"`` or ``"alnum9"`` (Mistral)
    id_format: ClassVar[str] = "chatcmpl-tool"
    #: the family's serving removes tool-call markup from the content even when the request
    #: declares tools but turns them off (``tool_choice: "none"``): the parser still runs, its
    #: calls are discarded (DeepSeek V4)
    strips_markup_when_off: ClassVar[bool] = False
    #: the parser can stream a call's name then its arguments as they are generated
    #: (``--tool-call-streaming incremental``, ``worker.parsers.incremental``)
    incremental: ClassVar[bool] = False
    #: vLLM 0.32 runs the family on its parser engine, which defers whitespace-only content
    #: until the first non-whitespace content (joined to it) or the output's end, with or
    #: without tools in the request (``ParserStack``, ``StackState.lead_ws``)
    defers_leading_ws: ClassVar[bool] = False
    #: vLLM 0.32 streams the whitespace before the first call as it comes, so the parser marks
    #: held whitespace it releases with text (``Delta.content_break``); ``ParserStack`` unmarks
    #: whitespace-only content of the step where the reasoning ended, which vLLM's chat stream
    #: adds to the next step (``StackState.ws_carried``; docs/parsers.md, "Whitespace before
    #: the first call")
    streams_leading_ws: ClassVar[bool] = False

    def stream_arguments(self, state: Any) -> None:
        """Switch a fresh ``state`` to incremental argument streaming (only called when
        ``incremental`` is true). Raises ``NotImplementedError`` otherwise."""
        raise NotImplementedError

    # -- bounded stream state (``worker.core.stream``, "Bounded state"; issue 13 item 5): an
    # engine that buffers an open call's body lets the stream core move the part of it no step
    # reads before the call closes out of its state, and back (``BodyNeeded``) when it closes.
    # Defaults: nothing is ever spilled (the engine holds no unbounded body).
    def body_held(self, state: Any) -> int:
        """Characters of the open call's body held in ``state`` (0: none)."""
        return 0

    def spill_point(self, state: Any) -> int:
        """How many characters at the start of the open body no step reads again until the
        call closes or the output ends (0: none; never more than ``body_held``)."""
        return 0

    def spill(self, state: Any, k: int) -> str:
        """Remove the first ``k`` (<= ``spill_point``) characters of the open body from
        ``state`` and return them; the engine then raises ``BodyNeeded`` wherever it would read
        them. Raises ``NotImplementedError`` for an engine whose ``spill_point`` is always 0."""
        raise NotImplementedError

    def unspill(self, state: Any, text: str) -> None:
        """Put back all the characters ``spill`` removed (``text``, in order). Raises
        ``ValueError`` when ``text`` is not as many characters as were removed."""
        raise NotImplementedError

    def spill_args_due(self, state: Any, threshold: int) -> bool:
        """The open call's sent argument entries (``TaggedToolParser.spill_args``) should leave
        the state: at least ``threshold`` characters of them, or some already left."""
        return False

    def spill_args(self, state: Any, keep: int) -> tuple[str, bool]:
        """As ``TaggedToolParser.spill_args``; default: nothing to move (``("", False)``)."""
        return "", False

    def args_spilled(self, state: Any) -> bool:
        """Some of the open call's sent argument entries left the state (``spill_args``)."""
        return False

    def unspill_args(self, state: Any, text: str) -> None:
        """As ``TaggedToolParser.unspill_args``; default: nothing was moved."""


class BodyNeeded(Exception):
    """A parser step needs the part of a buffered body that was moved out of the state (an open
    call that closes, or the output ends inside it; a required/named ``tool_choice``'s held
    content at the end): the stream core restores it (``ToolParser.unspill`` /
    ``ParserStack.unspill_held``) on the choice's state from before the step and runs the step
    again (``worker.core.stream``, "Bounded state")."""


class AppendedBody:
    """``spill`` / ``unspill`` for engines whose open call body is a ``str`` field of their
    state (``body_field``) that a step only appends to until the call closes, with a
    ``spilled`` count field (characters cut from its start). ``shift_body(state, k)`` moves the
    engine's offsets into the body by ``-k`` (default: it keeps none)."""

    body_field: ClassVar[str] = "buf"

    def shift_body(self, state: Any, k: int) -> None:
        """Move the engine's offsets into the open body by ``-k`` (none by default)."""

    def spill(self, state: Any, k: int) -> str:
        """As ``ToolParser.spill``."""
        body = getattr(state, self.body_field)
        setattr(state, self.body_field, body[k:])
        self.shift_body(state, k)
        state.spilled += k
        return body[:k]

    def unspill(self, state: Any, text: str) -> None:
        """As ``ToolParser.unspill``."""
        if len(text) != state.spilled:
            raise ValueError(f"unspill: {len(text)} characters given, {state.spilled} were spilled")
        setattr(state, self.body_field, text + getattr(state, self.body_field))
        self.shift_body(state, -len(text))
        state.spilled = 0


def names_ok(calls: list[tuple[str, str]] | None) -> bool:
    """True when every ``(name, arguments)`` of a parsed block has a usable function name: a
    string with a non-space character. A call named ``""`` or ``" "`` is malformed markup (the
    OpenAI API requires a function name, and a streaming client takes a tool-call delta without
    a name for a continuation of the previous call), so its block stays content, verbatim, like
    any malformed block. Every engine applies it to what its ``parse_*`` returned."""
    return calls is not None and all(isinstance(n, str) and n.strip() for n, _ in calls)


def partial_suffix_len(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker`` (0 if none).

    Used to hold back text that may be the start of a marker split across deltas.
    O(len(marker)) per call."""
    size = len(text)
    n = min(size, len(marker) - 1)
    if n <= 0:
        return 0
    first = marker[0]
    i = text.find(first, size - n)  # candidate starts, longest suffix first (C-level search)
    while i >= 0:
        if marker.startswith(text[i:]):
            return size - i
        i = text.find(first, i + 1)
    return 0


def find_first(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str | None]:
    """Earliest occurrence in ``text[start:]`` of any of ``markers``: ``(position in text,
    marker)`` or ``(-1, None)``. Ties go to the longer marker."""
    if len(markers) == 1:  # (most families: one marker, one C-level search)
        m = markers[0]
        i = text.find(m, start)
        return (i, m) if i >= 0 else (-1, None)
    best, which = -1, None
    for m in markers:
        i = text.find(m, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(m) > len(which or ""))):
            best, which = i, m
    return best, which


def hold_back(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing chars of ``text`` might begin one of ``markers`` (max over markers)."""
    if len(markers) == 1:
        return partial_suffix_len(text, markers[0])
    keep = 0
    for m in markers:  # (a loop, not ``max`` over a generator: Qwen3's explicit block, every chunk)
        k = partial_suffix_len(text, m)
        if k > keep:
            keep = k
    return keep


def _make_dumps_non_ascii():
    """``json.dumps(obj, ensure_ascii=False)`` as one prebuilt C encoder (the encoder and its
    options are not rebuilt per call): same bytes, for the acyclic values a JSON parse returns
    (no circular-reference check: a cycle would recurse until ``RecursionError``)."""
    enc = json.JSONEncoder(ensure_ascii=False)
    make = _json_encoder.c_make_encoder
    if make is None:  # (no C accelerator: the stdlib's own path)
        return enc.encode
    c = make(None, enc.default, _json_encoder.encode_basestring, None, enc.key_separator, enc.item_separator,
             False, False, True)
    join = "".join

    def dumps_non_ascii(obj: Any) -> str:
        return join(c(obj, 0))

    return dumps_non_ascii


#: a lone UTF-16 surrogate code point (only a JSON ``\udXXX`` escape a parser decoded makes one:
#: detokenized text never holds one)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_escape(m: re.Match) -> str:
    return f"\\u{ord(m.group()):04x}"


def surrogates_escaped(s: str) -> str:
    """``s`` with every lone surrogate written as its JSON escape (``\\ud800``, six ASCII
    characters); ``s`` itself when it holds none. For JSON text re-encoded from a parsed value
    (``json.dumps(ensure_ascii=False)``, as vLLM's tool parsers do): a surrogate the model
    escaped would otherwise be a code point no UTF-8 reply can hold (vLLM answers a 500); inside
    a JSON string literal the escape is the same value."""
    if s.isascii() or _LONE_SURROGATE.search(s) is None:
        return s
    return _LONE_SURROGATE.sub(_surrogate_escape, s)


#: ``json.dumps(obj, ensure_ascii=False)`` of a parsed JSON value (``_make_dumps_non_ascii``)
dumps_non_ascii = _make_dumps_non_ascii()
#: ``json.loads(text)`` for a ``str`` (the module-level call's checks skipped): the same value,
#: and a ``ValueError`` (``JSONDecodeError``) for text that is not one JSON value, a leading BOM
#: included (only its message differs)
json_loads = json.JSONDecoder().decode
