"""``--tool-call-streaming incremental``: split invariance and the streaming shape.

For every well-formed output (parity corpus chat cases of the models with tool parsers, the
family golden vectors, the parsing examples of every incremental family) the stack in
incremental mode is fed token-aligned (corpus) or character-level (vectors) deltas in 1, 3 and
random sizes with the state round-tripped through ``msgspec.json`` after every delta; for each
call the joined argument fragments must parse to the same JSON as the non-streaming arguments,
names / content / reasoning must be the same, and the fragments must have OpenAI's streaming
shape (the name once, on the first fragment, with empty arguments). Malformed / truncated calls
get the documented answer (``worker.parsers.incremental``).
"""
from __future__ import annotations

import json
import random

import msgspec
import pytest

from tests.harness import parsers as fam
from tests.harness.parsers import CASES
from tests.harness.parsers import chunks as _chunks
from tests.harness.parsers import setup as _setup
from tests.harness.round3 import ROUND3_VECTORS
from worker.core import derender as D
from worker.core.detokenize import IncrementalDetokenizer, stop_token_trimmed
from worker.parsers import TOOL_PARSERS, make_reasoning_parser, make_tool_parser
from worker.parsers.base import Delta, RequestContext
from worker.parsers.examples import PAD_C, PAD_R, TOOL_EXAMPLES, TOOLS
from worker.parsers.incremental import XmlArgs
from worker.parsers.stack import ParserStack

#: tool parsers that stream incrementally (every other one keeps ``whole`` in both settings)
INCREMENTAL = {"hermes", "ernie45", "granite4", "internlm", "longcat", "hunyuan_a13b", "jamba", "kimi_k2",
               "deepseek_v3", "deepseek_v31", "qwen3_coder", "qwen3_xml", "seed_oss", "glm45", "glm47",
               "minimax_m2", "step3", "mistral", "llama3_json", "llama4_json", "phi4_mini_json", "granite-20b-fc"}


def test_incremental_families_are_the_documented_ones():
    tok = fam.tokenizer("plain")
    got = {n for n in TOOL_PARSERS if make_tool_parser(n, tok).incremental}
    assert got == INCREMENTAL


class Collected:
    """Fragments of a stream, checked for OpenAI's shape as they come."""

    def __init__(self):
        self.reasoning, self.content = [], []
        self.names: dict[int, str] = {}
        self.args: dict[int, list[str]] = {}
        self.fragments = 0

    def take(self, d: Delta) -> None:
        self.reasoning.append(d.reasoning)
        self.content.append(d.content)
        for c in d.tool_calls:
            self.fragments += 1
            if c.name is not None:
                assert c.index not in self.names, "a call's name comes once"
                assert c.index == len(self.names), "calls start in index order"
                self.names[c.index] = c.name
            else:
                assert c.index in self.names, "arguments before the call's name"
            self.args.setdefault(c.index, []).append(c.arguments)

    def outcome(self) -> tuple:
        calls = [(self.names[i], _loads("".join(self.args[i]))) for i in sorted(self.args)]
        return "".join(self.reasoning), "".join(self.content), calls


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return ("not JSON", text)


def _whole_outcome(d: Delta) -> tuple:
    calls = D.merge_tool_calls("r", 0, d, "chatcmpl-tool")
    return d.reasoning, d.content, [(c.function.name, json.loads(c.function.arguments)) for c in calls]


# ------------------------------------------------------------------------- parity corpus --
def _inc(stack: ParserStack) -> ParserStack:
    return ParserStack(stack.reasoning, stack.tool, stack.enable_auto_tool_choice, tool_call_streaming="incremental")


