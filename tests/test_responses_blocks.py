"""The non-streaming Responses view with logprobs stepped in blocks (issue 25 item 1,
``worker.core.responses.blocks``): byte-identical to the token-by-token reference, the
``response`` of a stream's terminal event for the whole output in one chunk (a stream with
logprobs steps token by token), over every parser example (reasoning, tools, pairings; cut at
random points and spliced into malformed markup), the parity corpus' models and outputs (Qwen3,
DeepSeek, Llama 3, Mistral SentencePiece and mistral-common), random Qwen3 + Hermes outputs
(markers, whitespace, split characters, stray ids), every logprob shape and finish; plus the
pieces: the block texts against the stepped detokenizer, the Responses logprob JSON against its
Structs, the fallbacks, and the step count of ``bench core``'s paths-pass body."""
from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from schemas import GenerateTokensStreamChoice, GenerateTokensStreamResponse, TokenLogprobIn
from schemas.responses import LOGPROBS_INCLUDE, DerenderResponsesRequest, ResponseLogprob, ResponseLogprobTop
from tests.harness.parsers import TOK_JSON, example_outputs, family_runtime
from tests.harness.responses import TOOLS, chat_corpus_outputs
from worker.bench.parsers import build_ids
from worker.config import ServedModelConfig
from worker.core.derender import ModelRuntime
from worker.core.detokenize import IncrementalDetokenizer
from worker.core.errors import BadRequest
from worker.core.logprobs import chat_logprobs, responses_logprobs_json
from worker.core.responses import blocks
from worker.core.responses import derender as rd
from worker.core.responses.derender import StreamBody, derender_responses, derender_responses_chunk
from worker.core.responses.log import memory_reader
from worker.parsers.examples import cases

_enc = msgspec.json.encode
QWEN3 = str(Path(TOK_JSON).parent)
SHAPES = ("plain", "plain", "odd", "nosampled", "dup", "norank", "shuffle")


def _logprobs(rng: random.Random, ids: list[int], k: int, vocab: int, shape: str) -> dict:
    """Engine logprobs of ``ids`` with ``k`` candidates each, in one of vLLM's shapes (sampled
    first, ranked) or an irregular one (sampled absent, duplicate ids, no ranks, shuffled; odd
    values: 0, below the floor)."""
    out = []
    for t in ids:
        lp = rng.choice([-0.1, -1.5, -20000.0, -0.0, -3.25]) if shape == "odd" else -round(rng.random() * 5, 3)
        cands = [t] + [rng.randrange(vocab) for _ in range(k - 1)] if k else []
        if shape == "nosampled":
            cands = [rng.randrange(vocab) for _ in range(k)]
        if shape == "dup" and k > 2:
            cands[2] = cands[1]
        tops = [{"token_id": c, "logprob": lp - j, **({} if shape == "norank" else {"rank": j + 1})}
                for j, c in enumerate(cands)]
        if shape == "shuffle":
            rng.shuffle(tops)
        out.append({"token_id": t, "logprob": lp, "top_logprobs": tops, **({} if shape == "norank" else {"rank": 1})})
    return {"content": out}


def _both(rt: ModelRuntime, prompt: list[int], ids: list[int], k: int | None, rng: random.Random,
          tools=None, tool_choice=None, finish: str = "stop", stop_reason=None, extra: dict | None = None
          ) -> tuple[bytes, bytes]:
    """``(non-streaming Response, the stream's terminal response)`` of one output, JSON."""
    choice = {"index": 0, "token_ids": ids, "finish_reason": finish, "stop_reason": stop_reason}
    req: dict = {"model": "m", "input": "x", **({"tools": tools} if tools else {}),
                 **({"tool_choice": tool_choice} if tool_choice is not None else {}), **(extra or {})}
    if k is not None:
        req.update(include=[LOGPROBS_INCLUDE], top_logprobs=k)
        choice["logprobs"] = _logprobs(rng, ids, k, min(rt.tokenizer.vocab_size, 150000), rng.choice(SHAPES))
    body = {"model": "m", "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
            "generate_response": {"request_id": "r-1", "choices": [choice]}, "responses_request": req}
    got = _enc(derender_responses(rt, msgspec.convert(body, DerenderResponsesRequest), 0))
    sb = StreamBody(model="m", generate_chunk=GenerateTokensStreamResponse(
        request_id="r-1", choices=[msgspec.convert(choice, GenerateTokensStreamChoice)]),
        prompt_token_ids=prompt, prompt_tokens=len(prompt), responses_request=msgspec.Raw(_enc(req)))
    events, _, _ = derender_responses_chunk(rt, sb, None, memory_reader(b""), 0)
    return got, _enc(events[-1].response)


