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

from schemas import LogprobsIn, TokenLogprobIn, TopLogprobIn
from tests.harness.threads import race
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


def _shaped(tok, rng: random.Random, n: int, k: int, shape: str) -> list[TokenLogprobIn]:
    """Engine entries of a given candidate-list shape over real multi-byte text: ``first``
    (vLLM: the sampled id first, then k candidates by rank), ``absent`` (k candidates by rank,
    the sampled id not among them), ``vllm`` (the sampled id first with its own rank r, then the
    top k by rank without it), ``some-bad`` (``first`` with a few positions irregular: a
    duplicate id, the sampled id again, ranks out of order, no candidates)."""
    text = "mixed 天气预报 text 😀 with emoji 🌤️ and 東京 words, plain ascii too " * 4
    ids = tok.encode(text)[:n]
    vocab = tok.vocab_size
    out = []
    for p, t in enumerate(ids):
        alts = [a for a in (rng.randrange(vocab) for _ in range(k + 2)) if a != t][:k]
        lp = -0.5 - (p % 7) * 0.125
        if shape == "absent":
            tops = [TopLogprobIn(token_id=a, logprob=lp - j - 1, rank=j + 1) for j, a in enumerate(alts)]
        elif shape == "vllm":
            r = rng.randint(1, k + 1)
            ranked = alts[:r - 1] + alts[r:]  # the top k without the sampled id (rank r)
            tops = [TopLogprobIn(token_id=t, logprob=lp, rank=r)] + \
                [TopLogprobIn(token_id=a, logprob=lp - j - 1, rank=j + 1 + (j + 1 >= r)) for j, a in enumerate(ranked)]
        else:
            tops = [TopLogprobIn(token_id=t, logprob=lp, rank=1)] + \
                [TopLogprobIn(token_id=a, logprob=lp - j - 1, rank=j + 2) for j, a in enumerate(alts)]
            if shape == "some-bad" and p % 9 == 4 and len(tops) > 2:
                kind = (p // 9) % 4
                if kind == 0:
                    tops[2] = TopLogprobIn(token_id=tops[1].token_id, logprob=-3.0, rank=3)  # duplicate id
                elif kind == 1:
                    tops[-1] = TopLogprobIn(token_id=t, logprob=-3.0, rank=tops[-1].rank)  # sampled id again
                elif kind == 2:
                    tops[1], tops[2] = tops[2], tops[1]  # ranks out of order
                else:
                    tops = []  # no candidates
        out.append(TokenLogprobIn(token_id=t, logprob=lp, rank=1, top_logprobs=tops))
    return out


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-7b-v0.3"])
@pytest.mark.parametrize("k", [0, 1, 2, 5, 20])
def test_json_block_equals_encoded_structs(name, k):
    """``chat_logprobs_json`` (pre-encoded fragments joined with the logprobs) gives exactly the
    bytes ``msgspec.json`` gives the per-candidate path's Structs, for hostile and regular
    candidate lists (the column path, the per-position path with some positions irregular)."""
    from worker.core.logprobs import chat_logprobs_json

    tok = load_tokenizer(str(TOKDIR / name))
    rng = random.Random(f"json-{name}-{k}")
    for ctx in ([], [5, 6, 7, 8, 9]):
        lists = [_entries(tok, rng, 120, k)[0]] + [_shaped(tok, rng, 120, k, s)
                                                     for s in ("first", "absent", "vllm", "some-bad")]
        # whole lists, and the few entries of a stream chunk (the per-entry path up to SMALL)
        for entries in lists + [lst[i:i + n] for lst in lists for i, n in ((0, 1), (7, 3), (20, 8), (40, 9))]:
            want = _enc.encode(_chat_logprobs_slow(tok, entries, k, ctx, False))
            assert bytes(chat_logprobs_json(tok, entries, k, ctx)) == want
            assert _enc.encode(chat_logprobs(tok, entries, k, ctx)) == want
    assert bytes(chat_logprobs_json(tok, [], k, ctx)) == b"[]"


@pytest.mark.parametrize("k", [0, 2, 5, 20])
@pytest.mark.parametrize("shape", ["first", "absent", "vllm", "some-bad"])
def test_completion_shapes_equal_per_candidate_path(k, shape):
    from worker.core.logprobs import completion_logprobs

    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    whole = _shaped(tok, random.Random(f"{shape}-{k}"), 120, k, shape)
    for entries in (whole, whole[10:11], whole[30:38], whole[50:59]):
        for ctx in ([], [5, 6, 7, 8, 9]):
            got = msgspec.json.decode(_enc.encode(completion_logprobs(tok, entries, k, 11, ctx)))
            want = _completion_reference(tok, entries, k, ctx)
            want["text_offset"] = [x + 11 for x in want["text_offset"]]
            assert json.dumps(got) == json.dumps(msgspec.json.decode(_enc.encode(want)))


def test_shapes_take_the_c_level_paths():
    """The regular shapes are decided without per-position Python (``_regular`` answers
    ``_Columns`` for vLLM's sampled-first lists and for sampled-absent ones, ``_Slices`` with
    only the irregular positions left to ``_selected``)."""
    from worker.core.logprobs import _Columns, _regular, _Slices, candidates

    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    rng = random.Random(3)
    assert type(_regular(candidates(_shaped(tok, rng, 100, 5, "first")), 5)) is _Columns
    assert type(_regular(candidates(_shaped(tok, rng, 100, 5, "absent")), 5)) is _Columns
    vllm = _regular(candidates(_shaped(tok, rng, 100, 5, "vllm")), 5)
    assert type(vllm) is _Slices and vllm.bad == []
    bad = [e for e in _shaped(tok, rng, 100, 5, "some-bad")]
    reg = _regular(candidates([e for e in bad if e.top_logprobs]), 5)
    assert type(reg) is _Slices and 0 < len(reg.bad) < 20


@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek-v4"])
def test_unrepairable_pieces_repair_to_empty_in_any_context(name):
    """A byte-level piece whose bytes end in an incomplete or invalid UTF-8 sequence starting
    inside it (``_REPAIR_EMPTY`` in the table) repairs to ``""`` after any context without added
    tokens (what the table assumes instead of computing it per position); the table marks
    them so, and the context-dependent ones ``_REPAIR``."""
    from worker.core.logprobs import _REPAIR, _REPAIR_EMPTY, _correct, _fill, _table, _unrepairable

    tok = load_tokenizer(str(TOKDIR / name))
    table = _table(tok)
    rng = random.Random(name)
    fffd = [i for i in range(min(tok.vocab_size, 200000)) if i not in tok.added_token_ids
            and tok.decode_single(i).endswith("\ufffd")]
    empty = [i for i in fffd if _unrepairable(tok.token_bytes(i))]
    assert empty and len(empty) < len(fffd)
    real = tok.encode("天气预报 😀 🌤️ 東京 Ωμέγα ñandú 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 " * 3)
    for t in rng.sample(empty, min(200, len(empty))):
        assert _fill(tok, table, t) is _REPAIR_EMPTY
        for _ in range(10):
            ctx = [rng.choice(fffd + real) for _ in range(rng.randint(0, 4))]
            assert _correct(tok, t, ctx) == ""
    for t in rng.sample([i for i in fffd if i not in set(empty)], 20):
        assert _fill(tok, table, t) is _REPAIR


def _reference_check(vocab: int, max_lp: int, entries: list[TokenLogprobIn], where: str) -> str | None:
    """The per-entry logprob checks (entry order; candidate count, sampled id, candidate ids):
    the message of the first failure, or None."""
    for e in entries:
        if 0 <= max_lp < len(e.top_logprobs):
            return f"top_logprobs count ({len(e.top_logprobs)}) in {where} exceeds max_logprobs ({max_lp})."
        for t in [e.token_id] + [c.token_id for c in e.top_logprobs]:
            if t is None or t < 0 or t >= vocab:
                return f"logprob token_id {t} in {where} is missing or outside the vocabulary"
    return None


def test_bulk_logprob_checks_name_the_first_bad_entry():
    """``check_ids_and_logprobs`` checks every candidate with C-level min/max over the flattened
    record; a failure is named exactly as the per-entry checks name it (the first bad entry, in
    their order)."""
    from worker.config import ServedModelConfig
    from worker.core.derender import ModelRuntime, check_ids_and_logprobs
    from worker.core.errors import BadRequest

    rt = ModelRuntime(ServedModelConfig(name="q", tokenizer=str(TOKDIR / "qwen3"), max_logprobs=6))
    vocab = rt.tokenizer.vocab_size
    rng = random.Random(7)
    faults = [None, -1, vocab, vocab + 5]
    for trial in range(300):
        n = rng.randint(1, 12)
        entries = [TokenLogprobIn(token_id=rng.randrange(vocab), logprob=-1.0,
                                  top_logprobs=[TopLogprobIn(token_id=rng.randrange(vocab), logprob=-2.0, rank=j + 1)
                                                for j in range(rng.randint(0, 6))]) for _ in range(n)]
        for _ in range(rng.randint(0, 3)):
            e = rng.choice(entries)
            what = rng.random()
            if what < 0.3:
                e.token_id = rng.choice(faults)
            elif what < 0.6 and e.top_logprobs:
                rng.choice(e.top_logprobs).token_id = rng.choice(faults)
            else:
                e.top_logprobs = e.top_logprobs + [TopLogprobIn(token_id=1, logprob=-3.0)] * rng.randint(1, 3)
        ids = [e.token_id if isinstance(e.token_id, int) and 0 <= e.token_id < vocab else 0 for e in entries]
        want = _reference_check(vocab, 6, entries, "choice 0")
        try:
            check_ids_and_logprobs(rt, ids, LogprobsIn(content=entries), "choice 0")
            got = None
        except BadRequest as err:
            got = err.message
        assert got == want, trial


def test_concurrent_fills_of_a_fresh_table_give_the_same_bytes():
    """Threads filling one fresh table at once (switching every microsecond) all get the
    per-candidate path's bytes: a filled head is only ever seen with its row and tail filled."""

    from tokenizers import Tokenizer as HFTokenizer

    from worker.core.logprobs import chat_logprobs_json
    from worker.core.tokenizers import FastTokenizer

    raw = HFTokenizer.from_file(str(TOKDIR / "qwen3" / "tokenizer.json"))
    tok = FastTokenizer.from_fast(raw, path="<fresh qwen3>")
    lists = [_shaped(tok, random.Random(i), 120, 5, "first") for i in range(4)]
    ref_tok = load_tokenizer(str(TOKDIR / "qwen3"))
    want = [_enc.encode(_chat_logprobs_slow(ref_tok, e, 5, [], False)) for e in lists]
    got: dict[tuple[int, int], tuple[bytes, bytes]] = {}

    def work(t: int) -> None:
        for i in range(len(lists)):
            e = lists[(i + t) % len(lists)]
            got[t, (i + t) % len(lists)] = (bytes(chat_logprobs_json(tok, e, 5)),
                                              _enc.encode(chat_logprobs(tok, e, 5)))

    race(work)
    assert len(got) == 16
    for (_, i), (a, b) in got.items():
        assert a == want[i] and b == want[i]


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
@pytest.mark.parametrize("k", [0, 3])
def test_json_block_with_percent_tokens(name, k):
    """Token strings holding ``%`` (``%``, ``%%``, ``%b``, ``%s``: the fragments are a ``bytes %``
    format with the ``%`` of their strings doubled) give exactly the per-candidate path's
    bytes, as sampled tokens and as candidates, before and after their fragments are filled."""
    from tokenizers import Tokenizer as HFTokenizer

    from worker.core.logprobs import chat_logprobs_json
    from worker.core.tokenizers import FastTokenizer

    raw = HFTokenizer.from_file(str(TOKDIR / name / "tokenizer.json"))
    tok = FastTokenizer.from_fast(raw, path=f"<fresh {name}>")  # an empty table
    ref_tok = load_tokenizer(str(TOKDIR / name))
    ids = tok.encode("100% of %s and %b, 50%% then %d%%b done % ")
    assert any("%" in tok.decode_single(i) for i in ids)
    entries = [TokenLogprobIn(token_id=t, logprob=-0.5 - p, rank=1,
                              top_logprobs=[TopLogprobIn(token_id=t, logprob=-0.5 - p, rank=1)]
                              + [TopLogprobIn(token_id=ids[(p + j) % len(ids)], logprob=-1.0 - j, rank=j + 2)
                                 for j in range(1, 3)])
               for p, t in enumerate(ids)]
    want = _enc.encode(_chat_logprobs_slow(ref_tok, entries, k, [], False))
    assert b"%" in want and len(entries) > 8
    for _ in range(2):  # a fresh table, then a filled one
        assert bytes(chat_logprobs_json(tok, entries, k, [])) == want


def test_bounded_decode_of_logprob_ids_keeps_the_error_replies():
    """The one-decode path bounds logprob ids (sampled and candidate) in the msgspec decode and
    requires them; a body with a null, missing, negative or out-of-vocabulary logprob id fails
    that decode and gets the same 400 the probe path's validation gives, and a good body takes
    the bounded decode (validation then checks only lengths and candidate counts)."""
    from worker.bench import floor
    from worker.core.service import _one_decode

    svc = floor.make_service(str(TOKDIR / "qwen3"))
    vocab = svc.runtime("qwen3").tokenizer.vocab_size
    body = floor.build_bodies(svc.runtime("qwen3").tokenizer, "qwen3", 64, 1, top_logprobs=3)[0][0]
    one = _one_decode(body, None, svc._one[1])
    assert one is not None and type(one[1].generate_response.choices[0].logprobs.content[0]).__name__ \
        == "BoundedTokenLogprobIn"
    assert not svc.derender(body).is_error

    def derender(edit, bounded: bool):
        b = json.loads(body)
        edit(b["generate_response"]["choices"][0]["logprobs"]["content"])
        raw = json.dumps(b).encode()
        assert (_one_decode(raw, None, svc._one[1]) is not None) == bounded
        return svc.derender(raw)

    msg = "logprob token_id {} in choice 0 is missing or outside the vocabulary"
    edits = [  # (edit, bounded decode passes, message)
        (lambda c: c[3].__setitem__("token_id", None), False, msg.format(None)),
        (lambda c: c[3].pop("token_id"), False, msg.format(None)),
        (lambda c: c[3]["top_logprobs"][1].__setitem__("token_id", -1), False, msg.format(-1)),
        (lambda c: c[3]["top_logprobs"][2].__setitem__("token_id", vocab), False, msg.format(vocab)),
        (lambda c: c[5]["top_logprobs"][0].pop("token_id"), False, msg.format(None)),
        (lambda c: c[2]["top_logprobs"].extend([{"token_id": 1, "logprob": -1.0}] * 18), True,
         "top_logprobs count (21) in choice 0 exceeds max_logprobs (20)."),
        (lambda c: c.pop(), True, "logprobs.content length (63) in choice 0 differs from token_ids length (64)"),
    ]
    for edit, bounded, want in edits:
        res = derender(edit, bounded)
        assert res.status == 400 and json.loads(res.body)["error"]["message"] == want


@pytest.mark.parametrize("k", [0, 2, 6])
def test_json_block_with_byte_pieces_after_added_tokens(k):
    """Candidates that are byte pieces no context completes (``_REPAIR_EMPTY``: their table
    fragment is the ``""`` object's) keep the per-candidate path's bytes where the sampled ids
    before them hold an added token (``<think>``, ``</think>``, ``<|im_end|>``: repaired per
    position there), in the JSON block and the Struct path, with and without such a context."""
    from worker.core.logprobs import _REPAIR, _REPAIR_EMPTY, chat_logprobs_json

    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    pieces = [i for i in range(2000, 40000) if tok.decode_single(i).endswith("\ufffd")][:60]
    rows = logprob_rows(tok)
    chat_logprobs(tok, [TokenLogprobIn(token_id=i, logprob=-1.0) for i in pieces], 0)  # fill their rows
    assert any(rows[i] is _REPAIR_EMPTY for i in pieces) and any(rows[i] is _REPAIR for i in pieces)
    text = tok.encode("mixed 天气预报 text 😀 and 東京 words " * 3)
    added = [151667, 151668, 151645]
    sampled = []
    for p, t in enumerate(text):
        sampled += [added[p % 3], t] if p % 5 == 0 else [t]
    rng = random.Random(5)
    entries = [TokenLogprobIn(token_id=t, logprob=-0.5, rank=1,
                              top_logprobs=[TopLogprobIn(token_id=t, logprob=-0.5, rank=1)]
                              + [TopLogprobIn(token_id=rng.choice(pieces), logprob=-1.0 - j, rank=j + 2)
                                 for j in range(5)])
               for t in sampled]
    for ctx in ([], [151667], [5, 151668, 6]):
        want = _enc.encode(_chat_logprobs_slow(tok, entries, k, ctx, False))
        assert bytes(chat_logprobs_json(tok, entries, k, ctx)) == want
        assert _enc.encode(chat_logprobs(tok, entries, k, ctx)) == want