#: corpus cases whose calls are malformed or cut off (``finish_reason: "length"``): the
#: incremental answer is the documented one, not the non-streaming one
CUT_OR_MALFORMED = ("malformed", "finish-length")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_incremental_split_invariant(case):
    rt, req, gr, prompt_ids, ctx, skip = _setup(case)
    stack = _inc(rt.stack)
    rng = random.Random(case["id"])
    special = rt.tokenizer.special_ids if skip else frozenset()
    for c in gr.choices:
        text, pids = D._text_of(rt, c, prompt_ids, skip, req.spaces_between_special_tokens,
                                req.include_stop_str_in_output)
        st = rt.stack.initial_state(ctx)
        ref = rt.stack.feed(st, text, pids)
        expected = _whole_outcome(ref.extend(rt.stack.finish(st)))
        ids = stop_token_trimmed(c.token_ids, c.finish_reason, c.stop_reason, rt.tokenizer.eos_token_ids,
                                 req.include_stop_str_in_output)
        for how in ("one", "1", "3", "rand"):
            detok = IncrementalDetokenizer(rt.tokenizer, skip_special_tokens=skip,
                                           spaces_between_special_tokens=req.spaces_between_special_tokens,
                                           prompt_token_ids=prompt_ids)
            st = stack.initial_state(ctx, streaming=True)
            got = Collected()
            for chunk in _chunks(ids, how, rng):
                got.take(stack.feed(st, detok.add(chunk), [t for t in chunk if t not in special]))
                st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
            got.take(stack.finish(st))
            if not any(k in case["id"] for k in CUT_OR_MALFORMED):
                assert got.outcome() == expected, f"split {how}"
            elif got.names and stack.tool is not None and stack.tool.incremental:
                # documented: an announced call stays a call, its markup never comes as content
                content = "".join(got.content)
                starts = getattr(stack.tool, "starts", None) or stack.tool.markers
                assert not any(m in content for m in starts), f"split {how}"
                if isinstance(stack.tool.spec, XmlArgs):  # XML: the object is closed, valid JSON
                    assert all(isinstance(x[1], dict) for x in got.outcome()[2])
            else:
                assert got.outcome() == expected, f"split {how}"


# ------------------------------------------------------------------------ golden vectors --
#: vectors whose markup is malformed (4) or cut off (5): incremental answers are documented,
#: not the non-streaming ones (test_malformed_* below)
def _well_formed(v) -> bool:
    return not v.id.endswith((":4", ":5")) and v.tool_parser in INCREMENTAL


VECTORS = [v for v in fam.VECTORS if _well_formed(v)]
#: (a cut-off Seed-OSS block is content without streaming but a call once its name went out:
#: the documented incremental answer, worker.parsers.incremental; test_xml_call_cut_off_*)
ROUND3 = [v for v in ROUND3_VECTORS if v.id not in ("seed_oss:14f", "seed_oss:14k")]


def _run(stack: ParserStack, ctx: RequestContext, parts: list[str]) -> Collected:
    st = stack.initial_state(ctx, streaming=True)
    got = Collected()
    for p in parts:
        got.take(stack.feed(st, p, []))
        st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
    got.take(stack.finish(st))
    return got


def _stack(v_rp, v_tp, family) -> ParserStack:
    tok = fam.tokenizer(family)
    return ParserStack(make_reasoning_parser(v_rp, tok), make_tool_parser(v_tp, tok), enable_auto_tool_choice=True,
                       tool_call_streaming="incremental")


@pytest.mark.parametrize("v", VECTORS, ids=[v.id for v in VECTORS])
def test_vectors_incremental(v):
    stack = _stack(v.reasoning_parser, v.tool_parser, v.family)
    ctx = RequestContext(tools=v.tools, tool_choice=v.tool_choice, parallel_tool_calls=v.parallel,
                         chat_template_kwargs=v.kwargs)
    for parts in fam.splits(v.text):
        assert _run(stack, ctx, parts).outcome() == (v.reasoning, v.content, v.calls), parts[:3]


