"""Bug-report cases (tests/data/parity/bugs_public.jsonl) through the core, in-process.

Bodies are built with the case runner's own functions (tests/parity_tools/run_bugs.py: prompt
construction, output encoding, synthesized logprobs) against the project's tokenizers in
tests/data/tokenizers/, sent to ``worker.core.service.DerenderService`` and checked with the
runner's check functions (``check_result``, ``check_must_not``, ``check_usage``,
``check_additional``, ``check_logprobs``). Cases whose tokenizer is not in the project are
skipped with that reason.

Where a case's ``expected_correct`` (the right answer by the OpenAI/model format) differs from
what a coupled vLLM server returns, the case wins; the deviations are named per case in
``CASE_RULES`` below, and pinned by the dedicated tests at the end of this file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
TOKENIZERS_DIR = TESTS_DIR / "data" / "tokenizers"
CASES_FILE = TESTS_DIR / "data" / "parity" / "bugs_public.jsonl"

# run_bugs reads $DERENDER_MODELS_DIR at import; point its module global at the project's
# tokenizers afterwards as well (the import may already have happened elsewhere)
os.environ.setdefault("DERENDER_MODELS_DIR", str(TOKENIZERS_DIR))
from tests.parity_tools import run_bugs as rb  # noqa: E402

rb.MODELS_DIR = str(TOKENIZERS_DIR)

from worker.config import ServedModelConfig  # noqa: E402
from worker.core import stream as core_stream  # noqa: E402
from worker.core.service import DerenderService  # noqa: E402

#: where our answer deliberately differs from coupled vLLM (the case's expected_correct wins)
CASE_RULES = {
    "bug-005": "hermes: a call ends where its JSON object ends, not at a '</tool_call>' quoted "
               "inside a JSON string (vLLM's regex cuts the call there and drops it)",
    "bug-013": "llama3_json: prose after the JSON call is content (vLLM drops the call)",
    "bug-016": "pythonic: prose before the [call, ...] list is content (vLLM returns all as content)",
    "bug-020": "kimi_k2: a non-canonical call id (functionsexec5) resolves to the declared tool",
    "bug-029": "qwen3: '<tool_call>' inside an explicit <think> block does not end reasoning",
    "bug-040": "an empty output derenders to empty text (vLLM's render server rejects it)",
    "bug-111": "request stop strings apply to the answer, not the reasoning (vLLM PR 14550 for its "
               "earlier engine; vLLM 0.32 matches them in the reasoning too): worker.core.answer, "
               "every reasoning parser in tests/test_stop_answer.py",
    "bug-114": "schema-typed parameter values keep integers of any size exactly (vLLM's "
               "_convert_param_value goes through float for 'number'): tests/test_exact_numbers.py",
    "bug-209": "deepseek_v4: the V3.2 fence <｜DSML｜function_calls> is a tool-call block, as SGLang's fix (PR "
               "40237); vLLM's V4 parser keys on <｜DSML｜tool_calls> only and returns it as content "
               "(worker/parsers/families/deepseek.py; vectors 15 in tests/test_parser_malformed.py)",
    "bug-210": "qwen3_coder: <function=...> without <tool_call> is a call in both modes (vLLM's fallback is "
               "non-streaming only), never inside the answer's code (tagged engine, bare calls; vectors 14 in "
               "tests/test_parser_malformed.py)",
    "bug-046": "request stop strings are applied by the derender (the engine never sees them)",
    "bug-047": "request stop strings are applied by the derender (the engine never sees them)",
}

def _cases() -> list[dict]:
    with open(CASES_FILE, encoding="utf-8") as fh:
        return [json.loads(ln) for ln in fh if ln.strip()]


CASES = _cases()

_services: dict[str, DerenderService] = {}


def _service(plan: rb.Plan) -> DerenderService:
    """One service per run_bugs group (tokenizer dir, tool parser, reasoning parser), with the
    flags BatchBackend passes to ``derender-worker batch``."""
    svc = _services.get(plan.group)
    if svc is None:
        cfg = ServedModelConfig(
            name=plan.group, tokenizer=str(TOKENIZERS_DIR / plan.tokdir),
            reasoning_parser=plan.reasoning_parser, tool_parser=plan.tool_parser,
            enable_auto_tool_choice=bool(plan.tool_parser),
            max_model_len=rb.MAX_MODEL_LEN, max_logprobs=rb.MAX_LOGPROBS)
        svc = _services[plan.group] = DerenderService([cfg])
    return svc


def _missing_tokenizers(case: dict) -> list[str]:
    """Tokenizer dirs the case's tokenizer choice needs that the project does not ship."""
    need = {rb.FAMILY_TOKENIZER[case["model"]]} if case["model"] != "generic" \
        else set(rb.GENERIC_CANDIDATES)
    return sorted(d for d in need if not (TOKENIZERS_DIR / d / "tokenizer.json").is_file())


