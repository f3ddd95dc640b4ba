"""Responses API derender (issue 14): parity with the Responses reference cases
(tests/data/parity/responses_public.jsonl, compared by its own compare_responses.py) through
``derender-worker batch`` in both modes, the one-parse rule (non-streaming == the stream's
terminal response under any chunking), ids / sequence numbers / event order invariants, the
piece log, and the error cases."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from tests.harness.responses import (  # noqa: E402,F401
    BY_ID,
    CASES,
    CASES_PATH,
    DATA,
    MODELS,
    ROOT,
)
from tests.parity_tools import compare_responses as cmp
from tests.parity_tools import responses_to_requests as r2r
from worker.config import load_config_file
from worker.core.responses import memory_reader
from worker.core.service import DerenderService


@pytest.fixture(scope="module")
def service() -> DerenderService:
    return DerenderService(load_config_file(str(MODELS)))


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=str(ROOT))


def _batch(tmp_path: Path, stream: bool) -> Path:
    req, out = tmp_path / f"req{stream}.jsonl", tmp_path / f"out{stream}.jsonl"
    r = _run([str(ROOT / "tests/parity_tools/responses_to_requests.py"), str(CASES_PATH), str(req)]
             + (["--stream"] if stream else []))
    assert r.returncode == 0, r.stderr
    r = _run(["-m", "worker.cli", "batch", str(req), "-o", str(out), "--config", str(MODELS), "--workers", "1"])
    assert r.returncode == 0, r.stderr
    return out


def _compare(out: Path, stream: bool) -> dict[str, str]:
    """case id -> PASS or the FAIL reason, from compare_responses.py's own output."""
    r = _run([str(ROOT / "tests/parity_tools/compare_responses.py"), str(CASES_PATH), str(out)]
             + (["--stream"] if stream else []))
    res = {}
    for line in r.stdout.splitlines():
        if line.startswith("PASS "):
            res[line[5:]] = "PASS"
        elif line.startswith("FAIL "):
            cid, _, why = line[5:].partition(": ")
            res[cid] = why
    assert len(res) == len(CASES), r.stdout[-2000:]
    return res


@pytest.fixture(scope="module")
def batch_outputs(tmp_path_factory) -> dict[bool, Path]:
    tmp = tmp_path_factory.mktemp("responses_batch")
    return {False: _batch(tmp, False), True: _batch(tmp, True)}


def test_nonstream_parity_through_batch(batch_outputs):
    """compare_responses.py over `derender-worker batch` output: every case."""
    res = _compare(batch_outputs[False], False)
    failed = {k: v for k, v in res.items() if v != "PASS"}
    assert not failed, failed


def test_stream_parity_through_batch(batch_outputs):
    """compare_responses.py --stream over `derender-worker batch` chunk lines: every case event
    by event (27/27, the merged engine outputs fed as the reference's `stream_chunks` lists)."""
    res = _compare(batch_outputs[True], True)
    failed = {k: v for k, v in res.items() if v != "PASS"}
    assert not failed, failed
    assert len(res) == 27


def _joined(events: list[dict]) -> list[dict]:
    """Consecutive deltas of one item joined (text and logprob entries), sequence renumbered."""
    out: list[dict] = []
    for e in events:
        e = dict(e)
        last = out[-1] if out else None
        if last and e["type"].endswith(".delta") and last["type"] == e["type"] \
                and last.get("item_id") == e.get("item_id"):
            last["delta"] += e["delta"]
            if "logprobs" in e:
                last["logprobs"] = last["logprobs"] + e["logprobs"]
            continue
        out.append(e)
    for i, e in enumerate(out):
        e["sequence_number"] = i
    return out


def _stream_lines(out: Path) -> list:
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines() if x.strip()]


def test_stream_events_match_when_deltas_are_joined(batch_outputs):
    """With consecutive deltas joined, every streamed case equals the reference event by event
    (items, ids, order, .done values, logprobs, terminal event)."""
    lines = _stream_lines(batch_outputs[True])
    pos, bad = 0, {}
    for case in CASES:
        n = len(r2r.chunk_sizes(case))
        got = [e for chunk in lines[pos:pos + n] for e in chunk]
        pos += n
        want = _joined([e["data"] for e in case["expected"]["stream"]])
        mine = _joined(cmp.norm_events(got))
        diff = next((d for a, b in zip(want, mine) if (d := cmp.first_diff(a, b))), None)
        if diff or len(want) != len(mine):
            bad[case["id"]] = diff or f"{len(want)} vs {len(mine)} events"
    assert not bad, bad