@pytest.mark.parametrize("v", ROUND3, ids=[v.id for v in ROUND3])
def test_round3_recoveries_incremental(v):
    """Issue 15's recovered kinds (``tests/test_parser_malformed.py`` 12-15: DSML parameter
    without closer, Gemma 4 opener without ``call``, ``<function=`` without its wrapper,
    DeepSeek V4's ``function_calls`` fence) give the non-streaming answer with incremental
    tool-call streaming too, under every split (bare calls stream their arguments as they come)."""
    stack = _stack(v.reasoning_parser, v.tool_parser, v.family)
    ctx = RequestContext(tools=v.tools, tool_choice=v.tool_choice, parallel_tool_calls=v.parallel,
                         chat_template_kwargs=v.kwargs)
    for parts in fam.splits(v.text):
        assert _run(stack, ctx, parts).outcome() == (v.reasoning, v.content, v.calls), parts[:3]


def test_bare_call_streams_before_it_closes():
    """A Qwen3-Coder call without ``<tool_call>``: its name and string value go out before
    ``</function>`` (incremental), and the joined arguments parse to the non-streaming ones."""
    text = "<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\n" + "x = 1\n" * 20
    stack = _stack(None, "qwen3_coder", "plain")
    st = stack.initial_state(RequestContext(tools=STR_TOOLS, tool_choice="auto"), streaming=True)
    got = Collected()
    for ch in text:
        got.take(stack.feed(st, ch, []))
    assert got.names == {0: "write_file"} and "x = 1\\n" * 10 in "".join(got.args[0])
    got.take(stack.feed(st, "</parameter>\n</function>", []))
    got.take(stack.finish(st))
    assert got.outcome() == ("", "", [("write_file", {"path": "a.py", "content": "x = 1\n" * 19 + "x = 1"})])


# ---------------------------------------------------------- parsing examples (long calls) --
def _example_text(name: str) -> tuple[str, str]:
    ex = TOOL_EXAMPLES[name]
    return ex.template.replace(PAD_C, "Some text.").replace(PAD_R, "thinking"), ex.markers[0]


EXAMPLES = sorted(INCREMENTAL)


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_incremental(name):
    """Each family's parsing example (several calls, every value type): the same calls as the
    non-streaming parse under every split, and the arguments really arrive before the block
    closes (character deltas: the first argument fragment precedes the end marker)."""
    text, family = _example_text(name)
    tok = fam.tokenizer(family)
    whole = ParserStack(None, make_tool_parser(name, tok), enable_auto_tool_choice=True)
    ctx = RequestContext(tools=TOOLS, tool_choice="auto")
    st = whole.initial_state(ctx)
    d = whole.feed(st, text, [])
    expected = _whole_outcome(d.extend(whole.finish(st)))
    assert expected[2], "the example has calls"
    stack = _stack(None, name, family)
    for parts in fam.splits(text):
        got = _run(stack, ctx, parts)
        assert got.outcome() == expected
    # incremental: with 1-char deltas the first argument text goes out before the block ends
    st = stack.initial_state(ctx, streaming=True)
    ends = getattr(stack.tool, "ends", ())
    seen = ""
    first_args_at = None
    for i, ch in enumerate(text):
        d = stack.feed(st, ch, [])
        seen += ch
        if first_args_at is None and any(c.name is None and c.arguments for c in d.tool_calls):
            first_args_at = i
    assert first_args_at is not None
    assert not any(e in text[:first_args_at + 1] for e in ends), "arguments streamed only at the block's end"


def test_whole_is_default_and_unchanged():
    """Without the setting (or for a non-streamed choice) calls come whole, in one fragment."""
    text, family = _example_text("qwen3_coder")
    tok = fam.tokenizer(family)
    ctx = RequestContext(tools=TOOLS, tool_choice="auto")
    for stack, streaming in ((ParserStack(None, make_tool_parser("qwen3_coder", tok), True), True),
                             (_stack(None, "qwen3_coder", family), False)):
        st = stack.initial_state(ctx, streaming=streaming)
        frags = [c for ch in text for c in stack.feed(st, ch, []).tool_calls] + stack.finish(st).tool_calls
        assert all(c.name is not None for c in frags)


# ------------------------------------------------------------ malformed / cut-off calls --
def _frags(tp: str, family: str, text: str, parts: list[str] | None = None, tools=TOOLS) -> Collected:
    stack = _stack(None, tp, family)
    ctx = RequestContext(tools=tools, tool_choice="auto")
    return _run(stack, ctx, parts if parts is not None else list(text))


