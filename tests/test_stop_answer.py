"""Stop strings apply to the answer, not to the reasoning (bug-111's kind; worker.core.answer).

For every registered reasoning parser (its realistic template from ``worker.parsers.examples``,
on the Qwen3 test tokenizer with the family's markers added, as tests/test_parser_families.py)
and every reasoning + tool pairing vLLM serves, the output carries the stop string ``Question:``
in the reasoning and, in some runs, in the answer too. Checked through the core's chat paths
(``derender_chat`` and ``derender_chat_chunk``, state round-tripped as bytes):

* the reasoning is never cut and is the same as without ``stop``; a stop string only in the
  reasoning changes nothing (calls and finish_reason included);
* a stop string in the answer cuts the content there (through it with
  ``include_stop_str_in_output``), ``finish_reason`` ``stop`` and ``stop_reason`` the string;
  token ids and logprobs end at the token that completed the match; usage counts every token;
* streamed in 1-token, 3-token and random chunks: the same answer, token ids, logprob tokens
  and usage; no chunk after the choice's finish; the held-back answer tail stays shorter than
  the longest stop string.
"""
from __future__ import annotations

import functools
import json
import random

import msgspec
import pytest

from schemas import DerenderChatRequest, DerenderChatStreamRequest
from tests.harness.parsers import tokenizer
from tests.parity_tools.run_bugs import synth_logprobs
from worker.config import ServedModelConfig
from worker.core import derender as D
from worker.core import stream as S
from worker.parsers.examples import MARKERS, PAD_C, PAD_R, PAIRINGS, REASONING_EXAMPLES, TOOLS, pair_example

STOP = "Question:"
REASONING = "The Question: part asks for 3 times 4, which is 12."
ANSWER_PLAIN = "The product is 12."
ANSWER_STOP = "The product is 12.\nQuestion: what about 3 times 5?"
PROMPT = "<|im_start|>user\nWhat is 3 times 4?<|im_end|>\n<|im_start|>assistant\n"


@functools.cache
def runtime(reasoning: str, tool: str | None, markers: tuple[str, ...]) -> D.ModelRuntime:
    fam = next((m for m in markers if MARKERS.get(m)), "plain")
    tok = tokenizer(fam) if len([m for m in markers if MARKERS.get(m)]) <= 1 else _multi_tokenizer(markers)
    cfg = ServedModelConfig(name="m", tokenizer="<test>", reasoning_parser=reasoning, tool_parser=tool,
                            enable_auto_tool_choice=tool is not None)
    return D.ModelRuntime(cfg, tokenizer=tok)


@functools.cache
def _multi_tokenizer(markers: tuple[str, ...]):
    from tokenizers import Tokenizer as HFTokenizer

    from tests.harness.parsers import base_json as _base_json
    from worker.core.tokenizers import FastTokenizer
    fast = HFTokenizer.from_str(_base_json())
    fast.add_special_tokens(list(dict.fromkeys(t for m in markers for t in MARKERS[m])))
    return FastTokenizer.from_fast(fast, path="<qwen3+" + "+".join(markers) + ">")


def _body(rt: D.ModelRuntime, text: str, stop, tools, include: bool, kwargs) -> dict:
    tok = rt.tokenizer
    ids = tok.encode(text)
    prompt = tok.encode(PROMPT)
    req = {"messages": [{"role": "user", "content": "What is 3 times 4?"}], "stop": stop,
           "include_stop_str_in_output": include, "skip_special_tokens": False, "logprobs": True,
           "top_logprobs": 1, "return_token_ids": True}
    if tools:
        req["tools"] = tools
    if kwargs:
        req["chat_template_kwargs"] = kwargs
    return {"model": "m", "prompt_token_ids": prompt, "prompt_tokens": len(prompt), "chat_request": req,
            "generate_response": {"request_id": "r", "choices": [{
                "index": 0, "token_ids": ids, "finish_reason": "stop", "stop_reason": None,
                "logprobs": synth_logprobs(ids, {"top_k": 1})}]}}


def _nonstream(rt: D.ModelRuntime, body: dict) -> dict:
    b = msgspec.convert(body, DerenderChatRequest)
    D.validate_chat(rt, b)
    return msgspec.to_builtins(D.derender_chat(rt, b))


