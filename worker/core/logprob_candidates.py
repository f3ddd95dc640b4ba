"""Engine logprob candidates, selected (issue 13 item 3; split out of ``worker.core.logprobs``,
which renders them): vLLM's order of a position's candidates (sampled token first, then by rank,
duplicate ids collapsed, ``_ordered_candidates`` / ``_selected``), and the record-wide C-level
flattening of an engine ``logprobs.content`` list (``Candidates``) into the shown objects of
every position (``_elements``: ``_regular`` decides which positions have the regular shape vLLM's
engines send, the rest are selected one by one). No tokenizer and no output format here: ids and
logprobs in, ids and logprobs out.
"""
from __future__ import annotations

import operator
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate, chain, compress, islice, repeat
from operator import attrgetter

import numpy as np

from schemas import TokenLogprobIn

#: vLLM's floor for a logprob (below it, -inf and NaN are clamped to it)
MIN_LOGPROB = -9999.0


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


_get_id = attrgetter("token_id")
_get_lp = attrgetter("logprob")
_get_rank = attrgetter("rank")
_get_tops = attrgetter("top_logprobs")


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


class _Elements:
    """The logprob objects of a chat ``logprobs.content`` block, flattened: ``ids`` / ``lps``
    (token id and logprob of each object, logprobs clamped to ``MIN_LOGPROB``), per position
    ``[sampled]`` when ``top_logprobs`` is 0, else ``[sampled, *top_logprobs]`` (the first
    ``top_logprobs`` entry is the sampled token itself); ``starts``: the ``n + 1`` offsets of
    the positions in ``ids`` (None when every position has one object); ``tids``: the sampled
    ids."""

    __slots__ = ("ids", "lps", "starts", "tids")

    def __init__(self, ids: list, lps: list, starts: list | None, tids: list):
        self.ids, self.lps, self.starts, self.tids = ids, lps, starts, tids


class Candidates:
    """An engine ``logprobs.content`` list (``entries``) flattened once, C-level: ``tids`` (the
    sampled ids), ``tops`` (each entry's ``top_logprobs`` list), ``counts`` (their lengths),
    ``flat`` (every candidate, position by position) and ``ids`` (their ``token_id``s, a
    tuple). Read by the validation (``derender.check_ids_and_logprobs``, unless the decode
    bounded the ids) and the logprob blocks (:func:`candidates`)."""

    __slots__ = ("entries", "tids", "tops", "counts", "flat", "ids")

    def __init__(self, entries: list[TokenLogprobIn]):
        self.entries = entries
        self.tids = list(map(_get_id, entries))
        self.tops = list(map(_get_tops, entries))
        self.counts = list(map(len, self.tops))
        self.flat = list(chain.from_iterable(self.tops))
        self.ids = tuple(map(_get_id, self.flat))


def candidates(entries: list[TokenLogprobIn]) -> Candidates:
    """``Candidates(entries)``: the stream validation and the logprob block each flatten the list
    they read (~70 / ~200 us for 256 entries of 5 / 20 candidates, C-level), so neither holds a
    record's candidates after it is done with them (the non-streaming validation reads none:
    ``derender.check_ids_and_logprobs(in_vocab=True)``)."""
    return Candidates(entries)


class _Slices:
    """``_regular``'s answer in general: position ``i`` shows the sampled id then candidates
    ``ids[first[i]:last[i]]`` (flat offsets into ``ids`` / ``lps``), except the positions in
    ``bad`` (irregular candidate lists: ``_selected`` decides them one by one)."""

    __slots__ = ("ids", "lps", "first", "last", "bad")

    def __init__(self, ids: tuple, lps: tuple, first: list[int], last: list[int], bad: list[int]):
        self.ids, self.lps, self.first, self.last, self.bad = ids, lps, first, last, bad


