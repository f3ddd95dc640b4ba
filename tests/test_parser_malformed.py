"""Malformed and truncated tool-call markup, family by family (issue 8 items 2 and 3).

Extends the numbered corner-case taxonomy of ``tests/test_parser_families.py`` (1 single call ·
2 parallel · 3 no call · 4 malformed -> content · 5 missing end marker · 6 split markers ·
7 reasoning + tool · 8 tool_choice · 9 finish_reason) with:

10 an unclosed tool-call section (``finish_reason: "length"``) keeps its complete calls:
   10a one complete call then a cut-off one · 10b several complete calls · 10c no complete call
   (the family's rule for an open block: content, or dropped for DeepSeek V3.1) · 10d text
   before the section · 10e ``parallel_tool_calls=false`` · 10f DeepSeek V4 (its own rule: the
   open invoke's complete parameters, as the parity corpus expects);
11 malformed XML-parameter markup that is still unambiguous is recovered (the rules of
   ``worker.parsers.xmlcall``; an ambiguous one stays content, kind 4);
12-15 the round-3 recoveries (issue 15): a DSML parameter without its closer, Gemma 4's opener
   without ``call``, ``<function=`` without its wrapper, DeepSeek V4 given the V3.2 fence (see
   their section below).

Every vector runs like the family vectors (one delta, 1-char and random char deltas, state
round-tripped through msgspec) and, here, also as token-aligned deltas: the text encoded with
the family tokenizer and detokenized incrementally in chunks of 1 token, 3 tokens and random
sizes (``IncrementalDetokenizer``, as the streaming path does). All runs must agree with the
one-delta (non-streaming) answer and with the expected one. The DeepSeek V3.1 example of the
issue also runs end to end through ``DerenderService`` in both modes.
"""
from __future__ import annotations

import copy
import json
import random

import msgspec
import pytest

from tests.harness.parsers import TM, T, V, W, run, splits, stack_for, tokenizer
from tests.harness.streams import nonstream_view as _nonstream_view
from tests.harness.streams import run_stream, stream_bodies_from_nonstream
from tests.harness.streams import stream_view as _stream_view
from tests.parity import corpus, service
from tests.parity_tools import to_requests
from worker.core.detokenize import IncrementalDetokenizer
from worker.parsers.base import RequestContext

W2 = ("get_weather", {"city": "Paris", "days": 2})

# -------------------------------------------------------------- 10: unclosed sections --
_V31 = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "unit": "celsius"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_')
_V3_CALL = ('<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```'
            "<｜tool▁call▁end｜>")
_KIMI_CALL = ('<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
              "<|tool_call_end|>")
_KIMI_CALL2 = '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|>'
_DSML_INV = ('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris'
             "</｜DSML｜parameter>\n</｜DSML｜invoke>\n")
_STEP3_CALL = ('<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather"><steptml:parameter '
               'name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜>')
_MM_INV = '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n'
_JSON_W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
_JSON_T = '{"name": "get_time", "arguments": {"tz": "CET"}}'