def _stream(service: DerenderService, bodies: list[dict]) -> list[list[dict]]:
    state, log, out = None, bytearray(), []
    for b in bodies:
        res = service.derender_responses_stream(msgspec.json.encode(b), state, memory_reader(log))
        assert res.status == 200, res.body
        state = res.state
        log += res.log_append
        assert len(log) == res.log_len
        out.append(json.loads(res.body))
    assert res.done
    return out


def _rechunk(bodies: list[dict], rng: random.Random) -> list[dict]:
    """The one-token chunk bodies of a case merged into random-size chunks."""
    out, i = [], 0
    while i < len(bodies):
        n = rng.randint(1, 7)
        group = bodies[i:i + n]
        i += n
        b = json.loads(json.dumps(group[-1]))
        ch = b["generate_chunk"]["choices"][0]
        ch["token_ids"] = [t for g in group for t in g["generate_chunk"]["choices"][0]["token_ids"]]
        lps = [g["generate_chunk"]["choices"][0]["logprobs"] for g in group]
        ch["logprobs"] = {"content": [e for lp in lps if lp for e in lp["content"]]} if any(lps) else None
        out.append(b)
    return out


@pytest.mark.parametrize("cid", [c["id"] for c in CASES])
def test_one_parse_two_views(service, cid):
    """The non-streaming Response is byte-identical to the `response` of the stream's terminal
    event, one token per chunk and under random chunkings; sequence numbers run 0..N-1 across
    chunks; no delta is empty; every call's arguments.done precedes its output_item.done."""
    case = BY_ID[cid]
    ns = service.derender(msgspec.json.encode(r2r.nonstream_body(case)), "responses")
    assert ns.status == 200, ns.body
    rng = random.Random(cid)
    bodies = r2r.stream_bodies(case)
    for chunking in (bodies, _rechunk(bodies, rng), _rechunk(bodies, rng)):
        events = [e for chunk in _stream(service, chunking) for e in chunk]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        assert msgspec.json.encode(events[-1]["response"]) == msgspec.json.encode(json.loads(ns.body))
        assert all(e["delta"] for e in events if e["type"].endswith(".delta"))
        done_args = set()
        for e in events:
            if e["type"] == "response.function_call_arguments.done":
                done_args.add(e["item_id"])
            if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call":
                assert e["item"]["id"] in done_args
        final = events[-1]["response"]
        assert (final["status"] == "incomplete") == (case["finish"]["finish_reason"] == "length")
        if final["status"] == "incomplete":
            assert events[-1]["type"] == "response.incomplete"
            assert final["incomplete_details"] == {"reason": "max_output_tokens"}
            assert final["output"][-1]["status"] == "incomplete"


def test_redelivery_is_byte_identical_and_ids_deterministic(service):
    """The same body twice gives the same bytes; ids follow the request id (another id: other ids)."""
    case = BY_ID["qwen3-coder-reasoning-text-call"]
    body = r2r.nonstream_body(case)
    a = service.derender(msgspec.json.encode(body), "responses").body
    assert a == service.derender(msgspec.json.encode(body), "responses").body
    out = json.loads(a)
    assert [it["id"][:3] for it in out["output"]] == ["rs_", "msg", "fc_"]
    assert out["output"][2]["call_id"].startswith("chatcmpl-tool-")
    body["generate_response"]["request_id"] = "another"
    b = json.loads(service.derender(msgspec.json.encode(body), "responses").body)
    assert b["id"] == "another" and {i["id"] for i in b["output"]}.isdisjoint({i["id"] for i in out["output"]})


def test_created_at_rule(service):
    """created_at: the engine's created, else the caller's (Kafka: record time), else 0."""
    body = r2r.nonstream_body(BY_ID["qwen3-plain"])
    enc = msgspec.json.encode
    assert json.loads(service.derender(enc(body), "responses").body)["created_at"] == 0
    assert json.loads(service.derender(enc(body), "responses", created=1700000000).body)["created_at"] == 1700000000
    body["generate_response"]["created"] = 42
    assert json.loads(service.derender(enc(body), "responses", created=1700000000).body)["created_at"] == 42


def _err(res) -> dict:
    assert res.status == 400, res.body
    return json.loads(res.body)["error"]