def run_case(case: dict) -> tuple[list[str], dict]:
    """(failures, response) of one case's non-streaming body, checked as run_bugs checks it."""
    plan = rb.Plan(case)
    body = plan.nonstream_body(plan.group)
    res = _service(plan).derender(json.dumps(body, ensure_ascii=False).encode())
    resp = json.loads(res.body)
    if res.is_error:
        return [f"error {res.status}: {rb._err_text(resp)}"], resp
    exp = case["expected_correct"]
    manual: list[str] = []
    views = rb.nonstream_view(plan, resp)
    v = views.get(0)
    if v is None:
        return ["response has no choice 0"], resp
    fails = rb.check_result(plan, v, exp, "")
    fails += rb.check_must_not(v, exp, manual)
    fails += rb.check_usage(plan, resp, exp, manual)
    fails += rb.check_additional(plan, views, exp, "")
    fails += rb.check_logprobs(plan, v, exp, manual)
    if any(not c.get("id") for c in v["tool_calls"]):
        fails.append("tool call without id")
    return fails, resp


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bug_case_nonstream(case):
    missing = _missing_tokenizers(case)
    if missing:
        pytest.skip(f"needs tokenizer(s) not in tests/data/tokenizers: {', '.join(missing)}")
    try:
        fails, _ = run_case(case)
    except rb.NotRunnable as e:
        pytest.skip(f"not runnable: {e}")
    assert not fails, "; ".join(fails) + (f" [rule: {CASE_RULES[case['id']]}]" if case["id"] in CASE_RULES else "")


class InProcessStreamBackend:
    """run_bugs' stream back end, in-process: the case's chunk bodies (``Plan.stream_steps`` /
    ``Plan.stream_body``, as HttpBackend sends them) through ``DerenderService.derender_stream``
    with the request's state bytes carried between calls (the worker's transport contract: one
    state per request id). Records as HttpBackend's: one per OpenAI chunk returned."""

    streams = True

    def __init__(self, check_state: bool = False):
        self.usage: dict | None = None
        self.check_state = check_state
        self.max_held = 0  # longest held-back stop-string tail seen in a state (check_state)

    def stream(self, plan: rb.Plan, sizes: list[int]) -> tuple[str, object]:
        svc = _service(plan)
        records: list[dict] = []
        state: bytes | None = None
        seen: set[int] = set()
        positions: dict[int, int] = {}
        self.usage = None
        for k, (choice, delta, last) in enumerate(plan.stream_steps(sizes)):
            idx = choice["index"]
            pos = positions.get(idx, 0)
            body = plan.stream_body(plan.group, choice, delta, idx not in seen, last, pos, None)
            body.pop("stream_state", None)
            res, new_state = svc.derender_stream(json.dumps(body, ensure_ascii=False).encode(), state)
            out = json.loads(res.body)
            if res.is_error:
                return "error", f"chunk {k}: HTTP {res.status}: {rb._err_text(out)}"
            state = new_state
            if self.check_state:
                st = core_stream.decode_state(svc.runtime(plan.group), state)
                self.max_held = max([self.max_held] + [len(c.held) for c in st.choices.values()])
            seen.add(idx)
            positions[idx] = pos + len(delta)
            for chunk in out:
                if chunk.get("usage"):
                    self.usage = chunk["usage"]
                records.append({"token_ids": delta, "choice_index": idx, "chunk": chunk})
        return "ok", records


