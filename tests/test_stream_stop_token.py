"""A stream's stop token never reaches the streamed text, whatever chunk carries the finish.

vLLM's v1 detokenizer (``update(new_token_ids, stop_terminated)``) never decodes the last id of
a stop-terminated sequence (an EOS id, unless ``include_stop_str_in_output``), even with
``skip_special_tokens`` off. Found through ``derender-worker batch`` with the qwen3 tokenizer and
a tool parser that turns ``skip_special_tokens`` off (longcat, granite4, kimi_k2): an
``<|im_end|>`` ending a chunk without ``finish_reason``, the finish in a following empty chunk
(the parity corpus's ``qwen3-stream-final-empty-chunk-v0`` shape), streamed
``'Hello there<|im_end|>'`` while non-streaming gave ``'Hello there'``.
"""
from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from worker.config import load_config_file
from worker.core.responses import memory_reader
from worker.core.service import DerenderService
from worker.core.tokenizers.registry import load_tokenizer

TOK = Path(__file__).resolve().parent / "data" / "tokenizers" / "qwen3"
TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
IM_END, ENDOFTEXT = 151645, 151643


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(TOK))


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "models.json"
    cfg.write_text(json.dumps({f"{p}-{m}": {"tokenizer": str(TOK), "tool_parser": p, "enable_auto_tool_choice": True,
                                            "tool_call_streaming": m}
                               for p in ("longcat", "granite4", "kimi_k2") for m in ("whole", "incremental")}
                              | {"plain": {"tokenizer": str(TOK)}}))
    return DerenderService(load_config_file(str(cfg)))


def _chunks(ids: list[int], sizes: list[int], finish: str | None, stop_reason=None) -> list[dict]:
    """``ids`` cut into chunks of ``sizes`` (the rest in the last), then a token-less finish chunk."""
    out, pos = [], 0
    for n in sizes + [len(ids)]:
        if pos < len(ids):
            out.append({"index": 0, "token_ids": ids[pos:pos + n], "finish_reason": None, "stop_reason": None})
            pos += n
    out.append({"index": 0, "token_ids": [], "finish_reason": finish, "stop_reason": stop_reason})
    return out


def _lp(tok, ids: list[int]) -> dict:
    return {"content": [{"token": tok.decode([t], skip_special_tokens=False), "token_id": t, "logprob": -0.5,
                         "top_logprobs": []} for t in ids]}


def _openai(svc, tok, kind: str, model: str, ids: list[int], chunks: list[dict], extra: dict) -> tuple[dict, list]:
    """Non-streaming reply and the stream's chunks for a chat / completion request."""
    if kind == "chat":
        req = {"model": model, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
               "tools": [{"type": "function", "function": TOOL}], "tool_choice": "auto", **extra}
    else:
        req = {"model": model, "prompt": "hi", "logprobs": 0, **extra}
    key = f"{kind}_request"
    prompt = tok.encode("hi")
    gen = {"request_id": "r", "choices": [{"index": 0, "token_ids": ids, "finish_reason": chunks[-1]["finish_reason"],
                                           "stop_reason": chunks[-1]["stop_reason"], "logprobs": _lp(tok, ids)}]}
    if kind == "chat":
        body = {"model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt, key: req,
                "generate_response": gen}
    else:
        body = {"model": model, "prompt_tokens": [len(prompt)], "prompt_token_ids": [prompt], key: req,
                "generate_responses": [gen]}
    res = svc.derender(msgspec.json.encode(body), kind=kind)
    assert res.status == 200, res.body
    state, out = None, []
    for c in chunks:
        c = dict(c, logprobs=_lp(tok, c["token_ids"]) if c["token_ids"] else None)
        b = {"stream": True, "model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
             key: dict(req, stream=True), "generate_chunk": {"request_id": "s", "choices": [c]}}
        r, state = svc.derender_stream(msgspec.json.encode(b), state)
        assert r.status == 200, r.body
        out.extend(json.loads(r.body))
    return json.loads(res.body), out


