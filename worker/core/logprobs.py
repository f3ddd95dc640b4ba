"""OpenAI logprob blocks from engine logprobs, as a coupled vLLM 0.32 server returns them.

Token strings: vLLM decodes every candidate alone (``tokenizer.decode([id])``, special tokens
kept); a string ending in U+FFFD (a byte-fallback / partial UTF-8 piece) is repaired from up to 4
preceding *sampled* output ids (``LogprobsProcessor._correct_decoded_token``): the shortest
context whose joint decode no longer ends in U+FFFD, minus the text of the context's "clean"
prefix; ``""`` when no context completes it (always so for the first output token, whose context
is empty: the prompt is not used). ``bytes`` are the UTF-8 bytes of that string (``[]`` for "").

Chat (``chat_logprobs``): per token the sampled entry, and ``top_logprobs`` = the first k of
[sampled, candidates by rank] with duplicate ids collapsed (sampled token first).
Completion (``completion_logprobs``): ``tokens``, ``token_logprobs``, ``top_logprobs`` = dicts of
the first k+1 of that list keyed by token string (same-string entries collapse, the later value
wins at the first key's position), ``text_offset`` = running sum of token string lengths from
``text_offset_start``.

Streaming: keep the last 4 sampled ids (:func:`next_context`) and the running completion text
offset between chunks (``DerenderStreamState.logprob_context_token_ids`` /
``logprob_text_offset``).
"""
from __future__ import annotations

import operator
import threading
from functools import partial
from operator import attrgetter, itemgetter

import msgspec

from schemas import ChatLogprobToken, ChatLogprobTop, CompletionLogprobs, TokenLogprobIn

from .tokenizers import Tokenizer

__all__ = ["chat_logprobs", "completion_logprobs", "decode_logprob_token", "next_context", "token_id_string",
           "MAX_CONTEXT", "MIN_LOGPROB"]

MAX_CONTEXT = 4
MIN_LOGPROB = -9999.0
_FFFD = "\ufffd"


def _correct(tok: Tokenizer, token_id: int, context: list[int]) -> str:
    n = min(len(context), MAX_CONTEXT)
    added = tok.added_token_ids
    if tok.is_byte_level and token_id not in added and added.keys().isdisjoint(context[-n:] if n else ()):
        return _correct_bytes(tok, token_id, context[-n:] if n else [])
    return _correct_decoding(tok, token_id, context)


def _correct_bytes(tok: Tokenizer, token_id: int, context: list[int]) -> str:
    """``_correct_decoding`` for a byte-level tokenizer without added tokens involved: the same
    joint decodes, computed from the pieces' bytes (``Tokenizer.token_bytes``) instead of
    tokenizer calls."""
    tb = tok.token_bytes
    tail = tb(token_id)
    cb = [tb(i) for i in context]
    for k in range(1, len(context) + 1):
        ctx = context[-k:]
        cbk = cb[-k:]
        full = (b"".join(cbk) + tail).decode("utf-8", errors="replace")
        if full.endswith(_FFFD):
            continue
        clean_end = _clean_end(tok, ctx)
        clean = b"".join(cbk[:clean_end]).decode("utf-8", errors="replace") if clean_end > 0 else ""
        return _after_common_prefix(clean, full)
    return ""


def _clean_end(tok: Tokenizer, ctx: list[int]) -> int:
    """Length of ``ctx`` without its trailing run of ids that decode alone to text ending in
    U+FFFD (vLLM's ``_correct_decoded_token``: the context part whose text is complete)."""
    clean_end = len(ctx)
    for j in range(len(ctx) - 1, -1, -1):
        if tok.decode_single(ctx[j]).endswith(_FFFD):
            clean_end = j
        else:
            break
    return clean_end


def _after_common_prefix(clean: str, full: str) -> str:
    """What ``full`` adds after the longest prefix it shares with ``clean`` (vLLM's
    ``_correct_decoded_token`` tail: the text the corrected token contributes)."""
    if full.startswith(clean):
        return full[len(clean):]
    common = 0
    for a, b in zip(clean, full, strict=False):
        if a != b:
            break
        common += 1
    return full[common:]


def _correct_decoding(tok: Tokenizer, token_id: int, context: list[int]) -> str:
    """vLLM's ``_correct_decoded_token`` with the tokenizer's own decode (module docstring)."""
    n = min(len(context), MAX_CONTEXT)
    for k in range(1, n + 1):
        ctx = context[-k:]
        full = tok.decode(ctx + [token_id], skip_special_tokens=False)
        if full.endswith(_FFFD):
            continue
        clean_end = _clean_end(tok, ctx)
        clean = tok.decode(ctx[:clean_end], skip_special_tokens=False) if clean_end > 0 else ""
        return _after_common_prefix(clean, full)
    return ""


