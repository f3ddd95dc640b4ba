"""Logprobs at lookup cost (issue 13): the table-driven ``chat_logprobs`` gives exactly the bytes
of the one-candidate-at-a-time path for real tokenizers, over hostile engine candidate lists
(unsorted / missing ranks, duplicate ids, the sampled id among or outside the candidates,
byte-fallback pieces that need U+FFFD repair, logprobs below the floor, -inf and NaN)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from schemas import TokenLogprobIn, TopLogprobIn
from worker.core.logprobs import _chat_logprobs_slow, chat_logprobs, logprob_rows
from worker.core.tokenizer import load_tokenizer

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
_enc = msgspec.json.Encoder()


def _entries(tok, rng: random.Random, n: int, k: int) -> tuple[list[TokenLogprobIn], list[int]]:
    text = "mixed 天气预报 text 😀 with emoji 🌤️ and 東京 words, plain ascii too " * 4
    ids = tok.encode(text)[:n]
    vocab = tok.vocab_size
    out = []
    for t in ids:
        cands = [t] + [rng.randrange(vocab) for _ in range(k)]
        if rng.random() < 0.2:
            cands.append(cands[1] if len(cands) > 1 else t)  # a duplicate id
        if rng.random() < 0.3:
            cands.remove(t)  # sampled id not among the candidates
        shape = rng.random()
        lps = [rng.choice([-0.5, -3.25, -12000.0, float("-inf"), float("nan"), -1e-7]) for _ in cands]
        tops = []
        for j, (c, lp) in enumerate(zip(cands, lps)):
            rank = None if shape < 0.2 else (len(cands) - j if shape < 0.4 else j + 1)
            if 0.4 <= shape < 0.5 and j == 1:
                rank = None  # mixed ranks
            tops.append(TopLogprobIn(token_id=c, logprob=lp, rank=rank))
        out.append(TokenLogprobIn(token_id=t, logprob=rng.choice([-0.1, -20000.0, float("-inf")]),
                                  top_logprobs=tops))
    return out, ids


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-7b-v0.3"])
@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_table_path_equals_per_candidate_path(name, k):
    tok = load_tokenizer(str(TOKDIR / name))
    rng = random.Random(f"{name}-{k}")
    for ctx in ([], [5, 6, 7, 8, 9]):
        entries, _ = _entries(tok, rng, 120, k)
        fast = _enc.encode(chat_logprobs(tok, entries, k, ctx))
        slow = _enc.encode(_chat_logprobs_slow(tok, entries, k, ctx, False))
        assert fast == slow
    # repair happened somewhere (the test would prove nothing on ASCII alone)
    rows = logprob_rows(tok)
    if name == "qwen3":
        assert () in rows


def _completion_reference(tok, entries, k, ctx):
    """The per-candidate completion logprobs (the pre-table algorithm, from the module's
    primitives: ``decode_logprob_token`` per candidate, ``_ordered_candidates``)."""
    from worker.core.logprobs import _clamp, _ordered_candidates, decode_logprob_token, next_context

    tokens, lps, tops, offs = [], [], [], []
    off, last, first = 0, 0, True
    for e in entries:
        s0 = decode_logprob_token(tok, e.token_id, ctx)
        d = {}
        for tid, lp in _ordered_candidates(e)[:k + 1]:
            d[s0 if tid == e.token_id else decode_logprob_token(tok, tid, ctx)] = _clamp(lp)
        tokens.append(s0)
        lps.append(_clamp(e.logprob))
        tops.append(d)
        off = off if first else off + last
        first = False
        offs.append(off)
        last = len(s0)
        ctx = next_context(ctx, [e.token_id])
    return {"text_offset": offs, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


@pytest.mark.parametrize("k", [0, 5, 20])
def test_completion_table_path_equals_per_candidate_path(k):
    from worker.core.logprobs import completion_logprobs

    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    entries, _ = _entries(tok, random.Random(k), 120, k)
    got = msgspec.json.decode(_enc.encode(completion_logprobs(tok, entries, k)))
    want = msgspec.json.decode(_enc.encode(_completion_reference(tok, entries, k, [])))
    assert json.dumps(got, sort_keys=False) == json.dumps(want, sort_keys=False)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek-v4"])
def test_byte_repair_equals_tokenizer_decode_repair(name):
    """U+FFFD repair from piece bytes (byte-level tokenizers) equals the repair through the
    tokenizer's own decode calls, on contexts of real multi-byte text and random byte pieces."""
    from worker.core.logprobs import _correct, _correct_bytes, _correct_decoding

    tok = load_tokenizer(str(TOKDIR / name))
    assert tok.is_byte_level
    rng = random.Random(name)
    real = tok.encode("天气预报 😀 🌤️ 東京 Ωμέγα ñandú 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 " * 3)
    fffd = [i for i in range(min(tok.vocab_size, 200000)) if i not in tok.added_token_ids
            and tok.decode_single(i).endswith("\ufffd")]
    assert len(fffd) > 50
    checked = 0
    for _ in range(3000):
        if rng.random() < 0.5:
            j = rng.randrange(len(real))
            ctx, t = real[max(0, j - rng.randint(0, 4)):j], real[j]
        else:
            ctx = [rng.choice(fffd + real) for _ in range(rng.randint(0, 4))]
            t = rng.choice(fffd)
        if not tok.decode_single(t).endswith("\ufffd") or tok.added_token_ids.keys() & set(ctx):
            continue
        assert _correct_bytes(tok, t, ctx) == _correct_decoding(tok, t, ctx), (ctx, t)
        assert _correct(tok, t, ctx) == _correct_decoding(tok, t, ctx)
        checked += 1
    assert checked > 500


@pytest.mark.parametrize("ctx", [[], [5, 6, 7, 8, 9], [151667]])
def test_sampled_only_path_on_an_empty_table(ctx):
    """``top_logprobs`` 0 runs one pass per field over all entries: on a fresh tokenizer (empty
    table, ids repeated, U+FFFD pieces repaired per position from the ids before them, added
    tokens in the context) it gives exactly the per-candidate path's bytes."""
    from tokenizers import Tokenizer as HFTokenizer

    from worker.core.tokenizers import FastTokenizer
    raw = HFTokenizer.from_file(str(TOKDIR / "qwen3" / "tokenizer.json"))
    rng = random.Random(len(ctx))
    for _ in range(3):
        tok = FastTokenizer.from_fast(raw, path="<fresh qwen3>")  # a new, empty table each time
        entries, ids = _entries(tok, rng, 200, 0)
        assert any(tok.decode_single(i).endswith("\ufffd") for i in ids)
        assert len(set(ids)) < len(ids)
        want = _enc.encode(_chat_logprobs_slow(tok, entries, 0, ctx, False))
        assert _enc.encode(chat_logprobs(tok, entries, 0, ctx)) == want
        assert _enc.encode(chat_logprobs(tok, entries, 0, ctx)) == want  # filled table
