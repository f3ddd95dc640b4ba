"""Hostile pass over the non-streaming Responses one step (``worker.core.responses.onestep``,
branch brk32) and the Messages one step that now shares its ``ItemPlan``: through the service
(bytes in, bytes out) on the parity models and on every parser family's runtime, generated
outputs (markers of each family anywhere / cut / repeated, stray and split-character ids, EOS
alone / repeated / mid-output, empty outputs, ``* 50`` repeats), every finish (``stop`` /
``length`` / ``abort`` / None / ``""``), ``stop_reason`` int / str / ``""`` / None, tool
choices (none / auto / required / named / unknown name / invalid), tools absent or empty,
thinking off, ``skip_special_tokens`` off, echo fields, prompt ids absent or ending mid-character,
``created`` / ``kv_transfer_params`` / ``ec_transfer_params``: the one step's status and bytes are
the builder's (``onestep.response`` patched to None; Messages: ``onestep.message``), 200 or 4xx.
Plus the 500s the pass found on both Messages paths (a bare-array call name holding a raw
control character, ``bare_array.scan``), the one on both Messages paths for gpt-oss
(``_lead_merged`` and the Harmony reasoning parser's missing ``start_ids``), and the one on every
API (chat included, streamed or not) for a call name or arguments escaping a lone surrogate
(``base.surrogates_escaped``: the escape kept)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec
import pytest

from schemas.responses import DerenderResponsesRequest
from tests.harness.parsers import family_runtime, family_service, pieces_ids
from tests.harness.responses import HOSTILE_PIECES, TOOLS
from tests.parity import service as parity_service
from worker.bench.parsers import build_ids
from worker.core.errors import BadRequest
from worker.core.messages import onestep as m_onestep
from worker.core.responses import onestep
from worker.core.responses.derender import derender_responses
from worker.parsers.examples import cases

TEXT = HOSTILE_PIECES + ["<|im_end|>", "<|im_start|>",
                         "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "\x00",
                         '{"name": "search", "arguments": {"q": "\\ud800"}}', '"\\udc00x"']
QWEN3 = Path(__file__).resolve().parent.parent / "worker" / "demo_data" / "qwen3"
MODELS = ["qwen3", "qwen3-noparser", "deepseek-v4", "deepseek-v31-markup", "mistral-7b-v0.3-noparser",
          "mistral-7b-v0.3", "llama3"]
_enc = msgspec.json.Encoder()


def _ids(rng: random.Random, tok) -> list[int]:
    ids = pieces_ids(rng, tok, TEXT, 25, sorted(tok.added_token_ids) or [0, 1, 2])
    eos = sorted(tok.eos_token_ids or [])
    if eos and rng.random() < 0.3:
        for _ in range(rng.choice([1, 1, 2, 3])):
            ids.insert(rng.choice([len(ids), rng.randrange(len(ids) + 1)]), rng.choice(eos))
    r = rng.random()
    if r < 0.05:
        return []
    if r < 0.1 and eos:
        return [eos[0]] * rng.choice([1, 2])
    return ids * 50 if r < 0.12 else ids


def _body(rng: random.Random, svc, model: str, kind: str) -> bytes:
    tok = svc.runtime(model).tokenizer
    ids = _ids(rng, tok)
    choice = {"index": 0, "token_ids": ids, "finish_reason": rng.choice(["stop", "stop", "length", "abort", None, ""]),
              "stop_reason": rng.choice([None, None, "", "END", ids[-1] if ids else None, rng.randrange(tok.vocab_size)])}
    if kind == "messages":
        req: dict = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
        if rng.random() < 0.7:
            req["tools"] = [{"name": t["name"], "input_schema": t["parameters"]} for t in TOOLS]
            tc = rng.choice([None, {"type": "auto"}, {"type": "none"}, {"type": "any"},
                             {"type": "tool", "name": "get_weather"}, {"type": "tool", "name": "nope"}])
            if tc is not None:
                req["tool_choice"] = tc
        if rng.random() < 0.2:
            req["thinking"] = rng.choice([{"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024}])
    else:
        req = {"model": model, "input": "x"}
        if rng.random() < 0.7:
            req["tools"] = TOOLS if rng.random() < 0.9 else []
            tc = rng.choice([None, "auto", "none", "required", {"type": "function", "name": "get_weather"},
                             {"type": "function", "name": "nope"}, "bogus", {"type": "function"}, 5])
            if tc is not None:
                req["tool_choice"] = tc
        for k, v in (("metadata", {"a": "b"}), ("instructions", "be nice"), ("max_output_tokens", 5),
                     ("parallel_tool_calls", False), ("max_tool_calls", 1), ("include", []), ("top_logprobs", 3),
                     ("text", {"format": {"type": "text"}}), ("reasoning", {"effort": "low"}),
                     ("previous_response_id", "x")):
            if rng.random() < 0.08:
                req[k] = v
    if rng.random() < 0.2:
        req["chat_template_kwargs"] = rng.choice([{"enable_thinking": False}, {"thinking": True}, {}])
    if rng.random() < 0.2:
        req["skip_special_tokens"] = False
    prompt = tok.encode("hi there") + (sorted(tok.added_token_ids)[:1] if rng.random() < 0.3 else [])
    if rng.random() < 0.2:  # the prompt ends mid-character
        e = tok.encode("東京😀")
        prompt += e[:max(1, len(e) - 1)]
    gr: dict = {"request_id": rng.choice(["r-1", "", None, "é\u2028"]), "choices": [choice]}
    if rng.random() < 0.5:
        gr["created"] = rng.choice([0, 1700000000, -5])
    if rng.random() < 0.2:
        gr["kv_transfer_params"] = {"a": [1, {"b": None}]}
    if rng.random() < 0.2:
        gr["ec_transfer_params"] = {"x": 1}
    if rng.random() < 0.2:
        gr["prompt_token_ids"] = prompt
    body: dict = {"model": model, "generate_response": gr}
    if rng.random() < 0.95:
        body["messages_request" if kind == "messages" else "responses_request"] = req
    if rng.random() < 0.8:
        body["prompt_token_ids"] = prompt
        if rng.random() < 0.9:
            body["prompt_tokens"] = len(prompt) + (rng.random() < 0.03)
    return json.dumps(body).encode()


def _both(monkeypatch, svc, raw: bytes, kind: str) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
    """``(one step, reference)`` replies of ``raw``: the second with the one step patched off."""
    mod, name = (m_onestep, "message") if kind == "messages" else (onestep, "response")
    real = getattr(mod, name)
    r = svc.derender(raw, kind, 123)
    got = (r.status, bytes(r.body))
    monkeypatch.setattr(mod, name, lambda *a, **k: None)
    r = svc.derender(raw, kind, 123)
    monkeypatch.setattr(mod, name, real)
    return got, (r.status, bytes(r.body))


@pytest.mark.parametrize("kind", ["responses", "messages"])
@pytest.mark.parametrize("model", MODELS)
def test_hostile_bodies_one_step_is_the_reference(model, kind, monkeypatch):
    """Generated bodies through the service: one step = reference (status, bytes), 200 / 4xx."""
    svc = parity_service()
    rng = random.Random(model + kind)
    seen = set()
    for _ in range(150):
        raw = _body(rng, svc, model, kind)
        got, want = _both(monkeypatch, svc, raw, kind)
        assert got == want, raw
        assert got[0] in (200, 400), (raw, got)
        seen.add(got[0])
    assert 200 in seen and 400 in seen


@pytest.mark.parametrize("case", [c for c in cases() if c.tools], ids=lambda c: c.name)
def test_family_hostile_fields(case):
    """Each tool family on its runtime: spliced example ids with stray / EOS ids, odd finishes and
    stop reasons, unknown tool names, thinking on and off, ``skip_special_tokens`` off,
    transfer params: ``one_step`` True and False give the same bytes (or the same 400)."""
    rt = family_runtime(case, "whole")
    tok = rt.tokenizer
    rng = random.Random(case.name + "b32")
    base = build_ids(tok, case.example, 40)
    extra_ids = sorted(tok.added_token_ids) + sorted(tok.eos_token_ids or [])
    for _ in range(25):
        ids: list[int] = []
        for _ in range(rng.randrange(0, 5)):
            i = rng.randrange(len(base))
            ids += base[i:rng.randrange(i, len(base) + 1)]
        for _ in range(rng.choice([0, 1, 3])):
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(extra_ids + [rng.randrange(tok.vocab_size)]))
        req: dict = {"model": "m", "input": "x", "tools": TOOLS}
        tc = rng.choice([None, "none", "auto", "required", {"type": "function", "name": "get_weather"},
                         {"type": "function", "name": "nope"}])
        if tc is not None:
            req["tool_choice"] = tc
        kw = rng.choice([case.example.kwargs, {"enable_thinking": False}, {"thinking": True}])
        if kw:
            req["chat_template_kwargs"] = kw
        if rng.random() < 0.2:
            req["skip_special_tokens"] = False
        gr = {"request_id": "r", "kv_transfer_params": {"k": 1} if rng.random() < 0.3 else None,
              "choices": [{"index": 0, "token_ids": ids, "finish_reason": rng.choice(["stop", "length", "abort", None]),
                           "stop_reason": rng.choice([None, "", "x", ids[-1] if ids else None, 0])}]}
        body = {"model": "m", "generate_response": gr, "responses_request": req,
                "prompt_token_ids": tok.encode("<|im_start|>assistant\n")}
        out = []
        for one in (True, False):
            try:
                out.append(_enc.encode(derender_responses(rt, msgspec.convert(body, DerenderResponsesRequest), 9,
                                                          one_step=one)))
            except BadRequest as e:
                out.append(str(e).encode())
        assert out[0] == out[1], (ids, req)


def _qwen3_body(ids: list[int], prompt: list[int], finish: str | None = "stop", stop_reason=None,
                req: dict | None = None) -> bytes:
    return json.dumps({"model": "qwen3", "prompt_token_ids": prompt, "generate_response": {
        "request_id": "r", "choices": [{"index": 0, "token_ids": ids, "finish_reason": finish, "stop_reason": stop_reason}]},
        "responses_request": {"model": "qwen3", "input": "x", "tools": TOOLS[1:], **(req or {})}}).encode()


def test_named_hostile_outputs(monkeypatch):
    """Outputs named in the brief (Qwen3 + Hermes, no ``max_model_len``): a prompt ending
    mid-character, a 40k-token reasoning + 50k-character call, a call open at a ``length``
    cut, text and reasoning after a call, EOS alone / three times, ``<|endoftext|>`` as an int
    stop reason, logprobs asked but absent, a 62-bit stop reason: same bytes, 200."""
    from worker.bench.floor import make_service

    svc = make_service("worker/demo_data/qwen3")
    tok = svc.runtime("qwen3").tokenizer
    eos = tok.token_to_id("<|im_end|>")
    e = tok.encode("東京😀")
    call = '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'
    bodies = [
        _qwen3_body(e[1:] + tok.encode(call), e[:1]),
        _qwen3_body(tok.encode("<think>" + "a b " * 20000 + '</think><tool_call>\n{"name": "search", "arguments": '
                               '{"q": "' + "x" * 50000 + '"}}\n</tool_call>'), []),
        _qwen3_body(tok.encode('<tool_call>\n{"name": "search", "arguments": {"q": "ab'), [], "length"),
        _qwen3_body(tok.encode(call + "tail text<think>x</think>"), []),
        _qwen3_body([eos], []),
        _qwen3_body([eos] * 3, [], None),
        _qwen3_body(tok.encode("hi") + [tok.token_to_id("<|endoftext|>")], [], "stop", tok.token_to_id("<|endoftext|>")),
        _qwen3_body(tok.encode("<think>r</think>hello"), [], req={"include": ["message.output_text.logprobs"]}),
        _qwen3_body(tok.encode("hello"), [], "stop", 2**62),
    ]
    for raw in bodies:
        got, want = _both(monkeypatch, svc, raw, "responses")
        assert got == want and got[0] == 200, raw[:300]


def _bare_array_body(model: str, text: str) -> bytes:
    svc = parity_service()
    ids = svc.runtime(model).tokenizer.encode(text)
    return json.dumps({"model": model, "generate_response": {"request_id": "r", "choices": [
        {"index": 0, "token_ids": ids, "finish_reason": "stop"}]}, "messages_request": {
        "model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "search", "input_schema": {}}], "tool_choice": {"type": "any"}}}).encode()


@pytest.mark.parametrize("name", ["\x16search", "se\\qarch", "\\ud800"])
def test_bare_array_call_name_not_a_string(name, monkeypatch):
    """Mistral's bare call array (``tool_choice: any``) whose call name is no JSON string (a raw
    control character, a bad escape) or escapes a lone surrogate: was a 500 on both Messages
    paths (``json.loads`` in ``bare_array.scan``); now the object opens no call, its text stays
    content (200)."""
    svc = parity_service()
    raw = _bare_array_body("mistral-7b-v0.3", '[{"name": "' + name + '", "arguments": {"q": "x"}}]')
    got, want = _both(monkeypatch, svc, raw, "messages")
    assert got == want and got[0] == 200, got
    content = json.loads(got[1])["content"]
    assert [b["type"] for b in content] == ["text"]
    ok = _bare_array_body("mistral-7b-v0.3", '[{"name": "search", "arguments": {"q": "x"}}]')
    assert json.loads(svc.derender(ok, "messages").body)["content"][0]["type"] == "tool_use"


_SURROGATE = {
    "responses": ("qwen3", '<tool_call>\n{"name": "search", "arguments": {"q": "\\ud800x"}}\n</tool_call>',
                  {"model": "qwen3", "input": "x", "tools": TOOLS}),
    "messages": ("llama3", '{"name": "search", "arguments": {"q": "\\ud800x"}}',
                 {"model": "llama3", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
                  "tools": [{"name": "search", "input_schema": {}}]}),
}


@pytest.mark.parametrize("kind", ["responses", "messages"])
def test_lone_surrogate_arguments_not_a_500(kind, monkeypatch):
    """Call arguments escaping a lone surrogate (``\\ud800``): the tool parser decodes the call
    JSON and encodes it again, which once put a code point no UTF-8 reply holds (a 500 on both
    paths, as in vLLM's JSON response); the stack writes it back as the model's escape
    (``stack.escape_lone_surrogates``): 200, the same reply on both paths."""
    svc = parity_service()
    model, text, req = _SURROGATE[kind]
    raw = json.dumps({"model": model, "generate_response": {"request_id": "r", "choices": [{
        "index": 0, "token_ids": svc.runtime(model).tokenizer.encode(text), "finish_reason": "stop"}]},
        f"{kind}_request": req}).encode()
    got, want = _both(monkeypatch, svc, raw, kind)
    assert got == want and got[0] == 200, got
    if kind == "responses":
        call = json.loads(got[1])["output"][-1]
        assert call["type"] == "function_call" and call["arguments"] == '{"q": "\\ud800x"}'


@pytest.mark.parametrize("streaming", ["whole", "incremental"])
@pytest.mark.parametrize("args", ['{"q": "\\ud800x"}', '{"q": "a\\udfff\\ud83d\\ude00 é"}'])
def test_lone_surrogate_arguments_chat(args, streaming):
    """The same on chat, non-streaming and streamed in 1-token chunks (both tool-call streaming
    modes): 200 everywhere, the call's arguments the model's text (its escapes kept; a valid
    pair, decoded, stays the character), streamed fragments joining to the non-streaming ones."""
    from worker.config import ServedModelConfig
    from worker.core.service import DerenderService

    svc = DerenderService([ServedModelConfig(name="qwen3", tokenizer=str(QWEN3), reasoning_parser="qwen3",
                                             tool_parser="hermes", enable_auto_tool_choice=True,
                                             tool_call_streaming=streaming)])
    tok = svc.runtime("qwen3").tokenizer
    text = '<tool_call>\n{"name": "search", "arguments": ' + args + '}\n</tool_call>'
    ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
    req = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": t} for t in
                     ({k: v for k, v in t.items() if k != "type"} for t in TOOLS)]}
    r = svc.derender(json.dumps({"model": "qwen3", "chat_request": req, "generate_response": {
        "request_id": "r", "choices": [{"index": 0, "token_ids": ids}]}}).encode(), "chat")
    assert r.status == 200, r.body
    got = json.loads(r.body)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(got) == json.loads(args)
    state, streamed = None, []
    for k, t in enumerate(ids):
        b = {"model": "qwen3", "stream": True, "generate_chunk": {"request_id": "r", "choices": [
            {"index": 0, "token_ids": [t], "finish_reason": "stop" if k == len(ids) - 1 else None}]}}
        if k == 0:
            b["chat_request"] = req
        out, state = svc.derender_stream(json.dumps(b).encode(), state)
        assert out.status == 200, out.body
        for chunk in json.loads(out.body):
            for c in chunk["choices"]:
                streamed += [tc["function"].get("arguments") or "" for tc in c["delta"].get("tool_calls") or []]
    assert json.loads("".join(streamed)) == json.loads(args)


_OSS = ["<|channel|>", "analysis", "final", "commentary", " to=functions.get_weather", " to=functions.nope",
        " <|constrain|>json", "<|message|>", "<|end|>", "<|start|>assistant", "<|call|>", "<|return|>",
        '{"city": "P"}', "hello 東京", "🙂", "{", '"', " ", "\n"]


def test_gpt_oss_both_apis(monkeypatch):
    """gpt-oss (o200k_harmony, Harmony parsers: the stop token read) for Responses and Messages:
    one step = reference, 200. Messages once answered a 500 on both paths when the output
    started with an added token followed by others under tools (``_lead_merged`` read
    ``start_ids``, which the Harmony reasoning parser lacked; now on ``ReasoningParser``)."""
    from worker.config import ServedModelConfig
    from worker.core.service import DerenderService

    svc = DerenderService([ServedModelConfig(name="gpt-oss", tokenizer="o200k_harmony", reasoning_parser="openai_gptoss",
                                             tool_parser="openai", enable_auto_tool_choice=True, max_model_len=100000)])
    tok = svc.runtime("gpt-oss").tokenizer
    rng = random.Random(5)
    first = [200006, 173781, 35644, 24912, 185244, 17196, 220, 200003, 4108, 200012, 1, 200002, 316, 28, 44580, 775,
             170154, 200012, 200007]  # (the 500 the pass found: Messages, tool_choice any)
    for i in range(300):
        ids = first if i < 2 else tok.encode("".join(rng.choice(_OSS) for _ in range(rng.randrange(0, 20))))
        if i >= 2 and ids and rng.random() < 0.2:
            ids.insert(rng.randrange(len(ids) + 1), rng.randrange(tok.vocab_size))
        kind = ["responses", "messages"][i % 2]
        if kind == "responses":
            req: dict = {"model": "gpt-oss", "input": "x", "tools": [{"type": "function", "name": "get_weather",
                                                                        "parameters": {}}]}
            tc = rng.choice([None, "none", "required", "auto", {"type": "function", "name": "get_weather"}])
        else:
            req = {"model": "gpt-oss", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                   "tools": [{"name": "get_weather", "input_schema": {}}]}
            tc = {"type": "any"} if i < 2 else rng.choice([None, {"type": "none"}, {"type": "any"}, {"type": "auto"}])
        if tc is not None:
            req["tool_choice"] = tc
        if rng.random() < 0.2:
            req["skip_special_tokens"] = False
        raw = json.dumps({"model": "gpt-oss", "prompt_token_ids": tok.encode("<|start|>assistant"),
                          "generate_response": {"request_id": "r", "choices": [{
                              "index": 0, "token_ids": ids, "finish_reason": rng.choice(["stop", "length", None]),
                              "stop_reason": rng.choice([None, ids[-1] if ids else None, ""])}]},
                          f"{kind}_request": req}).encode()
        got, want = _both(monkeypatch, svc, raw, kind)
        assert got == want and got[0] == 200, (raw, got)


@pytest.mark.parametrize("streaming", ["whole", "incremental"])
@pytest.mark.parametrize("case", [c for c in cases() if c.kind == "tool"], ids=lambda c: c.name)
def test_lone_surrogate_every_tool_family(case, streaming):
    """Every tool family's example with a lone surrogate escaped in a string argument and in a
    call name (``\\\\ud800``, as a model writes it): no 500 from chat, Responses or Messages,
    non-streaming or streamed in 1-token chunks (the stream state holds no such code point)."""
    svc = family_service(case, streaming)
    rt = svc.runtime("m")
    text = rt.tokenizer.decode(build_ids(rt.tokenizer, case.example, 0), skip_special_tokens=False)
    tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("get_weather", "get_time")]
    reqs = {"chat": {"chat_request": {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                      "tools": [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                                                for t in tools]}},
            "responses": {"responses_request": {"model": "m", "input": "x", "tools": tools}},
            "messages": {"messages_request": {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                                              "tools": [{"name": t["name"], "input_schema": {}} for t in tools]}}}
    for old, new in (("Paris", "Pa\\ud800ris"), ("get_time", "get_\\udc00time")):
        ids = rt.tokenizer.encode(text.replace(old, new))
        for kind, req in reqs.items():
            body = {"model": "m", "generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]}}
            r = svc.derender(json.dumps({**body, **req}).encode(), kind)
            assert r.status < 500, (kind, old, r.body[:300])
            state = None
            for k, t in enumerate(ids):
                b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "r", "choices": [
                    {"index": 0, "token_ids": [t], "finish_reason": "stop" if k == len(ids) - 1 else None}]}}
                out, state = svc.derender_stream(json.dumps({**b, **req} if k == 0 else b).encode(), state, kind=kind)
                assert out.status < 500, (kind, old, k, out.body[:300])