STREAM_CASES = [c for c in CASES if c.get("stream_chunks")]


def run_stream_case(case: dict) -> tuple[list[str], list[dict]]:
    """(failures, records) of one case streamed with its own ``stream_chunks``, checked as
    run_bugs' stream mode checks it (``check_result``, ``check_must_not``, ``check_stream``
    against the non-streaming view) plus ``check_usage`` on the stream's usage chunk."""
    plan = rb.Plan(case)
    exp = case["expected_correct"]
    ns_view = None
    body = plan.nonstream_body(plan.group)
    res = _service(plan).derender(json.dumps(body, ensure_ascii=False).encode())
    if not res.is_error:
        ns_view = rb.nonstream_view(plan, json.loads(res.body))
    backend = InProcessStreamBackend()
    st, recs = backend.stream(plan, case["stream_chunks"])
    if st != "ok":
        return [str(recs)], []
    sv = rb.stream_view(plan, recs)
    v = sv.get(0)
    if v is None:
        return ["stream produced no choice 0"], recs
    manual: list[str] = []
    fails = rb.check_result(plan, v, exp, "")
    fails += rb.check_must_not(v, exp, [])
    fails += rb.check_stream(plan, backend, sv, ns_view, exp, manual, {}, [])
    fails += rb.check_usage(plan, {"usage": backend.usage or {}}, exp, [])
    return fails, recs


@pytest.mark.parametrize("case", STREAM_CASES, ids=[c["id"] for c in STREAM_CASES])
def test_bug_case_stream(case):
    missing = _missing_tokenizers(case)
    if missing:
        pytest.skip(f"needs tokenizer(s) not in tests/data/tokenizers: {', '.join(missing)}")
    try:
        fails, _ = run_stream_case(case)
    except rb.NotRunnable as e:
        pytest.skip(f"not runnable: {e}")
    assert not fails, "; ".join(fails) + (f" [rule: {CASE_RULES[case['id']]}]" if case["id"] in CASE_RULES else "")


# ------------------------------------------- stop strings, streamed under any chunking ---
def _stop_variants() -> list[tuple[str, dict]]:
    """(id, case) pairs: bug-046/047 with hand-picked stop settings, plus every runnable case
    with stop strings cut out of its own output text (parsers, special tokens, multi-byte
    text, tool-call markup cut mid-way), seeded per case."""
    import random

    out: list[tuple[str, dict]] = []

    def variant(cid: str, tag: str, **req) -> None:
        c = json.loads(json.dumps(next(x for x in CASES if x["id"] == cid)))
        c["request"].update(req)
        out.append((f"{cid}-{tag}", c))

    variant("bug-046", "case")
    variant("bug-046", "include", include_stop_str_in_output=True)
    variant("bug-046", "first-in-list-order", stop=["nine", "five", "six seven"])
    variant("bug-046", "one-char", stop=["e"])
    variant("bug-046", "at-end", stop=["ine"])
    variant("bug-046", "absent", stop=["eleven", "one two"])
    variant("bug-046", "min-tokens", stop=["four", "seven"], min_tokens=2)
    variant("bug-046", "min-tokens-past", stop=["four"], min_tokens=2)
    variant("bug-046", "spanning", stop=["ven eig", "r fi"], include_stop_str_in_output=True)
    variant("bug-047", "case")
    variant("bug-047", "include", include_stop_str_in_output=True)
    variant("bug-047", "two", stop=["day, F", "Wed"])
    variant("bug-047", "string", stop="Saturday")
    for c in CASES:
        if _missing_tokenizers(c) or c["id"] in ("bug-040",):
            continue
        try:
            plan = rb.Plan(c)
        except rb.NotRunnable:
            continue
        text = plan.tok.decode(plan.choices[0]["token_ids"])
        rng = random.Random(c["id"])
        for k in range(2):
            if len(text) < 4:
                break
            i = rng.randrange(1, len(text) - 1)
            s = text[i:i + rng.randint(1, 6)]
            if not s.strip():
                continue
            v = json.loads(json.dumps(c))
            v["request"]["stop"] = [s, "\u0000never"]
            v["request"]["include_stop_str_in_output"] = bool(k)
            out.append((f"{c['id']}-cut{k}", v))
    return out


