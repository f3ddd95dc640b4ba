"""vLLM's own parser test vectors through our parsers (issue 24 item 2), on real token ids.

The vectors are data (``tests/data/vllm_vectors/*.json``, ``tests.harness.vllm_vectors``): vLLM's
model-output strings and expected reasoning / content / calls, each with its vLLM test id, file,
commit and versions. Each vector runs non-streaming, then streamed in 1-token and random token
chunks with ``--tool-call-streaming`` ``whole`` and ``incremental`` (state round-tripped after
every chunk): every run must give the vector's answer (vLLM's, or the documented deviation's
``ours``), so the joined stream equals the non-streaming answer. Families covered: those with a
real tokenizer in ``tests/data/tokenizers``, the others on a byte-level test tokenizer with the
family's real markers as added tokens (``tests/data/test_tokenizers``), gpt-oss on ``o200k_harmony``.
``test_every_registered_parser_runs_vllm_vectors`` checks every registered parser name runs some;
``test_coverage_table`` prints per file vectors run / passed / deviations / open and per registered
name the vectors that run it (``-s``), and checks the table in ``docs/parsers.md``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.harness.vllm_vectors import expected, load_files, matches, real_tokenizer, run_output

FILES = load_files()
ITEMS = [(doc, v) for doc in FILES for v in doc["vectors"]]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "parsers.md"


def _tools(doc, v):
    """The request's tools: the vector's or file's, else (vLLM's unit tests call the parser
    without a request) one untyped function per expected call name plus a stand-in, so the tool
    parser runs (``tool_choice: auto``)."""
    tools = v.get("tools", doc.get("tools"))
    if tools is not None or v.get("tool_parser", doc.get("tool_parser")) is None:
        return tools
    names = {c["name"] for c in v.get("tool_calls", [])} | {"unused_tool"}
    dev = v.get("deviation") or {}
    names |= {c["name"] for c in dev.get("ours", {}).get("tool_calls", [])}
    return [{"type": "function", "function": {"name": n}} for n in sorted(names)]


def _run(doc, v, how="one", mode="whole", seed=0):
    return run_output(v.get("tokenizer", doc["tokenizer"]), doc.get("reasoning_parser"), v.get("tool_parser", doc.get("tool_parser")), v["output"],
                      tools=_tools(doc, v), kwargs=v.get("chat_template_kwargs"), how=how, mode=mode, seed=seed,
                      prompt=v.get("prompt", doc.get("prompt")))


def test_files_say_where_they_come_from():
    for doc in FILES:
        assert doc["vllm_file"].startswith("tests/") and doc["vllm_commit"] and doc["vllm_versions"], doc["family"]
        for v in doc["vectors"]:
            assert v["test"] and "output" in v, v
            dev = v.get("deviation")
            assert not dev or (dev.get("reason") and dev.get("source") and "ours" in dev), v["test"]
            assert not (dev and v.get("open")), v["test"]


@pytest.mark.parametrize("doc,v", ITEMS, ids=[f"{d['family']}:{v['test']}" for d, v in ITEMS])
def test_vector(doc, v):
    got = _run(doc, v)
    assert got["text"] == v["output"], "the tokenizer does not round-trip the output"
    if v.get("open"):  # a known failure, listed in docs/parsers.md: it must still fail
        assert not matches(doc, v, got), "an open vector passes now: drop its open entry"
        pytest.xfail(v["open"])
    assert matches(doc, v, got), (got, expected(doc, v))
    answer = (got["reasoning"], got["content"], got["tool_calls"], got["reasoning_tokens"])
    for mode in ("whole", "incremental"):
        if mode == "incremental" and v.get("nonstreaming_only"):
            continue
        for how, seed in (("1", 0), ("random", 1), ("random", 2)):
            s = _run(doc, v, how, mode, seed)
            assert (s["reasoning"], s["content"], s["tool_calls"], s["reasoning_tokens"]) == answer, (
                "stream != non-stream", mode, how, seed)


def _markers(doc) -> list[str]:
    if doc["tokenizer"].startswith("test/"):
        d = Path(__file__).resolve().parent / "data" / "test_tokenizers" / doc["tokenizer"].removeprefix("test/")
        return json.loads((d / "markers.json").read_text(encoding="utf-8"))["markers"]
    return {"qwen3": ["<think>", "</think>", "<tool_call>", "</tool_call>"],
            "mistral-7b-v0.3": ["[TOOL_CALLS]"], "deepseek-v4": ["<think>", "</think>"],
            "llama3": ["<|python_tag|>"],
            "o200k_harmony": ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>",
                              "<|return|>"]}[doc["tokenizer"]]


def test_markers_are_single_ids():
    for doc in FILES:
        tok = real_tokenizer(doc["tokenizer"])
        for m in _markers(doc):
            assert len(tok.encode(m)) == 1, (doc["family"], m)


def test_test_tokenizers_are_the_generators_output():
    """``tests/data/test_tokenizers`` is what ``tests.harness.make_test_tokenizers`` writes."""
    from tests.harness.make_test_tokenizers import MARKERS, OUT, build

    for fam, markers in MARKERS.items():
        stored = json.loads((OUT / fam / "tokenizer.json").read_text(encoding="utf-8"))
        assert stored == json.loads(build(markers).to_str()), fam
        assert json.loads((OUT / fam / "markers.json").read_text(encoding="utf-8"))["markers"] == markers


def coverage() -> list[tuple[str, str, int, int, int, int]]:
    """Per vector file: (family, kind, run, passed as vLLM expects, deviations, open), from the
    non-streaming runs (``test_vector`` checks the streams give the same)."""
    rows = []
    for doc in FILES:
        run = passed = dev = still_open = 0
        for v in doc["vectors"]:
            run += 1
            ok = matches(doc, v, _run(doc, v))
            if v.get("open"):
                still_open += not ok
            elif v.get("deviation"):
                dev += ok
            else:
                passed += ok
        rows.append((doc["family"], doc["kind"], run, passed, dev, still_open))
    return rows


def parsers_run() -> dict[tuple[str, str], int]:
    """(kind, registered parser name) -> vectors that run it: a file's reasoning parser, a
    vector's (or its file's) tool parser."""
    runs: dict[tuple[str, str], int] = {}
    for doc in FILES:
        for v in doc["vectors"]:
            tp = v.get("tool_parser", doc.get("tool_parser"))
            for kind, name in (("reasoning", doc.get("reasoning_parser")), ("tool", tp)):
                if name:
                    runs[(kind, name)] = runs.get((kind, name), 0) + 1
    return runs


def test_every_registered_parser_runs_vllm_vectors():
    """Issue 24: every tool and reasoning parser the registry registers runs vLLM's vectors."""
    from worker.parsers.registry import REASONING_PARSERS, TOOL_PARSERS

    runs = parsers_run()
    missing = [f"{k} {n}" for k, names in (("reasoning", REASONING_PARSERS), ("tool", TOOL_PARSERS))
               for n in sorted(names) if not runs.get((k, n))]
    assert not missing, missing