CUTS = [[2, 1], [1, 1, 1], [3], [1, 2]]


@pytest.mark.parametrize("model", ["longcat-whole", "longcat-incremental", "granite4-incremental", "kimi_k2-whole"])
@pytest.mark.parametrize("sizes", CUTS)
@pytest.mark.parametrize("eos", [IM_END, ENDOFTEXT])
def test_chat_stop_token_before_empty_finish_chunk(svc, tok, model, sizes, eos):
    ids = tok.encode("Hello there") + [eos]
    whole, stream = _openai(svc, tok, "chat", model, ids, _chunks(ids, sizes, "stop"), {"skip_special_tokens": False})
    assert whole["choices"][0]["message"]["content"] == "Hello there"
    ch = [c["choices"][0] for c in stream if c["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in ch) == "Hello there"
    # the stop token's logprob entry is still sent (vLLM), in the chunk that carried it
    lps = [e["token"] for c in ch if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert lps == [e["token"] for e in whole["choices"][0]["logprobs"]["content"]]
    assert lps[-1] == tok.decode([eos], skip_special_tokens=False)
    assert ch[-1]["finish_reason"] == "stop" and stream[-1]["usage"]["completion_tokens"] == len(ids)


@pytest.mark.parametrize("sizes", CUTS)
@pytest.mark.parametrize("finish,text", [("stop", "Hello there"), ("length", "Hello there<|im_end|>")])
def test_completion_stop_token_before_empty_finish_chunk(svc, tok, sizes, finish, text):
    """An EOS that is the ``max_tokens``-th id ends a ``length`` finish: vLLM checks the length
    first (``check_stop``), the sequence is not stop-terminated and the id is detokenized."""
    ids = tok.encode("Hello there") + [IM_END]
    whole, stream = _openai(svc, tok, "completion", "plain", ids, _chunks(ids, sizes, finish),
                            {"skip_special_tokens": False})
    assert whole["choices"][0]["text"] == text
    ch = [c["choices"][0] for c in stream if c["choices"]]
    assert "".join(c.get("text") or "" for c in ch) == text
    offs = [o for c in ch if c.get("logprobs") for o in c["logprobs"]["text_offset"]]
    assert offs == whole["choices"][0]["logprobs"]["text_offset"]


def test_stop_token_mid_stream_is_released_when_generation_goes_on(svc, tok):
    """``ignore_eos``: the engine goes past an EOS; the held id's text comes with the next chunk."""
    ids = tok.encode("Hi") + [IM_END] + tok.encode(" more")
    whole, stream = _openai(svc, tok, "completion", "plain", ids, _chunks(ids, [len(ids) - 2], "length"),
                            {"skip_special_tokens": False})
    assert whole["choices"][0]["text"] == "Hi<|im_end|> more"
    assert "".join(c["choices"][0].get("text") or "" for c in stream if c["choices"]) == "Hi<|im_end|> more"


def _events_text(events: list[dict], kind: str) -> str:
    if kind == "responses":
        return "".join(e.get("delta", "") for e in events if e.get("type") == "response.output_text.delta")
    return "".join(e["delta"].get("text", "") for e in events
                   if e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta")


@pytest.mark.parametrize("kind", ["responses", "messages"])
@pytest.mark.parametrize("sizes", CUTS)
@pytest.mark.parametrize("model", ["longcat-whole", "kimi_k2-incremental"])
def test_responses_and_messages_stop_token_before_empty_finish_chunk(svc, tok, kind, sizes, model):
    ids = tok.encode("Hello there") + [IM_END]
    prompt = tok.encode("hi")
    if kind == "responses":
        req = {"model": model, "input": "hi", "tools": [dict(TOOL, type="function")], "skip_special_tokens": False}
        call = svc.derender_responses_stream
    else:
        req = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": TOOL["name"], "input_schema": TOOL["parameters"]}]}
        call = svc.derender_messages_stream
    key = f"{kind}_request"
    body = {"model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt, key: req,
            "generate_response": {"request_id": "r", "choices": [
                {"index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None}]}}
    res = svc.derender(msgspec.json.encode(body))
    assert res.status == 200, res.body
    reply = json.loads(res.body)
    if kind == "responses":
        nonstream = "".join(p["text"] for o in reply["output"] if o["type"] == "message" for p in o["content"])
    else:
        nonstream = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
    assert nonstream == "Hello there"
    state, log, events = None, bytearray(), []
    for c in _chunks(ids, sizes, "stop"):
        b = {"stream": True, "model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
             key: dict(req, stream=True), "generate_chunk": {"request_id": "s", "choices": [c]}}
        r = call(msgspec.json.encode(b), state, memory_reader(log))
        assert r.status == 200, r.body
        state = r.state
        log += r.log_append
        events.extend(json.loads(r.body))
    assert _events_text(events, kind) == "Hello there"


@pytest.mark.parametrize("sizes", CUTS)
def test_responses_stop_token_logprobs(svc, tok, sizes):
    """The stop token's logprob entry (vLLM: in the final part's ``logprobs``) streams as it
    does without the hold: the events' entries equal the non-streaming output's."""
    model = "longcat-whole"
    ids = tok.encode("Hello there") + [IM_END]
    prompt = tok.encode("hi")
    req = {"model": model, "input": "hi", "tools": [dict(TOOL, type="function")], "skip_special_tokens": False,
           "include": ["message.output_text.logprobs"], "top_logprobs": 0}
    body = {"model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt, "responses_request": req,
            "generate_response": {"request_id": "r", "choices": [
                {"index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None, "logprobs": _lp(tok, ids)}]}}
    res = svc.derender(msgspec.json.encode(body))
    assert res.status == 200, res.body
    parts = [p for o in json.loads(res.body)["output"] if o["type"] == "message" for p in o["content"]]
    want = [e["token"] for p in parts for e in p["logprobs"]]
    assert want[-1] == "<|im_end|>"
    state, log, events = None, bytearray(), []
    for c in _chunks(ids, sizes, "stop"):
        c = dict(c, logprobs=_lp(tok, c["token_ids"]) if c["token_ids"] else None)
        b = {"stream": True, "model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
             "responses_request": dict(req, stream=True), "generate_chunk": {"request_id": "s", "choices": [c]}}
        r = svc.derender_responses_stream(msgspec.json.encode(b), state, memory_reader(log))
        assert r.status == 200, r.body
        state = r.state
        log += r.log_append
        events.extend(json.loads(r.body))
    assert _events_text(events, "responses") == "Hello there"
    done = [e for e in events if e.get("type") == "response.completed"][0]["response"]
    got = [e["token"] for o in done["output"] if o["type"] == "message" for p in o["content"] for e in p["logprobs"]]
    assert got == want


def test_one_held_stop_step_for_every_api():
    """``held_stop_step``, the shape chat (``_step_ids``) and Responses / Messages (``step_ids``)
    share: an EOS id ending a chunk without finish is held for the next one, not with
    ``include_stop`` (chat only); a held id leads the next chunk; a finish trims it."""
    from worker.core.detokenize import held_stop_step
    eos = {IM_END, ENDOFTEXT}
    assert held_stop_step([1, 2, IM_END], -1, None, None, eos) == ([1, 2, IM_END], [1, 2], 0, IM_END)
    assert held_stop_step([1, 2, IM_END], -1, None, None, eos, include_stop=True) == ([1, 2, IM_END],) * 2 + (0, -1)
    assert held_stop_step([], IM_END, "stop", None, eos) == ([IM_END], [], 1, -1)
    assert held_stop_step([], IM_END, "stop", None, eos, include_stop=True) == ([IM_END], [IM_END], 1, -1)
    assert held_stop_step([3], IM_END, None, None, eos) == ([IM_END, 3], [IM_END, 3], 1, -1)
    assert held_stop_step([3, 9], -1, "stop", 9, eos) == ([3, 9], [3], 0, -1)  # an int stop_reason
    assert held_stop_step(None, -1, "length", None, eos) == ([], [], 0, -1)