STOP_VARIANTS = _stop_variants()


def _nonstream_answer(plan: rb.Plan) -> tuple[dict, dict]:
    res = _service(plan).derender(json.dumps(plan.nonstream_body(plan.group), ensure_ascii=False).encode())
    resp = json.loads(res.body)
    assert not res.is_error, resp
    return rb.nonstream_view(plan, resp), resp


def _answer(v: dict) -> dict:
    calls = [(c["name"], c["arguments"]) for c in v["tool_calls"]]
    return {"content": v["content"] or "", "reasoning": v["reasoning"] or "", "tool_calls": calls,
            "finish_reason": v["finish_reason"], "stop_reason": v["stop_reason"]}


@pytest.mark.parametrize("vid,case", STOP_VARIANTS, ids=[v[0] for v in STOP_VARIANTS])
def test_stop_strings_stream_any_chunking(vid, case):
    """Stop strings streamed in 1-token, 3-token and random chunks give the non-streaming answer
    per choice (content/text, reasoning, tool calls, finish_reason, stop_reason) and its usage
    (every engine token counted); logprobs and token ids end at the matching token; nothing is
    streamed for a choice after its finish_reason; the held-back tail stays shorter than the
    longest stop string."""
    for with_logprobs in (True, False):
        _stop_strings_stream_check(vid, case, with_logprobs)


def _stop_strings_stream_check(vid: str, case: dict, with_logprobs: bool) -> None:
    import random

    plan = rb.Plan(case)
    plan.request["return_token_ids"] = True
    if with_logprobs:
        for c in plan.choices:
            c["logprobs"] = rb.synth_logprobs(c["token_ids"], {"top_k": 1})
        plan.request["logprobs"] = True if plan.endpoint == "chat" else 1
        if plan.endpoint == "chat":
            plan.request["top_logprobs"] = 1
    ns, resp = _nonstream_answer(plan)
    stops = plan.request["stop"]
    stops = [stops] if isinstance(stops, str) else stops
    rng = random.Random(vid)
    for how in ([1], [3], [rng.randint(1, 6) for _ in range(5)], [rng.randint(1, 6) for _ in range(5)]):
        backend = InProcessStreamBackend(check_state=True)
        st, recs = backend.stream(plan, how)
        assert st == "ok", recs
        sv = rb.stream_view(plan, recs)
        for idx, nv in ns.items():
            assert _answer(sv[idx]) == _answer(nv), (how, idx)
        assert backend.usage == resp["usage"], how
        assert backend.max_held <= max(len(s) for s in stops) - 1, how
        ended: set[int] = set()
        got_ids: dict[int, list[int]] = {}
        got_lp: dict[int, list[str]] = {}
        for r in recs:
            for ch in r["chunk"]["choices"]:
                assert ch["index"] not in ended, f"{how}: choice {ch['index']} streamed after its finish"
                got_ids.setdefault(ch["index"], []).extend(ch.get("token_ids") or [])
                lp = ch.get("logprobs")
                if lp:
                    toks = [e["token"] for e in lp["content"]] if plan.endpoint == "chat" else lp["tokens"]
                    got_lp.setdefault(ch["index"], []).extend(toks)
                if ch.get("finish_reason") is not None:
                    ended.add(ch["index"])
        for ch in resp["choices"]:
            assert got_ids.get(ch["index"], []) == ch["token_ids"], how
            lp = ch["logprobs"]
            if with_logprobs:
                want = [e["token"] for e in lp["content"]] if plan.endpoint == "chat" else lp["tokens"]
                assert got_lp.get(ch["index"], []) == want, how