@pytest.fixture
def plans(monkeypatch):
    """Counts of ``blocks.plan`` calls (``per_token`` ones), their fallbacks, parser steps."""
    n = {"plans": 0, "fallbacks": 0, "steps": 0, "per_token": 0}
    plan, feed = blocks.plan, blocks._Stepper.feed

    def counted(*a, **kw):
        n["plans"] += 1
        n["per_token"] += bool(a[6:7] and a[6])
        try:
            return plan(*a, **kw)
        except blocks.Fallback:
            n["fallbacks"] += 1
            raise

    def step(self, *a):
        n["steps"] += 1
        return feed(self, *a)

    monkeypatch.setattr(blocks, "plan", counted)
    monkeypatch.setattr(blocks._Stepper, "feed", step)
    return n


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_parser_examples(case, plans):
    """Every parser example, whole and cut at random points, padded short and long, spliced
    into malformed markup: the blocks give the token-by-token Response, without falling back."""
    rt = family_runtime(case)
    tok = rt.tokenizer
    rng = random.Random(case.name)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    extra = {"chat_template_kwargs": case.example.kwargs} if case.example.kwargs else None
    outputs = example_outputs(tok, case, rng)
    for ids in outputs:
        for tc in ([None, "none", "required", {"type": "function", "name": "get_weather"}] if case.tools else [None]):
            got, want = _both(rt, prompt, ids, rng.choice([0, 1, 3]), rng, TOOLS if case.tools else None, tc,
                              rng.choice(["stop", "length"]), ids[-1] if ids and rng.random() < 0.2 else None, extra)
            assert got == want, (ids, tc)
    assert plans["plans"] and not plans["fallbacks"]


@pytest.mark.parametrize("case", [c for c in cases() if c.kind == "tool"], ids=lambda c: c.name)
def test_incremental_arguments_step_token_by_token(case, plans):
    """With ``--tool-call-streaming incremental`` and tools on, a tool parser that streams
    arguments takes one-token blocks (``blocks.stepped``: call argument pieces are
    split-independent as JSON values only; on malformed markup, not even that): the same
    Response as the stream, spliced markup included; the others, and no tools, take blocks."""
    rt = family_runtime(case, "incremental")
    tok = rt.tokenizer
    rng = random.Random(case.name)
    base = build_ids(tok, case.example, 60)
    for _ in range(6):
        ids = base[:rng.randrange(len(base) + 1)] + base[rng.randrange(len(base)):]
        got, want = _both(rt, [], ids, 2, rng, TOOLS)
        assert got == want, ids
    assert plans["per_token"] == (6 if rt.stack.tool.incremental else 0)
    got, want = _both(rt, [], base, 2, rng)  # no tools: blocks
    assert got == want and plans["plans"] == 7 and plans["per_token"] in (0, 6) and not plans["fallbacks"]


def test_parity_corpus_outputs(plans):
    """The parity corpus' chat outputs on their own models (real tokenizers, SentencePiece and
    mistral-common ones stepped by the detokenizer) as Responses bodies with logprobs."""
    rng = random.Random(0)
    n = 0
    for case, rt, prompt, ids, tools, tc, extra in chat_corpus_outputs():
        fin = rng.choice([("stop", None), ("length", None), ("stop", ids[-1])])
        try:
            got, want = _both(rt, prompt, ids, rng.choice([0, 2, 5]), rng, tools, tc,
                              *fin, extra=extra)
        except BadRequest:  # (a case of a refused body: too long for its model)
            continue
        assert got == want, case["id"]
        n += 1
    assert n > 150 and not plans["fallbacks"]


_PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "\n\n", " ", "  ", "hello", " world", "🌤️",
           "😀", "東京", "天气", "{", "}", '"name"', ": ", '"get_weather"', ', "arguments": ', '{"city": "Paris"}',
           '{"name": "get_weather", "arguments": {"city": "P"}}', "<", "</", "<tool", "think>", "tool_call>",
           "<|im_end|>", "é", "\u00a0", "%", "%s", "\\", '"']


@pytest.fixture(scope="module")
def qwen3_rt() -> ModelRuntime:
    return ModelRuntime(ServedModelConfig(name="m", tokenizer=QWEN3, reasoning_parser="qwen3", tool_parser="hermes",
                                          enable_auto_tool_choice=True, max_logprobs=20))


def test_random_qwen3_outputs(qwen3_rt, plans):
    """Random Qwen3 + Hermes outputs: markers whole and in pieces, whitespace, characters split
    over ids and stray ids (invalid UTF-8: the detokenizer stepped), EOS, every tool choice,
    thinking off, no prompt."""
    rt = qwen3_rt
    tok = rt.tokenizer
    rng = random.Random(1)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    for _ in range(400):
        ids = tok.encode("".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 40))))
        if rng.random() < 0.2:
            ids += [rng.randrange(151000) for _ in range(rng.randrange(1, 5))]
        if rng.random() < 0.3:
            ids.append(tok.token_to_id("<|im_end|>"))
        tools = TOOLS if rng.random() < 0.8 else None
        tc = rng.choice([None, None, "none", "required", {"type": "function", "name": "get_weather"}]) if tools else None
        extra = {"chat_template_kwargs": {"enable_thinking": False}} if rng.random() < 0.2 else None
        got, want = _both(rt, rng.choice([prompt, prompt, [], prompt + tok.encode("<think>\n")]), ids,
                          rng.choice([0, 1, 3, 5]), rng, tools, tc, rng.choice(["stop", "length"]),
                          ids[-1] if rng.random() < 0.2 else None, extra)
        assert got == want, ids
    assert not plans["fallbacks"]


@pytest.mark.parametrize("streaming,most", [("whole", 16), ("incremental", 64)])
def test_bench_body_takes_a_few_steps(streaming, most, plans):
    """``bench core``'s paths-pass body (256 tokens: ~220 of reasoning, an answer, a Hermes
    call) takes a dozen parser steps, not 256 (with incremental call arguments: the reasoning
    in blocks, then one step per token), and gives the token-by-token Response."""
    from worker.bench.floor import build_bodies, path_body

    rt = ModelRuntime(ServedModelConfig(name="m", tokenizer=QWEN3, reasoning_parser="qwen3", tool_parser="hermes",
                                        enable_auto_tool_choice=True, max_logprobs=20, tool_call_streaming=streaming))
    body = msgspec.json.decode(path_body(build_bodies(rt.tokenizer, "m", 256, 1, top_logprobs=5)[0][0], "responses"))
    ch = body["generate_response"]["choices"][0]
    got, want = _both(rt, body["prompt_token_ids"], ch["token_ids"], 5, random.Random(0), TOOLS)
    assert got == want
    assert plans["plans"] == 1 and not plans["fallbacks"] and plans["steps"] <= most, plans
    out = msgspec.json.decode(got)["output"]
    assert [o["type"] for o in out] == ["reasoning", "message", "function_call"]
    assert 0 < len(out[1]["content"][0]["logprobs"]) < 16


