"""Hostile input for the parser stack and the derender core: minimised fuzz findings as golden
vectors, plus bounded, derandomized property runs (hypothesis) of the invariants.

Invariants (worker/parsers/AGENTS.md, worker/core/AGENTS.md):

* bad input never escapes as an exception and never yields a 500: every bad body is a 400 error
  object, in both modes;
* split independence: one delta == 1-char deltas == random deltas (state round-tripped through
  ``msgspec.json`` between deltas), and streaming chunks join to the non-streaming answer;
* a tool call always has a usable name and JSON arguments (malformed markup stays content);
* the parser state does not grow with the output outside an open call's body (sizes printed
  with ``-s``, bounded by a constant here; speed figures are printed, never asserted).

Findings pinned here (each fixed where its kind lives):

1. prompt ids outside the vocabulary (``-1``, ``2**64``, ``vocab_size``) crashed the detokenizer
   seed (500): now a 400 in both modes (``derender.check_prompt_ids``);
2. JSON nested past msgspec's depth limit (a tool schema 100k levels deep) was a 500:
   ``service._decode_or_400`` maps the ``RecursionError`` to a 400;
3. stop lists of 10k strings or 1M characters cost O(#stops) per streamed chunk (4.7 ms per
   1-token chunk for 10k stops) and were stored in every stream state write: bounded to
   ``MAX_STOP_STRINGS`` / ``MAX_STOP_CHARS`` (400 beyond);
4. integers out of range (``n``, ``top_logprobs``/``logprobs``, ``min_tokens``, ``prompt_tokens``,
   choice ``index``): past 64 bits they made the stream state unencodable (500; the schemas now
   reject them at decode), negative or huge ones were used as they came, and ``n`` above
   ``max_n`` made a stream that could never finish: bounded in ``derender.check_request_numbers``
   / ``check_choice_index`` (duplicate choice indexes are now a 400 in non-streaming bodies too,
   as in streams);
5. a tool call named ``""`` or ``" "`` (Hermes/JSON bodies, JSON lists, DSML ``name=" "``,
   required-mode JSON) was returned as a call, which streams as a nameless delta: the block now
   stays content, verbatim (``base.names_ok``, applied by every engine);
6. a corrupted stored stream state (a parser sub-state nulled or mistyped) was a 500: a 400.
"""
from __future__ import annotations

import copy
import json
import random
import re
import time

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from tests.parity import corpus, missing_parser, nonstream_cases, service
from tests.parity_tools import to_requests
from tests.test_parser_families import TOK_JSON
from tests.test_stream_parity import _nonstream_view, _stream_view, run_stream, stream_bodies_from_nonstream
from worker.bench.parsers import family_tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import Delta, RequestContext
from worker.parsers.examples import MARKERS, PAD_C, PAD_R, PROSE, cases
from worker.parsers.stack import ParserStack

CASES = {c["id"]: c for c in corpus()}
NS_CHAT = "qwen3-tool-single-v1"  # qwen3 + hermes, tools, auto
ST_CHAT = "qwen3-tool-single-stream1-v0"
NS_COMPLETION = "qwen3-completion-multi-n2-v0"
ST_COMPLETION = "qwen3-completion-logprobs-nonascii-v0"
VOCAB = 151669  # the Qwen3 test tokenizer's vocab_size


def _ns(cid: str, mutate) -> tuple[int, dict]:
    body = to_requests.nonstream_body(copy.deepcopy(CASES[cid]))
    raw = mutate(body)
    res = service().derender(raw if isinstance(raw, bytes) else json.dumps(body).encode())
    return res.status, json.loads(res.body)


def _st(cid: str, mutate) -> tuple[int, dict | list]:
    """Mutate the first streaming body of a case; run the stream until an error or the end."""
    bodies = to_requests.stream_bodies(copy.deepcopy(CASES[cid]))
    raw0 = mutate(bodies[0])
    state = None
    for i, b in enumerate(bodies):
        raw = raw0 if (i == 0 and isinstance(raw0, bytes)) else json.dumps(b).encode()
        res, new = service().derender_stream(raw, state, seq=i)
        if res.status != 200:
            return res.status, json.loads(res.body)
        state = new
    return 200, []


def _deep(n: int) -> str:
    return '{"type": "object", "properties": {"x": ' * n + "{}" + "}}" * n


