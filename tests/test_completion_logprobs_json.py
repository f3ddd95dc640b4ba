"""Issue 25 item 1: the completion logprobs block built as JSON (``completion_logprobs_json``:
pre-encoded ``top_logprobs`` key fragments joined with the logprobs encoded together) gives exactly
the bytes ``msgspec.json`` gives ``completion_logprobs``' Struct, and the Struct path's dict rule
(entries sharing a string: the first key, the last value) where it matters: two byte pieces
that both show as ``""``, ids whose texts are equal (a mid-string U+FFFD), an id whose text is
``""``, pieces repaired after added tokens; on a fresh table (ids filled during the block) and a
warm one, with irregular candidate lists, ``%`` in token text and NaN / -inf logprobs."""
from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest
from test_logprob_table import _completion_reference, _entries, _shaped

from schemas import TokenLogprobIn, TopLogprobIn
from tests.harness.threads import race
from worker.core.logprob_completion import completion_logprobs_json
from worker.core.logprobs import completion_logprobs
from worker.core.tokenizer import load_tokenizer

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
_enc = msgspec.json.Encoder()


def _same(tok, entries, k, start=0, ctx=None):
    """The JSON block equals the encoded Struct block (and, parsed, the per-candidate reference)."""
    want = _enc.encode(completion_logprobs(tok, entries, k, start, ctx))
    got = bytes(completion_logprobs_json(tok, entries, k, start, ctx))
    assert got == want
    ref = _completion_reference(tok, entries, k, list(ctx or []))
    ref["text_offset"] = [x + start for x in ref["text_offset"]]
    assert msgspec.json.decode(got) == msgspec.json.decode(_enc.encode(ref))


def _colliding(tok) -> tuple[list[list[int]], list[int]]:
    """Groups of ids whose texts alone are equal (not ending in U+FFFD), and ids whose text is ""."""
    texts = tok.decode_singles(list(range(tok.vocab_size)))
    by: dict = defaultdict(list)
    for i, s in enumerate(texts):
        if not s.endswith("\ufffd"):
            by[s].append(i)
    return [v for s, v in by.items() if len(v) > 1 and s], by.get("", [])


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-7b-v0.3"])
@pytest.mark.parametrize("k", [0, 1, 2, 5, 20])
def test_json_block_equals_the_struct_block(name, k):
    """Hostile lists (``_entries``) and the regular / partly irregular shapes, whole records and
    stream-chunk sizes, with and without a context, on a fresh table then a warm one."""
    tok = load_tokenizer(str(TOKDIR / name))
    tok.logprob_rows = None  # a fresh table: ids are filled inside the blocks
    rng = random.Random(f"cjson-{name}-{k}")
    lists = [_entries(tok, rng, 120, k)[0]] + [_shaped(tok, rng, 120, k, s)
                                                 for s in ("first", "absent", "vllm", "some-bad")]
    for _ in range(2):  # fresh, then warm
        for ctx in ([], [5, 6, 7, 8, 9], [151667]):
            for entries in lists + [lst[i:i + n] for lst in lists for i, n in ((0, 1), (20, 8), (40, 9))]:
                _same(tok, entries, k, 7, ctx)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-7b-v0.3"])
@pytest.mark.parametrize("k", [2, 6])
def test_dicts_with_one_string_twice(name, k):
    """Dicts whose entries share a string collapse as vLLM's dict does: byte pieces no context
    completes (``""``, twice in a dict), ids of equal texts (found in the vocabulary), the ``""``
    text of an id, pieces after added tokens (repaired per position), in any order within the
    dict and with the colliding ids first seen inside the block or already in the table."""
    tok = load_tokenizer(str(TOKDIR / name))
    groups, empties = _colliding(tok)
    pieces = [i for i in range(2000, 40000) if tok.decode_single(i).endswith("\ufffd")][:60]
    text = tok.encode("mixed 天气预报 text 😀 and 東京 words 100% sure " * 3)
    added = sorted(tok.added_token_ids)[:3] or text[:1]
    sampled = []
    for p, t in enumerate(text):
        sampled += [added[p % len(added)], t] if p % 5 == 0 else [t]
    pool = pieces + [i for g in groups for i in g] + empties
    assert pool
    collapsed = 0
    for seed in range(3):
        tok.logprob_rows = None
        rng = random.Random(f"dup-{name}-{k}-{seed}")
        entries = []
        for t in sampled:
            alts = []
            while len(alts) < k + 2:
                a = rng.choice(pool) if rng.random() < 0.7 else rng.randrange(tok.vocab_size)
                if a != t and a not in alts:
                    alts.append(a)
            if groups and rng.random() < 0.3:  # a whole colliding group in one dict
                g = rng.choice(groups)
                alts = [a for a in g if a != t][:k] + alts
                alts = list(dict.fromkeys(alts))
            lps = [rng.choice([-0.5, -1.25, -20000.0, float("-inf"), float("nan")]) for _ in alts]
            entries.append(TokenLogprobIn(token_id=t, logprob=-0.5, rank=1, top_logprobs=[
                TopLogprobIn(token_id=t, logprob=-0.5, rank=1)] + [
                TopLogprobIn(token_id=a, logprob=lp, rank=j + 2) for j, (a, lp) in enumerate(zip(alts, lps))]))
        for ctx in ([], [added[0]], [5, 6, 7, 8]):
            _same(tok, entries, k, 0, ctx)
            _same(tok, entries, k, 3, ctx)  # warm
        tops = msgspec.json.decode(bytes(completion_logprobs_json(tok, entries, k)))["top_logprobs"]
        collapsed += sum(len(d) < k + 1 for d in tops)  # (every position shows k + 1 distinct ids)
    assert collapsed > 10


