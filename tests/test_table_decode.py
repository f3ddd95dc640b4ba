"""``FastTokenizer.raw_decode`` by byte-table lookups (``worker.core.tokenizers.fast``,
``_DecodeTable``) against ``tokenizers.Tokenizer.decode`` itself: random id sequences (split
UTF-8 characters, CJK/emoji, added and special tokens, out-of-vocab ids, special tokens skipped
and kept) on the Qwen3 demo tokenizer, the byte-level tokenizers in tests/data and an in-memory
tokenizer with added tokens holding byte-level alphabet characters; lossy decoding of invalid
UTF-8 (``String::from_utf8_lossy`` vs CPython's ``errors="replace"``); the construction
self-check falling back to tokenizers; errors for ids outside ``[0, 2**32)``."""
from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from worker.core.tiktoken_vocab import byte_chars
from worker.core.tokenizers import FastTokenizer, load_tokenizer
from worker.core.tokenizers import fast as fast_mod

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "worker" / "demo_data" / "qwen3"
TOKDIR = REPO / "tests" / "data" / "tokenizers"
TEXT = ("Héllo wörld 你好，世界！🌞🎉 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🧑‍🚀 naïve “quotes” — ok. 日本語のテキスト、한국어 텍스트. "
        "<think>x</think> Ġ already-escaped ĠĠ text\n  x = 1  # code")
#: added tokens of the in-memory tokenizer: alphabet characters ("Ġ", "Ã" = byte 0xC3, a lone
#: lead byte), a space (outside the alphabet: the piece's own UTF-8), non-ASCII outside it
ADDED = ["ĠzqxĠ", "a b", "é€x", "ĠĠ中", "Ãzq", "Ã"]
#: special ones: "hello" is also a vocabulary piece (tokenizers skips by STRING)
SPECIAL = ["<|Ġsp|>", "hello", "<|€|>"]


def _demo() -> FastTokenizer:
    return FastTokenizer.from_file(DEMO / "tokenizer.json", str(DEMO), "auto")


def _extra() -> FastTokenizer:
    raw = HFTokenizer.from_file(str(DEMO / "tokenizer.json"))
    raw.add_tokens([AddedToken(s, special=False) for s in ADDED])
    raw.add_special_tokens([AddedToken(s, special=True) for s in SPECIAL])
    return FastTokenizer.from_fast(raw, path="<qwen3+extra>")


def _tokenizers(tok: FastTokenizer) -> HFTokenizer:
    """An independent ``tokenizers.Tokenizer`` equal to ``tok``'s (round trip through JSON)."""
    return HFTokenizer.from_str(tok.backend_tokenizer.to_str())


def _random_ids(tok: FastTokenizer, rng: random.Random, n: int) -> list[int]:
    text = tok.encode(TEXT)
    added = sorted(tok.added_token_ids)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.45:  # a run of the text from a random start: split characters at its ends
            j = rng.randrange(len(text))
            out.extend(text[j:j + rng.randrange(1, 6)])
        elif r < 0.65:
            out.append(rng.choice(added))
        elif r < 0.85:
            out.append(rng.randrange(tok.vocab_size))
        elif r < 0.95:
            out.append(rng.randrange(256))  # single-byte pieces (GPT-2 alphabet) in Qwen's vocab
        else:
            out.append(rng.choice([tok.vocab_size, tok.vocab_size + 3, 2**31, 2**32 - 1]))
    return out


def _check_equal(tok: FastTokenizer, ref: HFTokenizer, rng: random.Random, rounds: int) -> None:
    assert tok.decodes_by_table
    for _ in range(rounds):
        ids = _random_ids(tok, rng, rng.randrange(1, 40))
        for skip in (False, True):
            want = ref.decode(ids, skip_special_tokens=skip)
            assert tok.raw_decode(ids, skip) == want, (ids, skip)
            assert tok.raw_decode(tuple(ids), skip) == want
    assert tok.raw_decode([], False) == "" == tok.raw_decode([], True)


def test_demo_tokenizer_decodes_like_tokenizers():
    tok = _demo()
    _check_equal(tok, _tokenizers(tok), random.Random(13), 1500)


@pytest.mark.parametrize("name,mode", [("qwen3", "auto"), ("llama3", "auto"), ("deepseek-v4", "deepseek_v4")])
def test_byte_level_test_tokenizers_decode_like_tokenizers(name, mode):
    tok = load_tokenizer(str(TOKDIR / name), mode)
    assert isinstance(tok, FastTokenizer)
    _check_equal(tok, _tokenizers(tok), random.Random(name), 400)


