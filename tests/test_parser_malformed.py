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

from tests.parity import corpus, service
from tests.parity_tools import to_requests
from tests.test_parser_families import TM, T, V, W, run, splits, stack_for, tokenizer
from tests.test_stream_parity import _nonstream_view, _stream_view, run_stream, stream_bodies_from_nonstream
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
      'name="get_weather"><steptml:parameter name="city"> Paris <｜tool_call_end｜><｜tool_calls_end｜>', calls=[W]),
    T("11f", "step3", "step3", '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>',
      '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke '
      'name="get_weather">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>'),
]

# --------------------------------------------- 12-15: round 3 recoveries (issue 15) --
# 12 DSML parameter without </｜DSML｜parameter> (deepseek_v4 and deepseek_v32, vLLM PR 54838):
#    12a the next parameter opens · 12b the last parameter (closed invoke) · 12c a nested
#    (string="false" JSON) value · 12d the encoder's newline layout · 12e a block cut off (the
#    open invoke's last value without closer is dropped) · 12f two invokes · 12g the invokes'
#    closers missing too
# 13 Gemma 4 opener without ``call`` (vLLM PR 53444), each value syntax: 13a strings · 13b
#    numbers / booleans / null · 13c nested object · 13d array of delimited strings · 13e before
#    a well-formed call · 13f after one · 13g from the thought channel · 13h openers that are not
#    recovered (no brace, round brackets): content
# 14 ``<function=`` without its wrapper (qwen3_coder, qwen3_xml, seed_oss; tagged "bare calls"):
#    14a alone · 14b after a line of text · 14c inside a fenced code block: content · 14d inside
#    an inline code span: content (a call after the span is one) · 14e wrapper missing only at
#    the start · 14f only at the end · 14g two bare calls · 14h a missing </parameter> implied ·
#    14i after reasoning · 14j after a closed fence · 14k cut off (qwen3_coder: the complete
#    parameters; seed_oss: content) · 14l after text on the same line · 14m a name
#    no function has (a template in prose): content
# 15 deepseek_v4 given the V3.2 fence ``function_calls`` (SGLang PR 40237): 15a text before ·
#    15b ends the reasoning · 15c cut off, keeps complete invokes · 15d both fences in one output
_DS_P = '<｜DSML｜parameter name="{}" string="{}">'
_DS_EP = "</｜DSML｜parameter>"


def _dsml(fence: str, *invokes: str, close: bool = True) -> str:
    return f"<｜DSML｜{fence}>\n" + "".join(invokes) + (f"</｜DSML｜{fence}>" if close else "")


def _inv(name: str, params: str, close: bool = True) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + params + ("</｜DSML｜invoke>\n" if close else "")


_CITY, _DAYS = _DS_P.format("city", "true"), _DS_P.format("days", "false")
_GQ = '<|"|>'
_FN_W = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>"
_FN_T = "<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>"

DSML_VECTORS: list[V] = []
for _tp, _fence in (("deepseek_v4", "tool_calls"), ("deepseek_v32", "function_calls")):
    DSML_VECTORS += [
        T("12a", _tp, "deepseek", _dsml(_fence, _inv("get_weather", f"{_CITY}Paris{_DAYS}2{_DS_EP}\n")), calls=[W2]),
        T("12b", _tp, "deepseek", _dsml(_fence, _inv("get_weather", f"{_CITY}Paris{_DS_EP}\n{_DAYS}2\n")),
          calls=[W2]),
        T("12c", _tp, "deepseek", _dsml(_fence, _inv("get_weather", _DS_P.format("opts", "false")
                                                     + '{"units": {"t": "C"}, "days": [1, 2]}' + f"{_CITY}Paris{_DS_EP}\n")),
          calls=[("get_weather", {"opts": {"units": {"t": "C"}, "days": [1, 2]}, "city": "Paris"})]),
        T("12d", _tp, "deepseek", "Checking.\n\n" + _dsml(_fence, _inv("get_weather", f"{_CITY}Paris\n{_DAYS}2\n")),
          "Checking.\n\n", [W2]),
        T("12f", _tp, "deepseek", _dsml(_fence, _inv("get_weather", f"{_CITY}Paris\n"),
                                        _inv("get_time", _DS_P.format("tz", "true") + "CET\n")), calls=[W, TM]),
        # the invoke's closer missing too: it ends at the next invoke / the end of the closed block
        T("12g", _tp, "deepseek", _dsml(_fence, _inv("get_weather", f"{_CITY}Paris\n", close=False),
                                        _inv("get_time", _DS_P.format("tz", "true") + "CET\n", close=False)),
          calls=[W, TM]),
    ]
DSML_VECTORS += [
    # cut off: deepseek_v4 keeps the open invoke's complete parameters (an implied close counts)
    T("12e", "deepseek_v4", "deepseek", _dsml("tool_calls", _inv("get_weather", f"{_CITY}Paris{_DAYS}2", close=False),
                                              close=False), calls=[W]),
    T("12e", "deepseek_v32", "deepseek", _dsml("function_calls", _inv("get_time", _DS_P.format("tz", "true") + "CET"),
                                               _inv("get_weather", f"{_CITY}Paris{_DAYS}2", close=False), close=False),
      calls=[TM]),
    T("15a", "deepseek_v4", "deepseek", "I'll check.\n\n" + _dsml("function_calls", _inv("get_weather", f"{_CITY}Paris"
                                                                                     f"{_DS_EP}\n")), "I'll check.\n\n", [W]),
    T("15b", "deepseek_v4", "deepseek", "need it" + _dsml("function_calls", _inv("get_weather", f"{_CITY}Paris{_DS_EP}\n")),
      calls=[W], rp="deepseek_v4", reasoning="need it"),
    T("15c", "deepseek_v4", "deepseek", _dsml("function_calls", _inv("get_weather", f"{_CITY}Paris{_DS_EP}\n"),
                                              _inv("get_time", _DS_P.format("tz", "true") + "CE", close=False), close=False),
      calls=[W, ("get_time", {})]),
    T("15d", "deepseek_v4", "deepseek", _dsml("tool_calls", _inv("get_weather", f"{_CITY}Paris{_DS_EP}\n")) + "\n"
      + _dsml("function_calls", _inv("get_time", _DS_P.format("tz", "true") + f"CET{_DS_EP}\n")), calls=[W, TM]),
]


