"""Integers stay exact in tool-call arguments (bug-114's kind), for every parser that types
parameter values from the request's JSON schema (``worker.parsers.values``) and for the
JSON-argument formats that re-serialize arguments through the same helpers.

A parameter typed ``number`` holding ``9223372036854775807`` used to go through ``float`` and come
back as ``…808``. Integers of any size are now kept exactly: int64 edges, ``number`` and
``integer`` types, a type list with ``null``, integers inside ``array`` / ``object`` values, and
an integer longer than CPython's ``int()`` digit limit (4300 digits). Other number spellings stay
normalised as before (``1.50`` -> ``1.5``, ``1e2`` -> ``100``). Every vector runs as one delta,
as 1-char deltas and as random deltas with the state round-tripped (``test_parser_families``'
machinery), and the arguments must be the exact JSON text expected.
"""
from __future__ import annotations

import json
import sys

import msgspec
import pytest

from tests.harness.parsers import V, splits, stack_for
from worker.parsers.base import RequestContext
from worker.parsers.values import JsonInt, convert_param, dumps_args, exact_int, loads_json

BIG = "9" * (sys.get_int_max_str_digits() + 100) if hasattr(sys, "get_int_max_str_digits") else "9" * 4400

TOOLS = [{"type": "function", "function": {"name": "send", "parameters": {"type": "object", "properties": {
    "chat_id": {"type": "number"}, "n": {"type": "integer"}, "big": {"type": "number"},
    "ids": {"type": "array"}, "x": {"type": "number"}, "y": {"type": ["number", "null"]},
    "e": {"type": "number"}}}}}]

#: (parameter, raw value in the markup, JSON text of the value in the arguments)
PARAMS = [
    ("chat_id", "9223372036854775807", "9223372036854775807"),
    ("n", "-9223372036854775809", "-9223372036854775809"),
    ("big", BIG, BIG),
    ("ids", "[9223372036854775807, 18446744073709551617, 1.5]", "[9223372036854775807, 18446744073709551617, 1.5]"),
    ("x", "1.50", "1.5"),
    ("y", "12345678901234567890123", "12345678901234567890123"),
    ("e", "1e2", "100"),
]
EXPECTED = "{" + ", ".join(f'"{k}": {v}' for k, _, v in PARAMS) + "}"
#: GLM decodes a non-string value as JSON (vLLM's glm4_moe rule): ``1e2`` stays the float 100.0
EXPECTED_GLM = EXPECTED.replace('"e": 100}', '"e": 100.0}')


def _coder(open_: str, close: str) -> str:
    body = "".join(f"<parameter={k}>\n{raw}\n</parameter>\n" for k, raw, _ in PARAMS)
    return f"{open_}\n<function=send>\n{body}</function>\n{close}"


def _invoke(invoke: str, param: str) -> str:
    return f'<{invoke} name="send">' + "".join(f'<{param} name="{k}">{raw}</{param}>' for k, raw, _ in PARAMS) \
        + f"</{invoke}>"


def _dsml(block: str) -> str:
    ps = "".join(f'<｜DSML｜parameter name="{k}" string="false">{raw}</｜DSML｜parameter>\n' for k, raw, _ in PARAMS)
    return f'<｜DSML｜{block}>\n<｜DSML｜invoke name="send">\n{ps}</｜DSML｜invoke>\n</｜DSML｜{block}>'


_GLM_PAIRS = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{raw}</arg_value>\n" for k, raw, _ in PARAMS)
_JSON_ARGS = "{" + ", ".join(f'"{k}": {raw}' for k, raw, _ in PARAMS if k not in ("x", "e")) + "}"
_JSON_EXPECTED = "{" + ", ".join(f'"{k}": {v}' for k, _, v in PARAMS if k not in ("x", "e")) + "}"

