"""The non-logprob hot path of issue 13 items 1-2: each shortcut against the rule it replaces.

* reasoning-token counts by bounded marker searches (``ThinkReasoningParser._count``) equal a
  token-by-token stepping of the id-level rule, for every think-style family, any state, any
  marker placement;
* token ids bounded inside the one msgspec decode (``service._bounded_body_decoders``): a body
  with an id outside the vocabulary gets exactly the reply of the probe path (status, message,
  request id), and valid bodies the same reply with or without the bounded decoders.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.harness.parsers import reference_reasoning_count as _reference_count
from worker.config import ServedModelConfig
from worker.core.service import DerenderService
from worker.core.tokenizers import load_tokenizer
from worker.parsers import make_reasoning_parser
from worker.parsers.registry import REASONING_PARSERS
from worker.parsers.think import ThinkReasoningParser, ThinkState

TOKDIR = Path(__file__).parent / "data" / "tokenizers"


def _think_parsers():
    tok = load_tokenizer(str(TOKDIR / "qwen3"), "auto")
    out = []
    for name, cls in sorted(REASONING_PARSERS.items()):
        if not issubclass(cls, ThinkReasoningParser) or cls._count is not ThinkReasoningParser._count:
            continue
        p = make_reasoning_parser(name, tok)
        if p._marker_ids:
            out.append((name, p))
    return out


THINK = _think_parsers()



@pytest.mark.parametrize("name,p", THINK, ids=[n for n, _ in THINK])
def test_reasoning_count_equals_token_stepping(name, p):
    assert THINK, "no think-style reasoning parser found"
    rng = random.Random(name)
    markers = sorted(p._marker_ids)
    plain = [9707, 11, 1879, 13, 220, 198]
    for trial in range(400):
        size = rng.choice([0, 1, 2, 5, 17, 64, 300])
        dense = rng.random()
        ids = [rng.choice(markers) if rng.random() < dense * 0.3 else rng.choice(plain) for _ in range(size)]
        r0, e0 = rng.random() < 0.5, rng.random() < 0.5
        st = ThinkState(tok_reasoning=r0, tok_explicit=e0)
        got = p._count(st, ids)
        want = _reference_count(p, r0, e0, ids)
        assert (got, st.tok_reasoning, st.tok_explicit) == want, (trial, ids, r0, e0)


def _svc(**kw) -> DerenderService:
    return DerenderService([ServedModelConfig(name="m", tokenizer=str(TOKDIR / "qwen3"), reasoning_parser="qwen3",
                                              tool_parser="hermes", enable_auto_tool_choice=True, **kw)])


def _bodies(vocab: int) -> list[dict]:
    ok = [9707, 11, 1879]
    out = []
    for bad in (-1, vocab, vocab + 5, 2**40, -(2**63)):
        out += [
            {"model": "m", "generate_response": {"request_id": "a", "choices": [{"token_ids": [*ok, bad]}]},
             "chat_request": {}},
            {"model": "m", "prompt_token_ids": [1, bad], "prompt_tokens": 2,
             "generate_response": {"request_id": "b", "choices": [{"token_ids": ok}]}, "chat_request": {}},
            {"model": "m", "generate_response": {"request_id": "c", "prompt_token_ids": [bad],
                                                 "choices": [{"token_ids": ok}]}, "chat_request": {}},
            {"model": "m", "generate_response": {"request_id": "d", "choices": [{"index": 0, "token_ids": ok},
                                                                                {"index": 0, "token_ids": [bad]}]},
             "chat_request": {"n": 2}},
            {"model": "m", "generate_responses": [{"request_id": "e", "choices": [{"token_ids": [bad]}]}]},
            {"model": "m", "prompt_token_ids": [[bad]], "generate_responses": [{"request_id": "f",
                                                                               "choices": [{"token_ids": ok}]}]},
            {"model": "m", "generate_responses": [{"request_id": "g", "prompt_token_ids": [bad],
                                                   "choices": [{"token_ids": ok}]}]},
            # Responses bodies (issue 25: bounded in their one decode too)
            {"model": "m", "generate_response": {"request_id": "r1", "choices": [{"token_ids": [*ok, bad]}]},
             "responses_request": {}},
            {"model": "m", "prompt_token_ids": [1, bad], "prompt_tokens": 2,
             "generate_response": {"request_id": "r2", "choices": [{"token_ids": ok}]}, "responses_request": {}},
            {"model": "m", "generate_response": {"request_id": "r3", "prompt_token_ids": [bad],
                                                 "choices": [{"token_ids": ok}]}, "responses_request": {}},
            {"model": "m", "generate_response": {"request_id": "r4", "choices": [{"token_ids": ok, "logprobs": {
                "content": [{"token_id": t, "logprob": -1.0, "top_logprobs": [
                    {"token_id": bad if t == ok[1] else t, "logprob": -2.0}]} for t in ok]}}]},
             "responses_request": {"include": ["message.output_text.logprobs"], "top_logprobs": 1}},
        ]
    out.append({"model": "m", "generate_response": {"request_id": "h", "choices": [{"token_ids": ok}]},
                "chat_request": {}})
    out.append({"model": "m", "generate_responses": [{"request_id": "i", "choices": [{"token_ids": ok}]}]})
    out.append({"model": "m", "generate_response": {"request_id": "j", "choices": [{"token_ids": ok, "logprobs": {
        "content": [{"token_id": t, "logprob": -1.0, "top_logprobs": [{"token_id": t, "logprob": -1.0}]}
                    for t in ok]}}]},
                "responses_request": {"include": ["message.output_text.logprobs"], "top_logprobs": 1}})
    return out


def test_bounded_decode_keeps_every_reply(monkeypatch):
    """Ids bounded in the one decode: the same reply bytes as the unbounded decode (which is
    what the previous release ran) for out-of-vocabulary ids in every id field, and for valid
    bodies."""
    import worker.core.service as service

    fast = _svc()
    fast.preload()
    vocab = fast.runtime("m").tokenizer.vocab_size
    assert fast._one[0] == vocab
    slow = _svc()
    slow.preload()
    slow._one = (None, service._UNBOUNDED)
    statuses = set()
    for body in _bodies(vocab):
        raw = json.dumps(body).encode()
        a, b = fast.derender(raw), slow.derender(raw)
        assert (a.status, a.body, a.request_id, a.kind) == (b.status, b.body, b.request_id, b.kind), body
        statuses.add(a.status)
    assert statuses == {200, 400}


def test_bounded_decode_with_two_vocabularies():
    """Two served models with different vocabularies: the one decode is bounded by the larger
    one and the smaller model still checks its own bound (same message as without bounds)."""
    cfg = [ServedModelConfig(name="big", tokenizer=str(TOKDIR / "qwen3")),
           ServedModelConfig(name="small", tokenizer=str(TOKDIR / "llama3"))]
    svc = DerenderService(cfg)
    svc.preload()
    small = svc.runtime("small").tokenizer.vocab_size
    big = svc.runtime("big").tokenizer.vocab_size
    assert small < big and svc._one[0] == big
    body = {"model": "small", "generate_response": {"request_id": "r", "choices": [{"token_ids": [1, small]}]}}
    res = svc.derender(json.dumps(body).encode())
    assert res.status == 400
    assert f"token id {small} in choice 0 is outside the vocabulary [0, {small})" in res.body.decode()
    body["model"] = "big"
    assert svc.derender(json.dumps(body).encode()).status == 200
    rbody = {"model": "small", "generate_response": {"request_id": "r", "choices": [{"token_ids": [1, small]}]},
             "responses_request": {}}
    res = svc.derender(json.dumps(rbody).encode(), "responses")
    assert res.status == 400
    assert f"token id {small} in choice 0 is outside the vocabulary [0, {small})" in res.body.decode()
    rbody["model"] = "big"
    assert svc.derender(json.dumps(rbody).encode(), "responses").status == 200


def _reference_tail(special: frozenset[int], prompt: list[int], skip: bool) -> list[int]:
    """The prompt tail rule stepped one id at a time (``detokenize._prompt_tail``'s docstring)."""
    n = len(prompt)
    if n <= 6:
        return list(prompt)
    start = n - 6
    nonspecial = sum(1 for i in prompt[start:] if i not in special or not skip)
    while start > 0 and n - start < 64 and nonspecial < 2:
        start -= 1
        if prompt[start] not in special or not skip:
            nonspecial += 1
    return prompt[start:]


def test_prompt_tail_by_slicing_equals_stepping():
    from worker.core.detokenize import _prompt_tail

    tok = load_tokenizer(str(TOKDIR / "qwen3"), "auto")
    special = sorted(tok.special_ids)
    rng = random.Random(13)
    for _ in range(3000):
        size = rng.choice([0, 1, 5, 6, 7, 8, 20, 63, 64, 65, 70, 200])
        dense = rng.random()
        prompt = [rng.choice(special) if rng.random() < dense else rng.randrange(1000) for _ in range(size)]
        for skip in (True, False):
            got = _prompt_tail(tok, prompt, skip)
            assert got == _reference_tail(tok.special_ids, prompt, skip), (prompt, skip)
            assert got is not prompt


def test_window_text_cache_is_bounded_and_exact(monkeypatch):
    """The prompt-tail window's text comes from a FIFO-bounded cache keyed by tokenizer, skip
    flag and ids; it equals the decode, and eviction keeps it within its bound."""
    from worker.core import detokenize as dt

    tok = load_tokenizer(str(TOKDIR / "qwen3"), "auto")
    monkeypatch.setattr(dt, "_WINDOW_TEXT", {})
    monkeypatch.setattr(dt, "_WINDOW_TEXT_MAX", 8)
    rng = random.Random(5)
    for _ in range(200):
        ids = [rng.randrange(151700) for _ in range(rng.randrange(1, 8))]
        skip = rng.random() < 0.5
        assert dt._window_text(tok, ids, skip) == tok.raw_decode(ids, skip)
        assert dt._window_text(tok, ids, skip) == tok.raw_decode(ids, skip)
        assert len(dt._WINDOW_TEXT) <= 8


def _reference_scan(s: str, i: int, end: int, ins: bool, esc: bool, depth: int, clamp: bool) -> tuple:
    """RFC 8259 lexing one character at a time (``jsonlex.scan_json``'s rule, no stop)."""
    while i < end:
        c = s[i]
        i += 1
        if ins:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                ins = False
        elif c == '"':
            ins = True
        elif c in "{[":
            depth += 1
        elif c in "}]" and (depth > 0 or not clamp):
            depth -= 1
    return i, ins, esc, depth, False


def test_json_scan_by_spans_equals_character_stepping():
    from worker.parsers.jsonlex import scan_json

    rng = random.Random(7)
    alphabet = '{}[]"\\\\ab\n:,'
    for _ in range(20000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        i = rng.randrange(0, len(s) + 1)
        end = rng.randrange(i, len(s) + 1)
        ins, esc = rng.random() < 0.3, False
        esc = ins and rng.random() < 0.3
        depth, clamp = rng.randrange(0, 3), rng.random() < 0.7
        got = scan_json(s, i, end, ins, esc, depth, clamp=clamp)
        assert got == _reference_scan(s, i, end, ins, esc, depth, clamp), (s, i, end, ins, esc, depth, clamp)
    # resumable: any cut gives the state of one pass
    s = '{"name": "f", "arguments": {"q": "a \\\\"}\\" [x]", "n": [1, {"k": "}"}]}}'
    whole = scan_json(s, 0, len(s), False, False, 0)
    for cut in range(len(s) + 1):
        a = scan_json(s, 0, cut, False, False, 0)
        assert scan_json(s, a[0], len(s), a[1], a[2], a[3]) == whole
    assert whole[1:4] == (False, False, 0)


def test_json_scan_of_a_long_open_string_is_linear():
    """A call body whose string never closes (many escaped quotes) is lexed in C-level passes:
    twice the text costs about twice, not four times (counted in regex work, not timed)."""
    from worker.parsers import jsonlex

    body = '{"name": "w", "arguments": {"text": "' + 'a\\"b ' * 20000
    got = jsonlex.scan_json(body, 0, len(body), False, False, 0)
    assert got == _reference_scan(body, 0, len(body), False, False, 0, True)


@pytest.mark.parametrize("name,p", THINK, ids=[n for n, _ in THINK])
def test_prompt_mode_by_searches_equals_stepping(name, p):
    """``prompt_mode`` (C-level searches over a reversed window, the whole prompt when the
    window does not decide) equals stepping the prompt from its end."""
    rng = random.Random("prompt" + name)
    markers = sorted(p.start_ids | p.end_ids | ({p.turn_id} if p.turn_id is not None else set()))
    modes = set()
    for _ in range(600):
        size = rng.choice([0, 1, 3, 40, 255, 256, 257, 600])
        dense = rng.random() * 0.05
        prompt = [rng.choice(markers) if rng.random() < dense else rng.randrange(1000) for _ in range(size)]
        # a marker (or none) in the last 256 ids, the other markers before them
        tail = [rng.randrange(1000) for _ in range(rng.choice([250, 256, 300]))]
        if rng.random() < 0.7:
            tail[rng.randrange(len(tail))] = rng.choice(sorted(p.start_ids | p.end_ids))
        for ids in (prompt, prompt + tail):
            want = p._prompt_mode_stepped(ids) if ids else None
            assert p.prompt_mode(ids) == want, ids
            modes.add(want)
    assert modes == {None, "content", "reasoning"}


def test_bounded_messages_decode_keeps_every_reply(monkeypatch):
    """Messages bodies: ids bounded in their decode (``messages.service._bounded_decoder``) give
    the replies of the unbounded decode and its checks (the previous release) for out-of-vocabulary
    ids in every id field, and for valid bodies."""
    import msgspec

    import worker.core.messages.service as ms

    svc = _svc()
    svc.preload()
    vocab = svc.runtime("m").tokenizer.vocab_size
    ok = [9707, 11, 1879]
    req = {"model": "m", "max_tokens": 16, "messages": []}
    bodies = [{"model": "m", "generate_response": {"request_id": "k", "choices": [{"token_ids": ok}]},
               "messages_request": req}]
    for bad in (-1, vocab, vocab + 5, 2**40, -(2**63)):
        bodies += [
            {"model": "m", "generate_response": {"request_id": "m1", "choices": [{"token_ids": [*ok, bad]}]},
             "messages_request": req},
            {"model": "m", "prompt_token_ids": [1, bad], "prompt_tokens": 2,
             "generate_response": {"request_id": "m2", "choices": [{"token_ids": ok}]}, "messages_request": req},
            {"model": "m", "generate_response": {"request_id": "m3", "prompt_token_ids": [bad],
                                                 "choices": [{"token_ids": ok}]}, "messages_request": req},
        ]
    bounded = [svc.derender(json.dumps(b).encode()) for b in bodies]

    class _Refuses:
        def decode(self, _body):
            raise msgspec.ValidationError("unbounded")

    monkeypatch.setattr(ms, "_bounded_decoder", lambda _vocab: _Refuses())
    statuses = set()
    for body, a in zip(bodies, bounded):
        b = svc.derender(json.dumps(body).encode())
        assert (a.status, a.body, a.request_id, a.kind) == (b.status, b.body, b.request_id, b.kind), body
        statuses.add(a.status)
    assert statuses == {200, 400}
