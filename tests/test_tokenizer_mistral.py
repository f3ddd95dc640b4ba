"""The mistral-common backend (``worker.core.tokenizers.mistral``, ``--tokenizer-mode mistral``)
on its own, against mistral-common's own tokenizers: the SentencePiece v7 file in tests/data and
the Tekken file the installed mistral-common package ships."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from worker.core.detokenize import IncrementalDetokenizer
from worker.core.tokenizers import MistralTokenizer, load_tokenizer

pytest.importorskip("sentencepiece", reason="mistral-common SentencePiece needs sentencepiece")
mistral_common = pytest.importorskip("mistral_common")

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
TEXT = "Héllo wörld 你好，世界！🌞🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 naïve. ok"


@pytest.fixture(scope="module", params=["spm-v7", "tekken"])
def pair(request, tmp_path_factory):
    """``(our tokenizer, mistral-common's inner tokenizer)`` for one file."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as MC
    if request.param == "spm-v7":
        d = TOKDIR / "mistral-v7-mistral-mode"
        f = d / "tokenizer.model.v7"
    else:
        d = tmp_path_factory.mktemp("tekken")
        f = shutil.copy(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", d)
    tok = load_tokenizer(str(d), "mistral")
    assert isinstance(tok, MistralTokenizer) and tok.backend == "slow"
    assert tok.is_tekken == (request.param == "tekken")
    return tok, MC.from_file(str(f)).instruct_tokenizer.tokenizer


def test_queries_are_mistral_commons(pair):
    tok, inner = pair
    assert tok.vocab_size == inner.n_words
    assert tok.special_ids == {i for i in range(inner.n_words) if inner.is_special(i)}
    assert inner.eos_id in tok.eos_token_ids and tok.added_token_ids == {}
    ids = tok.encode(TEXT)
    assert ids == list(inner.encode(TEXT, bos=False, eos=False))
    assert [tok.piece(i) for i in ids] == [inner.id_to_piece(i) for i in ids]
    assert tok.token_to_id("[TOOL_CALLS]") == inner.get_special_token("[TOOL_CALLS]")
    assert tok.token_bytes(ids[0]) is None


def test_decode_is_mistral_commons(pair):
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    tok, inner = pair
    rng = random.Random(tok.path)
    pool = tok.encode(TEXT) + sorted(tok.special_ids)[:10]
    for _ in range(30):
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 20))]
        assert tok.decode(ids) == inner.decode(ids, SpecialTokenPolicy.IGNORE)
        assert tok.decode(ids, False) == inner.decode(ids, SpecialTokenPolicy.KEEP)
        assert tok.decode(ids + [tok.vocab_size]) == tok.decode(ids)


def test_incremental_text_keeps_the_tool_call_marker(pair):
    """vLLM's ``SlowIncrementalDetokenizer`` over ``MistralTokenizer``: plain text steps to the
    text (byte pieces held until complete); [TOOL_CALLS] survives ``skip_special_tokens`` (the
    tool parser needs it) while other control tokens such as [INST] are dropped."""
    tok, _ = pair
    ids = tok.encode(TEXT)
    d = IncrementalDetokenizer(tok)
    assert "".join(d.add([i]) for i in ids) == TEXT == tok.decode(ids)
    tc, inst = tok.token_to_id("[TOOL_CALLS]"), tok.token_to_id("[INST]")
    out = tok.encode("Hello") + [inst, tc] + tok.encode(" world")
    for skip in (True, False):
        d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        assert "".join(d.add([i]) for i in out) == "Hello[TOOL_CALLS] world"
    toks = tok.incremental_ids_to_tokens(out + [tok.vocab_size], True)
    assert "[TOOL_CALLS]" in toks and "[INST]" not in toks and toks[-1] == ""
    assert "[INST]" in tok.incremental_ids_to_tokens(out, False)


def test_tekken_partial_pieces_become_bytes(pair):
    """Tekken: pieces that are partial UTF-8 (U+FFFD as text) are handed to the join as their
    bytes (mistral-common's ``id_to_byte_piece``), so split emoji decode whole."""
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    tok, inner = pair
    if not tok.is_tekken:
        pytest.skip("SentencePiece pieces are never partial UTF-8 text")
    split = [i for i in tok.encode("🌞🎉𝔘") if "\ufffd" in tok.piece(i)]
    assert split
    assert tok.incremental_ids_to_tokens(split, True) == [inner.id_to_byte_piece(i, SpecialTokenPolicy.KEEP)
                                                           for i in split]
    assert tok.convert_tokens_to_string(tok.incremental_ids_to_tokens(tok.encode("🌞🎉𝔘"), True)) == "🌞🎉𝔘"
