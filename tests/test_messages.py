"""Anthropic Messages API derender (issue 26): parity with the Messages reference cases
(tests/data/parity/messages_public.jsonl, compared by its own compare_messages.py) through
``derender-worker batch`` in both modes, one parse two views (the non-streaming Message equals
the accumulation of the stream under any chunking, ours and anthropic-sdk-python's), every
Message / event / error validated with anthropic-sdk-python's types, deterministic ids, and the
error cases."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from schemas.messages import MessageStreamEvent
from tests.harness.messages import CASES, CASES_PATH, MODELS, ROOT
from tests.parity_tools import messages_to_requests as m2r
from worker.config import load_config_file
from worker.core.messages.events import accumulate, partial_input
from worker.core.responses import memory_reader
from worker.core.service import DerenderService

anthropic_types = pytest.importorskip("anthropic.types")
from anthropic.lib.streaming._messages import accumulate_event  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

_EVENT = TypeAdapter(anthropic_types.RawMessageStreamEvent)
OK_CASES = [c for c in CASES if not m2r.is_error_case(c)]


@pytest.fixture(scope="module")
def service() -> DerenderService:
    return DerenderService(load_config_file(str(MODELS)))


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=str(ROOT))


def _batch(tmp_path: Path, stream: bool, openai_batch: bool = False) -> Path:
    req, out = tmp_path / f"req{stream}{openai_batch}.jsonl", tmp_path / f"out{stream}{openai_batch}.jsonl"
    r = _run([str(ROOT / "tests/parity_tools/messages_to_requests.py"), str(CASES_PATH), str(req)]
             + (["--stream"] if stream else []))
    assert r.returncode == 0, r.stderr
    args = ["-m", "worker.cli", "batch", str(req), "-o", str(out), "--config", str(MODELS), "--workers", "1"]
    if openai_batch:  # OpenAI Batch-style lines whose url is /v1/messages (the body alone: no shape hint needed)
        lines = req.read_text(encoding="utf-8").splitlines()
        req.write_text("".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/messages",
                                           "body": json.loads(x)}) + "\n" for i, x in enumerate(lines)),
                       encoding="utf-8")
        args += ["--input-format", "openai-batch", "--output-format", "jsonl"]
    r = _run(args)
    assert r.returncode == 0, r.stderr
    return out


def _compare(out: Path, stream: bool) -> dict[str, str]:
    """case id -> PASS or the FAIL reason, from compare_messages.py's own output."""
    r = _run([str(ROOT / "tests/parity_tools/compare_messages.py"), str(CASES_PATH), str(out)]
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
    tmp = tmp_path_factory.mktemp("messages_batch")
    return {False: _batch(tmp, False), True: _batch(tmp, True)}


def test_nonstream_parity_through_batch(batch_outputs):
    """compare_messages.py over `derender-worker batch` output: 42/42."""
    res = _compare(batch_outputs[False], False)
    failed = {k: v for k, v in res.items() if v != "PASS"}
    assert not failed, failed
    assert len(res) == 42


def test_stream_parity_through_batch(batch_outputs):
    """compare_messages.py --stream over `derender-worker batch` chunk lines: 42/42, event by
    event (the hermes whitespace after ``</think>`` included: ``ToolParser.streams_leading_ws``)."""
    res = _compare(batch_outputs[True], True)
    failed = {k: v for k, v in res.items() if v != "PASS"}
    assert not failed, failed
    assert len(res) == 42


def test_openai_batch_lines_with_messages_url(tmp_path):
    """OpenAI Batch-style lines whose url is /v1/messages: the same Messages, 42/42."""
    res = _compare(_batch(tmp_path, False, openai_batch=True), False)
    assert all(v == "PASS" for v in res.values()), res


# ------------------------------------------------------------------------ one parse, two views ---
def _chunked(case: dict, sizes: list[int]) -> list[dict]:
    """The case's stream bodies re-cut into chunks of ``sizes`` tokens."""
    bodies = m2r.stream_bodies(case)
    ids = [t for b in bodies for t in b["generate_chunk"]["choices"][0]["token_ids"]]
    last = bodies[-1]["generate_chunk"]["choices"][0]
    out, pos = [], 0
    for k, n in enumerate(sizes):
        b = json.loads(json.dumps(bodies[0] if k == 0 else bodies[-1]))
        if k:
            b.pop("messages_request")  # later chunks may omit it
        ch = b["generate_chunk"]["choices"][0]
        ch["token_ids"] = ids[pos:pos + n]
        fin = k == len(sizes) - 1
        ch["finish_reason"], ch["stop_reason"] = (last["finish_reason"], last["stop_reason"]) if fin else (None, None)
        pos += n
        out.append(b)
    return out


def _stream(service: DerenderService, bodies: list[dict]) -> list[dict]:
    state, log, out = None, bytearray(), []
    res = None
    for b in bodies:
        res = service.derender_messages_stream(msgspec.json.encode(b), state, memory_reader(log))
        assert res.status == 200, res.body
        state = res.state
        log += res.log_append
        assert len(log) == res.log_len
        out.extend(json.loads(res.body))
    assert res is not None and res.done
    return out


def _nonstream(service: DerenderService, case: dict) -> dict:
    res = service.derender(msgspec.json.encode(m2r.nonstream_body(case)))
    assert res.status == 200, res.body
    assert res.kind == "messages"
    return json.loads(res.body)


def _sizes(n: int, rng: random.Random) -> list[int]:
    out = []
    while n > 0:
        k = min(n, rng.randint(1, 6))
        out.append(k)
        n -= k
    return out or [0]


@pytest.mark.parametrize("case", OK_CASES, ids=[c["id"] for c in OK_CASES])
def test_one_parse_two_views(service, case):
    """The non-streaming Message equals our accumulation and anthropic-sdk-python's accumulation
    of the stream (stop_details aside: the SDK adds it), for the reference's chunking, 1-token
    chunks and random chunkings; every Message and event validates with the SDK's types; no
    empty delta, no ping; a redelivered body is byte-identical."""
    msg = _nonstream(service, case)
    anthropic_types.Message.model_validate(msg)
    n = len(m2r.output_ids(case))
    rng = random.Random(case["id"])
    for sizes in (m2r.chunk_sizes(case), [1] * n or [0], _sizes(n, rng), _sizes(n, rng)):
        events = _stream(service, _chunked(case, sizes))
        snap, bufs = None, {}
        for e in events:
            assert e["type"] != "ping"
            d = e.get("delta") or {}
            assert all(v != "" for k, v in d.items() if k in ("text", "thinking", "partial_json", "signature"))
            snap = accumulate_event(event=_EVENT.validate_python(e), current_snapshot=snap, json_bufs=bufs)
        sdk = snap.to_dict(exclude_none=False)
        sdk.pop("stop_details", None)
        for k in [k for k in sdk if k not in msg]:  # SDK-only optional fields, None when absent
            assert sdk.pop(k) is None, k
        for block in sdk["content"]:
            for k in [k for k in block if block[k] is None]:
                block.pop(k)
        sdk["usage"] = {k: v for k, v in sdk["usage"].items() if v is not None}
        ours = msgspec.to_builtins(accumulate([_decode_event(e) for e in events]))
        assert ours == sdk, (case["id"], sizes)
        if case["id"] == "llama3-tool-use-max-tokens" and sizes != [1] * n:
            # vLLM's llama3_json autocompletion is per engine step (rules.py): a call cut inside a
            # string value keeps the value only if the last step sent an argument delta; the
            # non-streaming Message is the 1-token stream's
            continue
        assert sdk == msg, (case["id"], sizes)
    assert _nonstream(service, case) == msg


def _decode_event(e: dict):
    return msgspec.convert(e, MessageStreamEvent)


def test_ids_deterministic_and_well_formed(service):
    """msg_ / toolu_ ids and signatures come from the request id (Mistral: 9 alphanumerics), never
    empty, distinct per block; another request id gives other ids."""
    case = next(c for c in OK_CASES if c["id"] == "qwen3-thinking-tool-use")
    msg = _nonstream(service, case)
    assert msg["id"].startswith("msg_") and len(msg["id"]) == 28
    think = [b for b in msg["content"] if b["type"] == "thinking"]
    calls = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert think and all(len(b["signature"]) == 32 for b in think)
    assert calls and all(b["id"].startswith("toolu_") for b in calls)
    body = m2r.nonstream_body(case)
    body["generate_response"]["request_id"] = "other"
    other = json.loads(service.derender(msgspec.json.encode(body)).body)
    assert other["id"] != msg["id"] and other["content"][-1]["id"] != calls[-1]["id"]
    mistral = _nonstream(service, next(c for c in OK_CASES if c["id"] == "mistral-7b-v0.3-tool-use-one"))
    tid = [b for b in mistral["content"] if b["type"] == "tool_use"][0]["id"]
    assert len(tid) == 9 and tid.isalnum()


def test_partial_input_matches_the_sdk():
    """The SDK's partial JSON parse (jiter partial mode) on cut tool inputs."""
    jiter = pytest.importorskip("jiter")
    for s in ['{"', '{"city', '{"city":', '{"city": "Pa', '{"city": "Paris"', '{"limit": 3', '{"limit": 3.',
              '{"a": [1, "x', '{"a": {"b": "c"}, "d": tr', '{}', '{"a": -', '{"a": 1e', '{"a": [1, 2',
              '{"a": nu', '{"a": "x", "b": [{"c": "d', '{"d": true']:
        assert partial_input(s) == jiter.from_json(s.encode(), partial_mode=True), s


# ------------------------------------------------------------------------------- bad input ---
def _err(body: bytes, status: int) -> dict:
    obj = json.loads(body)
    anthropic_types.ErrorResponse.model_validate(obj)
    assert obj["type"] == "error" and obj["error"]["type"] == {400: "invalid_request_error", 404: "not_found_error",
                                                               409: "invalid_request_error"}[status]
    return obj


def test_error_cases(service):
    """Bad input: Anthropic error objects with the status, never a partial Message."""
    case = next(c for c in OK_CASES if c["id"] == "qwen3-plain")
    body = m2r.nonstream_body(case)
    no_req = dict(body)
    no_req.pop("messages_request")
    res = service.derender(msgspec.json.encode(no_req), kind="messages")
    assert res.status == 400 and "messages_request is required" in _err(res.body, 400)["error"]["message"]
    two = json.loads(json.dumps(body))
    two["generate_response"]["choices"].append(dict(two["generate_response"]["choices"][0], index=1))
    res = service.derender(msgspec.json.encode(two))
    assert res.status == 400 and "exactly one" in _err(res.body, 400)["error"]["message"]
    oov = json.loads(json.dumps(body))
    oov["generate_response"]["choices"][0]["token_ids"][0] = 10**9
    res = service.derender(msgspec.json.encode(oov))
    assert res.status == 400
    _err(res.body, 400)
    unknown = dict(body, model="nope")
    res = service.derender(msgspec.json.encode(unknown))
    assert res.status == 404
    _err(res.body, 404)
    bad_choice = json.loads(json.dumps(body))
    bad_choice["messages_request"]["tool_choice"] = {"type": "sometimes"}
    res = service.derender(msgspec.json.encode(bad_choice))
    assert res.status == 400
    _err(res.body, 400)


def test_stream_errors(service):
    """A chunk whose request differs from the stored one, a chunk after the end, a corrupted or
    foreign state: 400 error objects, the stored state unchanged."""
    case = next(c for c in OK_CASES if c["id"] == "qwen3-tool-use-one")
    bodies = m2r.stream_bodies(case)
    res = service.derender_messages_stream(msgspec.json.encode(bodies[0]), None, memory_reader(b""))
    assert res.status == 200
    state, log = res.state, bytes(res.log_append)
    changed = json.loads(json.dumps(bodies[1]))
    changed["messages_request"]["max_tokens"] = 7
    bad = service.derender_messages_stream(msgspec.json.encode(changed), state, memory_reader(log))
    assert bad.status == 400 and bad.state is None
    assert "differs" in _err(bad.body, 400)["error"]["message"]
    bad = service.derender_messages_stream(msgspec.json.encode(bodies[1]), b"\x93garbage", memory_reader(log))
    assert bad.status == 400
    _err(bad.body, 400)
    events = _stream(service, bodies)
    assert events[-1]["type"] == "message_stop"
    first = service.derender_messages_stream(msgspec.json.encode(bodies[0]), None, memory_reader(b""))
    st, lg = first.state, bytearray(first.log_append)
    for b in bodies[1:]:
        r = service.derender_messages_stream(msgspec.json.encode(b), st, memory_reader(lg))
        st, lg = r.state, lg + r.log_append
    after = service.derender_messages_stream(msgspec.json.encode(bodies[-1]), st, memory_reader(lg))
    assert after.status == 400 and "already ended" in _err(after.body, 400)["error"]["message"]


def test_refused_requests_need_no_output(service):
    """The reference's refused requests come from messages_request and the served config alone."""
    for case in (c for c in CASES if m2r.is_error_case(c)):
        res = service.derender(msgspec.json.encode(m2r.nonstream_body(case)))
        want = case["expected"]["error"]["nonstream"]
        assert res.status == want["status"] and json.loads(res.body) == want["body"], case["id"]


def test_parquet_rows_with_messages_request(tmp_path):
    """Parquet rows with a messages_request column (JSON strings): the same Messages, 42/42."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    bodies = [m2r.nonstream_body(c) for c in CASES]
    cols = {k: [b.get(k) if k == "model" else json.dumps(b.get(k)) for b in bodies]
            for k in ("model", "generate_response", "prompt_tokens", "prompt_token_ids", "messages_request")}
    src, out = tmp_path / "in.parquet", tmp_path / "out.jsonl"
    pq.write_table(pa.table(cols), src)
    r = _run(["-m", "worker.cli", "batch", str(src), "-o", str(out), "--config", str(MODELS), "--workers", "1",
              "--output-format", "jsonl"])
    assert r.returncode == 0, r.stderr
    res = _compare(out, False)
    assert all(v == "PASS" for v in res.values()), res


def test_hostile_request_fields_never_crash(service):
    """Odd values in every request field a derender reads (wrong types, huge numbers, history tool
    ids that are not strings): a Message or an Anthropic 4xx error, never a 500."""
    weird = [None, 1, -1, 2**70, "x", [], {}, [1], {"type": 5}, {"type": "tool"}, {"type": "tool", "name": 3},
             [{"a": 1}], True, 1.5]
    fields = ["tools", "tool_choice", "thinking", "stop_sequences", "max_tokens", "messages", "system", "top_k",
              "metadata", "stream"]
    rng = random.Random(26)
    statuses = set()
    for _ in range(150):
        case = rng.choice(CASES)
        stream = rng.random() < 0.5
        bodies = m2r.stream_bodies(case) if stream else [m2r.nonstream_body(case)]
        req = bodies[0]["messages_request"]
        req[rng.choice(fields)] = rng.choice(weird)
        if rng.random() < 0.3:
            req["messages"] = [{"role": "assistant", "content": [{"type": "tool_use", "id": rng.choice(weird)}]}]
        if not stream:
            res = service.derender(msgspec.json.encode(bodies[0]))
            statuses.add(res.status)
            assert res.status in (200, 400), res.body
            if res.status != 200:
                _err(res.body, 400)
            continue
        state, log = None, bytearray()
        for b in bodies:
            res = service.derender_messages_stream(msgspec.json.encode(b), state, memory_reader(log))
            statuses.add(res.status)
            assert res.status in (200, 400), res.body
            if res.status != 200:
                _err(res.body, 400)
                break
            state, log = res.state, log + res.log_append
    assert statuses == {200, 400}


def test_disable_parallel_tool_use_keeps_the_first_call(service):
    """``tool_choice.disable_parallel_tool_use`` -> vLLM's ``parallel_tool_calls: false``: only the
    first call of a parallel output becomes a tool_use block, in both views."""
    case = next(c for c in OK_CASES if c["id"] == "qwen3-tool-use-parallel")
    assert [b["type"] for b in _nonstream(service, case)["content"]].count("tool_use") == 2
    one = json.loads(json.dumps(case))
    one["request"]["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    msg = _nonstream(service, one)
    assert [b["type"] for b in msg["content"]] == ["tool_use"] and msg["stop_reason"] == "tool_use"
    assert msgspec.to_builtins(accumulate([_decode_event(e) for e in _stream(service, m2r.stream_bodies(one))])) \
        == msg


@pytest.mark.parametrize("cid", ["qwen3-tool-use-then-text", "qwen3-coder-tool-use-then-text",
                                 "qwen3-thinking-tool-use", "qwen3-coder-tool-use-one"])
def test_merged_engine_steps_keep_block_order(service, cid):
    """A chunk that carries a call's end and the text after it (an engine step merging several
    tokens, or the whole output in one chunk): the blocks keep the output's order and the
    stream accumulates to the non-streaming Message (no text before its call, no nameless
    tool_use holding the call's last argument characters), thinking disabled or not."""
    base = next(c for c in OK_CASES if c["id"] == cid)
    n = len(m2r.output_ids(base))
    for thinking in ({"type": "disabled"}, {"type": "adaptive"}, None):
        case = json.loads(json.dumps(base))
        if thinking is None:
            case["request"].pop("thinking", None)
        else:
            case["request"]["thinking"] = thinking
        msg = _nonstream(service, case)
        for sizes in ([n], [2, 1, 4, 5, 3, n - 15], [n - 3, 3], [1, n - 1]):
            events = _stream(service, _chunked(case, sizes))
            snap, bufs = None, {}
            for e in events:
                snap = accumulate_event(event=_EVENT.validate_python(e), current_snapshot=snap, json_bufs=bufs)
            assert all(e["content_block"]["name"] for e in events
                       if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use")
            assert msgspec.to_builtins(accumulate([_decode_event(e) for e in events])) == msg, (thinking, sizes)
            assert [b.type for b in snap.content] == [b["type"] for b in msg["content"]], (thinking, sizes)


def test_shape_detection_survives_bad_fields(service):
    """A body (or first stream chunk) told a Messages one by its ``messages_request`` alone (no
    kind header) gets Anthropic's error object even when another field has a wrong type (``model``
    or ``request_id`` not a string, ``generate_response`` not an object)."""
    case = next(c for c in OK_CASES if c["id"] == "qwen3-tool-use-one")
    body, chunk = m2r.nonstream_body(case), m2r.stream_bodies(case)[0]
    muts = [lambda b: b.__setitem__("model", 5), lambda b: b.__setitem__("model", None),
            lambda b: b[next(k for k in b if k.startswith("generate_"))].__setitem__("request_id", 5),
            lambda b: b.__setitem__(next(k for k in b if k.startswith("generate_")), "x")]
    for mut in muts:
        b = json.loads(json.dumps(body))
        mut(b)
        res = service.derender(msgspec.json.encode(b))
        assert res.status == 400 and res.kind == "messages", res.body
        _err(res.body, 400)
        s = json.loads(json.dumps(chunk))
        mut(s)
        res, _ = service.derender_stream(msgspec.json.encode(s), None)
        assert res.status == 400 and res.kind == "messages-stream", res.body
        _err(res.body, 400)


@pytest.mark.parametrize("stop", ['er",', "{", '"g', "Par", "}]"])
def test_stop_sequences_apply_to_mistral_bare_array(service, stop):
    """Mistral's bare call array (``tool_choice: any``) under ``stop_sequences``: the stop
    string's text is never delivered (neither as text nor as a tool_use's input JSON), the
    answer is cut where it starts (``stop_reason: stop_sequence`` with that string), and the
    stream, 1-token or whole, accumulates to the non-streaming Message."""
    base = next(c for c in OK_CASES if c["id"] == "mistral-7b-v0.3-tool-choice-any")
    ids = m2r.output_ids(base)
    for k in range(1, len(ids) + 1):
        case = json.loads(json.dumps(base))
        case["request"]["stop_sequences"] = ["zzqx", stop]
        case["output_token_ids"] = ids[:k]
        case["finish"] = {"finish_reason": "stop", "stop_reason": stop}
        case["stream_chunks"] = [k]
        msg = _nonstream(service, case)
        for sizes in ([1] * k, [k]):
            events = _stream(service, _chunked(case, sizes))
            sent = "".join(e["delta"].get("text", "") + e["delta"].get("partial_json", "")
                           for e in events if e["type"] == "content_block_delta")
            assert stop not in sent, (k, sizes, sent)
            assert msgspec.to_builtins(accumulate([_decode_event(e) for e in events])) == msg, (k, sizes)
        assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == stop
        assert all(stop not in b.get("text", "") for b in msg["content"]), (k, msg)
