"""Detokenization and logprob parity with coupled vLLM, on real tokenizers.

Data: ``tests/data/tokenizers/<name>/`` (copies of the parity tokenizer dirs) and
``tests/data/detok_cases.jsonl`` (the parity corpus fields these tests need: tokenizer, request
flags, prompt ids as sent, engine choices, and the expected non-stream choices).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

import schemas
from worker.core.detokenize import (
    DetokState,
    IncrementalDetokenizer,
    detokenize_output,
    stop_token_trimmed,
)
from worker.core.logprobs import chat_logprobs, completion_logprobs, next_context
from worker.core.tokenizer import load_tokenizer

DATA = Path(__file__).parent / "data"
TOKDIR = DATA / "tokenizers"
CASES = [json.loads(line) for line in (DATA / "detok_cases.jsonl").read_text(encoding="utf-8").splitlines()
         if line.strip()]


def _needs(mode: str):
    if mode == "mistral":
        pytest.importorskip("sentencepiece", reason="mistral-common SentencePiece needs sentencepiece")


def _tok(case):
    _needs(case["tokenizer_mode"])
    return load_tokenizer(str(TOKDIR / case["tokenizer"]), case["tokenizer_mode"])


def _flags(case):
    r = case["request"]
    return dict(
        skip_special_tokens=True if r.get("skip_special_tokens") is None else r["skip_special_tokens"],
        spaces_between_special_tokens=True if r.get("spaces_between_special_tokens") is None
        else r["spaces_between_special_tokens"],
    )


def _prompt(case, ch):
    p = case["prompt_token_ids"]
    if p is not None and case["endpoint"] == "completion":
        p = p[ch.get("prompt_index") or 0]
    return p


def _text_case(case) -> bool:
    """Cases whose text is pure detokenization: no parser, every completion, and the plain /
    non-ASCII cases of parser models (compared as reasoning + content, think tags removed)."""
    if case["endpoint"] == "completion":
        return True
    if not case["reasoning_parser"] and not case["tool_parser"]:
        return True
    return ("-plain-" in case["id"] or "-nonascii-" in case["id"]) and not case["request"].get("tools")


def _expected_text(case, exp) -> str:
    if case["endpoint"] == "completion":
        return exp["text"]
    msg = exp["message"]
    return (msg.get("reasoning") or "") + (msg.get("content") or "")


def _pairs(pred):
    for case in CASES:
        if not pred(case):
            continue
        for n, (ch, exp) in enumerate(zip(case["choices"], case["expected_choices"], strict=False)):
            yield pytest.param(case, ch, exp, id=f"{case['id']}#{n}")


TEXT_PAIRS = list(_pairs(_text_case))
LOGPROB_PAIRS = [p for p in _pairs(lambda c: True) if p.values[2].get("logprobs")]


def _output_text(case, ch, tok):
    return detokenize_output(
        tok, ch["token_ids"], prompt_token_ids=_prompt(case, ch), finish_reason=ch["finish_reason"],
        stop_reason=ch["stop_reason"], include_stop_str_in_output=bool(case["request"].get("include_stop_str_in_output")),
        **_flags(case))


@pytest.mark.parametrize("case,ch,exp", TEXT_PAIRS)
def test_corpus_text(case, ch, exp):
    tok = _tok(case)
    text = _output_text(case, ch, tok)
    want = _expected_text(case, exp)
    if case["endpoint"] == "chat" and case["reasoning_parser"]:
        text = text.replace("<think>", "").replace("</think>", "")
        assert text.strip() == want.strip()
    else:
        assert text == want


@pytest.mark.parametrize("case,ch,exp", LOGPROB_PAIRS)
def test_corpus_logprobs(case, ch, exp):
    tok = _tok(case)
    entries = msgspec.convert(ch["logprobs"]["content"], list[schemas.TokenLogprobIn])
    r = case["request"]
    if case["endpoint"] == "chat":
        got = msgspec.to_builtins(chat_logprobs(tok, entries, r.get("top_logprobs") or 0))
        assert got == exp["logprobs"]["content"]
        # chunked with carried context gives the same
        out, ctx = [], []
        for i in range(0, len(entries), 3):
            part = entries[i:i + 3]
            out += msgspec.to_builtins(chat_logprobs(tok, part, r.get("top_logprobs") or 0, context_token_ids=ctx))
            ctx = next_context(ctx, [e.token_id for e in part])
        assert out == got
    else:
        got = msgspec.to_builtins(completion_logprobs(tok, entries, r.get("logprobs") or 0))
        assert got == exp["logprobs"]


def _split_add(tok, case, ch, sizes, roundtrip=False):
    flags = _flags(case)
    ids = stop_token_trimmed(ch["token_ids"], ch["finish_reason"], ch["stop_reason"], tok.eos_token_ids,
                             bool(case["request"].get("include_stop_str_in_output")))
    d = IncrementalDetokenizer(tok, prompt_token_ids=_prompt(case, ch), **flags)
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(d.add(ids[i:i + n]))
        i += n
        k += 1
        if roundtrip:
            st = msgspec.json.decode(msgspec.json.encode(d.state()), type=DetokState)
            d = IncrementalDetokenizer(tok, state=st, **flags)
    return "".join(out)


@pytest.mark.parametrize("case,ch,exp", TEXT_PAIRS)
def test_incremental_splits_and_state_roundtrip(case, ch, exp):
    tok = _tok(case)
    whole = _output_text(case, ch, tok)
    assert _split_add(tok, case, ch, [1]) == whole
    assert _split_add(tok, case, ch, [3]) == whole
    assert _split_add(tok, case, ch, [2, 1, 3], roundtrip=True) == whole


def test_state_is_bounded():
    tok = load_tokenizer(str(TOKDIR / "qwen3"))
    ids = tok.backend_tokenizer.encode("Hello world, this is a long text. " * 100).ids
    d = IncrementalDetokenizer(tok, prompt_token_ids=[151644, 77091, 198])
    for t in ids:
        d.add([t])
        assert len(d.state().ids) <= 8


@pytest.mark.parametrize("name", ["qwen3", "mistral-7b-v0.3", "llama3", "deepseek-v4"])
@pytest.mark.parametrize("skip", [True, False])
def test_matches_tokenizers_decode_stream(name, skip):
    """Randomised: our bounded emulation equals tokenizers' DecodeStream primed with the whole
    prompt (what vLLM's FastIncrementalDetokenizer runs), incl. byte pieces and special ids."""
    from tokenizers.decoders import DecodeStream
    tok = load_tokenizer(str(TOKDIR / name), "deepseek_v4" if name == "deepseek-v4" else "auto")
    rng = random.Random(f"{name}-{skip}")
    text = "Héllo wörld 你好，世界！🌞🎉 naïve “quotes” — ok.\n  x = 1  # code"
    base = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    specials = sorted(tok.special_ids)[:5] + sorted(tok.added_token_ids)[-3:]
    for _trial in range(30):
        prompt = [rng.randrange(0, min(tok.vocab_size, 30000)) for _ in range(rng.randrange(0, 12))]
        prompt += rng.sample(specials, 2) + base[: rng.randrange(0, 6)]
        out_ids = []
        for _ in range(40):
            r = rng.random()
            if r < 0.6:
                out_ids.append(base[rng.randrange(len(base))])
            elif r < 0.75:
                out_ids.append(rng.choice(specials))
            else:
                out_ids.append(rng.randrange(0, min(tok.vocab_size, 1000)))
        ds = DecodeStream(ids=prompt, skip_special_tokens=skip) if prompt else DecodeStream(skip_special_tokens=skip)
        want = []
        for t in out_ids:
            try:
                want.append(ds.step(tok.backend_tokenizer, t) or "")
            except Exception as e:  # InvalidPrefix: vLLM resets the stream
                assert "Invalid prefix" in str(e)
                ds = DecodeStream(skip_special_tokens=skip)
                want.append(ds.step(tok.backend_tokenizer, t) or "")
        d = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt or None)
        got = [d.add([t]) for t in out_ids]
        assert got == want, (prompt, out_ids)


