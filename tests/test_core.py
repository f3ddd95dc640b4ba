"""The pure core through its public entry point (``DerenderService``) on the real Qwen3 tokenizer:
routing, validation with vLLM's semantics, determinism, the one-shot detokenization shortcut,
and the JSON Schemas staying in step with the Structs."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from schemas.__main__ import HERE as SCHEMA_DIR
from schemas.__main__ import render_all
from worker.config import load_config_file
from worker.core.detokenize import IncrementalDetokenizer
from worker.core.service import DerenderService
from worker.core.tokenizer import load_tokenizer

DATA = Path(__file__).resolve().parent / "data"
CASES = [json.loads(line) for line in (DATA / "detok_cases.jsonl").read_text(encoding="utf-8").splitlines()
         if line.strip()]


@pytest.fixture(scope="module")
def service() -> DerenderService:
    return DerenderService(load_config_file(DATA / "models.json"))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(DATA / "tokenizers" / "qwen3"))


def chat_body(tok, text: str, **extra) -> dict:
    """A chat derender body whose output is ``text`` + <|im_end|> tokenized for real."""
    ids = tok.encode(text) + [151645]
    prompt = tok.encode("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    body = {"model": "qwen3", "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
            "generate_response": {"request_id": "req-1", "choices": [
                {"index": 0, "token_ids": ids, "finish_reason": "stop"}]},
            "chat_request": {"model": "qwen3", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                             "tools": [{"type": "function", "function": {"name": "get_weather",
                                                                         "parameters": {"type": "object"}}}]}}
    for k, v in extra.items():
        body[k] = v
    return body


def run(service, body, kind=None):
    res = service.derender(json.dumps(body).encode() if not isinstance(body, bytes) else body, kind)
    return res, json.loads(res.body)


def test_chat_reasoning_content_and_tool_call(service, tok):
    text = ('<think>\nCheck the weather.\n</think>\n\nLet me look.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    res, out = run(service, chat_body(tok, text))
    assert res.status == 200 and res.request_id == "req-1" and res.kind == "chat"
    msg = out["choices"][0]["message"]
    assert msg["reasoning"] == "\nCheck the weather.\n"
    assert msg["content"] == "\n\nLet me look.\n"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == \
        [("get_weather", {"city": "Paris"})]
    assert msg["tool_calls"][0]["id"].startswith("chatcmpl-tool-")
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["usage"]["completion_tokens"] == len(json.loads(json.dumps(chat_body(tok, text)))
                                                    ["generate_response"]["choices"][0]["token_ids"])


def test_reprocessing_is_byte_identical(service, tok):
    body = json.dumps(chat_body(tok, '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')).encode()
    a, b = service.derender(body), service.derender(body)
    assert a.body == b.body
    other = json.loads(body)
    other["generate_response"]["request_id"] = "req-2"
    c = service.derender(json.dumps(other).encode())
    ida = json.loads(a.body)["choices"][0]["message"]["tool_calls"][0]["id"]
    idc = json.loads(c.body)["choices"][0]["message"]["tool_calls"][0]["id"]
    assert ida != idc  # ids derive from request_id and position


@pytest.mark.parametrize("mutate, status, needle", [
    (lambda b: b.update(model="nope"), 404, "does not exist"),
    (lambda b: b.update(stream=True), 400, "stream"),
    (lambda b: b["generate_response"]["choices"][0].update(token_ids=[]), 400, "empty"),
    (lambda b: b["generate_response"]["choices"][0].update(token_ids=[1, -5]), 400, "outside the vocabulary"),
    (lambda b: b["generate_response"]["choices"][0].update(token_ids=[151669 + 400]), 400, "outside"),
    (lambda b: b["generate_response"]["choices"][0].update(token_ids=[9707] * 4097), 400, "max_model_len"),
    (lambda b: b.pop("chat_request"), 400, "chat_request is required"),
    (lambda b: b.update(prompt_tokens=3), 400, "prompt_tokens"),
    (lambda b: b["generate_response"].update(choices=[]), 400, "must not be empty"),
    (lambda b: b["generate_response"]["choices"][0].update(token_ids="abc"), 400, "invalid request body"),
    (lambda b: b["generate_response"]["choices"][0].update(logprobs={"content": [
        {"token_id": 9707, "logprob": -0.1, "top_logprobs": [{"token_id": 9707, "logprob": -0.1}] * 21}]},
        token_ids=[9707]), 400, "max_logprobs"),
])
def test_validation_errors(service, tok, mutate, status, needle):
    body = chat_body(tok, "Hello there.")
    mutate(body)
    res, out = run(service, body)
    assert res.status == status, out
    assert out["error"]["code"] == status and needle in out["error"]["message"]
    assert out["error"]["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]


def test_too_many_choices(tok):
    cfg = load_config_file(DATA / "models.json")
    for c in cfg:
        c.max_n = 2
    svc = DerenderService(cfg)
    body = chat_body(tok, "Hi.")
    ch = body["generate_response"]["choices"][0]
    body["generate_response"]["choices"] = [dict(ch, index=i) for i in range(3)]
    res, out = run(svc, body)
    assert res.status == 400 and "maximum n" in out["error"]["message"]


@pytest.mark.parametrize("raw, needle", [
    (b"not json", "invalid request body"),
    (b'{"model": "qwen3"}', "exactly one of"),
    (b'{"model": "qwen3", "generate_response": {}, "generate_responses": []}', "exactly one of"),
    (b'[1, 2]', "invalid request body"),
])
def test_unroutable_bodies(service, raw, needle):
    res, out = run(service, raw)
    assert res.status == 400 and needle in out["error"]["message"]


def test_kind_header_must_match_shape(service, tok):
    res, out = run(service, chat_body(tok, "Hi."), kind="completion")
    assert res.status == 400 and "does not match" in out["error"]["message"]


def test_completion_flat_indexes_and_usage(service, tok):
    p1, p2 = tok.encode("Once upon a time"), tok.encode("The quick brown fox")
    body = {"model": "qwen3-noparser", "prompt_tokens": [len(p1), len(p2)], "prompt_token_ids": [p1, p2],
            "generate_responses": [
                {"request_id": "cmpl-a", "choices": [
                    {"index": 0, "token_ids": tok.encode(" there was a king."), "finish_reason": "length"},
                    {"index": 1, "token_ids": tok.encode(" a dragon slept.") + [151643], "finish_reason": "stop"}]},
                {"request_id": "cmpl-b", "choices": [
                    {"index": 0, "token_ids": tok.encode(" jumps."), "finish_reason": "length"}]}],
            "completion_request": {"model": "qwen3-noparser", "prompt": ["Once upon a time", "The quick brown fox"],
                                   "n": 2}}
    res, out = run(service, body)
    assert res.status == 200 and out["id"] == "cmpl-a" and out["object"] == "text_completion"
    assert [(c["index"], c["text"]) for c in out["choices"]] == [
        (0, " there was a king."), (1, " a dragon slept."), (2, " jumps.")]
    assert out["usage"]["prompt_tokens"] == len(p1) + len(p2)
    assert out["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for g in body["generate_responses"]
                                                    for c in g["choices"])


def test_whole_output_shortcut_equals_stepping():
    """The one-shot decode used for non-streaming bodies gives the same text as stepping every id."""
    rng = random.Random(7)
    checked = 0
    for case in CASES:
        if case["tokenizer_mode"] == "mistral":
            continue
        t = load_tokenizer(str(DATA / "tokenizers" / case["tokenizer"]), case["tokenizer_mode"])
        for ch in case["choices"]:
            prompt = case["prompt_token_ids"]
            if prompt and isinstance(prompt[0], list):
                prompt = prompt[ch.get("prompt_index", 0)]
            for skip in (True, False):
                ids = list(ch["token_ids"])
                if rng.random() < 0.3 and len(ids) > 3:
                    ids = ids[: rng.randrange(1, len(ids))]  # cut mid-character sometimes
                d1 = IncrementalDetokenizer(t, skip_special_tokens=skip, prompt_token_ids=prompt)
                d2 = IncrementalDetokenizer(t, skip_special_tokens=skip, prompt_token_ids=prompt)
                fast = d1.whole_output(ids)
                stepped = "".join(d2.add([i]) for i in ids)
                if fast is not None:
                    assert fast == stepped, (case["id"], ids)
                    checked += 1
    assert checked > 100


def test_json_schemas_match_structs():
    """schemas/*.schema.json are what `python -m schemas` generates from the Structs."""
    for fname, text in render_all().items():
        path = SCHEMA_DIR / fname
        assert path.exists(), f"{fname} missing: run python -m schemas"
        assert path.read_text(encoding="utf-8") == text, f"{fname} drifted: run python -m schemas"
