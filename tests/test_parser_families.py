"""Golden vectors for the parser families (text level), following a numbered corner-case taxonomy:

1 single call · 2 parallel calls · 3 no call · 4 malformed markup (content, verbatim) ·
5 missing end marker · 6 marker split across chunks (every vector runs split) ·
7 reasoning + tool · 8 tool_choice none / required / named through the stack ·
9 finish_reason (``tool_calls`` only when an ``auto`` request got calls).

Reasoning vectors use r-numbers: r1 complete block · r2 no start marker · r3 no end marker ·
r4 no block at all · r5 request / prompt switches.

Every vector runs as one delta, as 1-char deltas and as random-size deltas (3 seeds); the state
is round-tripped through ``msgspec.json`` + ``ParserStack.load_state`` between deltas; all runs
must give the same final reasoning / content / calls. The tokenizer is the Qwen3 test tokenizer
with the family's markers added as special tokens, wrapped by ``FastTokenizer.from_fast``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.parsers import (
    TOK_JSON,
    VECTORS,
    V,
    run,
    splits,
    tokenizer,
)
from worker.parsers import REASONING_PARSERS, TOOL_PARSERS, make_reasoning_parser, make_tool_parser
from worker.parsers.base import RequestContext
from worker.parsers.stack import ParserStack

# the vectors and the machinery running them: tests/harness/parsers.py





@pytest.mark.parametrize("v", VECTORS, ids=[v.id for v in VECTORS])
def test_vector(v: V) -> None:
    results = [run(v, parts) for parts in splits(v.text)]
    r, c, calls, fin = results[0]
    assert (r, c, calls) == (v.reasoning, v.content, v.calls)
    if v.finish is not None:
        assert fin == v.finish
    for other in results[1:]:
        assert other == results[0], "split-dependent result"


MINE_REASONING = {"deepseek_r1", "mistral", "granite", "glm45", "glm47", "kimi_k2", "minimax_m2",
                  "minimax_m2_append_think", "openai_gptoss", "seed_oss", "ernie45", "hunyuan_a13b", "olmo3", "step3",
                  "cohere_command3", "nemotron_v3", "gemma4"}
MINE_TOOL = {"llama4_json", "llama4_pythonic", "pythonic", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm45", "glm47",
             "granite", "granite4", "granite-20b-fc", "internlm", "jamba", "minimax_m2", "phi4_mini_json", "xlam",
             "seed_oss", "hunyuan_a13b", "longcat", "openai", "step3", "ernie45", "gemma4", "olmo3"}


def test_every_family_parser_registered_and_covered() -> None:
    assert MINE_REASONING <= set(REASONING_PARSERS)
    assert MINE_TOOL <= set(TOOL_PARSERS)
    covered_r = {v.reasoning_parser for v in VECTORS}
    covered_t = {v.tool_parser for v in VECTORS}
    assert MINE_REASONING - covered_r == set()
    assert MINE_TOOL - covered_t == set()


@pytest.mark.parametrize("name", sorted(MINE_REASONING | MINE_TOOL))
def test_parsers_construct_with_markers_tokenizer(name: str) -> None:
    """Every parser builds on a real tokenizer facade (``token_to_id`` over added tokens)."""
    tok = tokenizer("plain")
    if name in MINE_REASONING:
        assert make_reasoning_parser(name, tok) is not None
    if name in MINE_TOOL:
        assert make_tool_parser(name, tok) is not None


def test_marker_tokens_resolve() -> None:
    tok = tokenizer("kimi")
    p = make_reasoning_parser("kimi_k2", tok)
    assert p.start_ids and p.end_ids is not None
    assert tok.token_to_id("<|tool_calls_section_begin|>") is not None
    assert p.implicit_end_ids == frozenset({tok.token_to_id("<|tool_calls_section_begin|>")})


def test_prompt_preopened_think_glm47() -> None:
    """r5: GLM-4.7's generation prompt ends with ``<think>`` -> output starts in reasoning."""
    tok = tokenizer("glm")
    fast_ids = [tok.token_to_id("<|assistant|>"), tok.token_to_id("<think>")]
    stack = ParserStack(make_reasoning_parser("glm47", tok), None)
    st = stack.initial_state(RequestContext(prompt_token_ids=[i for i in fast_ids if i is not None]))
    d = stack.feed(st, "plan</think>done", [])
    d.extend(stack.finish(st))
    assert (d.reasoning, d.content) == ("plan", "done")


def test_needs_special_tokens_flags() -> None:
    tok = tokenizer("plain")
    for name in ("openai_gptoss", "gemma4", "mistral", "kimi_k2", "cohere_command3"):
        assert make_reasoning_parser(name, tok).needs_special_tokens
    for name in ("openai", "gemma4", "kimi_k2", "deepseek_v3", "deepseek_v32", "step3", "internlm"):
        assert make_tool_parser(name, tok).needs_special_tokens
    assert not make_reasoning_parser("olmo3", tok).needs_special_tokens
    assert not make_reasoning_parser("hunyuan_a13b", tok).needs_special_tokens


def test_docs_table_is_current() -> None:
    """``docs/parsers.md`` (``worker.parsers.table.DOC_PAGE``) embeds ``python -m
    worker.parsers.table``; regenerate it when the registry changes."""
    from worker.parsers.table import DOC_PAGE, markdown

    doc = (Path(__file__).parent.parent / DOC_PAGE).read_text(encoding="utf-8")
    begin = doc.index("-->\n", doc.index("<!-- BEGIN parser table")) + len("-->\n")
    end = doc.index("<!-- END parser table -->")
    assert doc[begin:end] == markdown(), f"{DOC_PAGE} parser table is stale: rerun python -m worker.parsers.table --update"


def test_table_lists_every_registered_parser() -> None:
    from worker.parsers.table import rows

    listed = {(kind, name) for name, kind, *_ in rows()}
    assert listed == {("reasoning", n) for n in REASONING_PARSERS} | {("tool", n) for n in TOOL_PARSERS}
    assert all(r[4] == "yes" for r in rows())


def test_every_parser_has_a_parsing_example() -> None:
    """``worker/parsers/examples.py`` (the benchmark's templates) covers every registered parser,
    and each template, padded to 300 tokens, parses into its expected structure (calls found for
    tool parsers, reasoning for reasoning parsers; streaming == non-streaming)."""
    from worker.bench.parsers import check, prepare
    from worker.parsers.examples import REASONING_EXAMPLES, TOOL_EXAMPLES, cases

    assert set(REASONING_EXAMPLES) == set(REASONING_PARSERS)
    assert set(TOOL_EXAMPLES) == set(TOOL_PARSERS)
    bad = []
    for case in cases():
        p = prepare(case, 300, path=str(TOK_JSON))
        ok, summary = check(p)
        if not ok or len(p.ids) != 300:
            bad.append(f"{case.name} ({case.kind}): {summary}, {len(p.ids)} tokens")
        if case.tool_parser is not None:
            assert case.example.calls > 0, case.name
    assert bad == []