def test_coverage_table():
    rows = coverage()
    print("\nvLLM parser test vectors: family kind run passed deviations open")
    for r in rows:
        print(f"  {r[0]:<24} {r[1]:<9} {r[2]:3d} {r[3]:3d} {r[4]:3d} {r[5]:3d}")
    print("  {:<24} {:<9} {:3d} {:3d} {:3d} {:3d}".format("total", "", *(sum(r[i] for r in rows) for i in range(2, 6))))
    runs = parsers_run()
    print("registered parsers (kind name: vectors that run it):")
    print("  " + ", ".join(f"{k} {n}: {c}" for (k, n), c in sorted(runs.items())))
    text = DOCS.read_text(encoding="utf-8")
    for fam, kind, run, passed, dev, still_open in rows:
        pat = rf"\| `{re.escape(fam)}` \| {kind} \| {run} \| {passed} \| {dev} \| {still_open} \|"
        assert re.search(pat, text), (f"docs/parsers.md coverage row for {fam} {kind}: {run} run, {passed} passed, "
                                      f"{dev} deviations, {still_open} open")


def table(rows) -> str:
    """The docs/parsers.md coverage table rows for ``coverage()``."""
    return "".join(f"| `{f}` | {k} | {r} | {p} | {d} | {o} |\n" for f, k, r, p, d, o in rows)


if __name__ == "__main__":  # python -m tests.test_vllm_vectors: rewrite the docs table
    doc = DOCS.read_text(encoding="utf-8")
    head, rest = doc.split("<!-- BEGIN vllm coverage -->\n", 1)
    _, tail = rest.split("<!-- END vllm coverage -->", 1)
    rule = "| family | kind | vectors run | passed | deviations | open |\n|---|---|---|---|---|---|\n"
    DOCS.write_text(head + "<!-- BEGIN vllm coverage -->\n" + rule + table(coverage()) + "<!-- END vllm coverage -->"
                    + tail, encoding="utf-8")
