"""Round-3 malformed-markup vectors (issue 15: kinds 12-15 of the corner-case taxonomy in
``tests/test_parser_malformed.py``), shared by that file and ``tests/test_tool_streaming.py``."""
from __future__ import annotations

from tests.harness.parsers import TM, T, V, W

W2 = ("get_weather", {"city": "Paris", "days": 2})

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