def test_json_call_cut_off_keeps_raw_arguments_so_far():
    """A JSON-argument call cut off (finish_reason length) after its name went out: the call
    with the raw argument text that went out (not complete JSON), nothing as content."""
    got = _frags("hermes", "plain", 'Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Par')
    assert got.names == {0: "get_weather"}
    assert "".join(got.args[0]) == '{"city": "Par'
    assert "".join(got.content) == "Hi "


def test_json_call_malformed_after_name_stays_a_call():
    """The non-streaming answer makes the block content (trailing junk); once the name went
    out the stream keeps the call and does not re-send the markup as content."""
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}} junk</tool_call> after'
    got = _frags("hermes", "plain", text)
    assert got.names == {0: "get_weather"}
    assert json.loads("".join(got.args[0])) == {"city": "Paris"}
    assert "".join(got.content) == " after"
    # the whole block in one delta: nothing was announced, the non-streaming answer applies
    one = _frags("hermes", "plain", text, [text])
    assert one.names == {} and "".join(one.content) == text


def test_xml_call_cut_off_closes_the_object():
    """An XML-parameter call cut off inside a value: the parameters whose value closed, the
    object closed (valid JSON), nothing as content."""
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3"
    got = _frags("qwen3_coder", "plain", text)
    assert got.outcome() == ("", "", [("get_weather", {"city": "Paris"})])
    got = _frags("minimax_m2", "minimax", '<minimax:tool_call>\n<invoke name="get_weather">\n'
                 '<parameter name="city">Paris</parameter>\n<parameter name="days">3')
    assert got.outcome() == ("", "", [("get_weather", {"city": "Paris"})])


def test_xml_recovered_markup_settles_to_the_whole_answer():
    """Malformed but unambiguous markup (a repeated closing tag, xmlcall's rules): streaming
    stops at the anomaly and the block's close adds what the non-streaming parse found."""
    text = ("<tool_call>get_weather\n<arg_key>city</arg_key></arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
    got = _frags("glm45", "glm", text)
    assert got.outcome() == ("", "", [("get_weather", {"city": "Paris", "days": 3})])


def test_parallel_false_streams_one_call():
    text, family = _example_text("minimax_m2")
    stack = _stack(None, "minimax_m2", family)
    ctx = RequestContext(tools=TOOLS, tool_choice="auto", parallel_tool_calls=False)
    for parts in fam.splits(text):
        assert len(_run(stack, ctx, parts).names) == 1


# -------------------------------------------------------- service, config and batch plumbing --
QWEN3 = str(fam.TOK_JSON.parent)


def _service(mode: str):
    from worker.config import ServedModelConfig
    from worker.core.service import DerenderService

    return DerenderService([ServedModelConfig(name="m", tokenizer=QWEN3, reasoning_parser="qwen3",
                                              tool_parser="hermes", enable_auto_tool_choice=True,
                                              tool_call_streaming=mode)])


def _stream(svc, ids: list[int], prompt: list[int]) -> list[dict]:
    out, state = [], None
    for i, t in enumerate(ids):
        b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "r", "choices": [
            {"index": 0, "token_ids": [t], "finish_reason": "stop" if i == len(ids) - 1 else None}]}}
        if i == 0:
            b["prompt_token_ids"] = prompt
            b["chat_request"] = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                 "tools": TOOLS, "tool_choice": "auto"}
        res, state = svc.derender_stream(json.dumps(b).encode(), state)
        assert not res.is_error, res.body
        out.extend(json.loads(res.body))
    return out