def test_stop_string_stream_ends_at_match_and_counts_later_tokens():
    """bug-047 streamed token by token: the finish_reason chunk is the one of the token that
    completed 'Thursday'; the engine's later chunks produce nothing but the usage chunk (sent
    with the engine's own finish) counts all of them."""
    case = _case("bug-047")
    plan = rb.Plan(case)
    plan.request["return_token_ids"] = True
    backend = InProcessStreamBackend(check_state=True)
    st, recs = backend.stream(plan, [1])
    assert st == "ok", recs
    fin = [k for k, r in enumerate(recs) for ch in r["chunk"]["choices"] if ch.get("finish_reason")]
    assert len(fin) == 1
    ids = plan.choices[0]["token_ids"]
    sent = [t for r in recs[: fin[0] + 1] for ch in r["chunk"]["choices"] for t in ch.get("token_ids") or []]
    assert sent == ids[: len(sent)] and len(sent) < len(ids)
    assert plan.tok.decode(sent).endswith("Thursday") and not plan.tok.decode(sent[:-1]).endswith("Thursday")
    assert recs[fin[0]]["chunk"]["choices"][0]["stop_reason"] == "Thursday"
    assert recs[-1]["chunk"]["choices"] == [] and recs[-1]["chunk"]["usage"]["completion_tokens"] == len(ids)
    assert all(not r["chunk"]["choices"] for r in recs[fin[0] + 1:])
    assert backend.max_held <= len("Thursday") - 1


def _case(cid: str) -> dict:
    return next(c for c in CASES if c["id"] == cid)


def _send(case: dict, mutate=None) -> tuple[int, dict, rb.Plan]:
    plan = rb.Plan(case)
    body = plan.nonstream_body(plan.group)
    if mutate is not None:
        mutate(body)
    res = _service(plan).derender(json.dumps(body, ensure_ascii=False).encode())
    return res.status, json.loads(res.body), plan


# ---------------------------------------------------------------- stop strings (bug-046/047) ---
def test_stop_string_cuts_text_but_usage_counts_engine_tokens():
    """The engine behind a derender never sees ``stop``: vLLM applies stop strings in its
    detokenizer, so the derender does. Coupled vLLM would have stopped the engine there; we get
    the extra tokens, cut the text at the first match, report ``stop``/the string, drop the
    logprobs and token ids after the matching token (as vLLM returns them), but usage counts
    every token the engine generated (they were generated and billed)."""
    case = _case("bug-047")

    def mutate(body):
        body["chat_request"]["logprobs"] = True
        body["chat_request"]["top_logprobs"] = 1
        body["chat_request"]["return_token_ids"] = True
        ids = body["generate_response"]["choices"][0]["token_ids"]
        body["generate_response"]["choices"][0]["logprobs"] = rb.synth_logprobs(ids, {"top_k": 1})

    status, resp, plan = _send(case, mutate)
    assert status == 200, resp
    ch = resp["choices"][0]
    assert ch["message"]["content"] == "Monday, Tuesday, Wednesday, "
    assert (ch["finish_reason"], ch["stop_reason"]) == ("stop", "Thursday")
    n_engine = len(plan.choices[0]["token_ids"])
    assert resp["usage"]["completion_tokens"] == n_engine
    kept = ch["token_ids"]
    assert 0 < len(kept) < n_engine and kept == plan.choices[0]["token_ids"][: len(kept)]
    assert len(ch["logprobs"]["content"]) == len(kept)
    # the token that completed the stop string is the last one kept
    assert "".join(e["token"] for e in ch["logprobs"]["content"]).endswith("Thursday")