def decode_logprob_token(tok: Tokenizer, token_id: int, context_token_ids: list[int] | None = None) -> str:
    """Text vLLM shows for ``token_id`` in a logprob entry, with U+FFFD repair from up to 4
    preceding sampled ids (``context_token_ids``, oldest first)."""
    if token_id is None or not tok.is_valid_id(token_id):
        return ""
    s = tok.decode_single(token_id)
    if s.endswith(_FFFD):
        return _correct(tok, token_id, list(context_token_ids or [])[-MAX_CONTEXT:])
    return s


#: row of a token whose text ends in U+FFFD on its own: repaired per position from the context
_REPAIR = ()
_TABLE_LOCK = threading.Lock()


def logprob_rows(tok: Tokenizer) -> list:
    """The tokenizer's lazily filled id -> ``(token string, UTF-8 bytes as a list of ints)`` table
    shared by every sampled token and candidate (one list of ``vocab_size`` slots, ``None`` until
    the id is first seen; ``()`` for an id whose text alone ends in U+FFFD, which is repaired per
    position). The bytes list is shared by every reply that shows that token: never mutate it.
    Filling a slot is idempotent, so concurrent fills are harmless."""
    rows = tok.logprob_rows
    if rows is None:
        with _TABLE_LOCK:
            rows = tok.logprob_rows
            if rows is None:
                rows = tok.logprob_rows = [None] * tok.vocab_size
    return rows


def _fill(tok: Tokenizer, rows: list, tid: int):
    s = tok.decode_single(tid)
    row = _REPAIR if s.endswith(_FFFD) else (s, list(s.encode("utf-8", errors="replace")))
    rows[tid] = row
    return row


def _rows_for(tok: Tokenizer, rows: list, ids: list[int], ctx: list[int], repaired: dict) -> list:
    """Rows of ``ids`` (all valid ids), filling the table and repairing U+FFFD tokens from
    ``ctx`` (``repaired``: per-position cache, id -> row)."""
    rs = [rows[t] for t in ids]
    if None in rs or _REPAIR in rs:
        for j, r in enumerate(rs):
            if r is None:
                r = rs[j] = _fill(tok, rows, ids[j])
            if r is _REPAIR:
                t = ids[j]
                r = repaired.get(t)
                if r is None:
                    fixed = _correct(tok, t, ctx)
                    r = repaired[t] = (fixed, list(fixed.encode("utf-8", errors="replace")))
                rs[j] = r
    return rs


def next_context(context_token_ids: list[int] | None, sampled_ids: list[int]) -> list[int]:
    """The logprob context after ``sampled_ids``: the last 4 sampled ids (bounded state)."""
    return (list(context_token_ids or []) + [i for i in sampled_ids if i is not None])[-MAX_CONTEXT:]


def _clamp(x: float | None) -> float:
    if x is None:
        return MIN_LOGPROB
    return x if x >= MIN_LOGPROB else MIN_LOGPROB  # also maps -inf; NaN stays NaN


def _ordered_candidates(entry: TokenLogprobIn) -> list[tuple[int | None, float]]:
    """[sampled, candidates in rank order], duplicate ids collapsed (vLLM's per-position dict)."""
    out: list[tuple[int | None, float]] = [(entry.token_id, entry.logprob)]
    seen = {entry.token_id}
    tops = entry.top_logprobs or []
    if any(t.rank is not None for t in tops):
        tops = sorted(tops, key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0))
    for t in tops:
        if t.token_id in seen:
            continue
        seen.add(t.token_id)
        out.append((t.token_id, t.logprob))
    return out


def _utf8(s: str) -> list[int]:
    return list(s.encode("utf-8", errors="replace"))


def token_id_string(token_id: int | None) -> str:
    """vLLM's ``--return-tokens-as-token-ids`` token string: ``token_id:<id>``."""
    return f"token_id:{token_id}"


def _fast_order(entry: TokenLogprobIn):
    """``[entry, candidates in rank order without the sampled id]`` as entries (each with
    ``token_id``/``logprob``) when the engine sent candidates already in rank order with
    distinct ids (vLLM always does); None otherwise (then ``_ordered_candidates`` decides)."""
    tops = entry.top_logprobs
    if not tops:
        return [entry]
    ranks = [t.rank for t in tops]
    if None in ranks:
        if ranks.count(None) != len(ranks):
            return None
    elif ranks != sorted(ranks):
        return None
    cids = [t.token_id for t in tops]
    if len(set(cids)) != len(cids):
        return None
    tid = entry.token_id
    if tid in cids:
        j = cids.index(tid)
        return [entry, *tops[:j], *tops[j + 1:]]
    return [entry, *tops]