def test_service_stream_shape_both_modes():
    """Through ``DerenderService.derender_stream`` (the worker's and batch's path): incremental
    streams OpenAI's shape (first fragment: id, type, name, arguments ""; then arguments only),
    whole sends each call in one fragment; both join to the non-streaming call."""
    whole, inc = _service("whole"), _service("incremental")
    tok = whole.runtime("m").tokenizer
    text = ('<think>\nok\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"days": 3, "notes": "' + "dry and sunny " * 10 + '"}}\n</tool_call>')
    ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
    prompt = tok.encode("<|im_start|>assistant\n")
    body = {"model": "m", "chat_request": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                           "tools": TOOLS, "tool_choice": "auto"},
            "prompt_token_ids": prompt,
            "generate_response": {"request_id": "r", "choices": [{"index": 0, "token_ids": ids,
                                                                  "finish_reason": "stop"}]}}
    res = whole.derender(json.dumps(body).encode())
    ref = json.loads(res.body)["choices"][0]["message"]["tool_calls"][0]
    for svc, many in ((whole, False), (inc, True)):
        frags = [tc for ck in _stream(svc, ids, prompt) if ck["choices"]
                 for tc in ck["choices"][0]["delta"].get("tool_calls") or []]
        finish = [ck["choices"][0]["finish_reason"] for ck in _stream(svc, ids, prompt) if ck["choices"]][-1]
        assert finish == "tool_calls"
        assert frags[0]["id"] == ref["id"] and frags[0]["type"] == "function"
        assert frags[0]["function"]["name"] == "get_weather"
        assert all(f.get("id") is None and f["function"].get("name") is None for f in frags[1:])
        joined = "".join(f["function"]["arguments"] for f in frags)
        assert json.loads(joined) == json.loads(ref["function"]["arguments"])
        if many:
            assert frags[0]["function"]["arguments"] == "" and len(frags) > 10
        else:
            assert len(frags) == 1


def test_config_key_and_flag(tmp_path):
    import argparse

    from worker.config import add_model_args, load_config_file, models_from_args

    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"a": {"tokenizer": QWEN3, "tool_call_streaming": "incremental"},
                               "b": {"tokenizer": QWEN3}}))
    a, b = load_config_file(cfg)
    assert (a.tool_call_streaming, b.tool_call_streaming) == ("incremental", "whole")
    cfg.write_text(json.dumps({"a": {"tokenizer": QWEN3, "tool_call_streaming": "sometimes"}}))
    with pytest.raises(ValueError):
        load_config_file(cfg)
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    (m,) = models_from_args(ap.parse_args(["--tokenizer", QWEN3, "--tool-call-streaming", "incremental"]))
    assert m.tool_call_streaming == "incremental"
    (m,) = models_from_args(ap.parse_args(["--tokenizer", QWEN3]))
    assert m.tool_call_streaming == "whole"


# ------------------------------------------------------- XML string values, streamed early --
STR_TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": ["string", "null"]},
    "n": {"type": "integer"}}}}}]
#: raw values (as the model writes them between the tags) that test the string rules: framing
#: newlines / whitespace, a value reading null, text looking like a tag, escapes, empties
TRICKY = ["\nsrc/a.py\n", "\n\ndef f():\n    return a < b and c > d\n\n", "null", "\nNULL\n", "nul", "",
          "\n", "  spaced  ", 'quote " back \\ tab \t é', "<not a tag", "x\n\n"]


def _xml_call(tp: str, values: list[str]) -> str:
    keys = ["path", "content", "mode", "extra"]  # "extra": not declared (a string)
    pairs = list(zip(keys * 3, values))
    if tp in ("qwen3_coder", "seed_oss"):
        inner = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in pairs)
        body = f"<function=write_file>\n{inner}<parameter=n>\n7\n</parameter>\n</function>"
        return ("<seed:tool_call>" + body + "</seed:tool_call>") if tp == "seed_oss" else f"<tool_call>\n{body}\n</tool_call>"
    if tp == "glm45":
        inner = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
        return f"<tool_call>write_file\n{inner}<arg_key>n</arg_key><arg_value>7</arg_value></tool_call>"
    tag, par = ("steptml:invoke", "steptml:parameter") if tp == "step3" else ("invoke", "parameter")
    inner = "".join(f'<{par} name="{k}">{v}</{par}>\n' for k, v in pairs)
    body = f'<{tag} name="write_file">\n{inner}<{par} name="n">7</{par}>\n</{tag}>'
    if tp == "step3":
        return f"<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>{body}<｜tool_call_end｜><｜tool_calls_end｜>"
    return f"<minimax:tool_call>\n{body}\n</minimax:tool_call>"


