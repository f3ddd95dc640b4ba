"""The non-streaming Responses view with logprobs, stepped in blocks instead of token by token.

What token by token decides. The Responses view gives a message part the logprob entries of
its own tokens only (``events.EventBuilder``, R3/R8): a token's entry waits (``pending_lp``)
until the first parser step from its own on that emits something; a step with content (and no
reasoning, and no call fragment before it) hands the waiting entries to the open message, a
step with reasoning or call fragments drops them, and those still waiting at the end go to the
last item if it is a message. A stream steps every token alone (each token's entry rides with
the text it produced), so which step consumes an entry depends on the parser's output at every
token: ~8 us of Python per token (detokenizer, parser stack, builder), and one entry Struct per
token and candidate.

Blocks. The parser stack is split-independent (``worker/parsers/AGENTS.md``); this module rests
on a slightly stronger form of it: its emission is prefix-determined, what it has emitted after
the first ``j`` tokens does not depend on how they were split into steps (checked wherever a
block is split, below; and over every parser example, the parity corpus and random outputs by
tests/test_responses_blocks.py). So a step over tokens ``[a, b)`` emits what the ``b - a``
one-token steps emit together, and

* a block whose step emits one kind only (reasoning, content or calls) or nothing is, token by
  token, steps of that kind or empty ones: its entries are consumed as one step consumes them,
  except the entries after its last non-empty token (they wait for the next non-empty step);
* those matter only when that next step consumes them otherwise (content against reasoning or
  calls, and any step of the parsers' final flush, whose calls ``argshape.cut_call_rest`` may
  still drop): there the block is split at its last non-empty token (``_split_tail``: the last
  token alone first, then bisection);
* a block whose step emits more than one kind is bisected (``_refine``) down to blocks of one
  kind or single tokens (a single token's step is what a stream's is).

The output is first cut before and after each added token (where markers are, on most models),
so most blocks are of one kind from the start: the Qwen3 reasoning + answer + Hermes call of
``bench core``'s paths pass takes 11 parser steps instead of ~256. Each split is checked
against the step it replaces (``_check``: the same reasoning, content, reasoning-token count
and call fragments, joined); a parser that ever disagrees raises ``Fallback`` and the record is
stepped token by token (``derender._step``). A record whose tool parser streams call arguments
(``--tool-call-streaming incremental`` with tools on, ``stepped``) takes one-token blocks from
the first block that hands the tool parser anything on (blocks before it: reasoning only): those
pieces are split-independent as JSON values only (on malformed markup not even that), so the
tool parser sees the stream's steps, without its per-token detokenizer and entry Structs. The
builder is fed the blocks' deltas with their tokens' positions as
entries (``plan``); the caller turns each message's positions into its logprob JSON at the end
(``worker.core.logprobs.responses_logprobs_json``).

Texts: a block's text is what the detokenizer emits stepping its ids one at a time
(``texts``): on a tokenizer that decodes by byte table, a slice of the output's bytes between
the last character boundaries at or before the block's ends (stepping holds a split character's
first bytes until the id that completes it), when their decode is the one-shot text; otherwise
the detokenizer stepped one id at a time.
"""
from __future__ import annotations

import weakref
from itertools import accumulate, compress
from typing import Any

import msgspec

from worker.core.detokenize import DetokState, IncrementalDetokenizer
from worker.parsers.base import Delta
from worker.parsers.idscan import has_special

__all__ = ["Fallback", "texts", "stepped", "plan"]

_R, _C, _T = 1, 2, 4


class Fallback(Exception):
    """A split step disagreed with the step it replaced (the parser's emission depends on how
    its input is split): step the record token by token instead."""


# --------------------------------------------------------------------------------- texts ---
class _ByteTexts:
    """``Texts`` of an output whose ids' bytes come from the tokenizer's decode tables: ``wb``
    the output's bytes, ``offs`` the byte offset of each id (``n + 1``)."""

    __slots__ = ("wb", "offs")

    def __init__(self, wb: bytes, offs: list[int]):
        self.wb, self.offs = wb, offs

    def _cut(self, j: int) -> int:
        """The byte offset stepping has emitted up to after ``j`` ids: that of the last id
        boundary at or before ``j`` that is a character boundary (stepping holds a character's
        first bytes until the id that completes it)."""
        offs, wb = self.offs, self.wb
        b = offs[j]
        while b < len(wb) and 0x80 <= wb[b] <= 0xBF:  # (inside a character: a continuation byte)
            j -= 1
            b = offs[j]
        return b

    def get(self, a: int, b: int) -> str:
        return self.wb[self._cut(a):self._cut(b)].decode("utf-8")


