"""Hostile comparison of the non-streaming Messages one step (``worker.core.messages.onestep``)
with the segmented path it bypasses, through the service's bytes-in bytes-out entry
(``DerenderService.derender(..., "messages")``): random Qwen3 / hermes outputs edited at the id
level (added tokens, markers and byte pieces inserted anywhere, ids dropped, EOS mid-output,
empty outputs), every finish (EOS, length, int and str ``stop_reason`` incl. ``""``, abort,
None, unknown strings), tools / ``tool_choice`` / ``thinking`` / ``stop_sequences`` variants,
prompts that pre-open or pre-close the reasoning, several parser configurations (incl. hermes on
a tokenizer whose markers are not added tokens): the reply (status and bytes) is the one the
segmented path gives (``onestep.message`` forced to refuse)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from worker.config import ServedModelConfig
from worker.core.messages import onestep
from worker.core.service import DerenderService

QWEN3 = str(Path(__file__).resolve().parent.parent / "worker" / "demo_data" / "qwen3")
TOKDIR = Path(__file__).parent / "data" / "tokenizers"
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
         {"name": "b", "input_schema": {"type": "object"}}]
_WORDS = [" the", " city", " 天气", " 🌤️", "\n", " {", "}", " \"", "Paris", " é", "  ", "\n\n", "%", "\\", "é"]
_PROMPTS = ["<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            "<|im_start|>assistant\n<think>\n"]
CONFIGS = {
    "qwen3": dict(tokenizer=QWEN3, reasoning_parser="qwen3", tool_parser="hermes", enable_auto_tool_choice=True),
    "qwen3-incremental": dict(tokenizer=QWEN3, reasoning_parser="qwen3", tool_parser="hermes",
                              enable_auto_tool_choice=True, tool_call_streaming="incremental"),
    "hermes": dict(tokenizer=QWEN3, tool_parser="hermes", enable_auto_tool_choice=True),
    "qwen3-no-auto": dict(tokenizer=QWEN3, reasoning_parser="qwen3", tool_parser="hermes"),
    "hermes-llama3": dict(tokenizer=str(TOKDIR / "llama3"), tool_parser="hermes", enable_auto_tool_choice=True),
    "qwen3-test-tokenizer": dict(tokenizer=str(TOKDIR / "qwen3"), reasoning_parser="qwen3", tool_parser="hermes",
                                 enable_auto_tool_choice=True),
}


def _words(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 5)))


def _call(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.1:  # unclosed arguments
        return "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": " + _words(rng) + "\n</tool_call>"
    if r < 0.15:
        return "<tool_call>" + _words(rng) + "</tool_call>"
    if r < 0.2:  # an unknown tool
        return "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"
    if r < 0.25:  # arguments not an object
        return "<tool_call>\n{\"name\": \"b\", \"arguments\": \"x\"}\n</tool_call>"
    args = json.dumps({"city": _words(rng)}, ensure_ascii=rng.random() < 0.5)
    return "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"


def _ids(rng: random.Random, tok, pools: dict) -> list[int]:
    if rng.random() < 0.5:
        s = ("<think>" if rng.random() < 0.7 else "") + _words(rng) + ("</think>" if rng.random() < 0.9 else "") \
            + _words(rng)
        if rng.random() < 0.8:
            s += _call(rng)
    else:
        pieces = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>",
                  "<|endoftext|>", _call(rng), _words(rng), _words(rng), _words(rng)]
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 7)))
    ids = tok.encode(s)
    for _ in range(rng.choice([0, 0, 0, 1, 2])):  # id-level edits anywhere (position 0, last)
        r = rng.random()
        pos = rng.randint(0, len(ids))
        if r < 0.4:
            ids.insert(pos, rng.choice(pools["added"]))
        elif r < 0.6:
            ids.insert(pos, rng.choice(pools["pieces"]))
        elif r < 0.7 and ids:
            del ids[min(pos, len(ids) - 1)]
        elif r < 0.8:
            ids.insert(pos, rng.choice(pools["marks"]))
        else:
            ids.insert(pos, rng.randrange(pools["vocab"]))
    return ids


def _body(rng: random.Random, tok, pools: dict, k: int) -> bytes:
    ids = _ids(rng, tok, pools)
    eos = sorted(tok.eos_token_ids)
    fin = rng.choice(["eos", "eos", "eos", "length", "int", "str", "abort", "none", "odd"])
    fr, sr = "stop", None
    if fin == "eos":
        ids.append(rng.choice(eos))
    elif fin == "length":
        fr = "length"
    elif fin == "int":
        if rng.random() < 0.5:
            ids.append(rng.choice(pools["added"] + eos))
        sr = ids[-1] if ids and rng.random() < 0.8 else rng.choice(pools["added"])
    elif fin == "str":
        sr = rng.choice(["END", "</tool_call>", ""])
    elif fin == "abort":
        fr = "abort"
    elif fin == "none":
        fr = None
        if rng.random() < 0.5:
            ids.append(rng.choice(eos))
    else:
        fr, sr = rng.choice(["tool_calls", "content_filter", "error", "Stop"]), rng.choice([None, 5, "x"])
    if rng.random() < 0.03:
        ids = []
    req: dict = {"model": "m", "max_tokens": 64, "messages": []}
    if rng.random() < 0.8:
        req["tools"] = TOOLS if rng.random() < 0.9 else []
        if rng.random() < 0.4:
            req["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                             {"type": "tool", "name": "get_weather"},
                                             {"type": "auto", "disable_parallel_tool_use": True}])
    if rng.random() < 0.3:
        req["thinking"] = rng.choice([{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"},
                                      {"type": "adaptive"}])
    if rng.random() < 0.1:
        req["stop_sequences"] = rng.choice([[], [""], ["the"], ["</tool_call>"]])
    body: dict = {"model": "m", "generate_response": {"request_id": f"r-{k}", "choices": [
        {"index": 0, "token_ids": ids, "finish_reason": fr, "stop_reason": sr}]}, "messages_request": req}
    if rng.random() < 0.9:
        prompt = tok.encode(rng.choice(_PROMPTS))
        body["prompt_token_ids"] = prompt
        if rng.random() < 0.7:
            body["prompt_tokens"] = len(prompt)
    return json.dumps(body).encode()


def _both(svc: DerenderService, body: bytes, monkeypatch) -> tuple[tuple, tuple, bool]:
    """(status, bytes) of the service as it is and with the one step refused, and whether the
    one step built the Message."""
    taken = []
    one_step = onestep.message

    def spy(*a):
        m = one_step(*a)
        taken.append(m is not None)
        return m

    with monkeypatch.context() as m:
        m.setattr(onestep, "message", spy)
        fast = svc.derender(body, "messages")
    with monkeypatch.context() as m:
        m.setattr(onestep, "message", lambda *a: None)
        slow = svc.derender(body, "messages")
    return (fast.status, fast.body), (slow.status, slow.body), any(taken)


def _pools(tok) -> dict:
    texts = tok.decode_singles(list(range(min(tok.vocab_size, 40000))))
    marks = [tok.token_to_id(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")]
    return {"vocab": tok.vocab_size, "added": sorted(tok.added_token_ids) or [0],
            "pieces": [i for i, s in enumerate(texts) if s.endswith("\ufffd")][:100] or [0],
            "marks": [i for i in marks if i is not None] or [0]}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hostile_outputs_give_the_segmented_reply(name, monkeypatch):
    svc = DerenderService([ServedModelConfig(name="m", **CONFIGS[name])])
    tok = svc.runtime("m").tokenizer
    pools = _pools(tok)
    rng = random.Random(f"brk31-{name}")
    taken = 0
    for k in range(300):
        body = _body(rng, tok, pools, k)
        fast, slow, one = _both(svc, body, monkeypatch)
        assert fast == slow, body
        assert fast[0] < 500, fast
        taken += one
    assert taken > 50


def test_empty_engine_stop_string_is_no_stop_sequence(monkeypatch):
    """An engine ``stop_reason`` of ``""`` on a ``stop`` finish: the segmented path's outcome
    reads it as no stop string (``engine_stop or matched``): ``end_turn`` / ``tool_use`` and a
    null ``stop_sequence``, not ``stop_sequence`` with ``""``."""
    svc = DerenderService([ServedModelConfig(name="m", **CONFIGS["qwen3"])])
    tok = svc.runtime("m").tokenizer
    call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>"
    for text, want in (("<think>r</think>t", "end_turn"), ("<think>r</think>t" + call, "tool_use")):
        body = json.dumps({"model": "m", "generate_response": {"request_id": "r", "choices": [
            {"index": 0, "token_ids": tok.encode(text), "finish_reason": "stop", "stop_reason": ""}]},
            "messages_request": {"model": "m", "max_tokens": 64, "messages": [], "tools": TOOLS}}).encode()
        fast, slow, one = _both(svc, body, monkeypatch)
        assert one
        msg = json.loads(fast[1])
        assert (msg["stop_reason"], msg["stop_sequence"]) == (want, None)
        assert fast == slow


def test_lone_surrogate_escape_in_call_arguments_is_no_500(monkeypatch):
    """A call whose arguments escape a lone surrogate (``"\\ud83c"``: an emoji's escaped pair cut
    by the model) parsed to a str msgspec cannot encode (a 500 on every path). The SDK's jiter
    raises on it (the block keeps its ``input``, ``partial_input`` None), so the Message has
    the tool_use block with ``{}``, on the one step and the segmented path alike."""
    svc = DerenderService([ServedModelConfig(name="m", **CONFIGS["qwen3"])])
    tok = svc.runtime("m").tokenizer
    for args in ('{"city": "\\ud83c"}', '{"city": "x\\udf24y", "n": 1}', '{"city": "\\ud83c\\f"}'):
        text = "<think>r</think>t<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"
        body = json.dumps({"model": "m", "generate_response": {"request_id": "r", "choices": [
            {"index": 0, "token_ids": tok.encode(text) + [tok.token_to_id("<|im_end|>")], "finish_reason": "stop"}]},
            "messages_request": {"model": "m", "max_tokens": 64, "messages": [], "tools": TOOLS}}).encode()
        fast, slow, one = _both(svc, body, monkeypatch)
        assert fast == slow
        assert fast[0] == 200, fast
        assert json.loads(fast[1])["content"][-1]["input"] == {}


@pytest.mark.parametrize("buf", ['{"a": "\\ud83c"}', '{"a": "\\udf24x"}', '{"a": "\\ud83c\\udf24"}', '{"a": "\\ud83c',
                                 '{"\\udc00": 1}', '{"a": ["\\ud800", 1', '{"a": "\\uD83C\\uDF24", "b": "\\uDBFF"}'])
def test_partial_input_surrogates_as_jiter(buf):
    """``partial_input`` on escaped surrogates: jiter's answer (an error: None), paired escapes
    decoded."""
    jiter = pytest.importorskip("jiter")
    from worker.core.messages.events import partial_input

    try:
        want = jiter.from_json(buf.encode(), partial_mode=True)
    except ValueError:
        want = None
    assert partial_input(buf) == want
