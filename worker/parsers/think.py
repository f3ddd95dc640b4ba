"""Declarative engine for ``<think>``-style reasoning: a start marker, an end marker, and a
default mode. Most reasoning families are one ``ThinkSpec`` plus a registration (see
``families/``); a model's quirk stays in its own module as a subclass.

Rules (from the models' chat templates and vLLM's reasoning parsers):

* ``mode`` starts as ``start``: a leading start marker is stripped, with any whitespace before it
  (vLLM's ``test_reasoning[new_line]``: ``"\n<think>…"``); after it (or when the output does not
  begin with one) the parser is in reasoning when ``default_reasoning`` is true (templates that
  pre-open the block, Qwen3 2507, DeepSeek R1) else in content;
* the initial mode also comes from the request: ``enable_thinking=false`` / ``thinking=false``
  start in content; and from the prompt's last assistant turn (ids after the last
  ``turn_token``): a closed block (end id after the last start id) starts in content, an open one
  (start id last) starts in reasoning;
* reasoning runs to the first end marker; text after it is content; an ``implicit_end`` marker
  (e.g. Qwen3's ``<tool_call>``) also ends it, except, with ``explicit_needs_end``, in a block
  the output opened with a start marker: there the model may quote tool-call syntax while
  reasoning and only the end marker closes the block (Qwen3, bug-029);
* ``hold_implicit`` (Qwen3): in such an explicit block an implicit end marker is held (mode
  ``held``) with the tool-call blocks it opens and the whitespace between them: the end marker
  arriving later means the calls were quoted (reasoning, bug-029); the output ending first means
  the model called the tools without closing its reasoning (content, vLLM's
  ``tool_call_with_think_no_end``); other text after a closed block means quoted. Same answer in
  both modes; the held text is streamed once decided. It stays in the state (the size of the
  held call blocks, like an open call's body, but not spilled to pieces); at rest as reasoning
  text still in ``buf`` (``ThinkState``: the previous release reads it as reasoning). Limit: ``reasoning_tokens`` follows the
  ids, where the explicit rule holds (an implicit-end id in an explicit block is a reasoning
  token), so the ids of calls surfaced that way still count as reasoning tokens;
* after a block closed by an end marker, a repeated end marker in the content is dropped
  (vLLM's ``test_duplicate_think_end_absorbed``); not for ``start_anywhere`` families, where
  ``drop_stray_end`` drops every end marker met in the content instead (Gemma 4);
* ``reasoning_tokens`` counts token ids seen in reasoning mode, markers excluded, following the
  id stream (so it is split-independent and counts tokens whose text is empty);
* ``strip_trailing_ws`` (families whose template writes whitespace before the end marker as
  framing, vLLM's ``strip_trailing_reasoning_whitespace``): the reasoning loses its trailing
  whitespace (``str.rstrip``) in both modes. While streaming, reasoning whitespace is held back
  (``ThinkState.ws``) until more reasoning text follows it, and dropped when reasoning ends or
  the output does.
"""
from __future__ import annotations

from typing import ClassVar

import msgspec

from worker.parsers.base import Delta, ReasoningParser, RequestContext, find_first, hold_back
from worker.parsers.idscan import SMALL, id_text


class ThinkFields(msgspec.Struct, kw_only=True, array_like=True):
    """The fields of release e8f2be2's ``ThinkState``, in its order (stream state format 6):
    ``mode`` (start|reasoning|content), ``buf`` (held-back text that may be a split marker, at
    most one marker long; at rest also the held text, ``ThinkState.held_len``),
    ``tok_reasoning`` (id-level mode). A state type puts its own fields after these, then
    ``closed`` / ``held_len`` / ``held_in``: trailing fields e8f2be2 ignores when it decodes
    (docs/delivery.md, "Rolling upgrades across releases")."""

    mode: str = "start"
    buf: str = ""
    tok_reasoning: bool = False
    #: the output opened the block with a start marker (text / id level): implicit ends off
    explicit: bool = False
    tok_explicit: bool = False
    #: trailing reasoning whitespace held back (``ThinkSpec.strip_trailing_ws``)
    ws: str = ""