def _stream(rt: D.ModelRuntime, body: dict, sizes: list[int], stop_reason=None) -> tuple[dict, list[dict], int]:
    """(joined answer, chunks, longest held-back tail) of ``body`` streamed in ``sizes`` chunks."""
    ch = body["generate_response"]["choices"][0]
    ids, lps = ch["token_ids"], ch["logprobs"]["content"]
    state, chunks, held, pos, k = None, [], 0, 0, 0
    while pos < len(ids) or pos == 0:
        n = sizes[k % len(sizes)]
        k += 1
        last = pos + n >= len(ids)
        part = {"index": 0, "token_ids": ids[pos:pos + n], "logprobs": {"content": lps[pos:pos + n]},
                "finish_reason": "stop" if last else None, "stop_reason": stop_reason if last else None}
        sb = {"model": "m", "generate_chunk": {"request_id": "r", "choices": [part]}}
        if pos == 0:
            sb.update(prompt_token_ids=body["prompt_token_ids"], prompt_tokens=body["prompt_tokens"],
                      chat_request=dict(body["chat_request"], stream=True))
        st = S.decode_state(rt, state) if state is not None else None
        out, st = S.derender_chat_chunk(rt, msgspec.convert(sb, DerenderChatStreamRequest), st)
        held = max([held] + [len(c.held) for c in st.choices.values()])
        state = S.encode_state(st)
        chunks += [msgspec.to_builtins(o) for o in out]
        pos += n
        if last:
            break
    j = {"content": "", "reasoning": "", "calls": {}, "finish_reason": None, "stop_reason": None,
         "token_ids": [], "lp": [], "usage": None}
    ended = False
    for c in chunks:
        if c.get("usage"):
            j["usage"] = c["usage"]
        for x in c["choices"]:
            assert not ended, "chunk after the choice's finish_reason"
            d = x["delta"]
            j["content"] += d.get("content") or ""
            j["reasoning"] += d.get("reasoning") or ""
            for tc in d.get("tool_calls") or []:
                e = j["calls"].setdefault(tc["index"], ["", ""])
                e[0] += (tc.get("function") or {}).get("name") or ""
                e[1] += (tc.get("function") or {}).get("arguments") or ""
            j["token_ids"] += x.get("token_ids") or []
            j["lp"] += [e["token"] for e in (x.get("logprobs") or {}).get("content") or []]
            if x.get("finish_reason"):
                j["finish_reason"], j["stop_reason"] = x["finish_reason"], x.get("stop_reason")
                ended = True
    return j, chunks, held


def _view(resp: dict) -> dict:
    ch = resp["choices"][0]
    m = ch["message"]
    return {"content": m.get("content") or "", "reasoning": m.get("reasoning") or "",
            "calls": {i: [t["function"]["name"], t["function"]["arguments"]] for i, t in enumerate(m.get("tool_calls") or [])},
            "finish_reason": ch["finish_reason"], "stop_reason": ch["stop_reason"],
            "token_ids": ch["token_ids"], "lp": [e["token"] for e in ch["logprobs"]["content"]],
            "usage": resp["usage"]}


def _check_stream_equals(rt, body, ns: dict, seed: str) -> None:
    rng = random.Random(seed)
    for sizes in ([1], [3], [rng.randint(1, 6) for _ in range(6)]):
        got, _, held = _stream(rt, body, sizes)
        assert got == ns, sizes
        assert held <= len(STOP) - 1, sizes


def _reasoning_cases():
    out = []
    for name, ex in REASONING_EXAMPLES.items():
        out.append(pytest.param(name, None, ex, None, id=name))
    for r, t in PAIRINGS:
        out.append(pytest.param(r, t, pair_example(r, t), TOOLS, id=f"{r}+{t}"))
    return out


def _fill(template: str, reasoning: str, answer: str) -> str:
    return template.replace(PAD_R, reasoning).replace(PAD_C, answer)


@pytest.mark.parametrize("rname,tname,ex,tools", _reasoning_cases())
def test_stop_string_in_reasoning_only_changes_nothing(rname, tname, ex, tools):
    rt = runtime(rname, tname, ex.markers)
    text = _fill(ex.template, REASONING, ANSWER_PLAIN)
    ref = _view(_nonstream(rt, _body(rt, text, None, tools, False, ex.kwargs)))
    body = _body(rt, text, [STOP, "\x00never"], tools, False, ex.kwargs)
    ns = _view(_nonstream(rt, body))
    if ex.reasoning:
        assert STOP in ref["reasoning"], "the template must put the stop string in the reasoning"
        assert ns == ref
        _check_stream_equals(rt, body, ns, f"{rname}+{tname}")
    else:  # the family keeps its thinking in the content: there the stop string is the answer's
        assert ns["stop_reason"] == STOP and STOP not in ns["content"]


@pytest.mark.parametrize("include", [False, True], ids=["cut", "include"])
@pytest.mark.parametrize("rname,tname,ex,tools", _reasoning_cases())
def test_stop_string_cuts_the_answer_only(rname, tname, ex, tools, include):
    rt = runtime(rname, tname, ex.markers)
    text = _fill(ex.template, REASONING, ANSWER_STOP)
    ref = _view(_nonstream(rt, _body(rt, text, None, tools, include, ex.kwargs)))
    body = _body(rt, text, ["\x00never", STOP], tools, include, ex.kwargs)
    ns = _view(_nonstream(rt, body))
    ids = body["generate_response"]["choices"][0]["token_ids"]
    if ex.reasoning:
        assert STOP in ref["reasoning"]
        assert ns["reasoning"] == ref["reasoning"], "the reasoning is never cut"
    assert (ns["finish_reason"], ns["stop_reason"]) == ("stop", STOP)
    if PAD_C in ex.template:  # the answer prose precedes any tool call: the cut drops the calls
        full = ref["content"]
        first = full.index(STOP)
        assert ns["content"] == full[: first + (len(STOP) if include else 0)]
        assert ns["calls"] == {}
    # ids / logprobs end at the token completing the answer's stop string; usage counts all
    kept = ns["token_ids"]
    assert kept == ids[: len(kept)] and len(kept) < len(ids)
    assert len(ns["lp"]) == len(kept)
    dec = rt.tokenizer.decode
    at = text.rindex(STOP) if ex.reasoning else text.index(STOP)  # the answer's first stop string
    n_before = text.count(STOP, 0, at)
    assert dec(kept, skip_special_tokens=False).count(STOP) == n_before + 1
    assert dec(kept[:-1], skip_special_tokens=False).count(STOP) == n_before
    assert ns["usage"]["completion_tokens"] == len(ids)
    _check_stream_equals(rt, body, ns, f"{rname}+{tname}+{include}")