def test_error_cases(service):
    """Each bad body is an OpenAI error object (400), never a crash, no response.failed event."""
    enc = msgspec.json.encode
    base = r2r.nonstream_body(BY_ID["qwen3-call-one"])
    b = json.loads(json.dumps(base))
    b["responses_request"]["previous_response_id"] = "resp_1"
    assert _err(service.derender(enc(b), "responses"))["param"] == "responses_request.previous_response_id"
    b = json.loads(json.dumps(base))
    b["generate_response"]["choices"].append(dict(b["generate_response"]["choices"][0], index=1))
    assert "exactly one" in _err(service.derender(enc(b), "responses"))["message"]
    b = json.loads(json.dumps(base))
    del b["responses_request"]
    assert _err(service.derender(enc(b), "responses"))["param"] == "responses_request"
    b = json.loads(json.dumps(base))
    b["generate_response"]["choices"][0]["token_ids"][3] = 10**9
    assert "vocabulary" in _err(service.derender(enc(b), "responses"))["message"]
    # streams: a later chunk whose request differs from the stored one; two choices in a chunk
    bodies = r2r.stream_bodies(BY_ID["qwen3-call-one"])
    first = service.derender_responses_stream(enc(bodies[0]), None)
    assert first.status == 200
    b = json.loads(json.dumps(bodies[1]))
    b["responses_request"]["tool_choice"] = "none"
    bad = service.derender_responses_stream(enc(b), first.state, memory_reader(first.log_append))
    assert _err(bad)["param"] == "responses_request" and bad.state is None
    b = json.loads(json.dumps(bodies[1]))
    del b["responses_request"]  # later chunks may omit it
    assert service.derender_responses_stream(enc(b), first.state, memory_reader(first.log_append)).status == 200
    b["generate_chunk"]["choices"].append(dict(b["generate_chunk"]["choices"][0], index=1))
    assert "exactly one" in _err(service.derender_responses_stream(enc(b), first.state,
                                                                   memory_reader(first.log_append)))["message"]
    b = json.loads(json.dumps(bodies[0]))
    del b["responses_request"]
    assert _err(service.derender_responses_stream(enc(b), None))["param"] == "responses_request"


def test_piece_log_keeps_state_small(service):
    """What grows with the output lives in the piece log: over a long stream the per-chunk state
    stays the same size while the log grows; a log appended twice for one chunk (a crash
    between append and checkpoint) reads the same once truncated to the recorded length."""
    case = BY_ID["qwen3-reasoning-answer"]
    body = r2r.stream_bodies(case)[0]
    text_ids = [t for b in r2r.stream_bodies(case)[:-1] for t in b["generate_chunk"]["choices"][0]["token_ids"]]
    enc = msgspec.json.encode
    state, log, sizes = None, bytearray(), []
    for k in range(2048):
        b = json.loads(json.dumps(body))
        b["generate_chunk"]["choices"][0]["token_ids"] = [text_ids[k % len(text_ids)]]
        res = service.derender_responses_stream(enc(b), state, memory_reader(log))
        assert res.status == 200, res.body
        if k == 1000:  # the append of this chunk lands twice: the recorded length wins
            log += res.log_append
        log += res.log_append
        del log[res.log_len:]
        state = res.state
        sizes.append(len(state))
    assert max(sizes[100:]) - min(sizes[100:]) < 64, (min(sizes[100:]), max(sizes[100:]))
    assert len(log) > 8 * max(sizes)  # ~6.6 bytes per 1-token chunk here, vs a flat ~0.8 kB state
    last = json.loads(json.dumps(r2r.stream_bodies(case)[-1]))
    res = service.derender_responses_stream(enc(last), state, memory_reader(log))
    assert res.status == 200 and res.done
    final = json.loads(res.body)[-1]["response"]
    assert final["usage"]["output_tokens"] == 2049


