"""The id scans of ``worker.parsers.idscan`` (issue 13): every C-level scan over ``id_text``
against a straightforward per-id reference, on random id lists with markers, special ids and
ids the text cannot hold (negative, above U+10FFFF, >= 2**32) in random places:

* ``ThinkReasoningParser._count`` (count and final id-level mode, for any start state, and
  split-independence: chunk counts add up to the whole count) for qwen3 (turn token, implicit
  end, explicit blocks) and deepseek_r1 / deepseek_v4 (implicit ends, no explicit blocks) on another tokenizer;
* ``ThinkReasoningParser.prompt_mode`` (the last turn's markers, window and whole prompt);
* ``idscan.has_special`` for tokenizers with few (qwen3), 256 contiguous (llama3) and many
  scattered (deepseek-v4) special ids;
* ``id_text``'s one-entry memo: a list mutated by append between scans is not served stale.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from tests.harness.parsers import reference_reasoning_count as _reference_count
from worker.core.tokenizers import load_tokenizer
from worker.parsers import idscan, make_reasoning_parser
from worker.parsers.think import ThinkReasoningParser, ThinkState

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _tok(name: str):
    return load_tokenizer(str(TOKDIR / name), "auto")


#: (family, tokenizer dir): think parsers whose markers are single ids of that tokenizer
CASES = [("qwen3", "qwen3"), ("deepseek_r1", "deepseek-v4"), ("deepseek_v4", "deepseek-v4")]
PARSERS = {c: make_reasoning_parser(c[0], _tok(c[1])) for c in CASES}
#: ids no text can hold: the scans must fall back to the per-id path, with the same results
ODD = [-1, -5, -(2**40), 0x110000, 2**32, 2**40]


def _ids_strategy(p: ThinkReasoningParser, special: frozenset[int]):
    """Lists longer than ``idscan.SMALL`` (shorter ones take the per-id path, which
    tests/test_hot_path.py covers): plain ids, markers, the turn id and special ids."""
    markers = sorted(p._marker_ids | p._prompt_ids)
    plain = hs.integers(min_value=0, max_value=p.tok.vocab_size - 1)
    return hs.lists(hs.one_of(plain, plain, hs.sampled_from(markers), hs.sampled_from(sorted(special)[:8])),
                    min_size=idscan.SMALL + 1, max_size=700)



def _reference_prompt_mode(p: ThinkReasoningParser, ids: list[int]) -> str | None:
    """The last turn (ids after the last turn id): its last end id after its last start id ->
    content, the reverse -> reasoning, neither -> None (an id in both sets is an end id)."""
    if p.turn_id is not None and p.turn_id in ids:
        ids = ids[len(ids) - ids[::-1].index(p.turn_id):]
    last_end = max((k for k, t in enumerate(ids) if t in p.end_ids), default=-1)
    last_start = max((k for k, t in enumerate(ids) if t in p.start_ids and t not in p.end_ids), default=-1)
    if last_end > last_start:
        return "content"
    if last_start > last_end:
        return "reasoning"
    return None


@pytest.mark.parametrize("case", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_count_equals_reference(case):
    p = PARSERS[case]
    assert p._marker_ids and p._text_ok

    @SETTINGS
    @given(ids=_ids_strategy(p, p.tok.special_ids), r0=hs.booleans(), e0=hs.booleans(),
           odd=hs.lists(hs.tuples(hs.integers(0, 700), hs.sampled_from(ODD)), max_size=2),
           cuts=hs.lists(hs.integers(0, 700), max_size=6))
    def check(ids, r0, e0, odd, cuts):
        for k, t in odd:
            ids.insert(min(k, len(ids)), t)
        want = _reference_count(p, r0, e0, ids)
        st = ThinkState(tok_reasoning=r0, tok_explicit=e0)
        assert (p._count(st, ids), st.tok_reasoning, st.tok_explicit) == want
        # split-independence: any chunking gives the same total and final mode
        st = ThinkState(tok_reasoning=r0, tok_explicit=e0)
        bounds = sorted({0, len(ids), *(min(c, len(ids)) for c in cuts)})
        total = sum(p._count(st, ids[a:b]) for a, b in zip(bounds, bounds[1:]))
        assert (total, st.tok_reasoning, st.tok_explicit) == want

    check()


def test_count_takes_the_text_path():
    """The lists above SMALL go through ``id_text`` (the test above would pass on the per-id
    path alone): a long list converts, and ``_count`` answers from its text."""
    p = PARSERS[("qwen3", "qwen3")]
    start, end = next(iter(p.start_ids)), next(iter(p.end_ids))
    ids = [start] + [9707] * 50 + [end] + [11] * 20
    idscan._last = None
    st = ThinkState(tok_reasoning=True)
    assert p._count(st, ids) == 50 and not st.tok_reasoning
    assert idscan._last is not None and idscan._last[0] is ids


@pytest.mark.parametrize("case", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_prompt_mode_equals_reference(case):
    p = PARSERS[case]

    @SETTINGS
    @given(ids=_ids_strategy(p, p.tok.special_ids), pad=hs.sampled_from([0, 0, 300]),
           odd=hs.lists(hs.tuples(hs.integers(0, 1000), hs.sampled_from(ODD)), max_size=1))
    def check(ids, pad, odd):
        ids = ids + [9707] * pad  # a tail of plain ids: the window must fall back to the whole prompt
        for k, t in odd:
            ids.insert(min(k, len(ids)), t)
        assert p.prompt_mode(ids) == _reference_prompt_mode(p, ids)

    check()


@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek-v4", "mistral-7b-v0.3"])
def test_has_special_equals_reference(name):
    tok = _tok(name)
    special = tok.special_ids
    assert special
    few = sorted(special)[:3] + sorted(special)[-3:]

    @SETTINGS
    @given(ids=hs.lists(hs.one_of(hs.integers(0, tok.vocab_size - 1), hs.sampled_from(few)), max_size=300),
           odd=hs.lists(hs.tuples(hs.integers(0, 300), hs.sampled_from(ODD)), max_size=1))
    def check(ids, odd):
        for k, t in odd:
            ids.insert(min(k, len(ids)), t)
        idscan._last = None
        assert idscan.has_special(tok, ids) == any(t in special for t in ids)

    check()


def test_runs_pattern_matches_exactly_the_ids():
    ids = {0, 1, 2, 5, 45, 93, 94, 95, 0xD800, 0x1F400, 0x10FFFF}  # '-', ']', '^', '\\' and a surrogate
    pat = idscan.runs_pattern(ids)
    assert pat is not None
    for i in range(0, 0x20000, 1):
        assert (pat.fullmatch(chr(i)) is not None) == (i in ids), i
    assert idscan.runs_pattern(range(0, 100, 2)) is None  # more than MAX_RUNS runs
    assert idscan.runs_pattern(()) is None


def test_id_text_memo_is_not_stale():
    ids = [9707] * 20
    s = idscan.id_text(ids)
    assert s == chr(9707) * 20 and idscan.id_text(ids) is s
    ids.append(151668)
    assert idscan.id_text(ids) == chr(9707) * 20 + chr(151668)
    assert idscan.id_text([1, -1]) is None and idscan.id_text([0x110000]) is None
    assert idscan.id_text([2**32]) is None
    prompt = [5] * 10
    idscan.id_text(prompt, keep=False)
    assert idscan._last[0] is ids