def test_stop_token_trimmed():
    eos = frozenset({151645, 151643})
    assert stop_token_trimmed([1, 2, 151645], "stop", None, eos) == [1, 2]
    assert stop_token_trimmed([1, 2, 151645], "stop", None, eos, include_stop_str_in_output=True) == [1, 2, 151645]
    assert stop_token_trimmed([1, 2, 7], "stop", 7, eos) == [1, 2]
    assert stop_token_trimmed([1, 2, 7], "stop", None, eos) == [1, 2, 7]
    assert stop_token_trimmed([1, 2, 151645], "length", None, eos) == [1, 2, 151645]
    assert stop_token_trimmed([1, 2, 151645], "stop", "</s>", eos) == [1, 2, 151645]


def test_tokenizer_api():
    q = load_tokenizer(str(TOKDIR / "qwen3"))
    assert q.eos_token_ids == frozenset({151645, 151643})
    assert q.token_to_id("<think>") == 151667
    assert q.vocab_size == 151669
    assert 151645 in q.special_ids and 151667 not in q.special_ids
    assert q.convert_ids_to_tokens([151667, 9707]) == ["<think>", "Hello"]
    assert q.decode([9707, 151645]) == "Hello" and q.decode([9707, 151645], False) == "Hello<|im_end|>"
    assert load_tokenizer(str(TOKDIR / "qwen3")) is q
    ll = load_tokenizer(str(TOKDIR / "llama3"))
    assert ll.eos_token_ids == frozenset({128001, 128008, 128009})
    with pytest.raises(ValueError):
        load_tokenizer(str(DATA / "no-such-dir"))
    with pytest.raises(ValueError):
        load_tokenizer(str(TOKDIR / "qwen3"), "bogus")