def _regular(c: Candidates, k: int):
    """Which positions of ``c`` (every one with candidates) are regular: distinct candidate ids,
    the sampled id either first or absent, ranks (after a first-place sampled id) in order or
    all missing. There the first ``k`` of [sampled, candidates by rank] (``_ordered_candidates``)
    is the sampled id followed by the next ``k - 1`` candidates in the engine's order. Returns
    ``_Columns`` when every position is regular with the same shape, else ``_Slices`` (None when
    ranks are partly missing: every position is then decided by ``_selected``). C-level passes
    over all candidates, Python only per irregular position (vLLM's engines send regular lists:
    the sampled token first, then the top candidates by rank)."""
    tids, counts, flat, cids = c.tids, c.counts, c.flat, c.ids
    cols = _uniform_columns(c)
    if cols is not None:
        return cols
    starts = list(accumulate(counts, initial=0))
    heads = starts[:-1]
    ends = starts[1:]
    first = list(map(operator.eq, tids, map(cids.__getitem__, heads)))  # sampled id first
    cands = map(cids.__getitem__, map(slice, heads, ends))
    if False not in first:  # distinct ids (the sampled id among them only first)
        distinct = list(map(operator.eq, map(len, map(set, cands)), counts))
    else:  # distinct ids, the sampled id nowhere but first: |{sampled} | candidates| = count + 1 - first
        uniq = map(len, map(set, map(operator.concat, zip(tids), cands)))
        distinct = list(map(operator.eq, uniq, map(operator.sub, map(operator.add, counts, repeat(1)), first)))
    ranks = list(map(_get_rank, flat))
    m = counts[0]
    uniform = counts.count(m) == len(counts)
    ordered = None  # per position, when not every one is in order
    if uniform and ranks == _rank_pattern(m) * len(counts):
        pass  # ranks 1..m at every position (in order: the common case)
    elif None in ranks:
        if ranks.count(None) != len(ranks):
            return None  # mixed: ranked candidates sort first (``_ordered_candidates``)
    elif len(ranks) > 1:
        ok = list(map(operator.le, ranks, islice(ranks, 1, None)))  # pair (j, j + 1) in order
        ok_set = ok.__setitem__
        list(map(ok_set, map(operator.sub, islice(ends, len(ends) - 1), repeat(1)), repeat(True)))  # across positions
        after_sampled = list(compress(heads, first))  # a first-place sampled id is shown first anyway
        if after_sampled and after_sampled[-1] >= len(ok):
            after_sampled.pop()
        list(map(ok_set, after_sampled, repeat(True)))
        if False in ok:
            pairs = map(ok.__getitem__, map(slice, heads, map(operator.sub, ends, repeat(1))))
            ordered = list(map(operator.not_, map(operator.contains, pairs, repeat(False))))
    clps = tuple(map(_get_lp, flat))
    if ordered is None and False not in distinct:
        if uniform and False not in first:  # the same shape at every position
            return _Columns(cids, clps, m, 1)
        if uniform and True not in first:
            return _Columns(cids, clps, m, 0)
        bad = []
    else:
        good = distinct if ordered is None else map(operator.and_, distinct, ordered)
        bad = list(compress(range(len(counts)), map(operator.not_, good)))
    rest = list(map(operator.add, heads, first))
    last = list(map(min, map(operator.add, rest, repeat(k - 1)), ends))
    return _Slices(cids, clps, rest, last, bad)


@lru_cache(maxsize=64)
def _uniform_shape(n: int, m: int) -> tuple[list[int], list[slice]]:
    """``(ranks 1..m repeated n times, the n slices of m)`` of ``n`` positions of ``m``
    candidates (shared: never mutate)."""
    return _rank_pattern(m) * n, list(map(slice, range(0, n * m, m), range(m, n * m + 1, m)))


def _uniform_columns(c: Candidates):
    """``_regular``'s ``_Columns`` answer for its commonest shape, from fewer C-level passes:
    ``m`` candidates at every position, ranks 1..m in order, the sampled id first everywhere,
    distinct ids within each position. None for any other shape (``_regular`` then decides)."""
    counts, cids = c.counts, c.ids
    m = counts[0]
    n = len(counts)
    if counts.count(m) != n or cids[0::m] != tuple(c.tids):
        return None
    ranks, slices = _uniform_shape(n, m)
    if list(map(_get_rank, c.flat)) != ranks or not _distinct_rows(cids, n, m, slices):
        return None
    return _Columns(cids, tuple(map(_get_lp, c.flat)), m, 1)


