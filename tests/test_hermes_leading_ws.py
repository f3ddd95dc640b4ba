"""Whitespace between ``</think>`` and the answer under ``hermes`` with tools (issue 26 item 6;
docs/parsers.md, "Whitespace before the first call"): vLLM 0.32's ``Hermes2ProToolParser``
streams each step's text as it comes, so ``"\\n\\n"`` in its own engine step is its own delta
in the Responses and Messages streams; whitespace in the step where the reasoning ended is
added to the next step's text (``OpenAIServingChat``); whitespace straight before a call is not
content (the chat reference's rule "one answer"), in every API; the chat stream's content is
unchanged."""
from __future__ import annotations

import json

import msgspec
import pytest

from tests.harness.messages import MODELS
from worker.bench.stream import stream_bodies
from worker.config import load_config_file
from worker.core.responses import memory_reader
from worker.core.service import DerenderService

THINK = "<think>\nLook it up.\n</think>"


@pytest.fixture(scope="module")
def svc() -> DerenderService:
    return DerenderService(load_config_file(str(MODELS)))


def _ids(svc: DerenderService, answer: str) -> tuple[list[int], list[int]]:
    tok = svc.runtime("qwen3").tokenizer
    prompt = tok.encode("<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n")
    return prompt, tok.encode(THINK + answer) + [tok.token_to_id("<|im_end|>")]


def _merged(bodies: list[bytes], at: int) -> list[bytes]:
    """``bodies`` with chunk ``at + 1``'s token joined to chunk ``at``'s (one engine output)."""
    a, b = json.loads(bodies[at]), json.loads(bodies[at + 1])
    ca, cb = a["generate_chunk"]["choices"][0], b["generate_chunk"]["choices"][0]
    ca["token_ids"] += cb["token_ids"]
    ca["finish_reason"] = cb["finish_reason"]
    if "logprobs" in ca:
        ca["logprobs"]["content"] += cb["logprobs"]["content"]
    return bodies[:at] + [json.dumps(a).encode()] + bodies[at + 2:]


def _replies(svc: DerenderService, kind: str, bodies: list[bytes]) -> list[list[dict]]:
    """The event list each chunk's reply carries (chat: its chunk objects)."""
    state, log, out = None, bytearray(), []
    for b in bodies:
        if kind == "chat":
            res, state = svc.derender_stream(b, state)
        else:
            run = svc.derender_responses_stream if kind == "responses" else svc.derender_messages_stream
            res = run(b, state, memory_reader(log))
            state, log = res.state, log + res.log_append
        assert res.status == 200, res.body
        out.append(json.loads(res.body))
    return out


def _texts(kind: str, replies: list[list[dict]]) -> list[tuple[int, str]]:
    """(reply number, text) of every answer-text delta, in order."""
    out = []
    for k, events in enumerate(replies):
        for e in events:
            if kind == "chat":
                text = e["choices"][0]["delta"].get("content") if e["choices"] else None
            elif kind == "responses":
                text = e["delta"] if e["type"] == "response.output_text.delta" else None
            else:
                text = e["delta"]["text"] if e["type"] == "content_block_delta" and \
                    e["delta"]["type"] == "text_delta" else None
            if text:
                out.append((k, text))
    return out


def _think_end(svc: DerenderService, out: list[int]) -> int:
    return out.index(svc.runtime("qwen3").tokenizer.token_to_id("</think>"))


@pytest.mark.parametrize("kind", ["responses", "messages"])
def test_whitespace_step_is_its_own_delta(svc, kind):
    """``</think>``, ``"\\n\\n"``, ``"Let"`` in three steps: ``"\\n\\n"`` then ``"Let"``, both
    in the reply of the ``"Let"`` step (held until text shows it is not before a call)."""
    prompt, out = _ids(svc, "\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>")
    k = _think_end(svc, out)
    texts = _texts(kind, _replies(svc, kind, stream_bodies(prompt, out, kind, 0)))
    assert texts[:2] == [(k + 2, "\n\n"), (k + 2, "Let")], texts


@pytest.mark.parametrize("kind", ["responses", "messages"])
def test_whitespace_in_the_reasoning_end_step_is_joined(svc, kind):
    """``</think>\\n\\n`` in one engine output: vLLM's chat stream adds that step's content to
    the next step's text, one delta ``"\\n\\nLet"``."""
    prompt, out = _ids(svc, "\n\nLet me check.")
    k = _think_end(svc, out)
    texts = _texts(kind, _replies(svc, kind, _merged(stream_bodies(prompt, out, kind, 0), k)))
    assert texts[0] == (k + 1, "\n\nLet"), texts


@pytest.mark.parametrize("kind", ["chat", "responses", "messages"])
def test_whitespace_before_a_call_is_not_content(svc, kind):
    """``"\\n\\n<tool_call>"`` after ``</think>``: no answer text in any API, streaming or not."""
    prompt, out = _ids(svc, "\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n"
                            "</tool_call>")
    bodies = stream_bodies(prompt, out, kind, 0)
    assert _texts(kind, _replies(svc, kind, bodies)) == []
    whole = json.loads(bodies[0])
    whole.pop("stream")
    whole["generate_response"] = whole.pop("generate_chunk")
    whole["generate_response"]["choices"][0].update(token_ids=out, finish_reason="stop")
    res = svc.derender(msgspec.json.encode(whole))
    assert res.status == 200, res.body
    msg = json.loads(res.body)
    if kind == "chat":
        assert msg["choices"][0]["message"]["content"] is None
        assert len(msg["choices"][0]["message"]["tool_calls"]) == 1
    elif kind == "responses":
        assert [it["type"] for it in msg["output"]] == ["reasoning", "function_call"]
    else:
        assert [b["type"] for b in msg["content"]] == ["thinking", "tool_use"]


def test_chat_content_is_unchanged(svc):
    """The chat stream keeps one chunk object per reply: the held ``"\\n\\n"`` goes out joined
    to ``"Let"``."""
    prompt, out = _ids(svc, "\n\nLet me check.")
    k = _think_end(svc, out)
    texts = _texts("chat", _replies(svc, "chat", stream_bodies(prompt, out, "chat", 0)))
    assert texts[0] == (k + 2, "\n\nLet"), texts


def test_responses_logprobs_ride_with_their_delta(svc):
    """With logprobs, the ``"\\n\\n"`` delta carries the entries that waited with it (the
    ``</think>`` token's, R8: an entry without text rides on the next delta) and ``"Let"`` its
    own; the final part lists them in the same order."""
    prompt, out = _ids(svc, "\n\nLet me check.")
    k = _think_end(svc, out)
    replies = _replies(svc, "responses", stream_bodies(prompt, out, "responses", 2))
    deltas = [e for e in replies[k + 2] if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["\n\n", "Let"]
    assert [[lp["token"] for lp in d["logprobs"]] for d in deltas] == [["</think>", "\n\n"], ["Let"]]
    final = replies[-1][-1]["response"]["output"][-1]["content"][0]
    assert [lp["token"] for lp in final["logprobs"]][:3] == ["</think>", "\n\n", "Let"]
