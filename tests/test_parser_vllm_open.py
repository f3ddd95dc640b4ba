"""The kinds behind the 9 vLLM vectors left open after issue 24 (``docs/parsers.md``, vLLM's parser
tests): Seed-OSS's think block seen by its tool parser (a quoted region: content, never calls),
Gemma 4's ``<channel|>`` with no channel open (dropped, the text stays content) and Cohere
Command 3's framing whitespace (the answers of Cohere's ``cohere_melody`` 0.15.3 ``cmd3`` filter,
which vLLM's parser runs, for the same outputs; facts, not code).

Each vector runs non-streaming, then streamed in 1-token and random token chunks with
``--tool-call-streaming`` ``whole`` and ``incremental`` (state round-tripped after every chunk,
``tests.harness.vllm_vectors.run_output``) on the family's test tokenizer (markers as single
ids); every run must give the expected answer, so the joined stream equals the non-streaming one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.harness.vllm_vectors import run_output

_P = "<parameter=city>\nParis\n</parameter>\n"
CALL = f"<seed:tool_call>\n<function=get_weather>\n{_P}</function>\n</seed:tool_call>"
BARE = f"<function=get_weather>\n{_P}</function>"
_CT, _CE, _CR, _CRE = "<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
           {"type": "function", "function": {"name": "f", "parameters": {
               "type": "object", "properties": {"x": {"type": "integer"}}}}}]


@dataclass
class V:
    id: str
    tok: str
    rp: str | None
    tp: str | None
    text: str
    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)


CASES = [
    # Seed-OSS, --tool-parser seed_oss alone: a think block is a quoted region
    V("seed-quoted-call-then-call", "test/seed_oss", None, "seed_oss",
      f"<seed:think>The format is {CALL}. Go.</seed:think>{CALL}",
      content=f"<seed:think>The format is {CALL}. Go.</seed:think>", calls=[PARIS]),
    V("seed-quoted-bare-call", "test/seed_oss", None, "seed_oss",
      f"<seed:think>Write {BARE} then.</seed:think>\n{CALL}",
      content=f"<seed:think>Write {BARE} then.</seed:think>\n", calls=[PARIS]),
    V("seed-unclosed-think-stays-content", "test/seed_oss", None, "seed_oss",
      f"<seed:think>maybe {CALL} and", content=f"<seed:think>maybe {CALL} and"),
    V("seed-two-think-blocks", "test/seed_oss", None, "seed_oss",
      f"<seed:think>a</seed:think>Text <seed:think>{CALL}</seed:think>{CALL}",
      content=f"<seed:think>a</seed:think>Text <seed:think>{CALL}</seed:think>", calls=[PARIS]),
    V("seed-fence-inside-think-is-not-code", "test/seed_oss", None, "seed_oss",
      f"<seed:think>```</seed:think>{BARE}", content="<seed:think>```</seed:think>", calls=[PARIS]),
    V("seed-no-think-unchanged", "test/seed_oss", None, "seed_oss", f"Sure.{CALL}", content="Sure.",
      calls=[PARIS]),
    V("seed-end-without-opener-ends-nothing", "test/seed_oss", None, "seed_oss",
      f"done</seed:think>{CALL}", content="done</seed:think>", calls=[PARIS]),
    V("seed-with-reasoning-parser", "test/seed_oss", "seed_oss", "seed_oss",
      f"<seed:think>quote {CALL}</seed:think>{CALL}", reasoning=f"quote {CALL}", calls=[PARIS]),
    # Gemma 4: a <channel|> with no channel open is dropped
    V("gemma4-stray-end-after-block", "test/gemma4", "gemma4", None,
      "<|channel>thought\nR<channel|>A<channel|>B", reasoning="R", content="AB"),
    V("gemma4-stray-end-before-block", "test/gemma4", "gemma4", None,
      "A<channel|><|channel>thought\nR<channel|>B", reasoning="R", content="AB"),
    V("gemma4-stray-end-twice", "test/gemma4", "gemma4", None, "<channel|>A<channel|><channel|>",
      content="A"),
    # Cohere Command 3 (melody cmd3 answers): framing whitespace dropped, response's lead kept
    V("cohere-whitespace-around-blocks", "test/cohere", "cohere_command3", None,
      f"{_CT}  \n two spaces \n {_CE}\n\n{_CR}  lead and trail  \n{_CRE}", reasoning="two spaces",
      content="  lead and trail"),
    V("cohere-newlines-inside-blocks", "test/cohere", "cohere_command3", None,
      f"{_CT}\nx\n{_CE}\n{_CR}\n y \n{_CRE}", reasoning="x", content="\n y"),
    V("cohere-text-before-response", "test/cohere", "cohere_command3", None,
      f"{_CT}t{_CE}  between  {_CR}r{_CRE}", reasoning="t", content="  betweenr"),
    V("cohere-action-keeps-its-newline", "test/cohere", "cohere_command3", None,
      f"{_CT}t{_CE}\n<|START_ACTION|>[]<|END_ACTION|>", reasoning="t",
      content="\n<|START_ACTION|>[]<|END_ACTION|>"),
    V("cohere-plain-text-trailing-ws", "test/cohere", "cohere_command3", None, "  text  \n", content="  text"),
    V("cohere-reasoning-cut-off", "test/cohere", "cohere_command3", None, f"{_CT} a\n\nb  ", reasoning="a\n\nb"),
    V("cohere-two-responses", "test/cohere", "cohere_command3", None,
      f"{_CT}t{_CE}{_CR}a{_CRE}\n{_CR} b {_CRE}", reasoning="t", content="a b"),
    V("gemma4-stray-end-then-call", "test/gemma4", "gemma4", "gemma4",
      "A<channel|><|tool_call>call:f{x:1}<tool_call|>", content="A",
      calls=[{"name": "f", "arguments": {"x": 1}}]),
]


def _answer(c: V, how: str, mode: str, seed: int) -> tuple[str, str, list[dict[str, Any]]]:
    got = run_output(c.tok, c.rp, c.tp, c.text, tools=WEATHER if c.tp else None, how=how, mode=mode, seed=seed)
    assert got["text"] == c.text, "the tokenizer does not round-trip the output"
    return got["reasoning"], got["content"], got["tool_calls"]


@pytest.mark.parametrize("mode", ["whole", "incremental"])
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_kind(c: V, mode: str) -> None:
    want = (c.reasoning, c.content, c.calls)
    assert _answer(c, "one", mode, 0) == want, "non-streaming"
    assert _answer(c, "1", mode, 0) == want, "1-token chunks"
    for seed in (1, 2, 3):
        assert _answer(c, "random", mode, seed) == want, f"random chunks, seed {seed}"
