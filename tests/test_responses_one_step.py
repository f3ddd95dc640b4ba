"""The non-streaming Response without logprobs built from its one parser step
(``worker.core.responses.onestep``, issue 25 item 2) against the event builder it replaces
(``derender_responses(one_step=False)``) and against a stream's terminal response for the whole
output in one chunk: every parser example (whole, cut, spliced into malformed markup; both
``--tool-call-streaming`` modes; every tool choice), the parity corpus' outputs on their own
models, random Qwen3 + Hermes outputs (markers in and out of place, stray ids, stop strings,
``skip_special_tokens`` off, thinking off), every finish; the same Response bytes, and the one
step is taken wherever its parsers allow (``onestep.response`` refuses logprobs and the shaped
or engine-cut tool parsers)."""
from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from schemas import GenerateTokensStreamChoice, GenerateTokensStreamResponse
from schemas.responses import LOGPROBS_INCLUDE, DerenderResponsesRequest, FunctionCallItem, ResponseObject
from tests.harness.parsers import TOK_JSON, example_outputs, family_runtime
from tests.harness.responses import TOOLS, chat_corpus_outputs
from worker.config import ServedModelConfig
from worker.core.derender import ModelRuntime
from worker.core.errors import BadRequest
from worker.core.responses import argshape, onestep
from worker.core.responses.derender import StreamBody, derender_responses, derender_responses_chunk
from worker.core.responses.log import memory_reader
from worker.parsers.examples import cases

_enc = msgspec.json.encode
QWEN3 = str(Path(TOK_JSON).parent)
CHOICES = [None, "none", "auto", "required", {"type": "function", "name": "get_weather"}]


@pytest.fixture
def taken(monkeypatch):
    """Counts of ``onestep.response`` calls and of the Responses it built."""
    n = {"calls": 0, "built": 0}
    real = onestep.response

    def counted(*a, **kw):
        n["calls"] += 1
        r = real(*a, **kw)
        n["built"] += r is not None
        return r

    monkeypatch.setattr(onestep, "response", counted)
    return n


def _three(rt: ModelRuntime, prompt: list[int], ids: list[int], tools=None, tool_choice=None, finish: str = "stop",
           stop_reason=None, extra: dict | None = None, stream_too: bool = True) -> tuple[bytes, bytes, bytes | None]:
    """``(one step, builder, the stream's terminal response)`` of one output, JSON."""
    choice = {"index": 0, "token_ids": ids, "finish_reason": finish, "stop_reason": stop_reason}
    req: dict = {"model": "m", "input": "x", **({"tools": tools} if tools else {}),
                 **({"tool_choice": tool_choice} if tool_choice is not None else {}), **(extra or {})}
    body = {"model": "m", "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
            "generate_response": {"request_id": "r-1", "choices": [choice]}, "responses_request": req}
    typed = msgspec.convert(body, DerenderResponsesRequest)
    fast = _enc(derender_responses(rt, typed, 7))
    slow = _enc(derender_responses(rt, msgspec.convert(body, DerenderResponsesRequest), 7, one_step=False))
    if not stream_too:
        return fast, slow, None
    sb = StreamBody(model="m", generate_chunk=GenerateTokensStreamResponse(
        request_id="r-1", choices=[msgspec.convert(choice, GenerateTokensStreamChoice)]),
        prompt_token_ids=prompt, prompt_tokens=len(prompt), responses_request=msgspec.Raw(_enc(req)))
    events, _, _ = derender_responses_chunk(rt, sb, None, memory_reader(b""), 7)
    return fast, slow, _enc(events[-1].response)


def _one_step_parsers(rt: ModelRuntime) -> bool:
    tp = rt.config.tool_parser
    return tp not in argshape.SHAPED_PARSERS and tp not in argshape.ENGINE_PARSERS


@pytest.mark.parametrize("streaming", ["whole", "incremental"])
@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_parser_examples(case, streaming, taken):
    """Every parser example, whole and cut at random points, spliced into malformed markup,
    every tool choice and finish: one step, builder and stream give the same Response."""
    rt = family_runtime(case, streaming)
    tok = rt.tokenizer
    rng = random.Random(case.name + streaming)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    extra = {"chat_template_kwargs": case.example.kwargs} if case.example.kwargs else None
    outputs = example_outputs(tok, case, rng) + [[]]
    for ids in outputs:
        for tc in (CHOICES if case.tools else [None]):
            fast, slow, stream = _three(rt, prompt, ids, TOOLS if case.tools else None, tc,
                                        rng.choice(["stop", "length"]),
                                        ids[-1] if ids and rng.random() < 0.2 else None, extra)
            assert fast == slow == stream, (ids, tc)
    assert taken["calls"] and (taken["built"] == taken["calls"]) == _one_step_parsers(rt)
    assert taken["built"] == (taken["calls"] if _one_step_parsers(rt) else 0)


def test_logprobs_take_the_builder(taken):
    """With ``include`` asking for logprobs the one step refuses (the builder attaches them)."""
    rt = ModelRuntime(ServedModelConfig(name="m", tokenizer=QWEN3, reasoning_parser="qwen3", tool_parser="hermes",
                                        enable_auto_tool_choice=True, max_logprobs=20))
    ids = rt.tokenizer.encode("<think>r</think>hello")
    body = {"model": "m", "prompt_tokens": 0, "prompt_token_ids": [],
            "generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids, "logprobs": {
                "content": [{"token_id": t, "logprob": -1.0} for t in ids]}}]},
            "responses_request": {"model": "m", "input": "x", "include": [LOGPROBS_INCLUDE]}}
    resp = derender_responses(rt, msgspec.convert(body, DerenderResponsesRequest), 0)
    assert taken["calls"] == 1 and taken["built"] == 0
    shown = msgspec.json.decode(_enc(resp.output[-1].content[0].logprobs))
    assert shown and shown[-1]["token"] == "hello"