class _Top(msgspec.Struct, gc=False):
    """Positional twin of ``schemas.ChatLogprobTop`` (same fields in the same order, same JSON):
    built with C-level ``map`` instead of one keyword call per candidate."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class _Tok(msgspec.Struct, gc=False):
    """Positional twin of ``schemas.ChatLogprobToken`` (see ``_Top``)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list = msgspec.field(default_factory=list)


_get_id = attrgetter("token_id")
_get_lp = attrgetter("logprob")
_get_rank = attrgetter("rank")
_first = itemgetter(0)
_second = itemgetter(1)
_not_below_floor = partial(operator.le, MIN_LOGPROB)


def _selected(e: TokenLogprobIn, k: int) -> tuple[list, list[float]]:
    """``(ids, logprobs)`` of the first ``k`` of [sampled, candidates by rank] with duplicate ids
    collapsed (``_ordered_candidates``), C-level when the engine sent candidates in rank order
    with distinct ids (vLLM always does)."""
    tid = e.token_id
    tops = e.top_logprobs
    if not tops or k == 1:
        return [tid], [e.logprob]
    ranks = list(map(_get_rank, tops))
    cids = list(map(_get_id, tops))
    if ((None not in ranks and ranks == sorted(ranks)) or ranks.count(None) == len(ranks)) \
            and len(set(cids)) == len(cids):
        lps = list(map(_get_lp, tops))
        if tid in cids:
            j = cids.index(tid)
            del cids[j], lps[j]
        return [tid, *cids[:k - 1]], [e.logprob, *lps[:k - 1]]
    pairs = _ordered_candidates(e)[:k]
    return [p for p, _ in pairs], [lp for _, lp in pairs]


def chat_logprobs(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                  context_token_ids: list[int] | None = None, as_token_ids: bool = False) -> list:
    """Chat ``logprobs.content`` for ``entries`` (one per output token; ids already checked to
    be in the vocabulary): Structs encoding exactly as ``ChatLogprobToken`` /
    ``ChatLogprobTop``. ``context_token_ids``: the sampled output ids before ``entries[0]``
    (last 4 are used; ``[]`` at the start). ``as_token_ids``: token strings are ``token_id:<id>``
    (vLLM's ``--return-tokens-as-token-ids``; ``bytes`` are then that string's bytes, as vLLM
    gives). Token strings and bytes come from :func:`logprob_rows` (lookup cost), U+FFFD pieces
    repaired per position; per candidate only C-level work (``map``, list ops)."""
    if as_token_ids:
        return _chat_logprobs_slow(tok, entries, top_logprobs, context_token_ids, as_token_ids)
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    if not k:
        return _sampled_only(tok, entries, ctx)
    rows = logprob_rows(tok)
    lookup = rows.__getitem__
    lo = MIN_LOGPROB
    out: list[_Tok] = []
    append = out.append
    for e in entries:
        tid = e.token_id
        ids, lps = _selected(e, k) if k else ([tid], [e.logprob])
        rs = list(map(lookup, ids))
        if None in rs or _REPAIR in rs:
            rs = _rows_for(tok, rows, ids, ctx, {})
        if not all(map(_not_below_floor, lps)):  # below the floor, -inf or NaN: the floor
            lps = [lp if lp >= lo else lo for lp in lps]
        toks = list(map(_first, rs))
        bys = list(map(_second, rs))
        append(_Tok(toks[0], lps[0], bys[0], list(map(_Top, toks, lps, bys)) if k else []))
        ctx.append(tid)
        if len(ctx) > MAX_CONTEXT:
            del ctx[0]
    return out