def test_sentencepiece_tokenizer_keeps_calling_tokenizers():
    tok = load_tokenizer(str(TOKDIR / "mistral-7b-v0.3"), "hf")
    assert isinstance(tok, FastTokenizer) and not tok.is_byte_level and not tok.decodes_by_table


def test_decode_pieces_join_to_the_raw_decode():
    """``decode_pieces``: each id's table bytes (fresh and warm tables), joined and decoded as
    ``raw_decode`` decodes; None for an id outside the vocabulary, and on a tokenizer that
    does not decode by table."""
    rng = random.Random(7)
    for tok in (_demo(), _extra()):
        for _ in range(300):
            ids = [i for i in _random_ids(tok, rng, rng.randrange(1, 30)) if i < tok.vocab_size]
            for skip in (False, True):
                pieces = tok.decode_pieces(ids, skip)
                assert len(pieces) == len(ids)
                assert b"".join(pieces).decode("utf-8", "replace") == tok.raw_decode(ids, skip)
        assert tok.decode_pieces([], False) == ()
        for bad in ([tok.vocab_size], [1, tok.vocab_size + 3], [-1], [5, -2]):
            assert tok.decode_pieces(bad, False) is None
    sp = load_tokenizer(str(TOKDIR / "mistral-7b-v0.3"), "hf")
    assert sp.decode_pieces([1, 2, 3], False) is None


def test_added_tokens_go_through_the_byte_level_decoder():
    """Added tokens decode through the alphabet ("Ġ" -> " "), unless a character lies outside
    it (then their UTF-8 as is), while ``token_bytes`` keeps their UTF-8 content; special
    tokens are skipped by string, so a vocabulary piece equal to a special token's content is
    skipped too."""
    tok = _extra()
    ref = _tokenizers(tok)
    ids = {s: tok.token_to_id(s) for s in ADDED + SPECIAL}
    assert all(i is not None for i in ids.values())
    assert tok.raw_decode([ids["ĠzqxĠ"]]) == " zqx " == ref.decode([ids["ĠzqxĠ"]], skip_special_tokens=False)
    assert tok.token_bytes(ids["ĠzqxĠ"]) == "ĠzqxĠ".encode()
    assert tok.raw_decode([ids["a b"]]) == "a b"
    assert tok.raw_decode([ids["é€x"]]) == "é€x"  # € is outside the alphabet
    assert tok.raw_decode([ids["ĠĠ中"]]) == "ĠĠ中"
    assert tok.raw_decode([ids["Ãzq"]]) == "\ufffdzq" == ref.decode([ids["Ãzq"]], skip_special_tokens=False)
    # "Ã" (0xC3) completed by the vocabulary's byte 0xA9 piece: "é"
    assert tok.raw_decode([ids["Ã"], tok.token_to_id(byte_chars()[0xA9])]) == "é"
    assert tok.raw_decode([ids["<|Ġsp|>"]]) == "<| sp|>" and tok.raw_decode([ids["<|Ġsp|>"]], True) == ""
    assert ids["hello"] == ref.get_vocab(with_added_tokens=False)["hello"]
    assert tok.raw_decode([ids["hello"], ids["a b"]], True) == "a b"
    _check_equal(tok, ref, random.Random(7), 1500)


#: invalid UTF-8: truncated sequences, overlongs, surrogates, above U+10FFFF, bytes that never
#: occur, stray continuation bytes, and mixes with valid characters
INVALID = [
    b"\xc3", b"\xe4\xbd", b"\xf0\x9f\x8c", b"a\xc3b", b"\xe4\xbd\xe4\xbd\xa0", b"\xf0\x9f\x8c\xf0\x9f\x8c\x9e",
    b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf",
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\x80\xed\xb0\x80", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
    b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\x80", b"\xbf\xbf", b"a\x80\x80b",
    b"\xe4\xbd\xa0\xa0", b"\xc3\xa9\xa9\xc3", b"\xf4\x8f\xbf\xbf\xf4", b"\xe0\xa0", b"\xf0\x90\x80",
]


def _byte_ids(tok: FastTokenizer, data: bytes) -> list[int]:
    chars = byte_chars()
    return [tok.token_to_id(chars[b]) for b in data]