SECTION_VECTORS: list[V] = [
    # the example: reasoning R, the complete call, the cut-off tail neither call nor content
    T("10a", "deepseek_v31", "deepseek", "R</think>" + _V31, calls=[("get_weather", {"city": "Paris", "unit": "celsius"})],
      rp="deepseek_v3", reasoning="R", kwargs={"thinking": True}),
    T("10b", "deepseek_v31", "deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
      '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜>'
      "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"ci", calls=[W, TM]),
    T("10c", "deepseek_v31", "deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"ci"),
    T("10d", "deepseek_v31", "deepseek", "Checking." + _V31, "Checking.",
      calls=[("get_weather", {"city": "Paris", "unit": "celsius"})]),
    T("10a", "deepseek_v3", "deepseek", "<｜tool▁calls▁begin｜>" + _V3_CALL + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get",
      calls=[W]),
    T("10c", "deepseek_v3", "deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get"),
    T("10a", "deepseek_v32", "deepseek", "<｜DSML｜function_calls>\n" + _DSML_INV + '<｜DSML｜invoke name="get_time">\n'
      '<｜DSML｜parameter name="tz" string="true">CET</｜DSML｜parameter>\n', calls=[W]),
    T("10a", "kimi_k2", "kimi", "<|tool_calls_section_begin|>" + _KIMI_CALL + "<|tool_call_begin|>functions.g",
      calls=[W]),
    T("10b", "kimi_k2", "kimi", "<|tool_calls_section_begin|>" + _KIMI_CALL + _KIMI_CALL2 + "<|tool_call_begin|>",
      calls=[W, TM]),
    T("10d", "kimi_k2", "kimi", "<think>plan</think>Sure.<|tool_calls_section_begin|>" + _KIMI_CALL
      + "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{\"tz\"", "Sure.", [W],
      rp="kimi_k2", reasoning="plan"),
    T("10e", "kimi_k2", "kimi", "<|tool_calls_section_begin|>" + _KIMI_CALL + _KIMI_CALL2 + "<|tool_call_begin|>",
      calls=[W], parallel=False),
    T("10a", "step3", "step3", "<｜tool_calls_begin｜>" + _STEP3_CALL + "<｜tool_call_begin｜>function<｜tool_sep｜>"
      '<steptml:invoke name="get_time">', calls=[W]),
    T("10a", "minimax_m2", "minimax", "<minimax:tool_call>\n" + _MM_INV + '<invoke name="get_time">\n<parameter name="tz">CE',
      calls=[W]),
    T("10a", "hunyuan_a13b", "hunyuan", "<tool_calls>[" + _JSON_W + ', {"name": "get_ti', calls=[W]),
    T("10b", "jamba", "hunyuan", "<tool_calls>[" + _JSON_W + ", " + _JSON_T, calls=[W, TM]),
    T("10c", "jamba", "hunyuan", '<tool_calls>[{"name": "get_weather", "arguments": {"ci',
      '<tool_calls>[{"name": "get_weather", "arguments": {"ci'),
    # wrapper sections of the pythonic engine (a call is complete at its closing parenthesis)
    T("10a", "llama4_pythonic", "llama4", '<|python_start|>[get_weather(city="Paris"), get_time(tz="CE', calls=[W]),
    T("10b", "llama4_pythonic", "llama4", '<|python_start|>[get_weather(city="Paris"), get_time(tz="CET")]', calls=[W, TM]),
    T("10c", "llama4_pythonic", "llama4", '<|python_start|>[get_weather(city="Pa)ris', '<|python_start|>[get_weather(city="Pa)ris'),
    T("10a", "olmo3", "plain", '<function_calls>\nget_weather(city="Paris")\nget_time(tz="C', calls=[W]),
    T("10b", "olmo3", "plain", '<function_calls>\nget_weather(city="Paris")\nget_time(tz="CET")', calls=[W, TM]),
    # DeepSeek V4: complete invokes plus the open invoke with its complete parameters
    # (dsv4-tool-malformed-*)
    T("10f", "deepseek_v4", "deepseek", "<｜DSML｜tool_calls>\n" + _DSML_INV + '<｜DSML｜invoke name="get_time">\n'
      '<｜DSML｜parameter name="tz" string="true">CET</｜DSML｜parameter>\n<｜DSML｜parameter name="x" string="true">y',
      calls=[W, TM]),
]

# ------------------------------------------------- 11: malformed but unambiguous XML --
# 11a repeated closing tag (also a block's end marker) · 11b repeated opening tag · 11c missing opening tag whose closing
# tag is there (GLM's attribute-less <arg_key>/<arg_value>) · 11d missing closing tag implied by
# the next tag of a closed block · 11e GLM: missing first <arg_key> right after the name ·
# 11f not recoverable (orphan closing tag of a key-carrying tag, text where only tags may be,
# key without value, uncertain name/key boundary): content, verbatim
_TC, _ETC = "<tool_call>", "</tool_call>"
_K, _EK, _VV, _EV = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


def _glm(body: str) -> str:
    return _TC + body + _ETC


XML_VECTORS: list[V] = [
    # the GLM examples
    T("11a", "glm47", "glm", _glm(f"get_weather{_K}path{_EK}{_EK}{_VV}/srv/x{_EV}"),
      calls=[("get_weather", {"path": "/srv/x"})]),
    T("11c", "glm47", "glm", _glm(f"get_weather{_K}q{_EK}text{_EV}"), calls=[("get_weather", {"q": "text"})]),
    T("11a", "glm45", "glm", _glm(f"get_weather\n{_K}city{_EK}\n{_VV}Paris{_EV}\n{_EV}\n"), calls=[W]),
    T("11b", "glm47", "glm", _glm(f"get_weather{_K}{_K}city{_EK}{_VV}Paris{_EV}"), calls=[W]),
    T("11b", "glm45", "glm", _glm(f"get_weather\n{_K}city{_EK}\n{_VV}\n{_VV}Paris{_EV}\n"), calls=[W]),
    T("11c", "glm45", "glm", _glm(f"get_weather\n{_K}city{_EK}\n{_VV}Paris{_EV}\ndays{_EK}\n{_VV}2{_EV}\n"),
      calls=[W2]),
    T("11d", "glm47", "glm", _glm(f"get_weather{_K}city{_VV}Paris{_EV}{_K}days{_EK}{_VV}2"), calls=[W2]),
    T("11e", "glm45", "glm", _glm(f"get_weather\ncity{_EK}\n{_VV}Paris{_EV}\n"), calls=[W]),
    T("11e", "glm47", "glm", _glm(f"get_weathercity{_EK}{_VV}Paris{_EV}"), calls=[W]),
    T("11f", "glm47", "glm", _glm(f"getcity{_EK}{_VV}Paris{_EV}"), _glm(f"getcity{_EK}{_VV}Paris{_EV}")),
    T("11f", "glm47", "glm", _glm(f"get_weather{_K}city{_EK}{_VV}Par{_EV}is{_EV}"),
      _glm(f"get_weather{_K}city{_EK}{_VV}Par{_EV}is{_EV}")),
    T("11f", "glm47", "glm", _glm(f"get_time{_EV}"), _glm(f"get_time{_EV}")),
    T("11f", "glm47", "glm", _glm(f"get_weather{_K}city{_EK}"), _glm(f"get_weather{_K}city{_EK}")),
    T("11a", "glm45", "glm", f"<think>use it</think>{_glm(f'get_time{_K}tz{_EK}{_EK}{_VV}CET{_EV}')} and "
      + _glm(f"get_weather{_K}city{_EK}Paris{_EV}"), " and ", [TM, W], rp="glm45", reasoning="use it"),
    # a block's end marker repeated after a parsed call counts once (tagged engine)
    T("11a", "hermes", "plain", f'<tool_call>{_JSON_W}</tool_call></tool_call>', calls=[W]),
    T("11a", "glm45", "glm", _glm(f"get_weather\n{_K}city{_EK}\n{_VV}Paris{_EV}\n") + "\n" + _ETC + "\nDone.",
      "\n\nDone.", [W]),
    T("11a", "kimi_k2", "kimi", "<|tool_calls_section_begin|>" + _KIMI_CALL + "<|tool_calls_section_end|>"
      "<|tool_calls_section_end|> ok", " ok", [W]),
    T("11f", "hermes", "plain", "<tool_call>{bad}</tool_call></tool_call>", "<tool_call>{bad}</tool_call></tool_call>"),
    T("11f", "hermes", "plain", f'<tool_call>{_JSON_W}</tool_call>x</tool_call>', "x</tool_call>", [W]),
    # a block's start marker repeated at the start of its body counts once (tagged engine; vLLM's GLM-4.7
    # test of issue 60703, tests/data/vllm_vectors/glm47_stray_tool_call.json)
    T("11b", "hermes", "plain", f"<tool_call>\n<tool_call>{_JSON_W}</tool_call>", calls=[W]),
    T("11b", "glm47", "glm", "Checking. " + _TC + _glm(f"get_weather{_K}city{_EK}{_VV}Paris{_EV}"), "Checking. ", [W]),
    T("11b", "kimi_k2", "kimi", "<|tool_calls_section_begin|> <|tool_calls_section_begin|>" + _KIMI_CALL
      + "<|tool_calls_section_end|>", calls=[W]),
    T("11b", "qwen3_coder", "plain", "<tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n</function>\n</tool_call>", calls=[W]),
    T("11b", "minimax_m2", "minimax", "<minimax:tool_call><minimax:tool_call>\n" + _MM_INV + "</minimax:tool_call>",
      calls=[W]),
    T("11f", "hermes", "plain", "<tool_call> <tool_call>{bad}</tool_call>", "<tool_call> <tool_call>{bad}</tool_call>"),
    T("11f", "glm47", "glm", "a " + _TC + "\n" + _TC, "a " + _TC + "\n" + _TC),
    # qwen3_coder / qwen3_xml / seed_oss (<function=N><parameter=K>)
    T("11a", "qwen3_coder", "plain", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</parameter>\n</function>\n</function>\n</tool_call>", calls=[W]),
    T("11b", "qwen3_xml", "plain", "<tool_call><function=get_weather><parameter=city><parameter=city>Paris</parameter>"
      "</function></tool_call>", calls=[W]),
    T("11d", "qwen3_coder", "plain", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2"
      "\n</tool_call>", calls=[W2]),
    T("11d", "seed_oss", "seed", "<seed:tool_call><function=get_weather><parameter=city>Paris</parameter>"
      "</seed:tool_call>", calls=[W]),
    T("11f", "qwen3_coder", "plain", "<tool_call><function=get_weather>Paris</parameter></function></tool_call>",
      "<tool_call><function=get_weather>Paris</parameter></function></tool_call>"),
    T("11f", "seed_oss", "seed", "<seed:tool_call>get_weather></function></seed:tool_call>",
      "<seed:tool_call>get_weather></function></seed:tool_call>"),
    # minimax_m2 / step3 (<invoke name="N"><parameter name="K">)
    T("11a", "minimax_m2", "minimax", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
      "</parameter></parameter>\n</invoke>\n</invoke>\n</minimax:tool_call>", calls=[W]),
    T("11d", "minimax_m2", "minimax", '<minimax:tool_call><invoke name="get_weather"><parameter name="city">Paris'
      '<parameter name="days">2</invoke><invoke name="get_time"><parameter name="tz">CET</parameter>'
      "</minimax:tool_call>", calls=[W2, TM]),
    T("11f", "minimax_m2", "minimax", '<minimax:tool_call><invoke name="get_weather">Paris</parameter></invoke>'
      "</minimax:tool_call>", '<minimax:tool_call><invoke name="get_weather">Paris</parameter></invoke>'
      "</minimax:tool_call>"),
    T("11a", "step3", "step3", '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter></steptml:parameter>'
      "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>", calls=[W]),
    T("11d", "step3", "step3", '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather"><steptml:parameter name="city"> Paris <｜tool_call_end｜><｜tool_calls_end｜>',
      # a declared string keeps its whitespace (vLLM's TestStep3ParameterWhitespace, issue 24)
      calls=[("get_weather", {"city": " Paris "})]),
    T("11f", "step3", "step3", '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>',
      '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>'),
]

# --------------------------------------------- 12-15: round 3 recoveries (issue 15) --
from tests.harness.round3 import ROUND3_VECTORS  # noqa: E402  (kinds 12-15, shared)

VECTORS = SECTION_VECTORS + XML_VECTORS + ROUND3_VECTORS


# ------------------------------------------------------------------------- machinery --
def _token_chunks(n: int, how: str, rng: random.Random) -> list[int]:
    if how in ("1", "3"):
        k = int(how)
        return [k] * (n // k) + ([n % k] if n % k else [])
    out = []
    while sum(out) < n:
        out.append(min(rng.randint(1, 7), n - sum(out)))
    return out


def run_tokens(v: V, how: str, seed: int = 0) -> tuple:
    """The vector's text as token ids of the family tokenizer, detokenized incrementally in
    ``how`` chunks ("1", "3", "random") and fed to the stack (state round-tripped)."""
    tok = tokenizer(v.family)
    ids = tok.encode(v.text)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    parts, pos = [], 0
    for n in _token_chunks(len(ids), how, random.Random(seed)):
        parts.append(detok.add(ids[pos:pos + n]))
        pos += n
    assert "".join(parts) == v.text, "the tokenizer does not round-trip the vector text"
    return run(v, parts)


def check(v: V) -> None:
    results = [run(v, parts) for parts in splits(v.text)]
    r, c, calls, fin = results[0]
    assert (r, c, calls) == (v.reasoning, v.content, v.calls)
    if v.finish is not None:
        assert fin == v.finish
    for other in results[1:]:
        assert other == results[0], "split-dependent result (char deltas)"
    for how, seed in (("1", 0), ("3", 0), ("random", 1), ("random", 2)):
        assert run_tokens(v, how, seed) == results[0], f"split-dependent result ({how}-token deltas)"


@pytest.mark.parametrize("v", VECTORS, ids=[v.id for v in VECTORS])
def test_vector(v: V) -> None:
    check(v)


def test_stack_feeds_tail_only_once_section_is_open() -> None:
    """While a section is open nothing is emitted (no call before the section is decided)."""
    v = SECTION_VECTORS[0]
    stack = stack_for(v)
    st = stack.initial_state(RequestContext(tools=v.tools, tool_choice="auto", chat_template_kwargs=v.kwargs))
    d = stack.feed(st, v.text, [])
    assert d.tool_calls == [] and d.content == "" and d.reasoning == "R"
    st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    d = stack.finish(st)
    assert [(c.name, json.loads(c.arguments)) for c in d.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})]


# ----------------------------------------------- end to end: the V3.1 example --
def _v31_length_body() -> dict:
    """The issue's DeepSeek V3.1 output, ``finish_reason: "length"``, thinking on, as a
    non-streaming derender body for the corpus' ``deepseek-v31-markup`` model (its tokenizer
    and prompt from ``dsv31-tool-malformed-v0``)."""
    case = next(c for c in corpus() if c["id"] == "dsv31-tool-malformed-v0")
    body = copy.deepcopy(to_requests.nonstream_body(case))
    ids = service().runtime("deepseek-v31-markup").tokenizer.encode("R</think>" + _V31)
    ch = body["generate_response"]["choices"][0]
    ch.update(token_ids=ids, finish_reason="length", stop_reason=None)
    body["chat_request"] = dict(body.get("chat_request") or {}, chat_template_kwargs={"thinking": True})
    return body


def test_deepseek_v31_unclosed_section_length_nonstream() -> None:
    body = _v31_length_body()
    res = service().derender(json.dumps(body).encode())
    assert not res.is_error, res.body
    ch = json.loads(res.body)["choices"][0]
    assert ch["finish_reason"] == "length"
    msg = ch["message"]
    assert msg["reasoning"] == "R"
    assert not msg["content"]
    assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in msg["tool_calls"]] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})]


@pytest.mark.parametrize("how", ["1", "3", "random"])
def test_deepseek_v31_unclosed_section_length_stream(how: str) -> None:
    body = _v31_length_body()
    want = _nonstream_view(json.loads(service().derender(json.dumps(body).encode()).body), "chat")
    for seed in ((0, 1, 2) if how == "random" else (0,)):
        got = _stream_view(run_stream(stream_bodies_from_nonstream(copy.deepcopy(body), "chat", how, seed)), "chat")
        assert got == want, f"chunking {how} seed {seed}"
    assert want["choices"][0]["finish_reason"] == "length"
