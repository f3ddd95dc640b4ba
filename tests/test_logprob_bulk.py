"""Issue 25 item 1: the logprob table's bulk fill (``_fill_many``, ``Tokenizer.decode_singles``)
and the one-pass regular-columns check (``_uniform_columns``) give what the per-id fill and
``_regular``'s general passes give, byte for byte, on the edge kinds: U+FFFD pieces, non-ASCII
and ``%`` in token text, duplicate ids, rank ties and out-of-order ranks, NaN / -inf logprobs,
an empty top list, and 0 shown of 20 candidates."""
from __future__ import annotations

import math
import random
from pathlib import Path

import msgspec
import pytest

from schemas import TokenLogprobIn, TopLogprobIn
from worker.core.logprob_candidates import _Columns, _regular, _uniform_columns, candidates
from worker.core.logprobs import (
    _chat_logprobs_slow,
    _fill,
    _fill_many,
    _Table,
    chat_logprobs,
    chat_logprobs_json,
)
from worker.core.tokenizer import load_tokenizer

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
_enc = msgspec.json.Encoder()


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-7b-v0.3"])
def test_bulk_fill_equals_the_per_id_fill(name):
    """Rows and fragments of ``_fill_many`` equal ``_fill``'s for a spread of ids (byte pieces
    ending in U+FFFD, CJK, ``%``, added tokens included), and ``decode_singles`` equals
    ``decode_single`` per id."""
    tok = load_tokenizer(str(TOKDIR / name))
    rng = random.Random(name)
    ids = sorted(set(rng.sample(range(tok.vocab_size), 3000)) | set(tok.added_token_ids)
                 | set(tok.encode("天气 😀 100% ñ \"q\" \\ <tag>")))
    assert tok.decode_singles(ids) == [tok.decode_single(i) for i in ids]
    one, bulk = _Table(tok.vocab_size), _Table(tok.vocab_size)
    for i in ids:
        _fill(tok, one, i)
    _fill_many(tok, bulk, ids + ids[:50])  # (repeated ids are filled once)
    assert bulk.rows == one.rows and bulk.frag == one.frag
    assert any(r is not None and len(r) < 2 for r in one.rows)  # U+FFFD pieces were among them
    assert any(r is not None and len(r) == 2 and "%" in r[0] for r in one.rows)


def _entry(t, lp, tops):
    return TokenLogprobIn(token_id=t, logprob=lp, rank=1,
                          top_logprobs=[TopLogprobIn(token_id=c, logprob=x, rank=r) for c, x, r in tops])


def _regular_shape(tok, rng, n, m):
    out = []
    for _ in range(n):
        t = rng.randrange(tok.vocab_size)
        rest = rng.sample([i for i in range(tok.vocab_size // 2) if i != t][:4000], m - 1)
        out.append(_entry(t, -0.5, [(t, -0.5, 1)] + [(c, -1.0 - j, j + 2) for j, c in enumerate(rest)]))
    return out


@pytest.mark.parametrize("kind", ["dup", "tie", "order", "nan", "ninf", "short", "empty", "sampled-late"])
@pytest.mark.parametrize("k", [0, 5, 20])
def test_uniform_columns_and_edge_kinds_equal_the_per_candidate_path(kind, k):
    """A regular record takes ``_uniform_columns``; one irregular position of each kind (but
    NaN / -inf logprobs, clamped later) sends the record to ``_regular``'s general passes;
    every block equals the per-candidate path."""
    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    rng = random.Random(f"{kind}-{k}")
    m = max(k, 5)
    entries = _regular_shape(tok, rng, 40, m)
    assert type(_uniform_columns(candidates(entries))) is _Columns
    e = entries[17]
    tops = [(c.token_id, c.logprob, c.rank) for c in e.top_logprobs]
    if kind == "dup":
        tops[3] = (tops[1][0], tops[3][1], tops[3][2])
    elif kind == "tie":
        tops[2] = (tops[2][0], tops[2][1], tops[1][2])
    elif kind == "order":
        tops[1], tops[3] = tops[3], tops[1]
    elif kind == "nan":
        tops[1] = (tops[1][0], math.nan, tops[1][2])
    elif kind == "ninf":
        tops[2] = (tops[2][0], -math.inf, tops[2][2])
    elif kind == "short":
        tops = tops[:2]
    elif kind == "empty":
        tops = []
    elif kind == "sampled-late":
        tops = tops[1:3] + [tops[0]] + tops[3:]
    entries[17] = _entry(e.token_id, e.logprob, tops)
    regular = kind in ("nan", "ninf")  # (logprobs are clamped later, the shape stays regular)
    assert (type(_uniform_columns(candidates(entries))) is _Columns) is regular
    if kind != "empty":
        _regular(candidates(entries), k)  # (the general passes decide; no exception)
    for ctx in ([], [100, 200, 300, 400]):
        want = _enc.encode(_chat_logprobs_slow(tok, entries, k, ctx, False))
        assert bytes(chat_logprobs_json(tok, entries, k, ctx)) == want
        assert _enc.encode(chat_logprobs(tok, entries, k, ctx)) == want