class ThinkState(ThinkFields, kw_only=True, array_like=True):
    """Per-sequence state: ``ThinkFields`` plus ``closed`` (an end marker closed the block: a
    repeated end marker in the content is dropped) and the held mode of
    ``ThinkSpec.hold_implicit``: the text from an implicit end marker met in an explicit block,
    undecided until ``</think>`` (reasoning) or the output's end (content). At rest (between
    feeds) that mode is stored as mode ``reasoning`` with the held text as the first
    ``held_len`` characters of ``buf`` (what e8f2be2 reads as reasoning: its answer for that
    output); ``held_in``: inside that tool-call block (before its ``implicit_close``)."""

    closed: bool = False
    held_len: int = 0
    held_in: bool = False


class ThinkSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Markers of a think-style reasoning format.

    ``start``/``end``: marker strings; ``default_reasoning``: output without a start marker is
    reasoning; ``start_anywhere``: a start marker inside content opens reasoning again;
    ``turn_token``: token string that opens a prompt turn (prompt scan scope), or None;
    ``implicit_end``: markers that end reasoning without an end marker and stay in the content
    (e.g. Qwen3's ``<tool_call>`` emitted straight from the thinking block);
    ``explicit_needs_end``: ``implicit_end`` markers do not end a block the output opened with
    a start marker; ``strip_trailing_ws``: trailing whitespace of the reasoning is framing and
    is dropped (module docstring)."""

    start: tuple[str, ...] = ("<think>",)
    end: tuple[str, ...] = ("</think>",)
    default_reasoning: bool = True
    start_anywhere: bool = False
    turn_token: str | None = None
    implicit_end: tuple[str, ...] = ()
    explicit_needs_end: bool = False
    strip_trailing_ws: bool = False
    #: with ``explicit_needs_end``: an implicit end met in an explicit block is held, with the
    #: tool-call blocks it opens (each closed by one of ``implicit_close``) and the whitespace
    #: between them, until the block's end marker (the calls were quoted: reasoning) or the end
    #: of the output (the model called the tools without closing its reasoning: content); other
    #: text after a closed block means quoted (module docstring)
    hold_implicit: bool = False
    implicit_close: tuple[str, ...] = ()
    #: after a block closed by an end marker, the end marker repeated in the content is dropped
    #: (off for text headers that are ordinary prose, Granite's ``Here is my response:``)
    drop_repeated_end: bool = True
    #: with ``start_anywhere``: an end marker in the content (no block open) is dropped, also
    #: before any block opened (Gemma 4's ``<channel|>``, a special token that is never text)
    drop_stray_end: bool = False


#: prompt ids ``prompt_mode`` reads from the end before it falls back to the whole prompt
_PROMPT_WINDOW = 256


def _first_of(rev: list[int], ids: tuple[int, ...], bound: int) -> int:
    """Smallest position below ``bound`` of any of ``ids`` in ``rev`` (``bound`` when none),
    each ``list.index`` bounded by the nearest hit so far."""
    for m in ids:
        try:
            bound = rev.index(m, 0, bound)
        except ValueError:
            pass
    return bound


class ThinkReasoningParser(ReasoningParser):
    """Reasoning parser driven by a ``ThinkSpec`` (see module docstring)."""

    spec: ClassVar[ThinkSpec] = ThinkSpec()

    def __init__(self, tok):
        self.tok = tok
        self.start_ids = frozenset(i for i in (tok.token_to_id(m) for m in self.spec.start) if i is not None)
        self.end_ids = frozenset(i for i in (tok.token_to_id(m) for m in self.spec.end) if i is not None)
        self.turn_id = tok.token_to_id(self.spec.turn_token) if self.spec.turn_token else None
        self.implicit_end_ids = frozenset(
            i for i in (tok.token_to_id(m) for m in self.spec.implicit_end) if i is not None)
        self._end_markers = self.spec.end + self.spec.implicit_end
        # ``prompt_mode``: an id in both sets is an end id there (its stepping tested ends first)
        self._start_only = tuple(sorted(self.start_ids - self.end_ids))
        self._start_only_differs = bool(self.start_ids & self.end_ids)
        self._prompt_ids = self.start_ids | self.end_ids | \
            (frozenset((self.turn_id,)) if self.turn_id is not None else frozenset())
        self._longest_start = max(map(len, self.spec.start), default=0)
        self._longest_end = max(map(len, self._end_markers), default=0)
        #: markers read in the content of a ``start_anywhere`` spec
        self._content_marks = self.spec.start + (self.spec.end if self.spec.drop_stray_end else ())
        self._longest_content_mark = max(map(len, self._content_marks), default=0)
        self._marker_ids = self.start_ids | self.end_ids | self.implicit_end_ids
        # the marker ids ``_count`` searches for in content, in an explicit block, in a block
        # an implicit end may close (the others leave its count unchanged there); start ids
        # first: an output usually opens with one, and each hit bounds the later searches
        starts = tuple(sorted(self.start_ids))
        ends = tuple(sorted(self.end_ids - self.start_ids))
        self._content_relevant = starts
        self._explicit_relevant = starts + ends
        self._all_relevant = starts + ends + tuple(sorted(self.implicit_end_ids - self.start_ids - self.end_ids))
        # the same ids as characters, for the scans of ``idscan.id_text`` (long id lists)
        self._chars = {i: chr(i) for i in self._marker_ids | self._prompt_ids if 0 <= i < 0x110000}
        self._text_ok = len(self._chars) == len(self._marker_ids | self._prompt_ids)

    # -- initial state -----------------------------------------------------------------------
    def prompt_mode(self, prompt_ids: list[int] | None) -> str | None:
        """``reasoning``/``content`` when the prompt's last turn (the ids after the last
        ``turn_token``) pre-opened/closed a block: its last start id after / before its last end
        id; None when it holds neither. C-level, never one Python step per prompt id: a prompt
        longer than ``idscan.SMALL`` through ``_prompt_mode_text``; otherwise (or when its ids
        cannot be text) ``isdisjoint`` first, then ``list.index`` on the reversed last
        ``_PROMPT_WINDOW`` ids (the whole prompt only when the window does not decide)."""
        if not prompt_ids:
            return None
        if self._start_only_differs:
            if self._prompt_ids.isdisjoint(prompt_ids):
                return None
            return self._prompt_mode_stepped(prompt_ids)
        n = len(prompt_ids)
        size = min(n, _PROMPT_WINDOW)
        if n > SMALL and self._text_ok:
            found, mode = self._prompt_mode_text(prompt_ids)
            if found:
                return mode
        if self._prompt_ids.isdisjoint(prompt_ids):
            return None
        while True:
            rev = prompt_ids[n - size:][::-1]  # rev[k] = prompt_ids[n - 1 - k]
            bound = size
            if self.turn_id is not None:
                try:
                    bound = rev.index(self.turn_id)
                except ValueError:
                    pass
            last_end = _first_of(rev, self.end_ids, bound)
            last_start = _first_of(rev, self._start_only, bound)
            if bound < size or size == n or min(last_end, last_start) < bound:
                break  # the window holds the turn's start, the whole prompt, or the last marker
            size = n
        if last_end < last_start:  # (positions from the end: smaller is later)
            return "content"
        if last_start < last_end:
            return "reasoning"
        return None

    def _prompt_mode_text(self, prompt_ids: list[int]) -> tuple[bool, str | None]:
        """``prompt_mode`` over ``idscan.id_text`` of the last ``_PROMPT_WINDOW`` ids (the whole
        prompt only when the window holds neither the turn id nor a marker): ``str.rfind`` per
        marker id, bounded by the last turn id. ``(True, mode)``; ``(False, None)`` when an id
        cannot be converted (the caller then scans the list)."""
        n = len(prompt_ids)
        size = min(n, _PROMPT_WINDOW)
        chars = self._chars
        while True:
            s = id_text(prompt_ids[n - size:] if size < n else prompt_ids, keep=False)
            if s is None:
                return False, None
            lo = s.rfind(chars[self.turn_id]) + 1 if self.turn_id is not None else 0
            last_end = max([s.rfind(chars[m], lo) for m in self.end_ids], default=-1)
            last_start = max([s.rfind(chars[m], lo) for m in self._start_only], default=-1)
            if lo > 0 or size == n or last_end >= 0 or last_start >= 0:
                break
            size = n
        if last_end > last_start:
            return True, "content"
        if last_start > last_end:
            return True, "reasoning"
        return True, None

    def _prompt_mode_stepped(self, prompt_ids: list[int]) -> str | None:
        """``prompt_mode`` one id at a time from the end: only for a spec whose start and end
        markers share an id (none of the registered families)."""
        last_start = last_end = -1
        for i in range(len(prompt_ids) - 1, -1, -1):
            t = prompt_ids[i]
            if self.turn_id is not None and t == self.turn_id:
                break
            if t in self.end_ids and last_end < 0:
                last_end = i
            elif t in self.start_ids and last_start < 0:
                last_start = i
            if last_start >= 0 and last_end >= 0:
                break
        if last_end > last_start:
            return "content"
        if last_start > last_end:
            return "reasoning"
        return None

    def answering(self, state: ThinkState) -> bool:
        return state.mode == "content"

    def initial_state(self, ctx: RequestContext) -> ThinkState:
        if ctx.thinking_disabled():
            return ThinkState(mode="content", tok_reasoning=False)
        pm = self.prompt_mode(ctx.prompt_token_ids)
        if pm == "content":
            return ThinkState(mode="content", tok_reasoning=False)
        if pm == "reasoning":
            return ThinkState(mode="reasoning", tok_reasoning=True)
        return ThinkState(mode="start", tok_reasoning=self.spec.default_reasoning)

    # -- steps -------------------------------------------------------------------------------
    def _reason(self, st: ThinkState, out: Delta, text: str) -> None:
        """Append reasoning ``text`` to ``out`` (trailing whitespace held back when the spec
        strips it)."""
        if not self.spec.strip_trailing_ws:
            out.reasoning += text
            return
        r = st.ws + text
        k = len(r.rstrip())
        out.reasoning += r[:k]
        st.ws = r[k:]

    def _count(self, st: ThinkState, token_ids: list[int]) -> int:
        """Reasoning ids among ``token_ids`` (markers excluded), following the id-level mode in
        ``st`` and updating it (rules: ``_count_ids``). A list longer than ``idscan.SMALL`` is
        searched as ``idscan.id_text`` (``str.find``, a ``wmemchr``, where ``_count_ids`` takes
        ``list.index``); a shorter one, or one that text cannot hold, by ``_count_ids``: the
        same count and final mode either way."""
        if len(token_ids) > SMALL and self._text_ok:
            s = id_text(token_ids)
            if s is not None:
                return self._count_ids(st, s, self._chars)
        return self._count_ids(st, token_ids)

    def _count_ids(self, st: ThinkState, token_ids, chars: dict[int, str] | None = None) -> int:
        """Reasoning ids among ``token_ids`` (markers excluded), following the id-level mode in
        ``st``: a start id enters reasoning (and sets the block explicit when the spec says so),
        an end id leaves it, an implicit-end id leaves it unless the block is explicit (there
        it counts as a reasoning token).

        Work is C-level over the ids (``set.isdisjoint``, ``list.index``) plus one Python step
        per marker occurrence, never one per token: from each position only the marker ids that
        can change the count are searched (in content: start ids; in reasoning: start and end
        ids, implicit ends too when the block is not explicit), each search bounded by the
        nearest hit so far and its result remembered, so a marker's stretch of the ids is
        scanned about once (issue 13: the ids after the last marker are not scanned once per
        marker id).

        ``token_ids`` is the id list, or (with ``chars``: marker id -> its character) its
        ``idscan.id_text``, searched with ``str.find``."""
        r = st.tok_reasoning
        if chars is None and self._marker_ids.isdisjoint(token_ids):
            return len(token_ids) if r else 0
        explicit = st.tok_explicit
        needs_end = self.spec.explicit_needs_end
        start_ids, end_ids = self.start_ids, self.end_ids
        size = len(token_ids)
        index = token_ids.index if chars is None else token_ids.find
        #: marker id -> (k, True): its first occurrence at or after the search start is k;
        #: (k, False): it does not occur between the search start and k
        known: dict[int, tuple[int, bool]] = {}
        n = pos = 0
        while pos < size:
            if not r:
                ids = self._content_relevant
            elif explicit:
                ids = self._explicit_relevant
            else:
                ids = self._all_relevant
            best = size
            for m in ids:
                k, found = known.get(m, (pos, False))
                if found and k >= pos:
                    if k < best:
                        best = k
                    continue
                lo = k if k > pos else pos
                if lo >= best:
                    continue
                if chars is None:
                    try:
                        best = index(m, lo, best)
                        known[m] = (best, True)
                    except ValueError:
                        known[m] = (best, False)
                else:
                    k = index(chars[m], lo, best)
                    if k >= 0:
                        best = k
                        known[m] = (k, True)
                    else:
                        known[m] = (best, False)
            if r:
                n += best - pos
            if best == size:
                break
            pos = best + 1
            t = token_ids[best] if chars is None else ord(token_ids[best])
            if t in start_ids:
                r = True
                explicit = needs_end
            elif t in end_ids:
                r = False
            elif not explicit:  # an implicit end
                r = False
            elif r:  # an implicit end inside an explicit block is a reasoning token
                n += 1
        st.tok_reasoning = r
        st.tok_explicit = explicit
        return n

    def feed(self, state: ThinkState, text: str, token_ids: list[int]) -> Delta:
        out = Delta(reasoning_tokens=self._count(state, token_ids))
        # (the held mode unpacked / packed only when it is on)
        held = _unpack(state) if state.held_len else ""
        s = state.buf + text
        state.buf = ""
        held = self._read(state, out, s, held)
        if state.mode == "held":
            _pack(state, held)
        return out

    def _read(self, state: ThinkState, out: Delta, s: str, held: str) -> str:
        """The text steps of ``feed`` over ``s`` (``buf`` + the delta) into ``out``; ``held``:
        the held text (mode ``held``, unpacked). Returns the held text left."""
        spec = self.spec
        i, size = 0, len(s)  # ``s[i:]`` is still to be read (offsets: no copy of the rest per step)
        while i < size:
            if state.mode == "start":
                k = i
                while k < size and s[k].isspace():  # only at the output's start
                    k += 1
                if k == size or (size - k < self._longest_start and
                                 any(len(m) > size - k and m.startswith(s[k:]) for m in spec.start)):
                    state.buf = s[i:]
                    return held
                for m in spec.start:
                    if s.startswith(m, k):  # whitespace before the start marker is dropped
                        i = k + len(m)
                        state.mode = "reasoning"
                        state.explicit = spec.explicit_needs_end
                        break
                else:
                    state.mode = "reasoning" if spec.default_reasoning else "content"
                continue
            if state.mode == "held":
                i, held = self._held(state, out, s, i, held)
                if i < 0:
                    return held
                continue
            if state.mode == "reasoning":
                ends = spec.end if state.explicit and not spec.hold_implicit else self._end_markers
                j, m = find_first(s, ends, i)
                if j < 0:
                    keep = hold_back(s[max(i, size - self._longest_end):], ends)
                    self._reason(state, out, s[i: size - keep])
                    state.buf = s[size - keep:]
                    return held
                self._reason(state, out, s[i:j])
                if state.explicit and spec.hold_implicit and m not in spec.end:
                    state.mode, held, state.held_in = "held", m, True
                    i = j + len(m)
                    continue
                state.ws = ""  # reasoning ended: its trailing whitespace is dropped
                if m in spec.end:
                    i = j + len(m)
                    state.closed = True
                else:
                    i = j
                state.mode = "content"
                continue
            # content
            if state.closed and spec.drop_repeated_end and not spec.start_anywhere:  # repeated end: dropped
                j, m = find_first(s, spec.end, i)
                if j >= 0:
                    out.content += s[i:j]
                    i = j + len(m)
                    continue
                keep = hold_back(s[max(i, size - self._longest_end):], spec.end)
                out.content += s[i: size - keep]
                state.buf = s[size - keep:]
                return held
            if spec.start_anywhere:
                marks = self._content_marks
                j, m = find_first(s, marks, i)
                if j >= 0:
                    out.content += s[i:j]
                    i = j + len(m)
                    if m in spec.start:
                        state.mode = "reasoning"
                    continue  # else a stray end marker: dropped (``drop_stray_end``)
                keep = hold_back(s[max(i, size - self._longest_content_mark):], marks)
                out.content += s[i: size - keep]
                state.buf = s[size - keep:]
                return held
            out.content += s[i:] if i else s
            return held
        return held

    def _held(self, st: ThinkState, out: Delta, s: str, i: int, held: str) -> tuple[int, str]:
        """One step of mode ``held`` (``ThinkSpec.hold_implicit``) over ``s[i:]`` with the held
        text ``held``: returns where reading goes on (-1 when ``s`` is used up, a possible split
        marker kept in ``buf``) and the held text left."""
        spec = self.spec
        size = len(s)
        if st.held_in:  # inside a tool-call block: its close, or the think block's end
            marks = spec.end + spec.implicit_close
            j, m = find_first(s, marks, i)
            if j < 0:
                keep = hold_back(s[max(i, size - max(map(len, marks))):], marks)
                st.buf = s[size - keep:]
                return -1, held + s[i: size - keep]
            if m in spec.end:  # the calls were quoted inside the reasoning
                self._reason(st, out, held + s[i:j])
                st.held_in, st.mode, st.closed = False, "content", True
                return j + len(m), ""
            st.held_in = False
            return j + len(m), held + s[i: j + len(m)]
        k = i
        while k < size and s[k].isspace():
            k += 1
        if k == size:
            return -1, held + s[i:]
        marks = spec.implicit_end + spec.end
        if any(len(m) > size - k and m.startswith(s[k:]) for m in marks):
            st.buf = s[k:]
            return -1, held + s[i:k]
        for m in spec.implicit_end:
            if s.startswith(m, k):  # the next tool-call block
                st.held_in = True
                return k + len(m), held + s[i: k + len(m)]
        # text (or the end marker) after a closed block: the calls were quoted
        self._reason(st, out, held)
        st.mode = "reasoning"
        return i, ""

    def finish(self, state: ThinkState) -> Delta:
        out = Delta()
        held = _unpack(state)
        if state.mode == "held":  # no end marker came: the reasoning ended at the held marker
            out.content = held + state.buf
            state.buf, state.held_in, state.mode = "", False, "content"
        s, state.buf = state.buf, ""
        if s:
            mode = state.mode
            if mode == "start":
                mode = "reasoning" if self.spec.default_reasoning else "content"
            if mode == "reasoning":
                self._reason(state, out, s)
            else:
                out.content = s
        state.ws = ""  # the output ended: trailing reasoning whitespace is dropped
        return out


def _unpack(st: ThinkState) -> str:
    """The held mode from its at-rest form (``ThinkState``): mode ``held`` again, ``buf`` without
    the held text; returns the held text ("" when not held)."""
    n = st.held_len
    if not n:
        return ""
    held, st.buf = st.buf[:n], st.buf[n:]
    st.mode, st.held_len = "held", 0
    return held


def _pack(st: ThinkState, held: str) -> None:
    """The held mode to its at-rest form: mode ``reasoning``, the held text ``held`` first in
    ``buf``, its length in ``held_len`` (e8f2be2 reads that as reasoning text still to emit)."""
    if st.mode == "held":
        st.mode, st.buf, st.held_len = "reasoning", held + st.buf, len(held)
