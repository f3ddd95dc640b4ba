"""vLLM's parser test vectors as data (``tests/data/vllm_vectors/*.json``, issue 24 item 2) and the
run of one output through our parsers on real token ids.

A data file is one vLLM test module for one parser: ``family``, ``kind`` (reasoning | tool), the
parsers, ``tokenizer`` (a directory of ``tests/data/tokenizers``, or ``test/<family>``), ``vllm_file`` /
``vllm_commit`` / ``vllm_versions`` (where the facts were copied from), and ``vectors``: ``test``
(the vLLM test id), ``streaming`` (the vLLM test's mode), ``output`` (model output text), the
expected ``reasoning`` / ``content`` (None as vLLM writes it: empty here) / ``tool_calls``
(``[{name, arguments}]``, arguments compared as JSON; ``arguments_text``: the exact text when the
vLLM test checks it), ``reasoning_tokens`` (the count vLLM's ``count_reasoning_tokens`` gives), optional ``chat_template_kwargs``, ``prompt`` (the rendered prompt's text, file or vector), ``tools``, ``tool_parser`` / ``tokenizer`` (a vector's own), ``checks`` (what the
vLLM test asserts, ``matches``; ``vllm_asserts``: the test's own words where it checks only part
of the answer, the vector's answer being the one they imply), and ``deviation`` (``ours``:
our answer, ``reason``, ``source``) or ``nonstreaming_only`` (why the streamed runs are not
compared), or ``open`` (a vector we do not pass yet: why; the test expects it to fail, so it
cannot pass unnoticed, and the coverage table counts it as run, not passed).
"""
from __future__ import annotations

import copy
import functools
import json
import random
from pathlib import Path
from typing import Any

import msgspec

from worker.core.detokenize import IncrementalDetokenizer
from worker.core.tokenizers.registry import load_tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import RequestContext
from worker.parsers.stack import ParserStack

DATA = Path(__file__).resolve().parents[1] / "data"
VECTORS_DIR = DATA / "vllm_vectors"


@functools.cache
def real_tokenizer(name: str):
    """A tokenizer of ``tests/data/tokenizers/<name>`` (``test/<family>``: the test tokenizer of
    ``tests/data/test_tokenizers/<family>``, ``tests.harness.make_test_tokenizers``; ``o200k_harmony``:
    gpt-oss's vocabulary, built from the ``bpe-openai`` package), loaded once."""
    if name == "o200k_harmony":
        return load_tokenizer(name)
    if name.startswith("test/"):
        return load_tokenizer(str(DATA / "test_tokenizers" / name.removeprefix("test/")))
    return load_tokenizer(str(DATA / "tokenizers" / name))


def load_files() -> list[dict[str, Any]]:
    """Every vector file, sorted by name."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(VECTORS_DIR.glob("*.json"))]


def chunk_sizes(n: int, how: str, rng: random.Random) -> list[int]:
    """``one`` (a single delta), ``1`` (one token per delta) or ``random`` (1-6 tokens)."""
    if how == "one":
        return [n]
    if how == "1":
        return [1] * n
    out: list[int] = []
    while sum(out) < n:
        out.append(min(rng.randint(1, 6), n - sum(out)))
    return out


def run_output(tok_name: str, rp: str | None, tp: str | None, text: str, *, tools=None, kwargs=None,
               how: str = "one", mode: str = "whole", seed: int = 0, prompt: str | None = None) -> dict[str, Any]:
    """``text`` as token ids of ``tok_name`` through a (``rp``, ``tp``) stack with
    ``--tool-call-streaming mode``, in ``how`` chunks (``one``: a non-streamed choice), the state
    round-tripped after every chunk; ``prompt``: the rendered prompt's text (its ids are the
    request's ``prompt_token_ids``), for families whose generation prompt opens the reasoning. Returns ``{reasoning, content, tool_calls: [{name,
    arguments}], arguments_text, text, reasoning_tokens}`` (``text``: the detokenized output, to check
    the round trip; ``reasoning_tokens``: the output ids counted as reasoning, for usage)."""
    tok = real_tokenizer(tok_name)
    stack = ParserStack(make_reasoning_parser(rp, tok) if rp else None, make_tool_parser(tp, tok) if tp else None,
                        enable_auto_tool_choice=True, tool_call_streaming=mode)
    ids = tok.encode(text)
    ctx = RequestContext(tools=copy.deepcopy(tools), tool_choice="auto" if tools else None,
                         chat_template_kwargs=kwargs, prompt_token_ids=tok.encode(prompt) if prompt else None)
    st = stack.initial_state(ctx, streaming=how != "one")
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    reasoning, content, seen = [], [], []
    counted = [0]
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}

    def take(d) -> None:
        reasoning.append(d.reasoning)
        content.append(d.content)
        counted[0] += d.reasoning_tokens
        for tc in d.tool_calls:
            if tc.name is not None:
                if tc.index in names:
                    raise AssertionError("a call's name comes once")
                names[tc.index] = tc.name
            args.setdefault(tc.index, []).append(tc.arguments)

    pos = 0
    for n in chunk_sizes(len(ids), how, random.Random(seed)):
        chunk = ids[pos:pos + n]
        pos += n
        t = detok.add(chunk)
        seen.append(t)
        take(stack.feed(st, t, chunk))
        st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    take(stack.finish(st))
    texts = ["".join(args[i]) for i in sorted(args)]
    calls = []
    for i, a in zip(sorted(args), texts):
        try:
            value = json.loads(a)
        except ValueError:
            value = {"<not JSON>": a}
        calls.append({"name": names.get(i), "arguments": value})
    return {"reasoning": "".join(reasoning), "content": "".join(content), "tool_calls": calls,
            "arguments_text": texts, "text": "".join(seen), "reasoning_tokens": counted[0]}


def expected(doc: dict[str, Any], v: dict[str, Any]) -> dict[str, Any]:
    """The answer a vector expects of us: vLLM's (None as empty), or ``deviation.ours`` over it."""
    want = {"reasoning": v.get("reasoning") or "", "content": v.get("content") or "",
            "tool_calls": v.get("tool_calls", [])}
    dev = v.get("deviation")
    if dev:
        for k, x in dev["ours"].items():
            want[k] = x if k == "tool_calls" else (x or "")
    if doc["kind"] == "reasoning" and v.get("tool_parser", doc.get("tool_parser")) is None:
        want["tool_calls"] = []
    return want


def matches(doc: dict[str, Any], v: dict[str, Any], got: dict[str, Any]) -> bool:
    """``got`` is the vector's expected answer (``expected``) in what the vLLM test checks
    (``checks``: ``reasoning`` / ``content`` / ``tool_calls``, or ``tool_names`` for the calls'
    names only; default all three), argument texts and ``reasoning_tokens`` (vLLM's
    ``count_reasoning_tokens``) too when given."""
    want = expected(doc, v)
    for k in v.get("checks", ("reasoning", "content", "tool_calls")):
        if k == "tool_names":
            if [c["name"] for c in got["tool_calls"]] != [c["name"] for c in want["tool_calls"]]:
                return False
        elif got[k] != want[k]:
            return False
    if "reasoning_tokens" in v and got["reasoning_tokens"] != v["reasoning_tokens"]:
        return False
    return "arguments_text" not in v or bool(v.get("deviation")) or got["arguments_text"] == v["arguments_text"]