def test_fallback_leaves_the_record_to_the_token_steps(qwen3_rt, plans, monkeypatch):
    """A split the check refuses (``blocks.Fallback``) leaves the state as it was: the record is
    stepped token by token, with the same Response."""
    def refuse(d, parts):
        raise blocks.Fallback

    monkeypatch.setattr(blocks, "_check", refuse)
    rng = random.Random(2)
    tok = qwen3_rt.tokenizer
    for text in ("<think>\nhm</think>\n\nHi there.\n<tool_call>\n"
                 '{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>', "Just text 😀 here."):
        ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
        got, want = _both(qwen3_rt, [], ids, 2, rng, TOOLS)
        assert got == want
    assert plans["fallbacks"] == 1  # (the plain text is one block: nothing to split)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek-v4"])
def test_block_texts_are_the_stepped_texts(name):
    """``blocks.texts(...).get(a, b)`` is the join of the detokenizer's one-id steps ``a`` to
    ``b - 1``, for every ``a <= b``: from the byte tables where they apply (characters split
    over ids held as stepping holds them), else from the steps."""
    from worker.core.tokenizer import load_tokenizer

    tok = load_tokenizer(str(Path(TOK_JSON).parents[1] / name))
    rng = random.Random(name)
    words = ["😀", "🌤️", " 東京", "天气", " ñ", " a", "\n", " the", "%"]
    bytes_paths = 0
    for _ in range(60):
        ids = tok.encode("".join(rng.choice(words) for _ in range(rng.randrange(1, 12))))
        if rng.random() < 0.3:  # split characters at odd places, special ids
            ids = [rng.choice(ids) for _ in range(len(ids))] + sorted(tok.added_token_ids)[:2]
        prompt = tok.encode("hi there") if rng.random() < 0.7 else None
        for skip in (True, False):
            st = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt).state()
            d = IncrementalDetokenizer(tok, skip_special_tokens=skip, state=st)
            steps = [d.add([t]) for t in ids]
            t = blocks.texts(tok, skip, ids, st, prompt)
            bytes_paths += type(t) is blocks._ByteTexts
            for a in range(len(ids) + 1):
                for b in range(a, len(ids) + 1):
                    assert t.get(a, b) == "".join(steps[a:b]), (ids, a, b)
    assert bytes_paths > 40


def test_responses_logprobs_json_is_the_structs():
    """``responses_logprobs_json`` gives the bytes of the ``ResponseLogprob`` Structs of
    ``chat_logprobs``' values (what the token steps build): added tokens in the context, U+FFFD
    pieces, ``%`` in token text, irregular candidate lists, logprobs below the floor."""
    from worker.core.tokenizer import load_tokenizer

    tok = load_tokenizer(QWEN3)
    rng = random.Random(3)
    pool = tok.encode("🌤️😀東京天气 预报 ok%s %d \"q\" \\") + sorted(tok.added_token_ids)[:5]
    for _ in range(600):
        k = rng.choice([0, 1, 2, 5, 20])
        ents = []
        for _ in range(rng.choice([1, 2, 3, 8, 9, 40])):
            t = rng.choice(pool + [rng.randrange(151000)])
            m = rng.choice([0, k, k, max(k - 1, 0), k + 2])
            tops = [{"token_id": t if j == 0 and rng.random() < .8 else rng.choice(pool + [rng.randrange(151000)]),
                     "logprob": -rng.random() * 3 - j, "rank": j + 1 if rng.random() < .95 else None} for j in range(m)]
            ents.append(msgspec.convert({"token_id": t, "logprob": rng.choice([-rng.random(), -1e5, 0.0]),
                                         "top_logprobs": tops}, TokenLogprobIn))
        ctx = [rng.choice(pool) for _ in range(rng.randrange(6))]
        ids = rng.random() < 0.05
        want = _enc([ResponseLogprob(token=e.token, bytes=e.bytes or [], logprob=e.logprob,
                                     top_logprobs=[ResponseLogprobTop(token=x.token, bytes=x.bytes or [],
                                                                      logprob=x.logprob) for x in e.top_logprobs])
                     for e in chat_logprobs(tok, ents, k, ctx, as_token_ids=ids)])
        assert responses_logprobs_json(tok, ents, k, ctx, as_token_ids=ids) == want


def test_runs():
    assert rd._runs([3]) == [(3, 4)]
    assert rd._runs([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 7), (9, 10)]
