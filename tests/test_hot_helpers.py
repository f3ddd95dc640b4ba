"""The hot-path helpers that replaced slower equivalents (issue 13, the Python around the decode)
give exactly what they replaced:

* ``base.partial_suffix_len`` / ``find_first`` / ``hold_back`` against their plain definitions
  (one slice per suffix length, a loop over every marker), on random texts and markers;
* ``base.dumps_non_ascii`` against ``json.dumps(ensure_ascii=False)`` and ``base.json_loads``
  against ``json.loads`` (value, or a ``ValueError`` for the same texts);
* ``detokenize._whole_text`` against ``IncrementalDetokenizer(...).whole_output`` on the demo
  Qwen3 tokenizer (prompts ending inside a character, special tokens kept or skipped, spaces
  between special tokens off), and ``detokenize_with_stop`` against stepping the ids.
"""
from __future__ import annotations

import json
import random

import pytest

from worker.bench.floor import DEMO_TOKENIZER
from worker.core.detokenize import IncrementalDetokenizer, _whole_text, detokenize_with_stop
from worker.core.tokenizers import load_tokenizer
from worker.parsers.base import dumps_non_ascii, find_first, hold_back, json_loads, partial_suffix_len


def _ref_partial(text: str, marker: str) -> int:
    n = min(len(text), len(marker) - 1)
    while n > 0:
        if marker.startswith(text[-n:]):
            return n
        n -= 1
    return 0


def _ref_find_first(text: str, markers: tuple[str, ...], start: int = 0):
    best, which = -1, None
    for m in markers:
        i = text.find(m, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(m) > len(which or ""))):
            best, which = i, m
    return best, which


def test_marker_helpers_match_their_definitions():
    rng = random.Random(13)
    alphabet = "<</ab>\n"
    for _ in range(20000):
        markers = tuple("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 7)))
                        for _ in range(rng.randrange(1, 4)))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        start = rng.randrange(0, len(text) + 2)
        for m in markers:
            assert partial_suffix_len(text, m) == _ref_partial(text, m), (text, m)
        assert hold_back(text, markers) == max(_ref_partial(text, m) for m in markers), (text, markers)
        assert find_first(text, markers, start) == _ref_find_first(text, markers, start), (text, markers, start)
    assert hold_back("abc", ()) == 0


@pytest.mark.parametrize("value", [
    {"city": "Paris", "unit": "c"}, {"é": "日本\u2028", "q": "\"\\/\n\t\x00"}, [1, -2, 2.5, 1e300, 1e-7, None, True],
    {"nested": {"a": [{"b": []}, {}]}}, {"inf": float("inf"), "nan": float("nan"), "ninf": float("-inf")},
    {1: "int key", None: "null key", 2.5: "float key"}, {True: "bool key", False: "other bool key"}, "plain string", 7, None, [],
    {"big": 10 ** 40},
])
def test_dumps_non_ascii_is_json_dumps(value):
    assert dumps_non_ascii(value) == json.dumps(value, ensure_ascii=False)


def test_dumps_non_ascii_refuses_what_json_dumps_refuses():
    for bad in ({"x": object()}, {(1, 2): 3}):
        with pytest.raises(TypeError):
            json.dumps(bad, ensure_ascii=False)
        with pytest.raises(TypeError):
            dumps_non_ascii(bad)


@pytest.mark.parametrize("text", ['{"name": "f", "arguments": {"a": 1}}', " [1, 2] ", "NaN", '"x"', "\ufeff{}",
                                  "{} extra", "", "{", '{"a": 1,}', "1e999"])
def test_json_loads_is_json_loads(text):
    try:
        want = ("ok", json.loads(text))
    except ValueError:
        want = ("ValueError", None)
    try:
        got = ("ok", json_loads(text))
    except ValueError:
        got = ("ValueError", None)
    assert repr(got) == repr(want)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(DEMO_TOKENIZER), "auto")


def _cases(tok):
    enc = tok.encode
    emoji = enc(" weather 🌤️ 東京")
    prompt = enc("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    out = enc("<think>\nplan 天气 🌤️\n</think>\n\nAnswer: ok") + [tok.token_to_id("<|im_end|>")]
    # a prompt ending inside a multi-byte character (its first bytes only), an output finishing it
    split = next((i for i in range(1, len(emoji)) if tok.decode(emoji[:i]).endswith("\ufffd")), None)
    cases = [(prompt, out), (None, out), ([], out), (prompt[:3], out), (prompt, []), (prompt, emoji)]
    if split is not None:
        cases.append((prompt + emoji[:split], emoji[split:] + out))
    return cases


def test_whole_text_is_whole_output(tok):
    for prompt, out in _cases(tok):
        for skip in (True, False):
            for spaces in (True, False):
                d = IncrementalDetokenizer(tok, skip_special_tokens=skip, spaces_between_special_tokens=spaces,
                                           prompt_token_ids=prompt)
                assert _whole_text(tok, out, skip, spaces, prompt) == d.whole_output(out), (prompt, out, skip, spaces)


def test_detokenize_with_stop_is_stepping(tok):
    for prompt, out in _cases(tok):
        for skip in (True, False):
            for spaces in (True, False):
                kw = dict(skip_special_tokens=skip, spaces_between_special_tokens=spaces, prompt_token_ids=prompt)
                stepped = IncrementalDetokenizer(tok, **kw).add(out)
                assert detokenize_with_stop(tok, out, (), **kw) == (stepped, len(out), None)