def test_stop_string_include_in_output_and_completion():
    case = _case("bug-046")
    status, resp, _ = _send(case, lambda b: b["completion_request"].update(include_stop_str_in_output=True))
    assert status == 200, resp
    ch = resp["choices"][0]
    assert ch["text"] == " four five six seven"
    assert (ch["finish_reason"], ch["stop_reason"]) == ("stop", "six seven")


def test_stop_string_absent_or_min_tokens_keeps_engine_finish():
    case = _case("bug-046")
    status, resp, _ = _send(case, lambda b: b["completion_request"].update(stop=["eleven"]))
    ch = resp["choices"][0]
    assert ch["text"] == " four five six seven eight nine"
    assert (ch["finish_reason"], ch["stop_reason"]) == ("length", None)
    # min_tokens: no stop string is checked until more than min_tokens ids were generated
    status, resp, _ = _send(case, lambda b: b["completion_request"].update(stop=["four"], min_tokens=2))
    assert resp["choices"][0]["text"] == " four five six seven eight nine"


# ------------------------------------------------------------------- empty output (bug-040) ---
def test_empty_output_rule():
    """Rule chosen: a *completion* choice with no token ids is valid and derenders to ``text ""``
    (OpenAI semantics: a completion that generated nothing is the empty string, finish_reason
    as the engine gave it, usage 0 completion tokens; never the prompt: the case's notes). A
    *chat* choice with no token ids stays a 400, as vLLM's render server rejects it and the
    parity corpus pins it (``qwen3-err-empty-token-ids-*``, source ``override:invalid-body``)."""
    status, resp, _ = _send(_case("bug-040"))
    assert status == 200, resp
    ch = resp["choices"][0]
    assert ch["text"] == "" and ch["finish_reason"] == "stop"
    assert resp["usage"]["completion_tokens"] == 0

    def empty_chat(body):
        body["generate_response"]["choices"][0]["token_ids"] = []
    status, resp, _ = _send(_case("bug-047"), empty_chat)
    assert status == 400 and "empty" in resp["error"]["message"]


# ---------------------------------------------------------- prompt ends mid-UTF-8 (bug-041) ---
def test_prompt_partial_char_completed_by_output():
    """Dangling prompt bytes are part of the detokenization prefix: never emitted alone (no
    U+FFFD, no prompt text); output bytes that complete the character emit the character."""
    case = dict(_case("bug-041"))
    plan = rb.Plan(case)
    tail = [plan.tok.byte_token(b) for b in bytes.fromhex("98 80".replace(" ", ""))]

    def complete(body):
        ch = body["generate_responses"][0]["choices"][0]
        ch["token_ids"] = tail + ch["token_ids"]
    status, resp, _ = _send(case, complete)
    assert status == 200, resp
    assert resp["choices"][0]["text"] == "\U0001F600 and more"


# ------------------------------------------------- parser fixes stay split-independent ---
PARSER_CASES = [c for c in CASES if c["endpoint"] == "chat" and (c.get("tool_parser") or c.get("reasoning_parser"))
                and not _missing_tokenizers(c)]