#: (tool parser, marker family, output text, expected arguments text)
CASES = [
    ("qwen3_coder", "plain", _coder("<tool_call>", "</tool_call>"), EXPECTED),
    ("qwen3_xml", "plain", _coder("<tool_call>", "</tool_call>"), EXPECTED),
    ("seed_oss", "seed", _coder("<seed:tool_call>", "</seed:tool_call>"), EXPECTED),
    ("glm45", "glm", f"<tool_call>send\n{_GLM_PAIRS}</tool_call>", EXPECTED_GLM),
    ("glm47", "glm", "<tool_call>send" + _GLM_PAIRS.replace("\n", "") + "</tool_call>", EXPECTED_GLM),
    ("minimax_m2", "minimax", f"<minimax:tool_call>\n{_invoke('invoke', 'parameter')}\n</minimax:tool_call>", EXPECTED),
    ("step3", "step3", "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
     + _invoke("steptml:invoke", "steptml:parameter") + "<｜tool_call_end｜><｜tool_calls_end｜>", EXPECTED),
    ("deepseek_v32", "deepseek", _dsml("function_calls"), EXPECTED),
    ("deepseek_v4", "deepseek_v4", _dsml("tool_calls"), EXPECTED),
    # JSON-argument formats re-serialized through the same helpers (arguments as written)
    ("kimi_k2", "kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.send:0<|tool_call_argument_begin|>"
     + _JSON_ARGS + "<|tool_call_end|><|tool_calls_section_end|>", _JSON_EXPECTED),
    ("deepseek_v31", "deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>send<｜tool▁sep｜>" + _JSON_ARGS
     + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", _JSON_EXPECTED),
]


def _run(v: V, parts: list[str]) -> tuple[str, list[tuple[str, str]]]:
    stack = stack_for(v)
    st = stack.initial_state(RequestContext(tools=v.tools, tool_choice="auto"))
    content: list[str] = []
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    for p in [*parts, None]:
        d = stack.finish(st) if p is None else stack.feed(st, p, [])
        content.append(d.content)
        for c in d.tool_calls:
            if c.name is not None:
                names[c.index] = c.name
            args.setdefault(c.index, []).append(c.arguments)
        if p is not None:
            st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    return "".join(content), [(names[i], "".join(args[i])) for i in sorted(args)]


@pytest.mark.parametrize("parser,family,text,expected", CASES, ids=[c[0] for c in CASES])
def test_integers_exact(parser, family, text, expected):
    v = V(id=parser, reasoning_parser=None, tool_parser=parser, family=family, text=text, tools=TOOLS)
    results = [_run(v, parts) for parts in splits(text)]
    content, calls = results[0]
    assert content.strip() == ""
    assert [n for n, _ in calls] == ["send"]
    got = calls[0][1]
    assert got == expected, got[:200]
    # the JSON is valid and its integers are the digits written (parse_int keeps the text)
    assert json.loads(got, parse_int=str)["chat_id"] == "9223372036854775807"
    for other in results[1:]:
        assert other == results[0], "split-dependent result"


def test_bug_114_example():
    """The case's own numbers: ``chat_id`` typed ``number`` stays 9223372036854775807."""
    assert dumps_args({"chat_id": convert_param("9223372036854775807", "number"), "text": "Deploy finished"}) \
        == '{"chat_id": 9223372036854775807, "text": "Deploy finished"}'


def test_value_helpers():
    assert convert_param("9007199254740993", "number") == 9007199254740993  # 2**53 + 1
    assert convert_param(" +12 ", "number") == 12
    assert convert_param("1.0", "number") == 1 and convert_param("2.5", "float") == 2.5
    assert convert_param("12abc", "number") == "12abc"
    assert convert_param(BIG, "integer") == JsonInt(BIG)
    assert convert_param("-00" + BIG, "number") == JsonInt("-" + BIG)
    assert exact_int("42") == 42
    with pytest.raises(ValueError):
        exact_int("4.2")
    assert loads_json('{"a": [' + BIG + "]}") == {"a": [JsonInt(BIG)]}
    assert dumps_args({"a": [JsonInt(BIG), "é", None, True]}) == '{"a": [' + BIG + ', "é", null, true]}'
    assert dumps_args({"k": "v", "n": 1}) == json.dumps({"k": "v", "n": 1})
