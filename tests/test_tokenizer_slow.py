"""The slow backend (``worker.core.tokenizers.slow``, ``--tokenizer-mode slow``) on its own,
against transformers' own tokenizer objects and vLLM's ``SlowIncrementalDetokenizer`` join rule
(``_convert_tokens_to_string_with_added_encoders``), over the real tokenizers in tests/data."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from worker.core.detokenize import IncrementalDetokenizer
from worker.core.tokenizers import SlowTokenizer, load_tokenizer

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
NAMES = ["mistral-7b-v0.3", "qwen3"]
TEXT = "Héllo wörld 你好，世界！🌞🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 naïve. It 's ok , right ?"


def _pair(name: str):
    from transformers import AutoTokenizer
    tok = load_tokenizer(str(TOKDIR / name), "slow")
    assert isinstance(tok, SlowTokenizer) and tok.backend == "slow"
    hf = AutoTokenizer.from_pretrained(str(TOKDIR / name), use_fast=False, local_files_only=True)
    return tok, hf


@pytest.mark.parametrize("name", NAMES)
def test_queries_are_transformers(name):
    tok, hf = _pair(name)
    assert tok.vocab_size == len(hf)
    assert tok.special_ids == frozenset(hf.all_special_ids)
    assert tok.added_token_ids == {i: t.content for i, t in hf.added_tokens_decoder.items()}
    assert hf.eos_token_id in tok.eos_token_ids
    ids = tok.encode(TEXT)
    assert ids == list(hf.encode(TEXT, add_special_tokens=False))
    pieces = hf.convert_ids_to_tokens(ids)
    assert tok.convert_ids_to_tokens(ids) == pieces and [tok.piece(i) for i in ids] == pieces
    assert tok.token_to_id(pieces[1]) == ids[1]
    assert tok.convert_tokens_to_string(pieces) == hf.convert_tokens_to_string(pieces)
    assert tok.token_bytes(ids[0]) is None and not tok.is_byte_level


@pytest.mark.parametrize("name", NAMES)
def test_decode_is_transformers_decode(name):
    tok, hf = _pair(name)
    rng = random.Random(name)
    base = tok.encode(TEXT)
    pool = base + sorted(tok.added_token_ids)[:8]
    for _ in range(30):
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 20))]
        for skip in (True, False):
            assert tok.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)
            assert tok.raw_decode(ids, skip) == tok.decode(ids, skip)
            assert tok.decode(ids + [tok.vocab_size], skip) == tok.decode(ids, skip)


@pytest.mark.parametrize("name", NAMES)
def test_incremental_text_of_plain_text_is_the_decode(name):
    """Stepping ``detokenize_incrementally`` one id at a time over plain text gives transformers'
    decode of the whole output (multi-byte characters held back until complete)."""
    tok, hf = _pair(name)
    ids = tok.encode(TEXT)
    d = IncrementalDetokenizer(tok)
    assert "".join(d.add([i]) for i in ids) == hf.decode(ids) == TEXT


def test_added_vocabulary_join_is_vllms():
    """vLLM's ``_convert_tokens_to_string_with_added_encoders``: special token strings dropped
    when skipped, added tokens verbatim between decoded runs, parts joined by a space when
    ``spaces_between_special_tokens``."""
    tok, _ = _pair("mistral-7b-v0.3")
    toks = ["\u2581Hello", "[INST]", "\u2581world", "</s>", "!"]
    assert tok.incremental_tokens_to_string(toks, True, True) == "Hello [INST] world!"
    assert tok.incremental_tokens_to_string(toks, True, False) == "Hello[INST]world!"
    assert tok.incremental_tokens_to_string(toks, False, True) == "Hello [INST] world </s> !"
    assert tok.incremental_tokens_to_string(toks, False, False) == "Hello[INST]world</s>!"


def test_incremental_tokens_of_ids():
    """vLLM's ``convert_ids_to_tokens(ids, skip_special_tokens)`` for the slow detokenizer:
    special ids dropped when skipped (added non-special tokens kept), ``""`` for an id outside
    the vocabulary."""
    tok, hf = _pair("mistral-7b-v0.3")
    hello, inst, eos = tok.encode("Hello")[0], tok.token_to_id("[INST]"), hf.eos_token_id
    assert inst not in tok.special_ids and eos in tok.special_ids
    assert tok.incremental_ids_to_tokens([hello, inst, eos, tok.vocab_size], True) == ["\u2581Hello", "[INST]", ""]
    assert tok.incremental_ids_to_tokens([hello, inst, eos, -1], False) == ["\u2581Hello", "[INST]", "</s>", ""]