def test_lossy_decode_of_invalid_utf8_equals_tokenizers():
    tok = _demo()
    ref = _tokenizers(tok)
    for data in INVALID:
        ids = _byte_ids(tok, data)
        assert None not in ids
        want = ref.decode(ids, skip_special_tokens=False)
        assert tok.raw_decode(ids) == want == data.decode("utf-8", "replace"), data
    assert tok.raw_decode(_byte_ids(tok, b"\xed\xa0\x80")) == "\ufffd" * 3  # a surrogate: 3 subparts
    assert tok.raw_decode(_byte_ids(tok, b"\xf0\x9f\x8c")) == "\ufffd"  # truncated: one subpart


_DEMO = None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=24), st.binary(max_size=6))
def test_lossy_decode_of_random_bytes_equals_tokenizers(data, tail):
    global _DEMO
    if _DEMO is None:
        _DEMO = (_demo(), HFTokenizer.from_file(str(DEMO / "tokenizer.json")))
    tok, ref = _DEMO
    ids = _byte_ids(tok, data + "é中🌞".encode() + tail)
    assert tok.raw_decode(ids) == ref.decode(ids, skip_special_tokens=False)


def test_failed_self_check_keeps_calling_tokenizers(monkeypatch):
    """A table that would decode differently (here: an alphabet shifted by one byte) fails
    the construction self-check: the tokenizer keeps calling ``tokenizers``."""
    real = fast_mod._byte_level_bytes
    monkeypatch.setattr(fast_mod, "_byte_level_bytes", lambda piece: bytes((b + 1) % 256 for b in real(piece)))
    tok = _demo()
    assert tok.is_byte_level and not tok.decodes_by_table
    ids = tok.encode(TEXT)
    assert tok.raw_decode(ids) == TEXT == tok.backend_tokenizer.decode(ids, skip_special_tokens=False)


def test_ids_outside_32_bits_raise_as_tokenizers_does():
    tok = _demo()
    ref = _tokenizers(tok)
    ok = tok.encode("ok")
    for bad, exc in ([-1], OverflowError), ([2**32], OverflowError), ([2**70], OverflowError), ([1.5], TypeError):
        for skip in (False, True):
            with pytest.raises(exc):
                tok.raw_decode(ok + bad, skip)
            with pytest.raises(exc):
                ref.decode(ok + bad, skip_special_tokens=skip)
    # out-of-vocab ids are skipped, alone or not, before and after the tables hold the others
    for _ in range(2):
        assert tok.raw_decode([*ok, 2**32 - 1, 10**9, tok.vocab_size + 5]) == "ok"
        assert tok.raw_decode([tok.vocab_size]) == "" == tok.raw_decode([2**32 - 1], True)
        assert tok.raw_decode(ok[:1]) == ref.decode(ok[:1], skip_special_tokens=False)


def test_concurrent_lazy_fills_decode_alike():
    tok = _demo()
    ref = _tokenizers(tok)
    rng = random.Random(3)
    seqs = [_random_ids(tok, rng, 200) for _ in range(4)]
    want = [ref.decode(s, skip_special_tokens=True) for s in seqs]
    got: list = [None] * 8

    def run(k):
        got[k] = [tok.raw_decode(s, True) for s in seqs]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 8


@pytest.mark.parametrize("make", [_demo, _extra])
@pytest.mark.parametrize("skip,spaces", [(True, True), (False, True), (False, False)])
def test_step_text_equals_the_detokenizer(make, skip, spaces):
    """``detokenize.step_text`` (its one-id shortcut on table-decoding tokenizers) gives the
    text and the state the incremental detokenizer gives, id by id, from a prompt-primed start
    (split UTF-8 characters, added and special tokens, ids outside the vocabulary)."""
    from worker.core.detokenize import IncrementalDetokenizer, step_text
    tok = make()
    rng = random.Random(7)
    for _ in range(20):
        prompt = _random_ids(tok, rng, 4)
        ids = _random_ids(tok, rng, 60) + [tok.vocab_size + 3]
        a = IncrementalDetokenizer(tok, skip_special_tokens=skip, spaces_between_special_tokens=spaces,
                                   prompt_token_ids=prompt)
        state = a.state()
        for i in ids:
            want = a.add([i])
            got, state = step_text(tok, state, [i], skip, spaces)
            assert (got, state) == (want, a.state())