def test_openai_batch_url_and_parquet(tmp_path):
    """OpenAI Batch lines with url /v1/responses are Responses bodies even without
    responses_request (a no-parser model: chat's shape otherwise); Parquet rows with a
    responses_request column are too."""
    case = BY_ID["qwen3-noparser-plain"]
    body = r2r.nonstream_body(case)
    del body["responses_request"]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": body}) + "\n"
                   + json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": body})
                   + "\n")
    out = tmp_path / "out.jsonl"
    r = _run(["-m", "worker.cli", "batch", str(src), "-o", str(out), "--config", str(MODELS), "--workers", "2"])
    assert r.returncode == 0, r.stderr
    a, b = (json.loads(x) for x in out.read_text().splitlines())
    assert a["response"]["body"]["object"] == "response"
    got = cmp.norm_response(a["response"]["body"])
    for k in ("output", "usage", "status"):  # no request: its echo fields are null
        assert cmp.first_diff(case["expected"]["nonstream"][k], got[k]) is None, k
    assert b["response"]["body"]["object"] == "chat.completion"
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rows = [{"model": x["model"], "generate_response": json.dumps(x["generate_response"]),
             "prompt_tokens": json.dumps(x["prompt_tokens"]), "prompt_token_ids": json.dumps(x["prompt_token_ids"]),
             "responses_request": json.dumps(x["responses_request"])}
            for x in (r2r.nonstream_body(BY_ID[c]) for c in ("qwen3-noparser-plain", "qwen3-noparser-logprobs"))]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    r = _run(["-m", "worker.cli", "batch", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out.parquet"),
              "--config", str(MODELS), "--workers", "1"])
    assert r.returncode == 0, r.stderr
    got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [g["status_code"] for g in got] == [200, 200]
    for g, cid in zip(got, ("qwen3-noparser-plain", "qwen3-noparser-logprobs")):
        resp = json.loads(g["response"])
        assert cmp.first_diff(BY_ID[cid]["expected"]["nonstream"], cmp.norm_response(resp)) is None, g
        # flat columns: the message text, the status, usage from input/output tokens
        want = BY_ID[cid]["expected"]["nonstream"]
        assert g["content"] == want["output"][0]["content"][0]["text"] and g["finish_reason"] == "completed"
        assert (g["prompt_tokens"], g["completion_tokens"]) == (want["usage"]["input_tokens"],
                                                                want["usage"]["output_tokens"])


def test_readme_responses_record_and_reply():
    """The Responses record of docs/responses.md gives exactly its literal reply (demo model config)."""
    import re
    doc = (ROOT / "docs" / "responses.md").read_text(encoding="utf-8")
    sec = doc[doc.index("# Responses API"):]
    rec, rep = re.findall(r"```\n(.*?)```", sec, re.S)[:2]
    value = rec.split("value   ", 1)[1].strip()
    reply = rep.split("value   ", 1)[1].strip()
    svc = DerenderService(load_config_file(str(ROOT / "worker" / "demo_data" / "models.json")))
    res = svc.derender(value.encode(), created=json.loads(reply)["created_at"])
    assert res.status == 200 and res.kind == "responses"
    assert res.body.decode() == reply


_HOSTILE = [None, 0, -1, 2**63, 2**64, 1.5, "x", "", [], [1], {}, {"a": 1}, True, [[]], {"type": "function"},
            {"type": "function", "name": 5}, {"type": "function", "name": "get_weather"}, [{"type": "function"}],
            ["x"], "required", "none", [{"type": "function", "name": "x", "parameters": "bad"}]]


def _paths(o, p=()):
    yield p
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, (*p, k))
    elif isinstance(o, list):
        for i, v in enumerate(o[:3]):
            yield from _paths(v, (*p, i))


def test_hostile_bodies_never_crash(service):
    """Random fields of Responses bodies (non-streaming, first and later stream chunks) replaced
    by hostile values (wrong types, 2**64, nameless tools, ...): every answer is a Response, a
    list of events or a 400/404 error object, never a 500 (derandomized)."""
    rng = random.Random(14)
    enc = msgspec.json.encode
    for _ in range(600):
        case = rng.choice(CASES)
        sb = json.loads(json.dumps(r2r.stream_bodies(case)))  # copies: the bodies share the case's lists
        mode = rng.choice(("nonstream", "first", "later"))
        body = json.loads(json.dumps(r2r.nonstream_body(case))) if mode == "nonstream" else (
            sb[1] if mode == "later" and len(sb) > 1 else sb[0])
        paths = [p for p in _paths(body) if p]
        for _ in range(rng.randint(1, 3)):
            p = rng.choice(paths)
            target = body
            try:
                for k in p[:-1]:
                    target = target[k]
                target[p[-1]] = json.loads(json.dumps(rng.choice(_HOSTILE)))
            except (KeyError, IndexError, TypeError):
                continue
        raw = enc(body)
        if mode == "nonstream":
            statuses = [service.derender(raw, "responses").status, service.derender(raw).status]
        else:
            first = service.derender_responses_stream(enc(sb[0]), None) if mode == "later" else None
            statuses = [service.derender_responses_stream(raw, first.state if first else None,
                                                          memory_reader(first.log_append if first else b"")).status,
                        service.derender_stream(raw, None)[0].status]
        assert all(s in (200, 400, 404) for s in statuses), (statuses, body)