def _distinct_rows(ids: tuple, n: int, m: int, slices: list[slice]) -> bool:
    """Whether each of the ``n`` consecutive runs of ``m`` ids of ``ids`` holds distinct ids: the
    runs as the rows of a numpy array, sorted, no equal neighbours (~2.5x cheaper than a set per
    run at 5 to 20 candidates); a set per run (``slices``) when an id is not an int64 (None)."""
    try:
        a = np.fromiter(ids, dtype=np.int64, count=n * m).reshape(n, m)
    except (TypeError, OverflowError):  # None (or out of range): the set per run decides
        return list(map(len, map(set, map(ids.__getitem__, slices)))) == [m] * n
    a.sort(axis=1)
    return not (a[:, 1:] == a[:, :-1]).any()


class _Columns:
    """``_regular``'s answer when every position has ``m`` candidates and the sampled id is
    first at every position (``f`` 1) or at none (``f`` 0): candidate ``j`` of position ``i``
    is ``ids[i * m + j]`` (its logprob ``lps[i * m + j]``)."""

    __slots__ = ("ids", "lps", "m", "f")

    def __init__(self, ids: tuple, lps: tuple, m: int, f: int):
        self.ids, self.lps, self.m, self.f = ids, lps, m, f


@lru_cache(maxsize=64)
def _rank_pattern(m: int) -> list[int]:
    """``[1, ..., m]``: ranks in order (shared: never mutate)."""
    return list(range(1, m + 1))


def _elements(entries: list[TokenLogprobIn], k: int) -> _Elements:
    """The logprob objects of ``entries`` for ``top_logprobs`` ``k`` (``_Elements``): C-level
    over all candidates when they are regular (``_regular``), else per entry (``_selected``)."""
    tids = list(map(_get_id, entries))
    lps = list(map(_get_lp, entries))
    starts = None
    if k == 1:
        ids = list(chain.from_iterable(zip(tids, tids)))
        lps = list(chain.from_iterable(zip(lps, lps)))
        starts = list(range(0, len(ids) + 1, 2))
    elif k:  # (the candidates are read only here)
        c = candidates(entries)
        reg = _regular(c, k) if 0 not in c.counts else None
        if type(reg) is _Columns:  # one slice assignment per column of objects
            t = min(k - 1, reg.m - reg.f)
            w = t + 2
            ids = [None] * (len(tids) * w)
            ids[0::w] = ids[1::w] = tids
            out_lps = ids.copy()
            out_lps[0::w] = out_lps[1::w] = lps
            for j in range(t):
                ids[2 + j::w] = reg.ids[reg.f + j::reg.m]
                out_lps[2 + j::w] = reg.lps[reg.f + j::reg.m]
            lps = out_lps
            starts = list(range(0, len(ids) + 1, w))
        elif reg is not None:
            slices = list(map(slice, reg.first, reg.last))
            id_groups = list(map(operator.concat, zip(tids, tids), map(reg.ids.__getitem__, slices)))
            lp_groups = list(map(operator.concat, zip(lps, lps), map(reg.lps.__getitem__, slices)))
            for p in reg.bad:  # irregular positions, one by one
                e = entries[p]
                sids, slps = _selected(e, k)
                id_groups[p] = (e.token_id, *sids)
                lp_groups[p] = (e.logprob, *slps)
            ids = list(chain.from_iterable(id_groups))
            lps = list(chain.from_iterable(lp_groups))
            starts = list(accumulate(map(len, id_groups), initial=0))
        else:
            ids, out_lps, starts = [], [], [0]
            for e in entries:
                sids, slps = _selected(e, k)
                ids.append(e.token_id)
                ids += sids
                out_lps.append(e.logprob)
                out_lps += slps
                starts.append(len(ids))
            lps = out_lps
    else:
        ids = tids
    if lps:  # below the floor, -inf or NaN (min skips a NaN that is not first; the sum does not)
        total = sum(lps)
        if not (min(lps) >= MIN_LOGPROB and total == total):
            lo = MIN_LOGPROB
            lps = [lp if lp >= lo else lo for lp in lps]
    return _Elements(ids, lps, starts, tids)


def _position(el: _Elements, j: int) -> int:
    """The position (entry index) of object ``j``."""
    return j if el.starts is None else bisect_right(el.starts, j) - 1