def test_bug_111_example_qwen3():
    """The issue's example: the reasoning keeps its 'Question:', the answer stops at its own."""
    ex = REASONING_EXAMPLES["qwen3"]
    rt = runtime("qwen3", None, ex.markers)
    text = "<think>\n" + REASONING + "\n</think>\n\n" + ANSWER_STOP
    ns = _view(_nonstream(rt, _body(rt, text, [STOP], None, False, None)))
    assert ns["reasoning"] == "\n" + REASONING + "\n"
    assert ns["content"] == "\n\n" + ANSWER_PLAIN + "\n"
    assert (ns["finish_reason"], ns["stop_reason"]) == ("stop", STOP)


def test_min_tokens_still_counts_reasoning_tokens():
    """``min_tokens`` counts every generated token (reasoning included), as vLLM's check does:
    with min_tokens past the answer's stop string, nothing is cut."""
    ex = REASONING_EXAMPLES["qwen3"]
    rt = runtime("qwen3", None, ex.markers)
    text = "<think>\n" + REASONING + "\n</think>\n\n" + ANSWER_STOP
    body = _body(rt, text, [STOP], None, False, None)
    n = len(body["generate_response"]["choices"][0]["token_ids"])
    body["chat_request"]["min_tokens"] = n
    ns = _view(_nonstream(rt, body))
    assert ns["content"] == "\n\n" + ANSWER_STOP and ns["stop_reason"] is None
    _check_stream_equals(rt, body, ns, "min_tokens")


# ------------------------------------------------- gpt-oss on its real ids (Harmony id mode) ---
@functools.cache
def _gptoss_runtime() -> D.ModelRuntime:
    cfg = ServedModelConfig(name="m", tokenizer="o200k_harmony", reasoning_parser="openai_gptoss",
                            tool_parser="openai", enable_auto_tool_choice=True)
    return D.ModelRuntime(cfg)


GPTOSS_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                                                                                      "properties": {}}}}]


@pytest.mark.parametrize("answer,want_content,want_stop", [
    ("The product is 12.\nQuestion: what about 5?", "The product is 12.\n", STOP),
    ("The product is 12.", "The product is 12.", None),
], ids=["answer-stop", "reasoning-only"])
def test_gptoss_ids_stop_string_skips_analysis(answer, want_content, want_stop):
    """gpt-oss parsed from its o200k_harmony ids: the analysis channel is reasoning and keeps its
    stop word; the final channel is the answer the stop string cuts; a call after the analysis
    survives a stop word that only the analysis holds."""
    rt = _gptoss_runtime()
    assert rt.stack.wants_stop_token, "o200k_harmony must select the id path"
    text = ("<|channel|>analysis<|message|>" + REASONING + "<|end|><|start|>assistant<|channel|>final<|message|>"
            + answer + "<|return|>")
    body = _body(rt, text, [STOP], None, False, None)
    body["generate_response"]["choices"][0]["stop_reason"] = 200002  # <|return|> ended generation
    ns = _view(_nonstream(rt, body))
    assert ns["reasoning"] == REASONING and ns["content"] == want_content
    assert (ns["finish_reason"], ns["stop_reason"]) == ("stop", want_stop if want_stop else 200002)
    _check_stream_equals_gptoss(rt, body, ns)
    # a call after the analysis: kept when only the reasoning holds the stop word
    call = ("<|channel|>analysis<|message|>" + REASONING + "<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
    body = _body(rt, call, [STOP], GPTOSS_TOOLS, False, None)
    body["generate_response"]["choices"][0]["stop_reason"] = 200012  # <|call|>
    ns = _view(_nonstream(rt, body))
    assert ns["reasoning"] == REASONING
    assert [(n, json.loads(a)) for n, a in ns["calls"].values()] == [("get_weather", {"city": "Paris"})]
    assert ns["finish_reason"] == "tool_calls"
    _check_stream_equals_gptoss(rt, body, ns)


def _check_stream_equals_gptoss(rt, body, ns) -> None:
    stop_reason = body["generate_response"]["choices"][0]["stop_reason"]
    for sizes in ([1], [3], [2, 5, 1]):
        got, _, _ = _stream(rt, body, sizes, stop_reason=stop_reason)
        assert got == ns, sizes