def test_pieces_only_when_needed(service):
    """Without a reader, a chunk that needs the stored log says which bytes (``needs_pieces``:
    only when an item closes or the stream ends) and derenders nothing; called again with those
    bytes it answers as with a full reader. A reader that lost bytes gives a 409."""
    case = BY_ID["qwen3-coder-reasoning-text-call"]
    enc = msgspec.json.encode
    state, log, asked, events = None, bytearray(), 0, []
    for b in r2r.stream_bodies(case):
        res = service.derender_responses_stream(enc(b), state, None)
        if res.needs_pieces is not None:
            asked += 1
            start, end = res.needs_pieces
            assert res.state is None and not res.body and 0 <= start < end == len(log)
            part = bytes(log[start:end])
            res = service.derender_responses_stream(enc(b), state, lambda s, e, p=part, o=start: p[s - o:e - o])
        assert res.status == 200, res.body
        state, log = res.state, log + res.log_append
        events.extend(json.loads(res.body))
    assert asked == 3  # the reasoning item closes, the message closes, the end (whole log)
    ns = json.loads(service.derender(enc(r2r.nonstream_body(case)), "responses").body)
    assert events[-1]["response"] == ns
    bodies = r2r.stream_bodies(case)
    res = service.derender_responses_stream(enc(bodies[0]), None)
    for b in bodies[1:]:
        res = service.derender_responses_stream(enc(b), res.state, memory_reader(b""))  # the log is gone
        if res.status != 200:
            break
    assert res.status == 409 and "lost" in json.loads(res.body)["error"]["message"]


def test_one_parse_with_whole_tool_call_streaming():
    """``--tool-call-streaming whole`` (calls in one delta when they close; a cut call stays
    text): the non-streaming Response still equals the stream's terminal response, every case."""
    cfgs = load_config_file(str(MODELS))
    for c in cfgs:
        c.tool_call_streaming = "whole"
    svc = DerenderService(cfgs)
    for case in CASES:
        ns = svc.derender(msgspec.json.encode(r2r.nonstream_body(case)), "responses")
        events = [e for chunk in _stream(svc, r2r.stream_bodies(case)) for e in chunk]
        assert msgspec.json.encode(events[-1]["response"]) == ns.body, case["id"]
        calls = [it for it in events[-1]["response"]["output"] if it["type"] == "function_call"]
        deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
        assert len(deltas) <= len(calls)  # whole: at most one argument delta per call


def _shape(pieces: list[str]) -> tuple[list[str], str]:
    """argshape over a call's raw argument pieces (one per engine output): the deltas sent and
    the rest sent at the close."""
    from worker.core.responses import argshape
    raw, sent, out = "", 0, []
    for p in pieces:
        prev, raw = raw, raw + p
        d = argshape.step(prev, raw, sent)
        sent += len(d)
        out.append(d)
    return out, argshape.final_rest(raw, "".join(out))


def test_llama3_argument_rule():
    """vLLM's llama3_json streaming rule (argshape.py), on the llama3 cases' token pieces: a
    string value lags one output, the rest goes out when the JSON completes, ``{}`` is never
    streamed (sent at the close), a cut call ends auto-closed, unparseable text goes out raw
    at the close, several pieces in one output are one step."""
    assert _shape(['{"', 'city', '":', ' "', 'L', 'yon', '"}']) == (
        ["", "", "", "", '{"city": "', "L", 'yon"}'], "")
    assert _shape(["{", "}"]) == (["", ""], "{}")
    assert _shape(['{"', 'city', '":', ' "', 'Pa']) == (["", "", "", "", '{"city": "'], 'Pa"}')
    assert _shape(['{"city": "Pa']) == ([""], '{"city": "Pa"}')  # one output: nothing, all at close
    assert _shape(['{"q": "', 'J', 'W', 'ST', '",', ' "', 'limit', '":', ' ', '3', '}']) == (
        ["", '{"q": "', "J", "W", "", "", "", "", "", 'ST"', ', "limit": 3}'], "")  # a key shows with its value
    assert _shape(['{"city":"Par', 'ís"}']) == (["", '{"city": "París"}'], "")  # json.dumps spacing, no \\u escapes
    assert _shape(["{bad", " json"]) == (["", ""], "{bad json")


