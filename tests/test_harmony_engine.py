"""The Harmony engine (``worker.parsers.harmony``) on its own: typed segments from the text
scanner, the one classifier (channel + recipient -> route, per parser role and mode), call
arguments, and the state's msgpack round trip (enums and the typed header survive the stream
state's encoding at any cut). The agreement with openai-harmony on the real ids is
``tests/test_gptoss_harmony.py``."""
from __future__ import annotations

import msgspec
import pytest

from tests.harness.parsers import TOOLS, tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import RequestContext
from worker.parsers.harmony import (
    HarmonyState,
    Header,
    Phase,
    Role,
    Route,
    Seg,
    call_arguments,
    classify,
    parse_header,
    scan,
)
from worker.parsers.stack import ParserStack

CALL = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')


def test_text_scanner_yields_typed_segments():
    st = HarmonyState()
    segs = scan(st, "hi " + CALL, final=True)
    assert [s.kind for s in segs] == [Seg.LOOSE, Seg.OPEN, Seg.BODY, Seg.CLOSE, Seg.OPEN, Seg.BODY, Seg.CLOSE]
    assert segs[1].header == Header("<|channel|>analysis", "analysis", "")
    assert segs[4].header.channel == "commentary" and segs[4].header.recipient == "functions.get_weather"
    assert segs[6].text == "<|call|>" and st.phase == Phase.TEXT


@pytest.mark.parametrize("channel,recipient,role,text_mode,route", [
    ("analysis", "", Role.REASONING, True, Route.REASONING),
    ("analysis", "", Role.TOOL, True, Route.DROP),
    ("final", "", Role.REASONING, False, Route.CONTENT),
    ("commentary", "", Role.TOOL, False, Route.CONTENT),
    ("commentary", "functions.f", Role.TOOL, True, Route.CALL),
    ("analysis", "functions.f", Role.TOOL, False, Route.CALL),  # the recipient decides
    ("commentary", "functions.f", Role.REASONING, False, Route.CALL),  # id mode: the tool parser reads it
    ("commentary", "functions.f", Role.REASONING, True, Route.RAW),  # text mode: passed on as text
    ("commentary", "browser.search", Role.REASONING, True, Route.RAW),
    ("analysis", "browser.search", Role.REASONING, False, Route.REASONING),
    ("commentary", "functions.", Role.TOOL, True, Route.CONTENT),  # no function name: not a call
])
def test_one_classifier(channel, recipient, role, text_mode, route):
    assert classify(Header("", channel, recipient), role, text_mode) == route


def test_header_grammar_and_arguments():
    assert parse_header("<|channel|>commentary to=functions.f <|constrain|>json", True) == Header(
        "<|channel|>commentary to=functions.f <|constrain|>json", "commentary", "functions.f", "<|constrain|>json")
    assert parse_header("<|channel|>", True) is None
    assert call_arguments('{"a": "é"}', "") == '{"a": "\\u00e9"}'
    assert call_arguments('{"a": 1}', "<|constrain|>xml") == '{"a": 1}'
    assert call_arguments("", "") == "{}"
    assert call_arguments("{bad", "") is None


@pytest.mark.parametrize("cut", range(0, len(CALL) + 1, 7))
def test_state_msgpack_round_trip_at_any_cut(cut):
    """The gpt-oss stack's state (Harmony sub-states: enum phase / route, typed header)
    encoded with msgpack, as the stream state store does, and re-typed by ``load_state``
    after any cut gives the one-delta answer."""
    tok = tokenizer("harmony")
    stack = ParserStack(make_reasoning_parser("openai_gptoss", tok), make_tool_parser("openai", tok),
                        enable_auto_tool_choice=True)
    ctx = RequestContext(tools=TOOLS, tool_choice="auto")

    def run(parts):
        st = stack.initial_state(ctx)
        d = None
        for p in parts:
            nd = stack.feed(st, p, [])
            d = nd if d is None else d.extend(nd)
            st = stack.load_state(msgspec.msgpack.decode(msgspec.msgpack.encode(st)))
            assert isinstance(st.tool, HarmonyState) and isinstance(st.tool.phase, Phase)
        d.extend(stack.finish(st))
        return d.reasoning, d.content, [(c.name, c.arguments) for c in d.tool_calls]

    whole = run([CALL])
    assert whole == ("Need weather.", "", [("get_weather", '{"city": "Paris"}')])
    assert run([CALL[:cut], CALL[cut:]]) == whole