XML_FAMILIES = [("qwen3_coder", "plain"), ("seed_oss", "seed"), ("glm45", "glm"), ("minimax_m2", "minimax"),
                ("step3", "step3")]


@pytest.mark.parametrize("tp,family", XML_FAMILIES)
def test_xml_string_values_stream_early_and_match(tp, family):
    """String parameters stream before their closing tag; under every split the joined JSON
    equals the non-streaming arguments for framing, null, tag-like text, escapes and empties."""
    for k in range(0, len(TRICKY), 4):
        text = _xml_call(tp, TRICKY[k:k + 4] + TRICKY[:max(0, k + 4 - len(TRICKY))])
        tok = fam.tokenizer(family)
        whole = ParserStack(None, make_tool_parser(tp, tok), enable_auto_tool_choice=True)
        ctx = RequestContext(tools=STR_TOOLS, tool_choice="auto")
        st = whole.initial_state(ctx)
        d = whole.feed(st, text, [])
        expected = _whole_outcome(d.extend(whole.finish(st)))
        assert expected[2], text
        stack = _stack(None, tp, family)
        splits = fam.splits(text) + [[text[i:i + 2] for i in range(0, len(text), 2)]]
        for parts in splits:
            assert _run(stack, ctx, parts).outcome() == expected, (text, parts[:4])
    # the content string goes out before its closing tag (1-char deltas)
    text = _xml_call(tp, ["\na.py\n", "\n" + "line of code\n" * 20])
    stack = _stack(None, tp, family)
    st = stack.initial_state(RequestContext(tools=STR_TOOLS, tool_choice="auto"), streaming=True)
    sent = ""
    close = text.index("line of code\n" * 20) + len("line of code\n" * 10)
    for ch in text[:close]:
        sent += "".join(c.arguments for c in stack.feed(st, ch, []).tool_calls)
    assert "line of code\\n" * 9 in sent, sent


def test_xml_string_value_cut_off_keeps_text_that_went_out():
    """Output cut inside a string value that was streaming: the text that went out, the string
    and the object closed (valid JSON); the whole-mode answer would drop that parameter."""
    text = ("<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
            "<parameter=content>\ndef f():\n    return 1")
    got = _frags("qwen3_coder", "plain", text, tools=STR_TOOLS)
    assert got.outcome() == ("", "", [("write_file", {"path": "a.py", "content": "def f():\n    return 1"})])


@pytest.mark.parametrize("mode", ["whole", "incremental"])
def test_batch_cli_honours_the_flag(tmp_path, mode):
    """``derender-worker batch --tool-call-streaming MODE`` on a streamed request (one line
    holding its chunk bodies): incremental sends many argument fragments, whole one."""
    import os
    import subprocess
    import sys

    svc = _service("whole")
    tok = svc.runtime("m").tokenizer
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "notes": "' + "x y " * 20 + '"}}\n</tool_call>'
    ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
    bodies = []
    for i, t in enumerate(ids):
        b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "r", "choices": [
            {"index": 0, "token_ids": [t], "finish_reason": "stop" if i == len(ids) - 1 else None}]}}
        if i == 0:
            b["prompt_token_ids"] = tok.encode("<|im_start|>assistant\n")
            b["chat_request"] = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                 "tools": TOOLS, "tool_choice": "auto"}
        bodies.append(b)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(bodies) + "\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, "-m", "worker.cli", "batch", str(src), "-o", str(out), "--tokenizer", QWEN3,
                    "--served-model-name", "m", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                    "--tool-call-streaming", mode], check=True, env=env, capture_output=True, timeout=300)
    chunks = json.loads(out.read_text().splitlines()[0])
    frags = [tc for ck in chunks if ck["choices"] for tc in ck["choices"][0]["delta"].get("tool_calls") or []]
    assert json.loads("".join(f["function"]["arguments"] for f in frags))["city"] == "Paris"
    assert (len(frags) > 10) if mode == "incremental" else (len(frags) == 1)