def test_llama3_argument_rule_is_bounded():
    """Past argshape.SHAPE_LIMIT raw characters nothing more is sent per step (per-step cost
    stays bounded); the close sends the rest, so deltas + rest == json.dumps(arguments)."""
    from worker.core.responses import argshape
    val = {"content": "line of code\n" * 400, "path": "a.py"}
    raw_full = json.dumps(val)
    assert len(raw_full) > argshape.SHAPE_LIMIT
    out, rest = _shape([raw_full[i:i + 3] for i in range(0, len(raw_full), 3)])
    sent = "".join(out)
    assert sent and len(sent) <= argshape.SHAPE_LIMIT and rest
    assert sent + rest == json.dumps(val, ensure_ascii=False)
    assert _shape(["[" * 5000]) == ([""], "[" * 5000)  # unparseable: out raw at the close, no raise


def test_held_call_logprobs_spill_to_the_log():
    """With ``--tool-call-streaming whole`` a call's body is held by the parser; the logprob
    entries of its tokens wait for text and, past ``PENDING_MAX``, go to the piece log instead of
    the per-chunk state: the state stays bounded over a long call (top_logprobs 20). A block
    that turns out malformed (content) gets its tokens' entries back from the log, also through
    the no-reader path: the terminal response equals the non-streaming one, one entry per token."""
    from worker.bench.stream import stream_bodies
    from worker.core.responses.events import PENDING_MAX
    cfgs = load_config_file(str(MODELS))
    for c in cfgs:
        c.tool_call_streaming = "whole"
    svc = DerenderService(cfgs)
    tok = svc.runtime("qwen3").tokenizer
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    eos = tok.token_to_id("<|im_end|>")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "notes": "' + "dry and sunny " * 60 + '"}}\n</tool_call>'
    bad = "<tool_call>\nnot a call at all, " + "just words " * 60 + "\n</tool_call> done"
    enc = msgspec.json.encode
    for text, want_types in ((call, ["function_call"]), (bad, ["message"])):
        ids = tok.encode("<think>\nok\n</think>\n\n" + text) + [eos]
        bodies = [json.loads(b) for b in stream_bodies(prompt, ids, "responses", 20)]
        for reader in ("memory", None):
            state, log, sizes, events = None, bytearray(), [], []
            for b in bodies:
                res = svc.derender_responses_stream(enc(b), state, memory_reader(log) if reader else None)
                if res.needs_pieces is not None:
                    res = svc.derender_responses_stream(enc(b), state, memory_reader(log))
                assert res.status == 200, res.body
                state, log = res.state, log + res.log_append
                sizes.append(len(state))
                events.extend(json.loads(res.body))
            final = events[-1]["response"]
            assert [it["type"] for it in final["output"]][1:] == want_types
            assert max(sizes) < (PENDING_MAX + 6) * 1100, max(sizes)  # ~1 kB per entry with 20 candidates
            whole = dict(bodies[-1])
            whole.pop("stream")
            whole["responses_request"] = bodies[0]["responses_request"]
            whole["prompt_token_ids"] = prompt
            whole["generate_response"] = dict(bodies[-1]["generate_chunk"], choices=[dict(
                bodies[-1]["generate_chunk"]["choices"][0], token_ids=ids,
                logprobs={"content": [e for b in bodies for e in b["generate_chunk"]["choices"][0]["logprobs"]["content"]]})])
            del whole["generate_chunk"]
            ns = svc.derender(enc(whole), "responses")
            assert ns.status == 200, ns.body
            assert msgspec.json.encode(final) == ns.body
            if want_types == ["message"]:  # R8: one entry per message token, EOS included (and the
                # text-less </think>, whose entry rides on the next delta: the message's first)
                n_msg = len(ids) - ids.index(tok.token_to_id("</think>"))
                assert len(final["output"][-1]["content"][0]["logprobs"]) == n_msg


