"""Issue 26 item 6: vLLM 0.32's parser-engine rule for whitespace-only content before the first
text (``ToolParser.defers_leading_ws``: qwen3_coder, qwen3_xml, mistral), applied by
``ParserStack`` for every API: held and joined to the next content, tools in the request or
not; alone at the output's end or with a call; never for other parsers (hermes streams it as
it comes without tools); after the first text a whitespace-only delta goes out alone."""
from __future__ import annotations

import msgspec
import pytest

from tests.harness.parsers import tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import RequestContext
from worker.parsers.stack import LEAD_WS_LIMIT, ParserStack

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _contents(tool: str, parts: list[str], tools: list | None) -> list[str]:
    tok = tokenizer("plain")
    stack = ParserStack(make_reasoning_parser("qwen3", tok), make_tool_parser(tool, tok), enable_auto_tool_choice=True)
    st = stack.initial_state(RequestContext(tools=tools))
    out = []
    for p in parts:
        out.append(stack.feed(st, p, []).content)
        st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    out.append(stack.finish(st).content)
    return out


THINK = ["<think>", "\nB is cheaper.\n", "</think>"]


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_engine_parser_joins_leading_whitespace(tools):
    got = _contents("qwen3_coder", THINK + ["\n\n", "Option", " B", "\n\n", "."], tools)
    assert got[3:] == ["", "\n\nOption", " B", "\n\n", ".", ""]


def test_hermes_without_tools_streams_it_alone():
    got = _contents("hermes", THINK + ["\n\n", "Option", " B"], None)
    assert got[3:] == ["\n\n", "Option", " B", ""]


def test_whitespace_only_answer_is_sent_at_the_end():
    got = _contents("qwen3_coder", THINK + ["\n\n", " "], None)
    assert got[3:] == ["", "", "\n\n "]


def test_held_whitespace_is_bounded():
    got = _contents("qwen3_coder", THINK + [" " * LEAD_WS_LIMIT, " ", "x"], None)
    assert got[3:] == ["", " " * (LEAD_WS_LIMIT + 1), "x", ""]