class _StepTexts:
    """``Texts`` from the detokenizer stepped one id at a time."""

    __slots__ = ("texts",)

    def __init__(self, texts: list[str]):
        self.texts = texts

    def get(self, a: int, b: int) -> str:
        return "".join(self.texts[a:b])


def _byte_texts(tok, skip: bool, ids: list[int], prompt_ids: list[int] | None) -> _ByteTexts | None:
    """``texts`` from the tokenizer's decode tables (``Tokenizer.decode_pieces``), or
    None when they do not apply: the output's bytes are its ids' table bytes joined, and what
    stepping emits after ``j`` ids is their decode up to the last character boundary at an id
    boundary, when the one-shot decode (``IncrementalDetokenizer.whole_output``, the
    non-streaming text: None when it could differ from stepping) is that of these bytes and
    holds no U+FFFD (valid UTF-8: a prefix decodes to U+FFFD only where it cuts a character)."""
    pieces = tok.decode_pieces(ids, skip)
    if pieces is None:
        return None
    wb = b"".join(pieces)
    whole = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt_ids).whole_output(ids)
    if whole is None or wb.decode("utf-8", "replace") != whole:
        return None
    return _ByteTexts(wb, list(accumulate(map(len, pieces), initial=0)))


def texts(tok, skip: bool, ids: list[int], state: DetokState | None, prompt_ids: list[int] | None):
    """The texts of the output ids ``ids``: ``.get(a, b)`` is what ids ``a`` to ``b - 1`` add
    when the detokenizer steps them one at a time from ``state`` (the stream's
    ``IncrementalDetokenizer.add([id])``; ``state`` is the one seeded from ``prompt_ids``, never
    changed here)."""
    t = _byte_texts(tok, skip, ids, prompt_ids) if ids else None
    if t is not None:
        return t
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip, state=state)
    return _StepTexts(list(map(d.add, zip(ids))))


# ----------------------------------------------------------------------------- the steps ---
_ENC = msgspec.msgpack.Encoder()
#: per parser stack: a msgpack decoder of its typed state (``ParserStack.typed_state``): a
#: snapshot (``_Stepper.snap``) decodes typed in one pass
_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _decoder(stack) -> msgspec.msgpack.Decoder:
    dec = _decoders.get(stack)
    if dec is None:
        dec = _decoders[stack] = msgspec.msgpack.Decoder(stack.typed_state)
    return dec


def _kind(d: Delta) -> int:
    """Bits of what ``d`` emits: reasoning 1, content 2, call fragments 4."""
    return (_R if d.reasoning else 0) | (_C if d.content else 0) | (_T if d.tool_calls else 0)


class _Stepper:
    """Parser steps over blocks of the output's text ids (``texts``: their one-by-one texts),
    as ``derender._step``'s ``parse`` takes them, and snapshots of the parser state."""

    __slots__ = ("stack", "tok", "ids", "texts", "special", "st", "dec")

    def __init__(self, rt, st, ids: list[int], texts):
        self.stack = rt.stack
        self.tok = rt.tokenizer
        self.ids = ids
        self.texts = texts
        self.special = rt.tokenizer.special_ids if st.skip_special else None
        self.st = st
        self.dec = _decoder(rt.stack).decode if st.parser is not None else None

    def feed(self, ps: Any, text: str, pids: list[int]) -> Delta:
        """``derender._step``'s ``parse`` on the parser state ``ps``."""
        st = self.st
        if st.hold_ids and not st.holding and not set(st.hold_ids).isdisjoint(pids):
            st.holding = True  # (only a stream's events read it)
        special = self.special
        if special is not None and has_special(self.tok, pids):
            pids = [t for t in pids if t not in special]
        if ps is None:
            return Delta(content=text)
        return self.stack.feed(ps, text, pids) if (text or pids) else Delta()

    def step(self, ps: Any, a: int, b: int) -> Delta:
        """The step of tokens ``[a, b)`` (advances ``ps``)."""
        return self.feed(ps, self.texts.get(a, b), self.ids[a:b])

    def snap(self, ps: Any) -> bytes | None:
        return _ENC.encode(ps) if ps is not None else None

    def restore(self, data: bytes | None) -> Any:
        return self.dec(data) if data is not None else None