def test_tool_choice_none_markup_is_held_with_its_logprobs(service):
    """vLLM 0.32's parser engine with ``tool_choice: none`` (mistral, qwen3_coder) drops call
    markup from the stream; the reference's R6 delivers it as one delta at the message's close.
    With logprobs that delta carries the held tokens' entries; the stop token's entry is only in
    the final part (R8), which lists one entry per generated token; non-streaming == terminal."""
    case = json.loads(json.dumps(BY_ID["mistral-7b-v0.3-tool-choice-none-markup"]))
    case["engine_logprobs"] = [{"token_id": t, "top": [[t, -0.5], [1000, -3.0]]} for t in case["output_token_ids"]]
    case["request"]["include"] = ["message.output_text.logprobs"]
    case["request"]["top_logprobs"] = 1
    ns = service.derender(msgspec.json.encode(r2r.nonstream_body(case)), "responses")
    assert ns.status == 200, ns.body
    events = [e for chunk in _stream(service, r2r.stream_bodies(case)) for e in chunk]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    final = events[-1]["response"]
    assert msgspec.json.encode(final) == ns.body
    part = final["output"][0]["content"][0]
    assert len(deltas) == 1 and deltas[0]["delta"] == part["text"] and part["text"].startswith(" [{")
    assert len(part["logprobs"]) == len(case["output_token_ids"])
    assert len(deltas[0]["logprobs"]) == len(case["output_token_ids"]) - 1  # all but the stop token
    # without tool_choice none the same ids stream as a call (the hold is the none mode's only)
    case2 = json.loads(json.dumps(case))
    case2["request"]["tool_choice"] = "auto"
    events = [e for chunk in _stream(service, r2r.stream_bodies(case2)) for e in chunk]
    assert events[-1]["response"]["output"][0]["type"] == "function_call"


def test_engine_cut_call_keeps_what_was_streamed(service):
    """qwen3_coder (vLLM 0.32's parser engine): a call the output ends in keeps its arguments
    exactly as streamed in a Responses stream and Response (``{"city": "Paris`` when the cut
    falls after ``</parameter>``: the held quote never goes out), under any chunking; the chat
    stream closes the object (``worker.parsers.incremental``; test_tool_streaming)."""
    tok = service.runtime("qwen3-coder").tokenizer
    head = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    for text, want in ((head, '{"city": "Paris'), (head + "<parameter=unit>\n", '{"city": "Paris", "unit": "')):
        case = json.loads(json.dumps(BY_ID["qwen3-coder-call-incomplete"]))
        case["output_token_ids"] = tok.encode(text)
        ns = json.loads(service.derender(msgspec.json.encode(r2r.nonstream_body(case)), "responses").body)
        assert ns["status"] == "incomplete" and ns["output"][-1]["arguments"] == want
        bodies = r2r.stream_bodies(case)
        for chunking in (bodies, _rechunk(bodies, random.Random(7))):
            events = [e for chunk in _stream(service, chunking) for e in chunk]
            args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
            assert args == want and events[-1]["response"] == ns


def test_merged_step_keeps_the_call_whole(service):
    """A chunk carrying a call's last argument characters and the text after it (merged engine
    steps; qwen3_coder): the call's item gets all its arguments and the text its own message
    item after it, never a nameless function_call holding the call's end."""
    from tests.harness.messages import BY_ID
    from tests.parity_tools import messages_to_requests as m2r
    case = BY_ID["qwen3-coder-tool-use-then-text"]
    ids = m2r.output_ids(case)
    tools = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in case["request"]["tools"]]
    state, pos, items = None, 0, []
    sizes = [2, 1, 4, 5, 3, len(ids) - 15]
    for k, n in enumerate(sizes):
        body = {"stream": True, "model": "qwen3-coder", "prompt_tokens": len(case["prompt_token_ids"]),
                "prompt_token_ids": case["prompt_token_ids"],
                "generate_chunk": {"request_id": "merged", "choices": [{
                    "index": 0, "token_ids": ids[pos:pos + n], "finish_reason": "stop" if k == len(sizes) - 1 else None}]}}
        if k == 0:
            body["responses_request"] = {"model": "qwen3-coder", "input": "hi", "tools": tools}
        pos += n
        res, state = service.derender_stream(msgspec.json.encode(body), state)
        assert res.status == 200, res.body
        items += [e["item"] for e in json.loads(res.body) if e["type"] == "response.output_item.done"]
    assert [(i["type"], i.get("name")) for i in items] == [("function_call", "get_stock_price"), ("message", None)]
    assert json.loads(items[0]["arguments"]) == {"ticker": "AAPL"}