def _set(path: str, value):
    """A mutation setting ``body[path...]`` (dotted; ints index lists) to ``value``."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]

    def mutate(body):
        obj = body
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value

    return mutate


def _deep_tools(n: int):
    def mutate(body):
        req = body.get("chat_request") or body.get("completion_request")
        req["tools"] = [{"type": "function", "function": {"name": "f", "parameters": "__DEEP__"}}]
        return json.dumps(body).replace('"__DEEP__"', _deep(n)).encode()

    return mutate


BIG = 2**63 - 1  # the largest int a body may spell (the schemas reject more: see "int-past-64-bits")
# (id, mutation of a chat body, mutation of its first stream body, message fragment)
BAD_CHAT = [
    ("prompt-id-neg", _set("prompt_token_ids.0", -1), _set("prompt_token_ids.0", -1), "prompt token id -1"),
    ("prompt-id-int64-max", _set("prompt_token_ids.0", BIG), _set("prompt_token_ids.0", BIG), "outside the vocabulary"),
    ("prompt-id-vocab", _set("prompt_token_ids.0", VOCAB), _set("prompt_token_ids.0", VOCAB), "outside the vocab"),
    ("engine-prompt-id", _set("generate_response.prompt_token_ids", [1, -5]),
     _set("generate_chunk.prompt_token_ids", [1, -5]), "prompt token id -5"),
    ("json-too-deep", _deep_tools(100_000), _deep_tools(100_000), "nested too deeply"),
    ("n-int64-max", _set("chat_request.n", BIG), _set("chat_request.n", BIG), "n ("),
    ("n-zero", _set("chat_request.n", 0), _set("chat_request.n", 0), "n (0)"),
    ("n-over-max", _set("chat_request.n", 16385), _set("chat_request.n", 16385), "maximum n"),
    ("top-logprobs-neg", _set("chat_request.top_logprobs", -1), _set("chat_request.top_logprobs", -1), "top_logprobs"),
    ("top-logprobs-21", _set("chat_request.top_logprobs", 21), _set("chat_request.top_logprobs", 21), "max_logprobs"),
    ("top-logprobs-int64-max", _set("chat_request.top_logprobs", BIG), _set("chat_request.top_logprobs", BIG),
     "max_logprobs"),
    ("min-tokens-neg", _set("chat_request.min_tokens", -1), _set("chat_request.min_tokens", -1), "min_tokens"),
    ("min-tokens-int64-max", _set("chat_request.min_tokens", BIG), _set("chat_request.min_tokens", BIG), "min_tokens"),
    ("choice-index-int64-max", _set("generate_response.choices.0.index", BIG),
     _set("generate_chunk.choices.0.index", BIG), "choice index"),
    ("choice-index-neg", _set("generate_response.choices.0.index", -1),
     _set("generate_chunk.choices.0.index", -1), "choice index"),
    ("token-id-float", _set("generate_response.choices.0.token_ids", [1.5]),
     _set("generate_chunk.choices.0.token_ids", [1.5]), "invalid request body"),
    ("token-id-bool", _set("generate_response.choices.0.token_ids", [True]),
     _set("generate_chunk.choices.0.token_ids", [True]), "invalid request body"),
    ("token-id-int64-max", _set("generate_response.choices.0.token_ids", [BIG]),
     _set("generate_chunk.choices.0.token_ids", [BIG]), "outside the vocabulary"),
    ("int-past-64-bits", _set("chat_request.n", 2**64), _set("chat_request.n", 2**64), "invalid request body"),
    ("lone-surrogate", lambda b: json.dumps(b).replace('"qwen3"', '"\\ud800"', 1).encode(),
     lambda b: json.dumps(b).replace('"qwen3"', '"\\ud800"', 1).encode(), "invalid request body"),
    ("invalid-utf8", lambda b: json.dumps(b).replace('"qwen3"', '"q\udcff"', 1).encode("utf-8", "surrogateescape"),
     lambda b: json.dumps(b).replace('"qwen3"', '"q\udcff"', 1).encode("utf-8", "surrogateescape"),
     "invalid request body"),
    ("stop-10k", _set("chat_request.stop", [f"zz{i}" for i in range(10_000)]),
     _set("chat_request.stop", [f"zz{i}" for i in range(10_000)]), "stop: at most 1024"),
    ("stop-1M-chars", _set("chat_request.stop", "x" * 1_000_000), _set("chat_request.stop", "x" * 1_000_000),
     "stop: at most"),
    ("logprobs-shape", _set("generate_response.choices.0.logprobs", {"content": [[1]]}),
     _set("generate_chunk.choices.0.logprobs", {"content": [[1]]}), "invalid request body"),
]


def _prompt_tokens_only(v):
    def mutate(body):
        body.pop("prompt_token_ids", None)
        body["prompt_tokens"] = v

    return mutate


BAD_CHAT += [
    ("prompt-tokens-neg", _prompt_tokens_only(-1), _prompt_tokens_only(-1), "prompt_tokens"),
    ("prompt-tokens-int64-max", _prompt_tokens_only(BIG), _prompt_tokens_only(BIG), "prompt_tokens"),
]


@pytest.mark.parametrize("label,ns,st,msg", BAD_CHAT, ids=[b[0] for b in BAD_CHAT])
def test_hostile_chat_body_is_a_400(label, ns, st, msg):
    status, out = _ns(NS_CHAT, ns)
    assert status == 400 and msg in out["error"]["message"], out
    status, out = _st(ST_CHAT, st)
    assert status == 400 and msg in out["error"]["message"], out


def test_duplicate_choice_index_is_a_400_in_both_modes():
    def dup(body):
        chs = body["generate_response"]["choices"]
        chs.append(copy.deepcopy(chs[0]))

    status, out = _ns(NS_CHAT, dup)
    assert status == 400 and "appears twice" in out["error"]["message"]

    def dup_st(body):
        chs = body["generate_chunk"]["choices"]
        chs.append(copy.deepcopy(chs[0]))

    status, out = _st(ST_CHAT, dup_st)
    assert status == 400 and "appears twice" in out["error"]["message"]


def test_hostile_completion_bodies_are_400s():
    for mutate, msg in ((_set("completion_request.n", BIG), "n ("), (_set("completion_request.logprobs", 21), "logprobs"),
                        (_set("prompt_token_ids.0.0", -1), "prompt token id -1"),
                        (_set("generate_responses.0.prompt_token_ids", [VOCAB]), "outside the vocabulary")):
        status, out = _ns(NS_COMPLETION, mutate)
        assert status == 400 and msg in out["error"]["message"], out
    # a stream whose n x prompts exceeds max_n could never finish
    status, out = _st(ST_COMPLETION, lambda b: b["completion_request"].update(n=9000, prompt=["a", "b"]))
    assert status == 400 and "maximum n" in out["error"]["message"], out


# (label, mutation) that must still be served (200) in both modes, the stream joining to the
# non-streaming answer
HEAVY_BUT_VALID = [
    ("stop-1024", lambda r: r.update(stop=[f"zz{i}" for i in range(1024)])),
    ("stop-64k-chars", lambda r: r.update(stop=["x" * 65536])),
    ("stop-empty-string", lambda r: r.update(stop=[""])),
    ("tool-name-with-markers", lambda r: r.update(tools=[{"type": "function", "function": {
        "name": "<tool_call>get_weather</tool_call>", "parameters": {"type": "object", "properties": {}}}}])),
    ("named-choice-markers", lambda r: r.update(tool_choice={"type": "function", "function": {"name": "</think>"}})),
    ("schema-200-deep", lambda r: r["tools"][0]["function"]["parameters"]["properties"].update(
        deep=json.loads(_deep(200)))),
    ("kwargs-garbage", lambda r: r.update(chat_template_kwargs={"enable_thinking": "no", "thinking": [1]})),
    ("tool-choice-garbage", lambda r: r.update(tool_choice={"function": 1})),
]


@pytest.mark.parametrize("label,mutate", HEAVY_BUT_VALID, ids=[h[0] for h in HEAVY_BUT_VALID])
def test_heavy_but_valid_request_stream_equals_nonstream(label, mutate):
    body = to_requests.nonstream_body(copy.deepcopy(CASES[NS_CHAT]))
    mutate(body["chat_request"])
    res = service().derender(json.dumps(body).encode())
    assert res.status == 200, res.body[:300]
    want = _nonstream_view(json.loads(res.body), "chat")
    got = _stream_view(run_stream(stream_bodies_from_nonstream(copy.deepcopy(body), "chat", "random", 3)), "chat")
    assert got == want


# ------------------------------------------------------------- nameless tool calls (4) ---
def _text_stack(reasoning: str | None, tool: str, markers: tuple[str, ...], streaming: str = "whole") -> ParserStack:
    tok = family_tokenizer(markers, str(TOK_JSON))
    return ParserStack(make_reasoning_parser(reasoning, tok), make_tool_parser(tool, tok), enable_auto_tool_choice=True,
                       tool_call_streaming=streaming)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]

NAMELESS = [
    ("hermes", ("plain",), 'Hi\n<tool_call>\n{"name": "", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", ("plain",), '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\n'
                           '<tool_call>{"name": " ", "arguments": {}}</tool_call>'),
    ("mistral", ("mistral_tools",), '[TOOL_CALLS][{"name": " ", "arguments": {"city": "Paris"}}]'),
    ("llama3_json", ("llama3",), '{"name": " ", "parameters": {"city": "Paris"}}'),
    ("hunyuan_a13b", ("hunyuan",), '<tool_calls>[{"name": "\\n", "arguments": {}}]</tool_calls>'),
    ("deepseek_v32", ("deepseek",), '<｜DSML｜function_calls>\n<｜DSML｜invoke name=" ">\n<｜DSML｜parameter '
                                    'name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                                    '</｜DSML｜function_calls>'),
]


def _split_runs(stack: ParserStack, ctx: RequestContext, text: str, rng: random.Random) -> list[tuple]:
    """Outcome of ``text`` as one delta, as 1-char deltas and as random deltas (state
    round-tripped through msgspec.json between deltas)."""
    splits = [[text], list(text)]
    parts, i = [], 0
    while i < len(text):
        n = rng.randint(1, 9)
        parts.append(text[i:i + n])
        i += n
    splits.append(parts)
    outs = []
    for parts in splits:
        st = stack.initial_state(ctx)
        tot = Delta()
        for p in parts:
            tot.extend(stack.feed(st, p, []))
            st = stack.load_state(msgspec.json.decode(msgspec.json.encode(st)))
        tot.extend(stack.finish(st))
        names: dict[int, list[str]] = {}
        args: dict[int, str] = {}
        for c in tot.tool_calls:
            if c.name is not None:
                names.setdefault(c.index, []).append(c.name)
            args[c.index] = args.get(c.index, "") + c.arguments
        outs.append((tot.reasoning, tot.content, [(names.get(i), args[i]) for i in sorted(args)]))
    return outs


@pytest.mark.parametrize("streaming", ["whole", "incremental"])
@pytest.mark.parametrize("tool,markers,text", NAMELESS, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(NAMELESS)])
def test_nameless_call_stays_content(tool, markers, text, streaming):
    """Also with ``--tool-call-streaming incremental``: a blank name is never announced."""
    stack = _text_stack(None, tool, markers, streaming)
    ctx = RequestContext(tools=TOOLS, tool_choice="auto")
    outs = _split_runs(stack, ctx, text, random.Random(0))
    assert all(o == outs[0] for o in outs)
    assert outs[0] == _split_runs(_text_stack(None, tool, markers), ctx, text, random.Random(0))[0]
    _, content, calls = outs[0]
    for name, _ in calls:
        assert name and name[0].strip(), calls
    assert content.strip() and content.strip() in text


def test_required_mode_json_with_empty_name_is_content():
    stack = _text_stack(None, "hermes", ("plain",))
    ctx = RequestContext(tools=TOOLS, tool_choice="required")
    text = '[{"name": "", "parameters": {"city": "Paris"}}]'
    outs = _split_runs(stack, ctx, text, random.Random(0))
    assert outs[0] == ("", text, [])
    assert all(o == outs[0] for o in outs)


# -------------------------------------------------- property runs: text level, every case ---
_EXTRA = ["<think>", "</think>", "\n", " ", "{", "}", "[", "]", '"', "\\", ",", ":", "<", ">", "</", "=", "'",
          "<tool_call>", "</tool_call>", "<parameter=", "</parameter>", "<function=", "</function>", 'name="',
          '"name": ', '"arguments": ', '"name": "", ', "null", "1", "é", "\u2028", "```", "functions.", ":0",
          "get_weather", "get_time", "(", ")", "call:", "\ufffd"]
PARSER_CASES = cases()


def _alphabet(case) -> list[str]:
    t = case.example.template.replace(PAD_R, "").replace(PAD_C, "")
    frags = [t[i:i + k] for i in range(0, len(t), 5) for k in (3, 11)]
    return _EXTRA + [m for key in case.example.markers for m in MARKERS[key]] + frags


@pytest.mark.parametrize("case", PARSER_CASES, ids=[c.name for c in PARSER_CASES])
def test_mutated_markup_property(case):
    """Mutated family markup: no exception, split-independent, calls named with JSON arguments."""
    stack = _text_stack(case.reasoning_parser, case.tool_parser, case.example.markers)
    alphabet = _alphabet(case)
    base = case.example.template.replace(PAD_R, "some reasoning").replace(PAD_C, "Hello")
    modes = ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}, "none"]

    @settings(max_examples=10, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(ops=hs.lists(hs.tuples(hs.integers(0, 4), hs.integers(0, 10**6), hs.integers(0, 10**6)), max_size=6),
           mode=hs.sampled_from(modes), parallel=hs.booleans(), seed=hs.integers(0, 2**16))
    def prop(ops, mode, parallel, seed):
        s = base
        for op, a, b in ops:
            i = a % (len(s) + 1)
            if op == 0:
                s = s[:i] + alphabet[b % len(alphabet)] + s[i:]
            elif op == 1:
                s = s[:i] + s[i + 1 + b % 20:]
            elif op == 2:
                j = min(len(s), i + 1 + b % 30)
                s = s[:j] + s[i:j] + s[j:]
            elif op == 3:
                s = s[:i]
            else:
                nm = ("get_weather", "get_time")[b % 2]
                s = s.replace(nm, ("", " ", "a<tool_call>b", "é")[a % 4], 1)
        ctx = RequestContext(tools=case.tools, tool_choice=mode if case.tools else None, parallel_tool_calls=parallel,
                             chat_template_kwargs=case.example.kwargs)
        outs = _split_runs(stack, ctx, s, random.Random(seed))
        assert outs[1] == outs[0] and outs[2] == outs[0], (s, outs)
        for names, args in outs[0][2]:
            assert names is not None and len(names) == 1 and names[0].strip(), (s, outs[0])
            json.loads(args)

    prop()


# ---------------------------------------- property runs: mutated ids through the service ---
ID_CASES = [c for c in nonstream_cases() if not (c.get("expected") or {}).get("error") and not missing_parser(c)]


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(k=hs.integers(0, len(ID_CASES) - 1), ops=hs.lists(hs.tuples(hs.integers(0, 5), hs.integers(0, 10**6),
                                                                    hs.integers(0, 10**9)), min_size=1, max_size=5),
       finish=hs.sampled_from(["stop", "length", None]), how=hs.sampled_from(["1", "3", "random"]))
def test_mutated_ids_stream_equals_nonstream(k, ops, finish, how):
    """Output ids spliced with special tokens, random vocabulary ids, byte tokens and pieces of
    the output itself, on the corpus' real tokenizers: never a 500, and the stream (1, 3 or
    random tokens per chunk, choices interleaved) joins to the non-streaming answer."""
    case = ID_CASES[k]
    body = to_requests.nonstream_body(copy.deepcopy(case))
    rt = service().runtime(case["model"])
    specials = sorted(rt.tokenizer.special_ids)
    chs = body["generate_response"]["choices"] if case["endpoint"] == "chat" else [
        c for g in body["generate_responses"] for c in g["choices"]]
    pool = [t for c in chs for t in c["token_ids"]]
    for c in chs:
        ids = list(c["token_ids"])
        for op, a, b in ops:
            i = a % (len(ids) + 1)
            if op == 0 and specials:
                ids[i:i] = [specials[b % len(specials)]]
            elif op == 1:
                del ids[i:i + 1 + b % 5]
            elif op == 2:
                j = min(len(ids), i + 1 + b % 10)
                ids[j:j] = ids[i:j]
            elif op == 3:
                ids[i:i] = [b % rt.tokenizer.vocab_size]
            elif op == 4:
                ids[i:i] = [b % 300]  # byte-level pieces: partial UTF-8
            elif pool:
                j = b % len(pool)
                ids[i:i] = pool[j:j + 1 + a % 8]
        c["token_ids"] = ids or [pool[0] if pool else 1]
        c.pop("logprobs", None)
        c["stop_reason"] = None
        if finish is not None:
            c["finish_reason"] = finish
    res = service().derender(json.dumps(body).encode())
    assert res.status != 500, res.body
    if res.is_error:
        return
    want = _nonstream_view(json.loads(res.body), case["endpoint"])
    got = _stream_view(run_stream(stream_bodies_from_nonstream(body, case["endpoint"], how, k)), case["endpoint"])
    assert got == want


# ----------------------------------------------------- state size and per-delta cost ---
_WORDS = re.findall(r"\S+\s*", PROSE)


def _long_run(case, n_words: int) -> tuple[float, int]:
    """(CPU seconds, largest encoded state) of ``case``'s template with ``n_words`` prose words
    in its padding slot, fed one word per delta."""
    stack = _text_stack(case.reasoning_parser, case.tool_parser, case.example.markers)
    ctx = RequestContext(tools=case.tools, tool_choice="auto" if case.tools else None,
                         chat_template_kwargs=case.example.kwargs)
    t = case.example.template
    slot = PAD_R if PAD_R in t else PAD_C
    head, tail = t.split(slot, 1)
    tail = tail.replace(PAD_R, "").replace(PAD_C, "")
    words = (_WORDS * (n_words // len(_WORDS) + 1))[:n_words]
    st = stack.initial_state(ctx)
    t0 = time.process_time()
    biggest = 0
    stack.feed(st, head, [])
    for k, w in enumerate(words):
        stack.feed(st, w, [])
        if k % 997 == 0:
            biggest = max(biggest, len(msgspec.json.encode(st)))
    stack.feed(st, tail, [])
    stack.finish(st)
    return time.process_time() - t0, biggest


#: padding that lands inside a tool call's arguments (the open call's body is buffered: its size
#: is documented to grow with that call, nothing else may)
_IN_CALL = {"granite", "phi4_mini_json", "xlam", "pythonic", "llama4_pythonic", "llama4_json", "llama3_json",
            "openai", "openai_gptoss+openai", "granite+granite"}


@pytest.mark.parametrize("case", PARSER_CASES, ids=[c.name for c in PARSER_CASES])
def test_state_bounded_and_cost_linear(case):
    """~20k-token outputs (5k words) in one-word deltas: the encoded state stays under 1 KB for
    padding outside a call (same size as for 500 words); CPU time is printed (``-s``), not
    asserted."""
    t_small, s_small = _long_run(case, 500)
    t_big, s_big = _long_run(case, 5000)
    print(f"\n{case.name}: 500 words {t_small * 1e3:.1f} ms state {s_small} B | 5000 words "
          f"{t_big * 1e3:.1f} ms state {s_big} B | x{t_big / max(t_small, 1e-6):.1f}")
    if case.name not in _IN_CALL:
        assert s_big <= max(1024, s_small), (s_small, s_big)


# ------------------------------------------------------- corrupted stored stream state ---
def test_corrupted_stream_state_is_a_400_never_a_500():
    """State bytes come back from the store: bytes flipped, cut or inserted, a parser sub-state
    dropped, or another model's state give a 400 (``stored stream state is unreadable``), never
    a 500. Found by fuzzing: a state whose reasoning sub-state was nulled crashed the parser
    (``AttributeError``), a mistyped sub-state raised from ``ParserStack.load_state``."""
    from worker.core import stream as core_stream

    svc = service()
    bodies = to_requests.stream_bodies(copy.deepcopy(CASES["qwen3-tool-with-reasoning-content-stream1-v0"]))
    state = None
    for i, b in enumerate(bodies[:3]):
        res, state = svc.derender_stream(json.dumps(b).encode(), state, seq=i)
        assert res.status == 200
    nxt = json.dumps(bodies[3]).encode()
    rt = svc.runtime("qwen3")
    st = core_stream.decode_state(rt, state)
    for c in st.choices.values():
        c.parser.reasoning = None
    res, _ = svc.derender_stream(nxt, core_stream.encode_state(st), seq=3)
    assert res.status == 400 and "unreadable" in json.loads(res.body)["error"]["message"]
    rng = random.Random(0)
    statuses = set()
    for _ in range(300):
        b = bytearray(state)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            op = rng.randrange(3)
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:i + rng.randint(1, 8)]
            else:
                b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        res, _ = svc.derender_stream(nxt, bytes(b), seq=3)
        statuses.add(res.status)
        assert res.status != 500, res.body
    assert 400 in statuses