@pytest.mark.parametrize("case", PARSER_CASES, ids=[c["id"] for c in PARSER_CASES])
def test_bug_case_split_independent(case):
    """The chat bug cases' outputs fed to the parser stack as token-aligned deltas (1, 3 and
    random token chunks, the state checkpointed through msgspec after each) give the
    non-streaming answer (e.g. bug-005's marker inside a JSON string split across deltas,
    bug-016's held-back ``[``, bug-029's quoted ``<tool_call>``)."""
    import random

    import msgspec

    from schemas import DerenderChatRequest
    from tests.harness.parsers import chunks as _chunks
    from tests.harness.parsers import run_ids as _run
    from worker.core import derender as D

    plan = rb.Plan(case)
    body = msgspec.json.decode(json.dumps(plan.nonstream_body(plan.group)).encode(), type=DerenderChatRequest)
    rt = _service(plan).runtime(plan.group)
    req = body.chat_request
    ctx = D.request_context(req, body.prompt_token_ids)
    skip = D.effective_skip_special_tokens(rt, req.skip_special_tokens, rt.stack.tool_mode(ctx))
    c = body.generate_response.choices[0]
    ids = list(c.token_ids)
    rng = random.Random(case["id"])
    ref, _ = _run(rt, ctx, req, body.prompt_token_ids, skip, ids, [ids], False)
    for how in ("1", "3", "rand", "rand"):
        got, _ = _run(rt, ctx, req, body.prompt_token_ids, skip, ids, _chunks(ids, how, rng), True)
        assert got == ref, how


# ------------------------------------------------------ logprob alternatives (bug-044) ---
def test_logprob_alternatives_decoded_on_their_own():
    """bug-044 under the corpus' chat shape (k entries: sampled first, then the k-1 best
    alternatives): every alternative's string is its own decode after the sampled context
    (run_bugs' ``_alt_text``), byte-fallback pieces included, never merged with a neighbouring
    alternative; the sampled strings join to the content."""
    case = _case("bug-044")
    status, resp, plan = _send(case)
    assert status == 200, resp
    ch = resp["choices"][0]
    entries = ch["logprobs"]["content"]
    ids = plan.choices[0]["token_ids"]
    k = case["request"]["top_logprobs"]
    assert "".join(e["token"] for e in entries) == ch["message"]["content"]
    for p, (e, src) in enumerate(zip(entries, plan.choices[0]["logprobs"]["content"])):
        assert len(e["top_logprobs"]) == k and e["top_logprobs"][0]["token"] == e["token"]
        ctx = plan.prompt_ids[-4:] + ids[:p]
        for got, alt in zip(e["top_logprobs"][1:], src["top_logprobs"][1:]):
            want = rb._alt_text(plan.tok, ctx, alt["token_id"])
            assert got["token"] == (want if want is not None else got["token"]), (p, alt)
            if want is None:  # a partial byte piece: its own decode, never a neighbour's text
                assert got["token"] in ("", plan.tok.decode([alt["token_id"]]).rstrip("\ufffd"))


# ------------------------------- issue 15: variants of the round-3 kinds, end to end ---
_FN = "<function=read_file>\n<parameter=path>\nconfig.yaml\n</parameter>\n</function>"
_DS = "｜DSML｜"
_PAT = f'<{_DS}parameter name="pattern" string="true">'
_MAXR = f'<{_DS}parameter name="max_results" string="false">'
_Q = '<|"|>'


def _variant(cid: str, tag: str, text: str, exp: dict, **case_fields) -> tuple[str, dict]:
    c = json.loads(json.dumps(next(x for x in CASES if x["id"] == cid)))
    c["output_text"] = text
    c["expected_correct"] = {**c["expected_correct"], **exp}
    c.update(case_fields)
    return f"{cid}-{tag}", c