def test_empty_and_percent_tokens():
    """``%`` in token text (the ``bytes %`` format's escape), an empty record, and NaN / -inf
    sampled logprobs."""
    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    ids = tok.encode("100% of 50%% and %s %b %d " * 6)
    entries = [TokenLogprobIn(token_id=t, logprob=[-0.5, float("nan"), float("-inf")][p % 3], rank=1,
                              top_logprobs=[TopLogprobIn(token_id=t, logprob=-0.5, rank=1)] + [
                                  TopLogprobIn(token_id=ids[(p + j) % len(ids)], logprob=-1.0 - j, rank=j + 2)
                                  for j in range(1, 4)])
               for p, t in enumerate(ids)]
    for k in (0, 2, 5):
        _same(tok, entries, k, 0)
    assert bytes(completion_logprobs_json(tok, [], 5)) == _enc.encode(completion_logprobs(tok, [], 5))


def test_service_replies_are_unchanged():
    """Completion replies of the service (which encodes the JSON block) equal the encoded Struct
    reply of ``derender_completion`` without it, for the bench's bodies at 0, 5 and 20."""
    from worker.bench.floor import DEMO_TOKENIZER, build_bodies, make_service, path_body
    from worker.core.derender import derender_completion
    from worker.core.service import DerenderCompletionRequest

    svc = make_service(str(DEMO_TOKENIZER))
    rt = svc.runtime("qwen3")
    for k in (0, 5, 20):
        bodies, _ = build_bodies(rt.tokenizer, "qwen3", 96, 3, top_logprobs=k, seed=k)
        for b in bodies:
            body = path_body(b, "completion")
            req = msgspec.json.decode(body, type=DerenderCompletionRequest)
            assert svc.derender(body, "completion").body == _enc.encode(derender_completion(rt, req, None))


def test_distinct_rows_equals_a_set_per_run():
    """``_distinct_rows`` (numpy: sorted rows, no equal neighbours) answers what a set per run of
    ids answers, duplicates anywhere in a run, large ids and None ids (the set fallback)."""
    from worker.core.logprob_candidates import _distinct_rows

    rng = random.Random(11)
    for _ in range(400):
        n, m = rng.randint(1, 12), rng.randint(1, 21)
        ids = [rng.randrange(1 << rng.choice([3, 8, 17, 40])) for _ in range(n * m)]
        if rng.random() < 0.1:
            ids[rng.randrange(n * m)] = None
        slices = [slice(i * m, (i + 1) * m) for i in range(n)]
        want = all(len(set(ids[s])) == m for s in slices)
        assert _distinct_rows(tuple(ids), n, m, slices) is want


def test_concurrent_blocks_on_a_fresh_table_give_the_same_bytes():
    """Threads building completion blocks on one fresh table at once (switching every
    microsecond: key fragments and string holders filled concurrently, colliding ids among the
    candidates) all get the bytes of the encoded Struct block built on another table."""

    from tokenizers import Tokenizer as HFTokenizer

    from worker.core.tokenizers import FastTokenizer

    raw = HFTokenizer.from_file(str(TOKDIR / "qwen3" / "tokenizer.json"))
    tok = FastTokenizer.from_fast(raw, path="<fresh qwen3>")
    ref_tok = load_tokenizer(str(TOKDIR / "qwen3"))
    groups, _ = _colliding(ref_tok)
    lists = []
    for i in range(4):
        entries = _shaped(tok, random.Random(i), 120, 5, "first")
        for p in range(0, len(entries), 7):  # a colliding pair in some dicts
            e = entries[p]
            g = groups[p % len(groups)]
            if e.token_id not in g:
                tops = e.top_logprobs
                tops[1:3] = [TopLogprobIn(token_id=g[0], logprob=-2.0, rank=2),
                             TopLogprobIn(token_id=g[1], logprob=-3.0, rank=3)]
        lists.append(entries)
    want = [_enc.encode(completion_logprobs(ref_tok, e, 5)) for e in lists]
    got: dict[tuple[int, int], bytes] = {}

    def work(t: int) -> None:
        for i in range(len(lists)):
            j = (i + t) % len(lists)
            got[t, j] = bytes(completion_logprobs_json(tok, lists[j], 5))

    race(work)
    assert len(got) == 16
    for (_, j), a in got.items():
        assert a == want[j]
