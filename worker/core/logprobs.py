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

Cost (issue 13 item 3): the candidates are flattened once per record (:func:`candidates`; the
non-streaming validation needs no flattening: its decode bounds the logprob ids), the shown lists are selected by C-level passes over all of them (Python
only at irregular positions: duplicate ids, ranks out of order), token strings / bytes / JSON
fragments come from a lazily filled per-tokenizer table (a record's new ids filled together,
``_fill_many``), U+FFFD repair runs only at pieces that need it (cached per (id, context);
pieces no context can complete are ``""`` from the table) and :func:`chat_logprobs_json` joins one pre-encoded fragment per shown object (a ``bytes %``
format) filled with the logprobs encoded in one call; ``worker.core.logprob_completion.completion_logprobs_json`` the same
with one key fragment (``"<token>":%b,``) per dict entry, the whole block one format (issue 25
item 1).

Streaming: keep the last 4 sampled ids (:func:`next_context`) and the running completion text
offset between chunks (``DerenderStreamState.logprob_context_token_ids`` /
``logprob_text_offset``).
"""
from __future__ import annotations

import operator
import threading
import weakref
from itertools import accumulate, compress, islice, repeat
from operator import itemgetter

import msgspec

from schemas import ChatLogprobToken, ChatLogprobTop, CompletionLogprobs, TokenLogprobIn

from .logprob_candidates import (  # noqa: F401 - re-exported: the logprob block's inputs
    MIN_LOGPROB,
    Candidates,
    _clamp,
    _Columns,
    _Elements,
    _elements,
    _fast_order,
    _get_id,
    _get_lp,
    _get_rank,
    _get_tops,
    _ordered_candidates,
    _position,
    _rank_pattern,
    _regular,
    _selected,
    _Slices,
    candidates,
)
from .tokenizers import Tokenizer

__all__ = ["chat_logprobs", "chat_logprobs_json", "candidates", "Candidates", "completion_logprobs",
           "decode_logprob_token", "next_context", "token_id_string",
           "MAX_CONTEXT", "MIN_LOGPROB", "SMALL"]

MAX_CONTEXT = 4
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


#: ``logprob_rows`` value of an id whose text alone ends in U+FFFD and whose repair depends on
#: the context (repaired per position)
_REPAIR = ()
#: ``logprob_rows`` value of an id whose text alone ends in U+FFFD on a byte-level tokenizer and
#: whose bytes end in an incomplete or invalid UTF-8 sequence that starts inside the token: no
#: preceding bytes can complete it (UTF-8 is self-synchronising: a byte outside 0x80-0xBF always
#: starts a new sequence), so vLLM's repair gives ``""`` whenever it runs on piece bytes
#: (``_correct_bytes``: no added token in the context); otherwise repaired per position
_REPAIR_EMPTY = (None,)
#: ``frag`` table value of an id not filled yet or repaired per position
_FIX = b"\x00"
_TABLE_LOCK = threading.Lock()
#: most (id, context) U+FFFD repairs a tokenizer keeps (cleared when full)
_REPAIRS_MAX = 65536
_json = msgspec.json.Encoder()


class _Table:
    """A tokenizer's lazily filled logprob table (``logprob_rows``): per token id, ``rows[id]``
    = ``(token string, UTF-8 bytes as a list of ints)`` (or ``_REPAIR`` / ``_REPAIR_EMPTY``),
    and the same entry as one pre-encoded JSON fragment of a chat logprob object with a
    ``%b`` slot for its logprob, ``frag[id]`` = ``{"token":<string>,"logprob":%b,"bytes":[...]},``
    (``%`` of the string doubled: a ``bytes %`` format; ``_FIX`` until filled, and for ids
    repaired per position, except ``_REPAIR_EMPTY`` ids: the ``""`` object's fragment, their
    repair after any context without added tokens); ``repairs``: (id, context ids) -> repaired row ``(string, bytes,
    frag, key)`` (``key``: the completion fragment, ``keys`` below). One fragment per id (not a head and a tail) halves the random table reads per
    shown object, which dominate the block's cost on a large vocabulary. Filling a slot is
    idempotent, so concurrent fills are harmless; rows are shared by every reply: never
    mutate one."""

    __slots__ = ("rows", "frag", "repairs", "keys", "holders")

    def __init__(self, vocab_size: int):
        self.rows: list = [None] * vocab_size
        self.frag: list = [_FIX] * vocab_size
        self.repairs: dict = {}
        #: completion (``completion_logprobs_json``): per id the pre-encoded key fragment of its
        #: ``top_logprobs`` dict entry, ``"<string>":%b,`` (``_key``); ``_FIX`` until filled
        #: (``_fill_keys``), and for ids repaired per position and ids whose string another id
        #: already has (``holders``); ``_EMPTY_KEY`` for ``_REPAIR_EMPTY`` ids
        self.keys: list = [_FIX] * vocab_size
        #: token string -> the first id given a key fragment for it (``""``: no id, -1): a later
        #: id with the same string keeps ``_FIX`` in ``keys``, so a dict holding both is checked
        self.holders: dict = {"": -1}


def _table(tok: Tokenizer) -> _Table:
    t = tok.logprob_rows
    if t is None:
        with _TABLE_LOCK:
            t = tok.logprob_rows
            if t is None:
                t = tok.logprob_rows = _Table(tok.vocab_size)
    return t


def logprob_rows(tok: Tokenizer) -> list:
    """The tokenizer's lazily filled id -> ``(token string, UTF-8 bytes as a list of ints)`` table
    shared by every sampled token and candidate (one list of ``vocab_size`` slots, ``None`` until
    the id is first seen; ``()`` (``_REPAIR``) or ``(None,)`` (``_REPAIR_EMPTY``) for an id whose
    text alone ends in U+FFFD, which is repaired per position). The bytes list is shared by every
    reply that shows that token: never mutate it."""
    return _table(tok).rows


def _row(s: str) -> tuple:
    """``(s, its UTF-8 bytes as a list, its JSON fragment)`` (see ``_Table``)."""
    b = list(s.encode("utf-8", errors="replace"))
    return s, b, b'{"token":' + _json.encode(s).replace(b"%", b"%%") + b',"logprob":%b,"bytes":' \
        + _json.encode(b) + b"},"


#: the repaired row of ``""``: ``_row("")`` and its completion key fragment (``_EMPTY_KEY``)
_EMPTY_ROW = (*_row(""), b'"":%b,')


def _unrepairable(tail: bytes) -> bool:
    """``tail`` (a token's bytes) ends in an incomplete or invalid UTF-8 sequence that starts at
    a byte inside it: no bytes before it can complete it (``_REPAIR_EMPTY``)."""
    j = len(tail) - 1
    while j >= 0 and 0x80 <= tail[j] <= 0xBF:
        j -= 1
    return j >= 0 and tail[j:].decode("utf-8", errors="replace").endswith(_FFFD)


def _fill(tok: Tokenizer, table: _Table, tid: int):
    """Fill ``tid``'s slots of ``table`` (a valid id); returns its row."""
    s = tok.decode_single(tid)
    if s.endswith(_FFFD):
        row = _REPAIR_EMPTY if tok.is_byte_level and tid not in tok.added_token_ids \
            and _unrepairable(tok.token_bytes(tid)) else _REPAIR
        table.rows[tid] = row
        if row is _REPAIR_EMPTY:
            table.frag[tid] = _EMPTY_ROW[2]
        return row
    full = _row(s)
    # row, then fragment: a reader that sees the fragment filled (readers look fragments up
    # first) finds the row filled too
    row = table.rows[tid] = full[:2]
    table.frag[tid] = full[2]
    return row


_FRAG_HEAD = b'{"token":'
_FRAG_MID = b',"logprob":%b,"bytes":'
_FRAG_TAIL = b"},"
_PCT = b"%"
_PCT2 = b"%%"


def _fill_many(tok: Tokenizer, table: _Table, tids) -> None:
    """``_fill`` of every id of ``tids`` (valid ids) whose row is still empty, in bulk: one
    ``Tokenizer.decode_singles`` call and C-level ``map``s build the rows and fragments (the
    same values as ``_row``); Python only per id whose text ends in U+FFFD (``_fill``)."""
    rows = table.rows
    new = [t for t in set(tids) if rows[t] is None]
    if not new:
        return
    texts = tok.decode_singles(new)
    fffd = list(map(str.endswith, texts, repeat(_FFFD)))
    if True in fffd:
        for t in compress(new, fffd):
            _fill(tok, table, t)
        keep = list(map(operator.not_, fffd))
        new, texts = list(compress(new, keep)), list(compress(texts, keep))
    bys = list(map(list, map(str.encode, texts, repeat("utf-8"), repeat("replace"))))
    enc = _json.encode
    frags = list(map(b"".join, zip(repeat(_FRAG_HEAD), map(bytes.replace, map(enc, texts), repeat(_PCT), repeat(_PCT2)),
                                   repeat(_FRAG_MID), map(enc, bys), repeat(_FRAG_TAIL))))
    # rows, then fragments (as ``_fill``: a reader that sees a fragment finds its row)
    list(map(rows.__setitem__, new, zip(texts, bys)))
    list(map(table.frag.__setitem__, new, frags))


def _repaired(tok: Tokenizer, table: _Table, tid: int, row, ctx: list[int]) -> tuple:
    """The repaired row ``(string, bytes, fragment, completion key fragment)`` of ``tid`` (its table row ``row`` is
    ``_REPAIR`` / ``_REPAIR_EMPTY``) after the sampled ids ``ctx`` (up to 4), cached per
    (id, context)."""
    if row is _REPAIR_EMPTY and tok.added_token_ids.keys().isdisjoint(ctx):
        return _EMPTY_ROW
    key = (tid, *ctx)
    r = table.repairs.get(key)
    if r is None:
        s = _correct(tok, tid, ctx)
        r = (*_row(s), _key(s))
        if len(table.repairs) >= _REPAIRS_MAX:
            table.repairs.clear()
        table.repairs[key] = r
    return r


def next_context(context_token_ids: list[int] | None, sampled_ids: list[int]) -> list[int]:
    """The logprob context after ``sampled_ids``: the last 4 sampled ids (bounded state)."""
    return (list(context_token_ids or []) + [i for i in sampled_ids if i is not None])[-MAX_CONTEXT:]


def _utf8(s: str) -> list[int]:
    return list(s.encode("utf-8", errors="replace"))


def token_id_string(token_id: int | None) -> str:
    """vLLM's ``--return-tokens-as-token-ids`` token string: ``token_id:<id>``."""
    return f"token_id:{token_id}"


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


_first = itemgetter(0)
_second = itemgetter(1)
_CUT1 = slice(None, -1)
_CUT2 = slice(None, -2)


def _positions_of(items: list, value):
    """The positions ``j`` with ``items[j] == value``, in order (C-level ``list.index`` per hit)."""
    j = -1
    index = items.index
    while True:
        try:
            j = index(value, j + 1)
        except ValueError:
            return
        yield j


def _irregular(tok: Tokenizer, table: _Table, el: _Elements, frags: list, ctx: list[int]):
    """Objects whose id is not in the table yet or needs U+FFFD repair (``frags[j]`` is
    ``_FIX``; the new ids are filled first, together: ``_fill_many``): yields ``(j, row)``
    with the row of a filled id (2 fields) or the repaired row of that position (3 fields; the
    context is the up to 4 sampled ids before it)."""
    rows = table.rows
    js = list(_positions_of(frags, _FIX))
    if not js:
        return
    tids = list(map(el.ids.__getitem__, js))
    if None in map(rows.__getitem__, tids):
        _fill_many(tok, table, tids)
    seq = None
    for j, tid in zip(js, tids):
        r = rows[tid]
        if len(r) < 2:
            if seq is None:
                seq = ctx + el.tids
            p = _position(el, j) + len(ctx)
            r = _repaired(tok, table, tid, r, seq[max(0, p - MAX_CONTEXT):p])
        yield j, r


def _after_added(tok: Tokenizer, table: _Table, el: _Elements, frags: list, seq: list[int], c: int) -> None:
    """Mark (``frags[j] = _FIX``) the ``_REPAIR_EMPTY`` objects of the positions whose context
    (the up to 4 sampled ids before them in ``seq`` = ``c`` context ids + ``el.tids``) holds an
    added token: there the table's ``""`` fragment is not vLLM's rule, so ``_irregular``
    repairs them per position. Python per added-token occurrence and per object of the (up to
    4) positions after it."""
    added = tok.added_token_ids
    n = len(el.tids)
    hit = set()
    for a in added.keys() & set(seq):
        q = -1
        while True:
            try:
                q = seq.index(a, q + 1)
            except ValueError:
                break
            hit.update(range(max(0, q - c + 1), min(n, q - c + MAX_CONTEXT + 1)))
    rows, ids, starts = table.rows, el.ids, el.starts
    for p in hit:
        a, b = (starts[p], starts[p + 1]) if starts is not None else (p, p + 1)
        if _REPAIR_EMPTY in map(rows.__getitem__, ids[a:b]):  # (C-level; then the objects one by one)
            for j in range(a, b):
                if rows[ids[j]] is _REPAIR_EMPTY:
                    frags[j] = _FIX


def chat_logprobs(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                  context_token_ids: list[int] | None = None, as_token_ids: bool = False) -> list:
    """Chat ``logprobs.content`` for ``entries`` (one per output token; ids already checked to
    be in the vocabulary): Structs encoding exactly as ``ChatLogprobToken`` /
    ``ChatLogprobTop``. ``context_token_ids``: the sampled output ids before ``entries[0]``
    (last 4 are used; ``[]`` at the start). ``as_token_ids``: token strings are ``token_id:<id>``
    (vLLM's ``--return-tokens-as-token-ids``; ``bytes`` are then that string's bytes, as vLLM
    gives). Token strings and bytes come from :func:`logprob_rows` (lookup cost), U+FFFD pieces
    repaired per position; per candidate only C-level work (``map``, list ops).
    :func:`chat_logprobs_json` gives the same block as JSON bytes, faster."""
    if as_token_ids:
        return _chat_logprobs_slow(tok, entries, top_logprobs, context_token_ids, as_token_ids)
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    if len(entries) <= SMALL:
        return _chat_small(tok, entries, k, ctx)
    el = _elements(entries, k)
    rows = _element_rows(tok, el, ctx)
    toks = list(map(_first, rows))
    bys = list(map(_second, rows))
    if not k:
        return list(map(_Tok, toks, el.lps, bys))
    tops = list(map(_Top, toks, el.lps, bys))
    hs = el.starts[:-1]
    return list(map(_Tok, map(toks.__getitem__, hs), map(el.lps.__getitem__, hs), map(bys.__getitem__, hs),
                    map(tops.__getitem__, map(slice, map(operator.add, hs, repeat(1)), el.starts[1:]))))


def _element_rows(tok: Tokenizer, el: _Elements, ctx: list[int]) -> list:
    """The table rows (``(token string, UTF-8 bytes)``) of every shown id of ``el``, in order:
    looked up C-level, filled and U+FFFD-repaired (``ctx``: the sampled ids before ``el``'s first
    position) only where ``_irregular`` names a position."""
    table = _table(tok)
    frags = list(map(table.frag.__getitem__, el.ids))  # (first: a filled fragment means a filled row)
    rows = list(map(table.rows.__getitem__, el.ids))
    j = -1
    try:  # ``_REPAIR_EMPTY`` rows (their fragment is the "" object's): repaired per position here
        while True:
            j = rows.index(_REPAIR_EMPTY, j + 1)
            frags[j] = _FIX
    except ValueError:
        pass
    for j, r in _irregular(tok, table, el, frags, ctx):
        rows[j] = r
    return rows


#: at most this many entries (a stream chunk's few tokens) take the per-entry paths
#: (``_chat_small``, ``_completion_per_entry``): below it the record-wide passes cost more than
#: they save
SMALL = 8


def _small_rows(tok: Tokenizer, table: _Table, ids: list[int], ctx: list[int], memo: dict) -> list:
    """Rows of ``ids`` (one position's shown ids, context ``ctx``), filled / repaired as needed
    (``memo``: the position's repairs, id -> row)."""
    rows = table.rows
    rs = list(map(rows.__getitem__, ids))
    if None in rs or _REPAIR in rs or _REPAIR_EMPTY in rs:
        for j, r in enumerate(rs):
            t = ids[j]
            if r is None:
                r = _fill(tok, table, t)
            if len(r) < 2:
                fixed = memo.get(t)
                if fixed is None:
                    fixed = memo[t] = _repaired(tok, table, t, r, ctx)
                r = fixed
            rs[j] = r
    return rs


def _chat_small(tok: Tokenizer, entries: list[TokenLogprobIn], k: int, ctx: list[int]) -> list:
    """``chat_logprobs`` one entry at a time (a few entries: a stream chunk)."""
    table = _table(tok)
    lo = MIN_LOGPROB
    out = []
    for e in entries:
        tid = e.token_id
        ids, lps = _selected(e, k) if k else ([tid], [e.logprob])
        rs = _small_rows(tok, table, ids, ctx, {})
        lps = [lp if lp >= lo else lo for lp in lps]  # below the floor, -inf or NaN: the floor
        toks = list(map(_first, rs))
        bys = list(map(_second, rs))
        out.append(_Tok(toks[0], lps[0], bys[0], list(map(_Top, toks, lps, bys)) if k else []))
        ctx = ctx[1:] + [tid] if len(ctx) >= MAX_CONTEXT else ctx + [tid]
    return out


_TOPS_EMPTY = b',"top_logprobs":[]},'
_TOPS_OPEN = b',"top_logprobs":['
_TOPS_CLOSE = b"]},"


def chat_logprobs_json(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                       context_token_ids: list[int] | None = None, as_token_ids: bool = False) -> msgspec.Raw:
    """:func:`chat_logprobs` encoded: the JSON array ``[{"token", "logprob", "bytes",
    "top_logprobs"}, ...]`` as ``msgspec.Raw`` (the same bytes ``msgspec.json`` gives the
    Structs), built from one pre-encoded fragment per shown object (``_Table.frag``: the
    object with a ``%b`` slot for its logprob), joined into one ``bytes %`` format, filled with
    the logprobs encoded together in one call: no per-candidate object and no per-candidate
    Python."""
    if as_token_ids:
        return msgspec.Raw(_json.encode(_chat_logprobs_slow(tok, entries, top_logprobs, context_token_ids,
                                                            as_token_ids)))
    if len(entries) <= SMALL:
        return msgspec.Raw(_json.encode(chat_logprobs(tok, entries, top_logprobs, context_token_ids)))
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    el = _elements(entries, k)
    table = _table(tok)
    frags = list(map(table.frag.__getitem__, el.ids))
    seq = ctx + el.tids
    if not tok.added_token_ids.keys().isdisjoint(seq):
        _after_added(tok, table, el, frags, seq, len(ctx))
    for j, r in _irregular(tok, table, el, frags, ctx):
        if len(r) == 2:  # a new id: its fragment is in the table (unless another thread is
            f = table.frag[el.ids[j]]  # filling it right now: then from its row)
            frags[j] = f if f is not _FIX else _row(r[0])[2]
        else:
            frags[j] = r[2]
    return msgspec.Raw(_joined(frags, el, k, _TOPS_EMPTY, _TOPS_OPEN, _TOPS_CLOSE))


def _joined(frags: list, el: _Elements, k: int, empty: bytes, opened: bytes, closed: bytes) -> bytes:
    """The JSON array (bytes) of the shown objects of ``el``: ``frags`` holds one fragment per
    object, each a whole object ending ``},`` with a ``%b`` slot for its logprob (changed in
    place). With ``k`` 0 every object is a position whose ``}`` becomes ``empty``; else a
    position's first object opens its candidates with ``opened`` and its last closes them with
    ``closed``. The slots are filled from one encode of ``el.lps``. Chat's and Responses'
    blocks (their own closers)."""
    if not k:
        frags = list(map(operator.add, map(operator.getitem, frags, repeat(_CUT2)), repeat(empty)))
    else:
        hs = el.starts[:-1]
        ls = list(map(operator.sub, el.starts[1:], repeat(1)))
        heads = list(map(operator.add, map(operator.getitem, map(frags.__getitem__, hs), repeat(_CUT2)),
                         repeat(opened)))
        tails = list(map(operator.add, map(operator.getitem, map(frags.__getitem__, ls), repeat(_CUT1)),
                         repeat(closed)))
        list(map(frags.__setitem__, hs, heads))
        list(map(frags.__setitem__, ls, tails))
    frags[0] = b"[" + frags[0]
    frags[-1] = frags[-1][:-1] + b"]"
    return b"".join(frags) % tuple(_json.encode(el.lps)[1:-1].split(b","))


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
    advances by their length, as vLLM's ``--return-tokens-as-token-ids`` does. Token strings
    come from the table (``logprob_rows``), the dicts from C-level ``map``s over all
    candidates (``_elements``: Python only per irregular candidate list)."""
    if as_token_ids:
        return _completion_per_entry(tok, entries, top_logprobs, text_offset_start, context_token_ids, True)
    if len(entries) <= SMALL:
        return _completion_per_entry(tok, entries, top_logprobs, text_offset_start, context_token_ids, False)
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    el = _elements(entries, k + 1)  # per position [sampled, *the dict's k + 1 entries]
    rows = _element_rows(tok, el, ctx)
    strs = list(map(_first, rows))
    hs = el.starts[:-1]
    tokens = list(map(strs.__getitem__, hs))
    dict_slices = list(map(slice, map(operator.add, hs, repeat(1)), el.starts[1:]))
    tops = list(map(dict, map(zip, map(strs.__getitem__, dict_slices), map(el.lps.__getitem__, dict_slices))))
    return CompletionLogprobs(
        text_offset=list(accumulate(map(len, islice(tokens, len(tokens) - 1)), initial=text_offset_start)),
        token_logprobs=list(map(el.lps.__getitem__, hs)), tokens=tokens, top_logprobs=tops)


_KEY_TAIL = b":%b,"
#: the ``""`` key fragment (``_Table.keys`` of a ``_REPAIR_EMPTY`` id)
_EMPTY_KEY = _EMPTY_ROW[3]


def _key(s: str) -> bytes:
    """The completion ``top_logprobs`` key fragment of token string ``s``: ``"<s>":%b,`` (``%``
    of the encoded string doubled: a ``bytes %`` format with one slot for the logprob)."""
    return _json.encode(s).replace(_PCT, _PCT2) + _KEY_TAIL


def _completion_per_entry(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                          text_offset_start: int, context_token_ids: list[int] | None,
                          as_token_ids: bool) -> CompletionLogprobs:
    """``completion_logprobs`` one candidate at a time: ``token_id:<id>`` strings
    (``as_token_ids``, vLLM's ``--return-tokens-as-token-ids``), or the table's (a few entries:
    a stream chunk)."""
    if as_token_ids:
        def text(tid, ctx):
            return token_id_string(tid)
    else:
        table = _table(tok)
        rows = table.rows

        def text(tid, ctx):
            r = rows[tid]
            if r is None:
                r = _fill(tok, table, tid)
            return r[0] if len(r) > 1 else _repaired(tok, table, tid, r, ctx)[0]

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


# ------------------------------------------------------------- Responses (final form) ---
class _RTop(msgspec.Struct, gc=False):
    """Positional twin of ``schemas.responses.ResponseLogprobTop`` (same fields in the same
    order, same JSON)."""

    token: str
    bytes: list[int]
    logprob: float


class _RTok(msgspec.Struct, gc=False):
    """Positional twin of ``schemas.responses.ResponseLogprob`` (see ``_RTop``)."""

    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list = msgspec.field(default_factory=list)


#: per tokenizer: its Responses logprob fragments by token id, the twin of ``_Table.frag``
#: (``{"token":<string>,"bytes":[...],"logprob":%b},``, built from the table's row when an id
#: is first shown; ``_FIX`` until then and for ids repaired per position); a weak key: the
#: table goes with its tokenizer
_RESP_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RFRAG_MID = b',"bytes":'
_RFRAG_TAIL = b',"logprob":%b},'
_RTOPS_EMPTY = b',"top_logprobs":[]},'
_RTOPS_OPEN = b',"top_logprobs":['
_RTOPS_CLOSE = b"]},"
#: at most this many entries take ``responses_logprobs_json``'s per-entry path (from 3 on the
#: fragments cost less: a message part's few entries are a record's, not a stream chunk's)
_RESP_SMALL = 2


def _rfrag(row) -> bytes:
    """The Responses fragment of a table row ``(string, bytes, ...)``."""
    return _FRAG_HEAD + _json.encode(row[0]).replace(_PCT, _PCT2) + _RFRAG_MID + _json.encode(row[1]) + _RFRAG_TAIL


_REMPTY = _rfrag(_EMPTY_ROW)


def _resp_table(tok: Tokenizer) -> list:
    t = _RESP_TABLES.get(tok)
    if t is None:
        with _TABLE_LOCK:
            t = _RESP_TABLES.get(tok)
            if t is None:
                t = _RESP_TABLES[tok] = [_FIX] * tok.vocab_size
    return t


def _resp_frags(tok: Tokenizer, el: _Elements, ctx: list[int]) -> list:
    """One Responses fragment per shown object of ``el`` (``ctx``: the sampled ids before its
    first position), as ``chat_logprobs_json`` finds chat's: looked up by id, C-level; new ids
    (their rows filled together) and U+FFFD pieces (repaired per position, ``_after_added``)
    one by one."""
    table = _table(tok)
    rtab = _resp_table(tok)
    frags = list(map(rtab.__getitem__, el.ids))
    seq = ctx + el.tids
    if not tok.added_token_ids.keys().isdisjoint(seq):
        _after_added(tok, table, el, frags, seq, len(ctx))
    rows = table.rows
    for j, r in _irregular(tok, table, el, frags, ctx):
        f = _rfrag(r)
        frags[j] = f
        tid = el.ids[j]
        if len(r) == 2:  # a filled row: the id's fragment from now on
            rtab[tid] = f
        elif rows[tid] is _REPAIR_EMPTY:  # "" after any context without added tokens (``_after_added``)
            rtab[tid] = _REMPTY
    return frags


def responses_logprobs(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                       context_token_ids: list[int] | None = None, as_token_ids: bool = False) -> list:
    """Responses final-form logprob entries (``schemas.responses.ResponseLogprob``: ``token``,
    ``bytes``, ``logprob``, ``top_logprobs``) of ``entries``: chat's values
    (:func:`chat_logprobs`, same arguments) in the Responses field order, as Structs that encode
    exactly as ``ResponseLogprob`` / ``ResponseLogprobTop``. Per-entry Python: for a few entries
    (a stream chunk); :func:`responses_logprobs_json` for a record."""
    return [_RTok(e.token, e.bytes or [], e.logprob, [_RTop(t.token, t.bytes or [], t.logprob) for t in e.top_logprobs])
            for e in chat_logprobs(tok, entries, top_logprobs, context_token_ids, as_token_ids)]


def responses_logprobs_json(tok: Tokenizer, entries: list[TokenLogprobIn], top_logprobs: int,
                            context_token_ids: list[int] | None = None, as_token_ids: bool = False) -> bytes:
    """:func:`responses_logprobs` encoded: the JSON array of the entries (the bytes
    ``msgspec.json`` gives the ``ResponseLogprob`` Structs), built as
    :func:`chat_logprobs_json` builds chat's: one pre-encoded fragment per shown object
    (``_resp_frags``: the tokenizer's Responses twin of ``_Table.frag``, filled and U+FFFD-
    repaired as chat's), joined into one ``bytes %`` format filled with the logprobs encoded in
    one call. No per-candidate object and no per-candidate Python."""
    if as_token_ids or len(entries) <= _RESP_SMALL:
        return _json.encode(responses_logprobs(tok, entries, top_logprobs, context_token_ids, as_token_ids))
    k = max(int(top_logprobs or 0), 0)
    ctx = list(context_token_ids or [])[-MAX_CONTEXT:]
    el = _elements(entries, k)
    return _joined(_resp_frags(tok, el, ctx), el, k, _RTOPS_EMPTY, _RTOPS_OPEN, _RTOPS_CLOSE)