def _round3_variants() -> list[tuple[str, dict]]:
    """Neighbours of bug-202 / 207 / 209 / 210 (the kinds issue 15 recovers) with their right
    answers: the same checks as the cases themselves, real tokenizers, both modes."""
    search = {"name": "search_files", "arguments": {"pattern": "src/**/*.py", "max_results": 20}}
    read = {"name": "read_file", "arguments": {"path": "config.yaml"}}
    proc = {"name": "process", "arguments": {"action": "poll", "sessionId": "calm-ridge", "timeout": 20000}}
    v = [
        _variant("bug-202", "last-param", f"<{_DS}tool_calls>\n<{_DS}invoke name=\"search_files\">\n{_PAT}src/**/*.py"
                 f"</{_DS}parameter>\n{_MAXR}20\n</{_DS}invoke>\n</{_DS}tool_calls>", {"tool_calls": [search]}),
        _variant("bug-202", "both-params", f"<{_DS}tool_calls>\n<{_DS}invoke name=\"search_files\">\n{_PAT}src/**/*.py\n"
                 f"{_MAXR}20\n</{_DS}invoke>\n</{_DS}tool_calls>", {"tool_calls": [search]}),
        _variant("bug-202", "v32", f"<{_DS}function_calls>\n<{_DS}invoke name=\"search_files\">\n{_PAT}src/**/*.py"
                 f"{_MAXR}20</{_DS}parameter>\n</{_DS}invoke>\n</{_DS}function_calls>", {"tool_calls": [search]},
                 tool_parser="deepseek_v32"),
        _variant("bug-207", "then-call", f"<|tool_call>:process{{action:{_Q}poll{_Q},sessionId:{_Q}calm-ridge{_Q},"
                 f"timeout:20000}}<tool_call|><|tool_call>call:process{{action:{_Q}poll{_Q},sessionId:{_Q}calm-ridge{_Q},"
                 "timeout:20000}<tool_call|>", {"tool_calls": [proc, proc]}),
        _variant("bug-207", "nested", f"Checking.<|tool_call>:process{{action:{_Q}poll{_Q},sessionId:{_Q}calm-ridge{_Q},"
                 f"timeout:20000,opts:{{tags:[{_Q}a,b{_Q},true,null],depth:{{n:1.5}}}}}}<tool_call|>",
                 {"content": "Checking.", "tool_calls": [{"name": "process", "arguments": {
                     **proc["arguments"], "opts": {"tags": ["a,b", True, None], "depth": {"n": 1.5}}}}]}),
        _variant("bug-209", "reasoning", f"Read it first.<{_DS}function_calls>\n<{_DS}invoke name=\"read_file\">\n"
                 f'<{_DS}parameter name="path" string="true">README.md</{_DS}parameter>\n</{_DS}invoke>\n'
                 f"</{_DS}function_calls>", {"content": None, "reasoning": "Read it first."},
                 reasoning_parser="deepseek_v4"),
        _variant("bug-210", "prose", "I'll open it.\n" + _FN, {"content": "I'll open it."}),
        _variant("bug-210", "wrapper-end", "<tool_call>\n" + _FN + "\n", {"tool_calls": [read]}),
        _variant("bug-210", "wrapper-start", _FN + "\n</tool_call>", {"tool_calls": [read]}),
        _variant("bug-210", "seed", _FN, {"tool_calls": [read]}, tool_parser="seed_oss"),
        _variant("bug-210", "code-block", "Like this:\n```xml\n" + _FN + "\n```",
                 {"content": "Like this:\n```xml\n" + _FN + "\n```", "tool_calls": [], "finish_reason": "stop",
                  "content_must_not_contain": [], "stream_checks": []}),
    ]
    return v


ROUND3_VARIANTS = _round3_variants()


@pytest.mark.parametrize("vid,case", ROUND3_VARIANTS, ids=[v[0] for v in ROUND3_VARIANTS])
def test_round3_variants_both_modes(vid, case):
    """Each variant non-streaming, then streamed in 1-token, 3-token and random chunks: the
    case's checks (content, reasoning, calls, finish_reason, streamed argument fragments)."""
    import random

    fails, _ = run_case(case)
    assert not fails, "; ".join(fails)
    rng = random.Random(vid)
    for chunks in ([1], [3], [rng.randint(1, 6) for _ in range(6)]):
        c = {**case, "stream_chunks": chunks}
        fails, _ = run_stream_case(c)
        assert not fails, f"{chunks}: " + "; ".join(fails)