def _gem(body: str) -> str:
    return f"<|tool_call>{body}<tool_call|>"


GEMMA_VECTORS: list[V] = [
    T("13a", "gemma4", "gemma4", _gem(f":get_weather{{city:{_GQ}Paris, {{FR}}: x{_GQ}}}"),
      calls=[("get_weather", {"city": "Paris, {FR}: x"})]),
    T("13b", "gemma4", "gemma4", _gem(f":get_weather{{city:{_GQ}Paris{_GQ},days:2,t:-1.5,ok:true,no:false,z:null}}"),
      calls=[("get_weather", {"city": "Paris", "days": 2, "t": -1.5, "ok": True, "no": False, "z": None})]),
    T("13c", "gemma4", "gemma4", _gem(f":get_weather{{city:{_GQ}Paris{_GQ},opts:{{units:{{t:{_GQ}C{_GQ}}},n:[1,2]}}}}"),
      calls=[("get_weather", {"city": "Paris", "opts": {"units": {"t": "C"}, "n": [1, 2]}})]),
    T("13d", "gemma4", "gemma4", _gem(f":get_weather{{cities:[{_GQ}a, b{_GQ},{_GQ}c]{_GQ}],days:2}}"),
      calls=[("get_weather", {"cities": ["a, b", "c]"], "days": 2})]),
    T("13e", "gemma4", "gemma4", _gem(f":get_weather{{city:{_GQ}Paris{_GQ}}}") + _gem(f"call:get_time{{tz:{_GQ}CET{_GQ}}}"),
      calls=[W, TM]),
    T("13f", "gemma4", "gemma4", "Sure." + _gem(f"call:get_time{{tz:{_GQ}CET{_GQ}}}") + _gem(f":get_weather{{city:{_GQ}Paris{_GQ}}}"),
      "Sure.", [TM, W]),
    T("13g", "gemma4", "gemma4", f"<|channel>thought\nneed it<channel|>{_gem(f':get_weather{{city:{_GQ}Paris{_GQ}}}')}",
      calls=[W], rp="gemma4", reasoning="need it"),
    T("13h", "gemma4", "gemma4", _gem(":get_weather Paris") + _gem(f":get_time({_GQ}CET{_GQ})"),
      _gem(":get_weather Paris") + _gem(f":get_time({_GQ}CET{_GQ})")),
]

BARE_VECTORS: list[V] = []
for _tp, _fam, _wo, _wc in (("qwen3_coder", "plain", "<tool_call>", "</tool_call>"),
                            ("qwen3_xml", "plain", "<tool_call>", "</tool_call>"),
                            ("seed_oss", "seed", "<seed:tool_call>", "</seed:tool_call>")):
    _fence = "Write it as:\n```xml\n" + _FN_W + "\n```\n"
    BARE_VECTORS += [
        T("14a", _tp, _fam, _FN_W, calls=[W]),
        T("14b", _tp, _fam, "Checking the weather.\n" + _FN_W + "\n", "Checking the weather.\n", [W]),
        T("14c", _tp, _fam, _fence, _fence),
        T("14d", _tp, _fam, "Use `" + _FN_W.replace("\n", "") + "` for it.", "Use `" + _FN_W.replace("\n", "") + "` for it."),
        T("14d", _tp, _fam, "Use ``" + _FN_T.replace("\n", "") + "`` then:" + _FN_W, "Use ``" + _FN_T.replace("\n", "")
          + "`` then:", [W]),
        T("14l", _tp, _fam, "Let me check." + _FN_W, "Let me check.", [W]),
        T("14m", _tp, _fam, "Template: <function={{ tc.name }}>\n</function>\n" + _FN_T,
          "Template: <function={{ tc.name }}>\n</function>\n", [TM]),
        T("14e", _tp, _fam, _FN_W + "\n" + _wc + "\nDone.", "\n\nDone.", [W]),
        T("14g", _tp, _fam, _FN_W + "\n" + _FN_T + "\n", calls=[W, TM]),
        T("14h", _tp, _fam, "<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</function>",
          calls=[W2]),
        T("14j", _tp, _fam, "```\ncode\n```\n" + _FN_T, "```\ncode\n```\n", [TM]),
    ]
BARE_VECTORS += [
    T("14f", "qwen3_coder", "plain", "<tool_call>\n" + _FN_W + "\n", calls=[W]),
    T("14f", "seed_oss", "seed", "<seed:tool_call>" + _FN_W, "<seed:tool_call>" + _FN_W),
    T("14i", "qwen3_coder", "plain", "<think>\nneed weather\n</think>\n\n" + _FN_W, calls=[W], rp="qwen3",
      reasoning="\nneed weather\n"),
    T("14k", "qwen3_coder", "plain", "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2",
      calls=[W]),
    T("14k", "seed_oss", "seed", "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
      "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"),
]

#: the recovered kinds of issue 15 (also run with incremental tool-call streaming:
#: tests/test_tool_streaming.py)
ROUND3_VECTORS = DSML_VECTORS + GEMMA_VECTORS + BARE_VECTORS

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