def _sampled_only(tok: Tokenizer, entries: list[TokenLogprobIn], ctx: list[int]) -> list:
    """``chat_logprobs`` with ``top_logprobs`` 0 (the sampled tokens alone): one C-level pass
    per field over all entries; Python runs only at ids the table has not seen yet and at
    positions whose token needs U+FFFD repair (``ctx``: up to 4 sampled ids before
    ``entries[0]``; a position's context is the 4 sampled ids before it)."""
    rows = logprob_rows(tok)
    tids = list(map(_get_id, entries))
    lps = list(map(_get_lp, entries))
    rs = list(map(rows.__getitem__, tids))
    if None in rs:
        j = rs.index(None)
        while True:
            r = rows[tids[j]]  # an earlier position may have filled it
            rs[j] = r if r is not None else _fill(tok, rows, tids[j])
            try:
                j = rs.index(None, j + 1)
            except ValueError:  # no unseen id left
                break
    if _REPAIR in rs:
        seq = ctx + tids
        off = len(ctx)
        j = rs.index(_REPAIR)
        while True:
            fixed = _correct(tok, tids[j], seq[max(0, off + j - MAX_CONTEXT):off + j])
            rs[j] = (fixed, list(fixed.encode("utf-8", errors="replace")))
            try:
                j = rs.index(_REPAIR, j + 1)
            except ValueError:  # no position left to repair
                break
    if not all(map(_not_below_floor, lps)):  # below the floor, -inf or NaN: the floor
        lo = MIN_LOGPROB
        lps = [lp if lp >= lo else lo for lp in lps]
    return list(map(_Tok, map(_first, rs), lps, map(_second, rs)))


class _Cand:
    """A candidate of ``_ordered_candidates`` with the entry attributes the fast path reads."""

    __slots__ = ("token_id", "logprob")

    def __init__(self, token_id, logprob):
        self.token_id, self.logprob = token_id, logprob


def _chat_logprobs_slow(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                        context_token_ids: list[int] | None, as_token_ids: bool) -> list[ChatLogprobToken]:
    """``chat_logprobs`` one candidate at a time (``--return-tokens-as-token-ids``)."""
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    out: list[ChatLogprobToken] = []
    for e in entries:
        texts: dict[int | None, str] = {}

        def text_of(tid, _ctx=ctx, _texts=texts):
            s = _texts.get(tid)
            if s is None:
                s = token_id_string(tid) if as_token_ids else decode_logprob_token(tok, tid, _ctx)
                _texts[tid] = s
            return s

        cands = _ordered_candidates(e)
        tops = []
        for tid, lp in cands[:k]:
            s = text_of(tid)
            tops.append(ChatLogprobTop(token=s, logprob=_clamp(lp), bytes=_utf8(s)))
        s = text_of(e.token_id)
        out.append(ChatLogprobToken(token=s, logprob=_clamp(e.logprob), bytes=_utf8(s), top_logprobs=tops))
        ctx = next_context(ctx, [e.token_id])
    return out


def completion_logprobs(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                        text_offset_start: int = 0, context_token_ids: list[int] | None = None,
                        as_token_ids: bool = False) -> CompletionLogprobs:
    """Completion ``logprobs`` for ``entries``; ``top_logprobs`` is the request's int ``logprobs``
    (k: each dict holds up to k+1 entries). ``text_offset_start``: chars of completion text
    before ``entries[0]`` (0 for a whole non-stream choice; the streamed text length so far).
    ``as_token_ids``: token strings (and dict keys) are ``token_id:<id>`` and ``text_offset``
    advances by their length, as vLLM's ``--return-tokens-as-token-ids`` does."""
    if as_token_ids:
        def text(tid, ctx):
            return token_id_string(tid)
    else:
        rows = logprob_rows(tok)

        def text(tid, ctx):
            r = rows[tid]
            if r is None:
                r = _fill(tok, rows, tid)
            return r[0] if r is not _REPAIR else _correct(tok, tid, ctx)

    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    res = CompletionLogprobs()
    offset = text_offset_start
    last_len = 0
    first = True
    lo = MIN_LOGPROB
    for e in entries:
        tid0 = e.token_id
        tok_str = text(tid0, ctx)
        sel = _fast_order(e) if k else [e]
        if sel is None:
            sel = [_Cand(t, lp) for t, lp in _ordered_candidates(e)]
        d: dict[str, float] = {}
        for c in sel[:k + 1]:
            tid, lp = c.token_id, c.logprob
            s = tok_str if tid == tid0 else text(tid, ctx)
            d[s] = lp if lp >= lo else lo
        res.tokens.append(tok_str)
        res.token_logprobs.append(_clamp(e.logprob))
        res.top_logprobs.append(d)
        offset = offset if first else offset + last_len
        first = False
        res.text_offset.append(offset)
        last_len = len(tok_str)
        ctx = next_context(ctx, [e.token_id])
    return res


def completion_text_offset_after(res: CompletionLogprobs, text_offset_start: int = 0) -> int:
    """Offset the next streamed chunk would start from if it continued these tokens' offsets
    (vLLM instead restarts each chunk from the streamed text length: pass that)."""
    if not res.text_offset:
        return text_offset_start
    return res.text_offset[-1] + len(res.tokens[-1])