def test_parity_corpus_outputs(taken):
    """The parity corpus' chat outputs on their own models (real tokenizers: Qwen3, DeepSeek,
    Llama 3, Mistral SentencePiece and mistral-common) as Responses bodies without logprobs."""
    rng = random.Random(1)
    n = 0
    for case, rt, prompt, ids, tools, tc, extra in chat_corpus_outputs():
        fin = rng.choice([("stop", None), ("length", None), ("stop", ids[-1]), ("stop", "END")])
        try:
            fast, slow, _ = _three(rt, prompt, ids, tools, tc, *fin, extra=extra,
                                   stream_too=False)
        except BadRequest:  # (a case of a refused body: too long for its model)
            continue
        assert fast == slow, case["id"]
        n += 1
    assert n > 150 and taken["built"] > 100


_PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "\n\n", " ", "  ", "hello", " world", "🌤️",
           "東京", "{", "}", '{"name": "get_weather", "arguments": {"city": "P"}}', '{"name": "search"',
           ', "arguments": {"q": 1}}', "<", "</", "<tool", "think>", "<|im_end|>", "<|im_start|>", "é", "%s", "\\", '"']


@pytest.mark.parametrize("parsers", [("qwen3", "hermes"), (None, "hermes"), ("qwen3", None), (None, None)])
def test_random_qwen3_outputs(parsers, taken):
    """Random Qwen3 outputs: markers whole and in pieces, stray ids (characters split over ids),
    EOS and other added tokens, every tool choice, thinking off, ``skip_special_tokens`` off,
    stop strings and ids, no prompt."""
    reasoning, tool = parsers
    rt = ModelRuntime(ServedModelConfig(name="m", tokenizer=QWEN3, reasoning_parser=reasoning, tool_parser=tool,
                                        enable_auto_tool_choice=tool is not None))
    tok = rt.tokenizer
    rng = random.Random(f"{reasoning}-{tool}")
    eos = tok.token_to_id("<|im_end|>")
    for _ in range(150):
        ids = tok.encode("".join(rng.choice(_PIECES) for _ in range(rng.randrange(0, 12))))
        if rng.random() < 0.2:
            ids.insert(rng.randrange(len(ids) + 1), rng.randrange(tok.vocab_size))
        if rng.random() < 0.5:
            ids.append(eos)
        extra: dict = {}
        if rng.random() < 0.2:
            extra["chat_template_kwargs"] = {"enable_thinking": False}
        if rng.random() < 0.2:
            extra["skip_special_tokens"] = False
        prompt = [] if rng.random() < 0.3 else tok.encode("<|im_start|>assistant\n")
        fin = rng.choice([("stop", None), ("length", None), ("stop", eos), ("stop", "END")])
        tools = TOOLS if rng.random() < 0.7 else None
        fast, slow, stream = _three(rt, prompt, ids, tools, rng.choice(CHOICES) if tools else None, *fin, extra=extra)
        assert fast == slow == stream, (tok.decode(ids, skip_special_tokens=False), extra, fin)
    assert taken["built"] == taken["calls"] == 150


def test_item_plan_is_the_quiet_builder():
    """``ItemPlan`` against a quiet ``EventBuilder`` over random delta sequences (reasoning,
    content and call fragments in any mix: named and unnamed fragments, parser indices that
    repeat or change, merged steps whose text follows an open call's end): the same items, in
    the same order, with the same texts, names and call numbers."""
    from worker.core.responses.events import EventBuilder, ResponsesStreamState
    from worker.core.responses.log import MemoryLog
    from worker.parsers.base import Delta, ToolCallDelta

    rng = random.Random(7)
    merged = 0
    for _ in range(3000):
        st = ResponsesStreamState(request_id="r", fmt="chatcmpl-tool", head=ResponseObject(id="r", created_at=0, model="m"))
        b, plan = EventBuilder(st, MemoryLog(), quiet=True), onestep.ItemPlan()
        for _ in range(rng.randrange(1, 6)):
            calls = [ToolCallDelta(index=rng.randrange(3), name=rng.choice([None, None, "f", "g"]),
                                   arguments=rng.choice(["", "{", "\"a\": 1", "}"]))
                     for _ in range(rng.choice([0, 0, 1, 2, 3]))]
            d = Delta(reasoning=rng.choice(["", "", "think"]), content=rng.choice(["", "", "text", " "]),
                      tool_calls=calls)
            merged += bool(calls and (d.reasoning or d.content) and st.open is not None
                           and st.open.type == "function_call" and calls[0].name is None
                           and calls[0].index == st.open.tool_index)
            b.feed(d, None)
            plan.feed(msgspec.structs.replace(d, tool_calls=list(calls)))
        out = b.finish("stop").output
        want = [(type(it).__struct_config__.tag, it.name, it.arguments) if isinstance(it, FunctionCallItem)
                else (type(it).__struct_config__.tag, "", it.content[0].text) for it in out]
        got = [(kind, name, "".join(parts)) for kind, parts, name, _, _ in plan.items]
        assert got == want
        assert plan.calls == st.n_calls
    assert merged > 100
