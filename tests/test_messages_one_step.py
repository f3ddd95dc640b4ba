"""The non-streaming Message's one-step view (``worker.core.messages.onestep``, issue 25 item 2) against the segments' steps it replaces: random Qwen3 (qwen3 reasoning + hermes
tools) outputs built from reasoning / answer / call pieces, markers in and out of place (a
second call, text or whitespace after a call, markers inside the reasoning or the call, a start
marker mid-output, other added tokens, an unclosed block, invalid call JSON), every finish
(EOS stop, length, an int ``stop_reason``, an engine stop string), with and without tools and
``tool_choice``: the one-step path gives the same Message bytes as the segmented one
(``onestep.message`` forced to refuse), and it is taken for the well-formed shapes."""
from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from schemas.messages import DerenderMessagesRequest
from worker.config import ServedModelConfig
from worker.core.derender import ModelRuntime
from worker.core.messages import derender as md
from worker.core.messages import onestep
from worker.parsers.idscan import id_text

QWEN3 = Path(__file__).resolve().parent.parent / "worker" / "demo_data" / "qwen3"
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
_WORDS = [" the", " city", " 天气", " 🌤️", "\n", " {", "}", " \"", "Paris", " é", "  "]
_EOS = "<|im_end|>"


@pytest.fixture(scope="module", params=[("qwen3", "whole"), ("qwen3", "incremental"), (None, "whole")])
def rt(request):
    reasoning, streaming = request.param
    return ModelRuntime(ServedModelConfig(name="m", tokenizer=str(QWEN3), reasoning_parser=reasoning,
                                          tool_parser="hermes", enable_auto_tool_choice=True,
                                          tool_call_streaming=streaming))


def _words(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))


def _call(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": " + _words(rng) + "\n</tool_call>"
    args = json.dumps({"city": _words(rng)}, ensure_ascii=rng.random() < 0.5)
    return "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"


def _output(rng: random.Random) -> str:
    """A random output text: mostly the well-formed ``<think>…</think>`` answer + one call shape,
    else pieces in random order."""
    if rng.random() < 0.6:
        head = "<think>" if rng.random() < 0.7 else ""
        s = head + _words(rng) + ("</think>" if rng.random() < 0.9 else "") + _words(rng)
        if rng.random() < 0.8:
            s += _call(rng)
        if rng.random() < 0.2:
            s += rng.choice(["\n", " tail", _call(rng), "<think>", "<|im_start|>"])
        return s
    pieces = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", _call(rng), _words(rng),
              _words(rng), _words(rng)]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 7)))


def _body(rt, rng: random.Random, k: int) -> DerenderMessagesRequest:
    tok = rt.tokenizer
    ids = tok.encode(_output(rng))
    fin = rng.choice(["stop-eos", "stop-eos", "stop-eos", "length", "stop-int", "stop-str"])
    stop_reason = None
    if fin == "stop-eos" or (fin == "stop-int" and rng.random() < 0.5):
        ids = ids + [tok.token_to_id(_EOS)]
    if fin == "stop-int" and ids:
        stop_reason = ids[-1]
    if fin == "stop-str":
        stop_reason = "END"
    if not ids:
        ids = [tok.token_to_id(_EOS)]
    req = {"model": "m", "max_tokens": 64, "messages": []}
    r = rng.random()
    if r < 0.8:
        req["tools"] = TOOLS
        if rng.random() < 0.2:
            req["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                             {"type": "tool", "name": "get_weather"}])
    prompt = tok.encode("<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n")
    body = {"model": "m", "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
            "generate_response": {"request_id": f"r-{k}", "choices": [
                {"index": 0, "token_ids": ids, "finish_reason": "length" if fin == "length" else "stop",
                 "stop_reason": stop_reason}]},
            "messages_request": req}
    return msgspec.json.decode(json.dumps(body).encode(), type=DerenderMessagesRequest)


def _bytes(rt, body) -> bytes:
    return msgspec.json.encode(md.derender_messages(rt, body))


def test_one_step_equals_segments(rt, monkeypatch):
    rng = random.Random(25)
    taken = 0
    one_step = onestep.message
    for k in range(400):
        body = _body(rt, rng, k)
        fast = _bytes(rt, body)
        c = body.generate_response.choices[0]
        with monkeypatch.context() as m:
            m.setattr(onestep, "message", lambda *a: None)
            slow = _bytes(rt, body)
        assert fast == slow, (rt.tokenizer.decode(c.token_ids, skip_special_tokens=False), fast, slow)
        taken += one_step(rt, body.messages_request, "r", "m", body.prompt_token_ids, 0, c) is not None
    # the well-formed shapes take the one step (without a reasoning parser ``<think>`` is just
    # another added token: only outputs without one)
    assert taken > (60 if rt.stack.reasoning is not None else 5)


def test_one_step_shapes(rt):
    """The shapes the one step takes and refuses (the ids' added tokens decide)."""
    tok = rt.tokenizer
    eos = tok.token_to_id(_EOS)

    def ok(text: str, tail: list[int] | None = None, finish: str = "stop") -> bool:
        ids = tok.encode(text) + ([eos] if tail is None else tail)
        s = id_text(ids, keep=False)
        return s is not None and onestep.shape_ok(rt, s, ids, finish, None)

    call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>"
    head = "<think>\nr</think>\n\nt" if rt.stack.reasoning is not None else "t"
    assert ok(head + call)
    assert ok(head + call, tail=[], finish="length")
    assert ok(head)
    assert not ok(head + call + "\n")  # text after the call
    assert not ok(head + call + call)  # two calls
    assert not ok(head + call, tail=[eos], finish="length")  # the EOS is text
    assert not ok("<|im_start|>" + head + call)  # another added token
    if rt.stack.reasoning is not None:
        assert not ok("<think>\nr" + call)  # the call inside an open reasoning block
        assert not ok("r</think><think>t" + call)  # a start marker mid-output
    else:
        assert not ok("<think>\nr</think>\n\nt" + call)  # reasoning markers are other added tokens