# ------------------------------------------------ vLLM 0.32 delta boundaries (Responses parity) --
def test_qwen3_coder_delta_boundaries_follow_vllm_engine():
    """qwen3_coder (``XmlArgs.safe_prefix``, vLLM 0.32's parser engine): a plain string value's
    key and quote go out when ``<parameter=K>`` is complete, the value as it comes (its framing
    newline held), the closing quote with what follows; the token split of the Responses
    reference case qwen3-coder-call-one gives its exact argument deltas."""
    tools = [{"type": "function", "function": {"name": "get_stock_price", "parameters": {"type": "object",
              "properties": {"ticker": {"type": "string"}, "exchange": {"type": "string"}}}}}]
    parts = ["<tool_call>", "\n", "<", "function", "=get", "_stock", "_price", ">\n", "<", "parameter", "=t",
             "icker", ">\n", "AAP", "L", "\n", "</", "parameter", ">\n", "<", "parameter", "=", "exchange",
             ">\n", "NASDAQ", "\n", "</", "parameter", ">\n", "</", "function", ">\n", "</tool_call>"]
    got = _frags("qwen3_coder", "plain", "".join(parts), parts, tools=tools)
    assert got.args[0] == ["", '{"ticker": "', "AAP", "L", '", "exchange": "', "NASDAQ", '"}']
    # a non-string value goes out whole at its closing tag, with the quote held before it
    parts = ["<tool_call>\n<function=get_weather>\n<parameter=city>\n", "Paris", "\n</parameter>\n",
             "<parameter=days>\n", "3", "\n</parameter>\n", "</function>\n</tool_call>"]
    got = _frags("qwen3_coder", "plain", "".join(parts), parts)
    assert got.args[0] == ["", '{"city": "', "Paris", '", "days": 3', "}"]


def test_qwen3_coder_null_is_text_for_a_plain_string_parameter():
    """``null`` written for a parameter whose schema type is ``string`` stays the text (vLLM
    0.32's ``coerce_to_schema_type``), in both modes; a type admitting null and an integer
    still read it as JSON null."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "m": {"type": ["string", "null"]}, "n": {"type": "integer"}}}}}]
    text = ("<tool_call>\n<function=f>\n<parameter=s>\nnull\n</parameter>\n<parameter=m>\nnull\n</parameter>\n"
            "<parameter=n>\nnull\n</parameter>\n</function>\n</tool_call>")
    want = ("", "", [("f", {"s": "null", "m": None, "n": None})])
    assert _frags("qwen3_coder", "plain", text, tools=tools).outcome() == want
    assert _frags("qwen3_coder", "plain", text, [text], tools=tools).outcome() == want
    tok = fam.tokenizer("plain")
    whole = ParserStack(None, make_tool_parser("qwen3_coder", tok), enable_auto_tool_choice=True)
    ctx = RequestContext(tools=tools, tool_choice="auto")
    st = whole.initial_state(ctx)
    assert _whole_outcome(whole.feed(st, text, []).extend(whole.finish(st))) == want


def test_hermes_holds_trailing_whitespace_of_the_arguments():
    """hermes (``JsonArgs.hold_ws``, vLLM 0.32's Hermes parser strips the call body): a
    whitespace-only token after ``"limit":`` goes out with the next token (reference case
    qwen3-call-parallel); the closing brace still goes out with the object's end."""
    parts = ["<tool_call>", "\n", '{"', "name", '":', ' "', "get_weather", '",', ' "', "arguments", '":', ' {"',
             "days", '":', " ", "3", "}}\n", "</tool_call>"]
    got = _frags("hermes", "plain", "".join(parts), parts)
    assert got.args[0] == ["", '{"', "days", '":', " 3", "}"]
