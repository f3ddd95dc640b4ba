"""The completion logprobs block as JSON (issue 25 item 1; split out of ``worker.core.logprobs``,
whose table, repair and candidate passes it uses): ``completion_logprobs_json`` gives the bytes
``msgspec.json`` gives ``logprobs.completion_logprobs``' ``CompletionLogprobs`` Struct, built as
``chat_logprobs_json`` builds chat's block: one pre-encoded key fragment per dict entry
(``_Table.keys``: ``"<token>":%b,``) joined into one ``bytes %`` format filled with the logprobs
encoded together.
"""
from __future__ import annotations

import operator
from bisect import bisect_right
from itertools import accumulate, compress, islice, repeat

import msgspec

from schemas import TokenLogprobIn

from .logprobs import (
    _CUT1,
    _EMPTY_KEY,
    _REPAIR,
    _REPAIR_EMPTY,
    MAX_CONTEXT,
    SMALL,
    _after_added,
    _Elements,
    _elements,
    _first,
    _irregular,
    _json,
    _key,
    _position,
    _positions_of,
    _Table,
    _table,
    completion_logprobs,
)
from .tokenizers import Tokenizer

__all__ = ["completion_logprobs_json"]

_OPEN = b"{"
_CLOSE = b"},"
#: ``completion_logprobs_json``'s format head: text_offset, token_logprobs and tokens as slots
_COMPLETION_HEAD = b'{"text_offset":%b,"token_logprobs":[%b],"tokens":%b,"top_logprobs":['


def _completion_keys(tok: Tokenizer, table: _Table, el: _Elements, ctx: list[int]) -> tuple[list, set, dict]:
    """``(keys, suspect, fixed)`` of ``el``'s objects for :func:`completion_logprobs_json`: the key
    fragment of every object (``_Table.keys``, C-level; filled, and repaired per position,
    only where ``_irregular`` names an object), the positions whose dict may hold one string
    twice (an object repaired per position, an id whose string an earlier id has, two ``""``
    keys) and the repaired strings by object index. Python per irregular object only."""
    keys = list(map(table.keys.__getitem__, el.ids))
    seq = ctx + el.tids
    if not tok.added_token_ids.keys().isdisjoint(seq):
        _after_added(tok, table, el, keys, seq, len(ctx))
    list(map(keys.__setitem__, el.starts[:-1], repeat(_OPEN)))  # a position's sampled object opens its
    # dict (no slot, never repaired here: the dict's first entry is the same id at the same position)
    suspect: set = set()
    fixed: dict = {}
    tkeys, holders, ids, rows = table.keys, table.holders, el.ids, table.rows
    for j, r in _irregular(tok, table, el, keys, ctx):
        tid = ids[j]
        if len(r) == 2:  # a filled id: its key, unless an earlier id holds its string
            k = _key(r[0])
            if holders.setdefault(r[0], tid) == tid:
                tkeys[tid] = k
            else:
                suspect.add(_position(el, j))
        else:  # repaired here
            k = r[3]
            fixed[j] = r[0]
            suspect.add(_position(el, j))
            if rows[tid] is _REPAIR_EMPTY:
                tkeys[tid] = _EMPTY_KEY
        keys[j] = k
    js = list(_positions_of(keys, _EMPTY_KEY))
    if len(js) > 1:  # positions with two "" keys (C-level)
        ps = list(map(bisect_right, repeat(el.starts, len(js)), js))  # position + 1 of each
        suspect.update(map(operator.sub, compress(islice(ps, 1, None), map(operator.eq, ps, islice(ps, 1, None))),
                           repeat(1)))  # (in order: a position's "" keys are adjacent in ``ps``)
    return keys, suspect, fixed


def completion_logprobs_json(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                             text_offset_start: int = 0, context_token_ids: list[int] | None = None,
                             as_token_ids: bool = False) -> msgspec.Raw:
    """:func:`completion_logprobs` encoded (``msgspec.Raw``: the bytes ``msgspec.json`` gives the
    ``CompletionLogprobs`` Struct), as :func:`chat_logprobs_json` builds chat's: each dict
    entry is a pre-encoded key fragment (``_Table.keys``, ``"<token>":%b,``) joined into one
    ``bytes %`` format filled with the logprobs encoded together; ``tokens`` and ``text_offset``
    from the sampled ids' table strings. A dict whose entries share a string (vLLM's dict keeps
    the first key with the last value) is rebuilt in Python, found without per-candidate
    Python: only positions with an irregular object (``_completion_keys``) can hold one."""
    if as_token_ids or len(entries) <= SMALL:
        return msgspec.Raw(_json.encode(completion_logprobs(tok, entries, top_logprobs, text_offset_start,
                                                            context_token_ids, as_token_ids)))
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    el = _elements(entries, k + 1)  # per position [sampled, *the dict's k + 1 entries]
    table = _table(tok)
    keys, suspect, fixed = _completion_keys(tok, table, el, ctx)  # (``keys[starts[p]]``: ``_OPEN``)
    n = len(el.tids)
    starts = el.starts
    hs = starts[:-1]
    # tokens: the sampled ids' strings (repaired ones from ``fixed``; an unrepaired
    # ``_REPAIR_EMPTY`` id is "")
    srows = list(map(table.rows.__getitem__, el.tids))
    for bad in (_REPAIR, _REPAIR_EMPTY):
        if bad in srows:
            for p in list(_positions_of(srows, bad)):
                srows[p] = (fixed.get(starts[p] + 1, ""),)
    tokens = list(map(_first, srows))
    parts = _json.encode(el.lps)[1:-1].split(b",")
    token_lps = b",".join(map(parts.__getitem__, hs))
    keep = None
    redo = []
    for p in suspect:  # a dict holding one string twice: the first key, the last value
        a, b = starts[p] + 1, starts[p + 1]
        fr = keys[a:b]
        if len(set(fr)) < b - a:
            d = dict(zip(fr, parts[a:b]))
            if keep is None:
                keep = [True] * len(parts)
            parts[a:a + len(d)] = d.values()
            keep[a + len(d):b] = repeat(False, b - a - len(d))
            redo.append((a - 1, b, _OPEN + b"".join(d.keys())[:-1] + _CLOSE))
    ls = list(map(operator.sub, starts[1:], repeat(1)))  # a position's last object closes its dict
    closed = list(map(operator.add, map(operator.getitem, map(keys.__getitem__, ls), repeat(_CUT1)),
                      repeat(_CLOSE)))
    list(map(keys.__setitem__, ls, closed))
    for a, b, frag in redo:
        keys[a:b] = [frag] + [b""] * (b - a - 1)
    w = starts[1]
    if keep is None and starts == list(range(0, starts[-1] + 1, w)):  # every position w objects
        del parts[0::w]
    else:
        if keep is None:
            keep = [True] * len(parts)
        list(map(keep.__setitem__, hs, repeat(False)))
        parts = list(compress(parts, keep))
    # one ``bytes %`` format for the whole block: its head's three slots, then the dicts'
    keys[0] = _COMPLETION_HEAD + keys[0]
    last = -1 if keys[-1] else starts[-2]  # (the last dict rebuilt above: its one fragment)
    keys[last] = keys[last][:-1] + b"]}"
    offsets = list(accumulate(map(len, islice(tokens, n - 1)), initial=text_offset_start))
    return msgspec.Raw(b"".join(keys) % (_json.encode(offsets), token_lps, _json.encode(tokens), *parts))