def _calls_sig(calls: list) -> tuple:
    args: dict[int, str] = {}
    for c in calls:
        args[c.index] = args.get(c.index, "") + (c.arguments or "")
    return [(c.index, c.name) for c in calls if c.name is not None], args


def _check(d: Delta, parts: list[Delta]) -> None:
    """``parts`` (the steps of a split block) emit what ``d`` (the block's one step) emits, or
    ``Fallback``."""
    if d.reasoning != "".join([p.reasoning for p in parts]) or d.content != "".join([p.content for p in parts]) \
            or d.reasoning_tokens != sum([p.reasoning_tokens for p in parts]):
        raise Fallback
    calls = [c for p in parts for c in p.tool_calls]
    if bool(calls) != bool(d.tool_calls) or (calls and _calls_sig(calls) != _calls_sig(d.tool_calls)):
        raise Fallback


def _refine(sp: _Stepper, a: int, b: int, ps: Any, out: list) -> Any:
    """Step tokens ``[a, b)`` from ``ps`` (the state at ``a``, advanced), appending blocks
    ``[a, b, delta, snapshot at a]`` to ``out``: one block when its step emits one kind or
    nothing (or it is one token), else the two halves refined (``_check``ed against the one
    step). Returns the state at ``b``."""
    if b - a == 1:
        out.append([a, b, sp.step(ps, a, b), None])
        return ps
    snap = sp.snap(ps)
    d = sp.step(ps, a, b)
    k = _kind(d)
    if not k & (k - 1):  # nothing, or one kind
        out.append([a, b, d, snap])
        return ps
    ps = sp.restore(snap)
    m = (a + b) // 2
    n0 = len(out)
    ps = _refine(sp, a, m, ps, out)
    ps = _refine(sp, m, b, ps, out)
    _check(d, [x[2] for x in out[n0:]])
    return ps


def _split_tail(sp: _Stepper, blk: list) -> list:
    """Block ``blk`` (several tokens, one kind, something emitted) as blocks whose last
    non-empty one is its last non-empty token alone, followed by the tokens after it (one
    empty block): the last token alone first, then bisection of the rest."""
    lo, hi, cur, s_lo = blk
    pre: list = []
    tail: list = []
    m = hi - 1
    while True:
        ps = sp.restore(s_lo)
        d1 = sp.step(ps, lo, m)
        s_m = sp.snap(ps) if hi - m > 1 else None
        d2 = sp.step(ps, m, hi)
        _check(cur, [d1, d2])
        if _kind(d2):
            if lo < m:
                pre.append([lo, m, d1, None])
            lo, s_lo, cur = m, s_m, d2
        else:
            tail.append([m, hi, d2, None])
            hi, cur = m, d1
        if hi - lo == 1:
            out = pre + [[lo, hi, cur, None]]
            if tail:  # (the empty blocks after the last non-empty token, as one: their reasoning tokens)
                out.append([hi, blk[1], Delta(reasoning_tokens=sum([t[2].reasoning_tokens for t in tail])), None])
            return out
        m = (lo + hi) // 2


def _cuts(tok, ids: list[int]) -> list[int]:
    """Block boundaries: the output cut before and after each added token."""
    n = len(ids)
    added = tok.added_token_ids
    if n < 2 or not added:
        return [0, n]
    pos = list(compress(range(n), map(added.__contains__, ids)))
    if not pos:
        return [0, n]
    return sorted({0, n, *pos, *[p + 1 for p in pos]})


def _splits_before(k_prev: int, k_next: int) -> bool:
    """Whether the waiting entries after a block of kind ``k_prev`` may be consumed otherwise
    than that block consumes its own by a next non-empty step of kind ``k_next``: content
    against reasoning or calls (reasoning and calls both drop them; content hands them to
    the same open message)."""
    if k_prev == _C:
        return k_next != _C
    return k_next not in (_R, _T)


def _tool_side(ps: Any) -> bytes:
    """The parser state but the reasoning parser's, encoded: unchanged by a step in which the
    tool parser and the stack's own content rules were handed nothing."""
    return _ENC.encode(msgspec.structs.replace(ps, reasoning=None)) if ps is not None else b""


def stepped(rt, st) -> bool:
    """Whether the record's tool parser must see the stream's steps, one per token (``plan``'s
    ``per_token``): it streams call arguments (``--tool-call-streaming incremental`` with tools
    on), whose pieces are split-independent as JSON values only (``worker.parsers.incremental``;
    on malformed markup not even that)."""
    ps = st.parser
    stack = rt.stack
    return ps is not None and ps.tool is not None and stack.tool_call_streaming == "incremental" \
        and ps.mode in ("auto", "required", "named") and stack.tool.incremental


def plan(rt, st, ids: list[int], texts, stop_ids: list[int], n_entries: int, per_token: bool = False
         ) -> tuple[list[tuple[Delta, list[int] | None]], Delta | None, Any]:
    """The builder feeds of a whole output with logprobs: ``(feeds, finish, state)``.
    ``ids``: the text ids (stop token trimmed), ``texts`` their one-by-one texts
    (``texts``), ``stop_ids`` the stop ids a parser reads (``ParserStack.wants_stop_token``),
    ``n_entries`` the output's logprob entries (one per output id: those after the text ids are
    the stop token's). ``feeds``: ``(delta, entry positions or None)`` in order, as
    ``derender._step`` feeds its per-token steps (then the stop ids' step, then the stop token's
    entries); ``finish``: the parsers' final flush (None without parsers), fed by the caller
    after ``argshape.cut_call_rest``; ``state``: the parser state after it. ``st.parser`` is
    not changed. ``per_token`` (``stepped``): one token per block from the first block that
    hands the tool parser anything (it changes the state outside the reasoning parser's, or
    emits content or calls) on: the stream's steps there, without its per-token detokenizer and
    entry Structs. Raises ``Fallback`` (module docstring)."""
    stack = rt.stack
    sp = _Stepper(rt, st, ids, texts)
    ps = sp.restore(sp.snap(st.parser))
    blocks: list = []
    n = len(ids)
    if n:
        cuts = _cuts(rt.tokenizer, ids)
        for a, b in zip(cuts, cuts[1:]):
            if per_token:  # (blocks while the tool side is untouched: reasoning only)
                snap, side, m = sp.snap(ps), _tool_side(ps), len(blocks)
            ps = _refine(sp, a, b, ps, blocks)
            if per_token and (_tool_side(ps) != side or any(_kind(x[2]) & (_C | _T) for x in blocks[m:])):
                del blocks[m:]
                ps = sp.restore(snap)
                for j in range(a, n):
                    blocks.append([j, j + 1, sp.step(ps, j, j + 1), None])
                break
    units = blocks  # text blocks, then the stop ids' step and the parsers' flush: [a, b, delta, snap]
    if stop_ids:
        units.append([n, n, sp.feed(ps, "", stop_ids), None])
    fin = stack.finish(ps) if ps is not None else None
    last = -1  # the last non-empty unit
    out: list = []
    for u in units + ([[n_entries, n_entries, fin, None]] if fin is not None else []):
        k = _kind(u[2])
        if k:
            if last >= 0:
                p = out[last]
                if p[1] - p[0] > 1 and (u[2] is fin or _splits_before(_kind(p[2]), k)):
                    out[last:last + 1] = _split_tail(sp, p)
            last = len(out)
        out.append(u)
    if fin is not None:
        out.pop()
    feeds: list = [(d, list(range(a, b)) if b > a else None) for a, b, d, _ in out]
    if n_entries > n:  # the stop token's entries: the final part only
        feeds.append((Delta(), list(range(n, n_entries))))
    return feeds, fin, ps
