"""The command line: vLLM flags, environment defaults, one-line startup errors (exit 2), log
flags after the subcommand, consistent model flags across run/batch/bench.

Startup mistakes run the real console entry point as a subprocess and check exit status 2 and a
single stderr line; the rest call ``worker.cli.main`` in-process on real tokenizers."""
from __future__ import annotations

import json
import os

import pytest

from tests.harness.cli import QWEN3, REPO
from tests.harness.cli import cli as _cli
from tests.harness.cli import one_error_line as _one_error_line
from worker.cli import main, parse_args

EXAMPLES = REPO / "worker" / "demo_data" / "examples.jsonl"
QWEN_FLAGS = ["--tokenizer", QWEN3, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
              "--enable-auto-tool-choice"]


def _bodies(n: int = 2) -> list[dict]:
    out = []
    for line in EXAMPLES.read_text().splitlines():
        ex = json.loads(line)
        if ex["kind"] == "chat":
            out.append(ex["body"])
    return out[:n]


@pytest.fixture(autouse=True)
def _no_derender_env(monkeypatch):
    """No DERENDER_* variable during a test, and none left after it (``main`` exports the log
    settings for pool processes: registered here so monkeypatch removes them afterwards)."""
    for k in ("DERENDER_LOG_LEVEL", "DERENDER_LOG_FORMAT"):
        monkeypatch.setenv(k, "")
    for k in list(os.environ):
        if k.startswith("DERENDER_"):
            monkeypatch.delenv(k)


# ----------------------------------------------------------------- startup mistakes: exit 2 ----
@pytest.mark.parametrize("cmd", [["run"], ["batch", "-", "-o", "-"], ["bench"]])
def test_unknown_flag_is_one_line_with_the_subcommand_usage(cmd):
    line = _one_error_line(_cli(*cmd, "--no-such-flag"), "unrecognized arguments: --no-such-flag",
                           f"derender-worker {cmd[0]} --help")
    assert line.startswith(f"derender-worker {cmd[0]}: error:")


def test_bad_flag_value_is_one_line():
    _one_error_line(_cli("batch", "-", "-o", "-", "--max-n", "many"), "--max-n", "derender-worker batch")


@pytest.mark.parametrize("flag,value,bound", [("--chunksize", "0", ">= 1"), ("--workers", "-3", ">= 0"),
                                              ("--part-size", "-1", ">= 0"), ("--row-group-size", "0", ">= 1"),
                                              ("--max-in-flight", "-1", ">= 0")])
def test_batch_numbers_out_of_range_are_one_line_with_the_bound(flag, value, bound):
    """``--chunksize 0`` hung the pool forever and ``--workers -3`` printed multiprocessing's
    message: now one line naming the flag and its bound, before anything runs."""
    _one_error_line(_cli("batch", "-", "-o", "-", *QWEN_FLAGS, flag, value, timeout=60),
                    f"argument {flag}: invalid int value: '{value}' (must be {bound})")


def test_a_required_flag_reads_its_env_variable_too(tmp_path):
    """``batch -o`` is required; ``DERENDER_OUTPUT`` gives it, as every flag reads its variable."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_bodies(1)[0]) + "\n")
    out = tmp_path / "out.jsonl"
    proc = _cli("batch", str(src), *QWEN_FLAGS, "--served-model-name", "qwen3", "--workers", "1",
                env={"DERENDER_OUTPUT": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["object"] == "chat.completion"
    _one_error_line(_cli("batch", str(src), *QWEN_FLAGS), "required: -o/--output")


def test_a_bounded_flag_says_its_bound():
    """argparse alone says ``invalid int value: '0'`` for ``--max-in-flight 0``, as if 0 were no
    integer; the bound's reason is kept (plain int() failures keep argparse's wording)."""
    _one_error_line(_cli("run", "--max-in-flight", "0"), "invalid int value: '0' (must be >= 1)")
    _one_error_line(_cli("batch", "-", "-o", "-", "--max-logprobs", "-2"), "(must be >= -1 (-1 = no limit))")
    line = _one_error_line(_cli("batch", "-", "-o", "-", "--max-n", "many"))
    assert line.split(" (usage")[0].endswith("argument --max-n: invalid int value: 'many'")


@pytest.mark.parametrize("cmd", [["run"], ["batch", "-", "-o", "-"], ["bench"], ["demo"]])
def test_malformed_env_value_names_the_variable(cmd):
    var = {"run": "DERENDER_MAX_IN_FLIGHT", "batch": "DERENDER_WORKERS", "bench": "DERENDER_TOKENS",
           "demo": "DERENDER_TIMEOUT"}[cmd[0]]
    _one_error_line(_cli(*cmd, env={var: "abc"}), f"{var}='abc'")


def test_malformed_env_value_never_breaks_help():
    env = {"DERENDER_MAX_IN_FLIGHT": "abc", "DERENDER_MAX_N": "x", "DERENDER_LOG_LEVEL": "loud"}
    for cmd in (["--help"], ["run", "--help"], ["batch", "--help"], ["bench", "--help"]):
        p = _cli(*cmd, env=env)
        assert p.returncode == 0, (cmd, p.stderr)
        assert "usage:" in p.stdout


def test_a_flag_given_wins_over_a_malformed_env_value(tmp_path):
    out = tmp_path / "out.jsonl"
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_bodies(1)[0] | {"model": QWEN3}) + "\n")
    p = _cli("batch", str(src), "-o", str(out), "--tokenizer", QWEN3, "--workers", "1",
             env={"DERENDER_WORKERS": "abc"})
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["object"] == "chat.completion"


@pytest.mark.parametrize("var,value", [("DERENDER_LOG_LEVEL", "loud"), ("DERENDER_LOG_FORMAT", "xml"),
                                       ("DERENDER_ENABLE_AUTO_TOOL_CHOICE", "maybe"),
                                       ("DERENDER_TOKENIZER_MODE", "fancy")])
def test_malformed_env_values_of_other_kinds(var, value):
    _one_error_line(_cli("batch", "-", "-o", "-", env={var: value}), var)


def test_run_with_a_bad_tokenizer_path_is_one_line_before_any_pool(tmp_path):
    p = _cli("run", "--tokenizer", str(tmp_path / "missing"), "--bootstrap-servers", "127.0.0.1:1",
             "--stream-state", "memory", "--num-threads", "2")
    line = _one_error_line(p, "missing")
    assert "BrokenProcessPool" not in p.stderr and "initializer" not in p.stderr, line


def test_run_with_an_unknown_parser_is_one_line():
    p = _cli("run", "--tokenizer", QWEN3, "--reasoning-parser", "no-such-parser",
             "--bootstrap-servers", "127.0.0.1:1", "--stream-state", "memory")
    _one_error_line(p, "no-such-parser")


def test_run_with_an_unreachable_broker_exits_2_without_a_traceback():
    """Nothing listens on the port: one error line naming the address and the flag, status 2 (was a
    KafkaConnectionError traceback and status 1, then three ERROR lines after the pool loaded:
    issue 16). Checked before the derender pool starts."""
    from worker.transport.broker import free_port
    addr = f"127.0.0.1:{free_port()}"
    p = _cli("run", "--tokenizer", QWEN3, "--bootstrap-servers", addr, "--stream-state", "memory",
             "--num-threads", "1")
    line = _one_error_line(p, f"Kafka broker unreachable at {addr}", "--bootstrap-servers", "refused")
    assert "pool" not in p.stderr and "aiokafka" not in line


def test_run_with_an_unknown_trace_exporter_is_one_line():
    p = _cli("run", "--tokenizer", QWEN3, "--bootstrap-servers", "127.0.0.1:1", "--stream-state", "memory",
             env={"OTEL_TRACES_EXPORTER": "carrier-pigeon"})
    _one_error_line(p, "OTEL_TRACES_EXPORTER")


def test_batch_with_a_bad_tokenizer_path_is_one_line(tmp_path):
    _one_error_line(_cli("batch", "-", "-o", "-", "--model", str(tmp_path / "missing")), "missing")


def test_bench_with_a_bad_tokenizer_path_is_one_line(tmp_path):
    _one_error_line(_cli("bench", "--tokenizer", str(tmp_path / "missing")), "missing")


def test_yaml_config_is_refused_in_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("model: x\n")
    _one_error_line(_cli("batch", "-", "-o", "-", "--config", str(cfg)), "YAML")


# --------------------------------------------------------------------------- vLLM flags ----
def test_vllm_flags_without_effect_are_accepted_and_noted_once(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_bodies(1)[0] | {"model": QWEN3}) + "\n")
    out = tmp_path / "out.jsonl"
    rc = main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--workers", "1", "--trust-remote-code",
               "--revision", "main", "--chat-template", "t.jinja", "--enable-reasoning", "--dtype", "bfloat16",
               "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.9", "--lora-modules", "a=b", "c=d"])
    assert rc == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "without effect" in ln]
    assert len(notes) == 1 and "--trust-remote-code" in notes[0] and "--lora-modules" in notes[0], err
    assert json.loads(out.read_text())["object"] == "chat.completion"


def test_served_model_name_aliases_reply_with_the_name_used(tmp_path, capsys):
    body = _bodies(1)[0]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(body | {"model": m}) + "\n" for m in ("qwen3", "qwen3-alias", "other")))
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--served-model-name", "qwen3", "qwen3-alias",
                 "--workers", "1"]) == 0
    r = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x.get("model") for x in r[:2]] == ["qwen3", "qwen3-alias"]
    assert r[0]["choices"] == r[1]["choices"]
    assert r[2]["error"]["code"] == 404 and "qwen3-alias" in r[2]["error"]["message"]


def test_served_model_name_aliases_from_env(monkeypatch):
    monkeypatch.setenv("DERENDER_SERVED_MODEL_NAME", "a,b c")
    args, _ = parse_args(["batch", "-", "-o", "-", "--tokenizer", QWEN3])
    assert args.served_model_name == ["a", "b", "c"]
    from worker.config import models_from_args
    (m,) = models_from_args(args)
    assert (m.name, m.aliases) == ("a", ["b", "c"])


def test_model_flag_is_the_tokenizer_and_the_default_served_name():
    from worker.config import models_from_args
    args, _ = parse_args(["run", "--model", QWEN3])
    (m,) = models_from_args(args)
    assert (m.name, m.tokenizer) == (QWEN3, QWEN3)
    args, _ = parse_args(["run", QWEN3, "--tokenizer", QWEN3 + "/"])  # vllm serve MODEL --tokenizer T
    (m,) = models_from_args(args)
    assert (m.name, m.tokenizer) == (QWEN3, QWEN3 + "/")


def test_model_flags_beside_config_are_named_in_a_warning(caplog, tmp_path):
    """``--config`` names the served models: a per-model flag given too is not read, and says so."""
    import logging

    from worker.config import models_from_args
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"q": {"tokenizer": QWEN3, "tool_parser": "hermes"}}))
    args, _ = parse_args(["batch", "-", "-o", "-", "--config", str(cfg)])
    with caplog.at_level(logging.WARNING, logger="worker.config"):
        (m,) = models_from_args(args)
    assert m.tool_call_streaming == "whole" and not caplog.records
    args, _ = parse_args(["batch", "-", "-o", "-", "--config", str(cfg), "--tool-call-streaming", "incremental",
                          "--reasoning-parser", "qwen3"])
    with caplog.at_level(logging.WARNING, logger="worker.config"):
        (m,) = models_from_args(args)
    assert (m.tool_call_streaming, m.reasoning_parser) == ("whole", None)  # the file's settings
    (rec,) = caplog.records
    assert "--tool-call-streaming incremental" in rec.getMessage()
    assert "--reasoning-parser qwen3" in rec.getMessage()


def _logprob_body(top: int) -> dict:
    body = json.loads(json.dumps(_bodies(1)[0]))
    body["model"] = "q"
    ch = body["generate_response"]["choices"][0]
    ch["logprobs"] = {"content": [{"token_id": t, "logprob": -0.1, "top_logprobs": [
        {"token_id": (t + k) % 1000, "logprob": -1.0 - k} for k in range(top)]} for t in ch["token_ids"]]}
    body["chat_request"]["logprobs"] = True
    body["chat_request"]["top_logprobs"] = top
    return body


def test_max_logprobs_minus_one_means_no_limit(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_logprob_body(25)) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--served-model-name", "q", "--workers", "1",
                 "--max-logprobs", "-1"]) == 0
    r = json.loads(out.read_text())
    assert len(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 25
    # the only record is refused: batch exits 1 (no record succeeded), its error object is written
    assert main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--served-model-name", "q", "--workers", "1"]) == 1
    assert "exceeds max_logprobs (20)" in json.loads(out.read_text())["error"]["message"]


def test_max_logprobs_below_minus_one_is_refused():
    _one_error_line(_cli("batch", "-", "-o", "-", "--max-logprobs", "-2"), "--max-logprobs")


def test_tokenizer_mode_custom_loads_as_auto(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_bodies(1)[0] | {"model": "q"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--served-model-name", "q", "--workers", "1",
                 "--tokenizer-mode", "custom"]) == 0
    assert json.loads(out.read_text())["object"] == "chat.completion"
    assert "--tokenizer-mode custom" in capsys.readouterr().err


def test_max_model_len_takes_vllm_suffixes():
    args, _ = parse_args(["batch", "-", "-o", "-", "--max-model-len", "32K"])
    assert args.max_model_len == 32768
    args, _ = parse_args(["batch", "-", "-o", "-", "--max-model-len", "25.6k"])
    assert args.max_model_len == 25600


# ------------------------------------------------------------------------------ log flags ----
def test_log_flags_after_the_subcommand_and_from_env(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_bodies(1)[0] | {"model": QWEN3}) + "\n")
    out = tmp_path / "out.jsonl"
    p = _cli("batch", str(src), "-o", str(out), "--tokenizer", QWEN3, "--workers", "1", "--trust-remote-code",
             "--log-format", "json")
    assert p.returncode == 0, p.stderr
    logged = [json.loads(ln) for ln in p.stderr.splitlines() if ln.startswith("{")]
    assert logged and {"ts", "level", "logger", "message"} <= set(logged[0])
    p = _cli("batch", str(src), "-o", str(out), "--tokenizer", QWEN3, "--workers", "1", "--trust-remote-code",
             env={"DERENDER_LOG_FORMAT": "json", "DERENDER_LOG_LEVEL": "warning"})
    assert p.returncode == 0, p.stderr
    assert not [ln for ln in p.stderr.splitlines() if ln.startswith("{")]  # the INFO note is filtered out
    args, sub = parse_args(["--log-level", "debug", "batch", "-", "-o", "-", "--log-level", "error"])
    from worker.flags import log_settings
    assert log_settings(sub, args, {}) == ("ERROR", "text")
    args, sub = parse_args(["--log-level", "debug", "batch", "-", "-o", "-"])
    assert log_settings(sub, args, {"DERENDER_LOG_LEVEL": "ERROR"}) == ("DEBUG", "text")


def test_every_flag_of_every_subcommand_reads_its_env_variable(monkeypatch):
    """Each flag's DERENDER_<DEST> sets it (checked on a sample of kinds: str, int, float, choice,
    bool, list), and the flag on the command line wins."""
    env = {"DERENDER_INPUT_TOPIC": "t-in", "DERENDER_MAX_IN_FLIGHT": "7", "DERENDER_DRAIN_TIMEOUT": "1.5",
           "DERENDER_EXECUTOR": "thread", "DERENDER_ENABLE_AUTO_TOOL_CHOICE": "yes",
           "DERENDER_REDIS_TLS_INSECURE": "1", "DERENDER_REDIS_STATE_TTL": "60", "DERENDER_TOOL_PARSER": "hermes"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args, _ = parse_args(["run"])
    assert (args.input_topic, args.max_in_flight, args.drain_timeout, args.executor) == ("t-in", 7, 1.5, "thread")
    assert args.enable_auto_tool_choice is True and args.redis_tls_insecure is True
    assert args.redis_state_ttl == 60.0 and args.tool_parser == "hermes"
    args, _ = parse_args(["run", "--max-in-flight", "9", "--input-topic", "x"])
    assert (args.max_in_flight, args.input_topic) == (9, "x")
    monkeypatch.setenv("DERENDER_TOKENS", "128")
    args, _ = parse_args(["bench"])
    assert args.tokens == 128


# ---------------------------------------------------------------------------------- bench ----
#: the floor pass at test size (its defaults run ~50 CPU seconds: a benchmark, not a test)
SMALL_FLOOR = ["--floor-tokens", "64", "--floor-logprob-tokens", "64", "--floor-distinct", "2",
               "--floor-seconds", "0.02", "--floor-repeats", "1"]


def test_bench_takes_the_model_flags_of_run(capsys):
    assert main(["bench", "--model", QWEN3, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
                 "--enable-auto-tool-choice", "--served-model-name", "q", "--tokens", "64", "--distinct", "2",
                 "--seconds", "0.05", "--repeats", "1", *SMALL_FLOOR]) == 0
    out = capsys.readouterr().out
    assert "core/floor" in out and "top_logprobs=20" in out  # the floor pass ran, at test size
    assert "core/I/O floor" in out  # each logprobs figure next to its JSON I/O floor (issue 13)
    assert "model=q" in out and "responses/s" in out and "note:" not in out
    assert "Responses API (/v1/responses bodies of the same ids)" in out  # next to chat (issue 14)
    assert main(["bench", "--tokenizer", QWEN3, "--tokens", "64", "--distinct", "2", "--seconds", "0.05",
                 "--repeats", "1", "--no-floor"]) == 0  # no parsers: plain text, with a note
    assert "note:" in capsys.readouterr().out


def test_noop_vllm_flags_never_shadow_a_flag_the_subcommand_defines():
    import argparse

    from worker.flags import add_vllm_noop_args, noop_note
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    add_vllm_noop_args(ap)
    a = ap.parse_args(["--port", "5", "--dtype", "half", "--no-trust-remote-code"])
    assert a.port == 5 and noop_note(a).endswith("--dtype, --no-trust-remote-code")


def test_return_tokens_as_token_ids(tmp_path):
    body = _logprob_body(2)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(body) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--served-model-name", "q", "--workers", "1",
                 "--return-tokens-as-token-ids"]) == 0
    lp = json.loads(out.read_text())["choices"][0]["logprobs"]["content"]
    ids = body["generate_response"]["choices"][0]["token_ids"]
    assert [e["token"] for e in lp] == [f"token_id:{t}" for t in ids]
    assert lp[0]["bytes"] == list(f"token_id:{ids[0]}".encode())
    assert [t["token"] for t in lp[0]["top_logprobs"]] == [f"token_id:{ids[0]}", f"token_id:{ids[0] % 1000}"]
    assert main(["batch", str(src), "-o", str(out), *QWEN_FLAGS, "--served-model-name", "q", "--workers", "1",
                 "--no-return-tokens-as-token-ids"]) == 0
    assert not json.loads(out.read_text())["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")


def test_return_tokens_as_token_ids_in_streams_and_completions():
    from worker.config import ServedModelConfig
    from worker.core.service import DerenderService
    svc = DerenderService([ServedModelConfig(name="q", tokenizer=QWEN3, return_tokens_as_token_ids=True)])
    lp = {"content": [{"token_id": 9707, "logprob": -0.5, "top_logprobs": [{"token_id": 13, "logprob": -2.0}]}]}
    chunk = {"model": "q", "stream": True, "prompt_token_ids": [151644, 872, 198],
             "chat_request": {"model": "q", "messages": [], "logprobs": True, "top_logprobs": 1},
             "generate_chunk": {"request_id": "s", "choices": [{"index": 0, "token_ids": [9707], "logprobs": lp}]}}
    res, _ = svc.derender_stream(json.dumps(chunk).encode(), None)
    got = [c["choices"][0]["logprobs"]["content"][0]["token"] for c in json.loads(res.body)
           if c["choices"] and c["choices"][0].get("logprobs")]
    assert got == ["token_id:9707"], res.body
    comp = {"model": "q", "prompt_tokens": [1], "prompt_token_ids": [[6023]],
            "completion_request": {"model": "q", "prompt": "hi", "logprobs": 1},
            "generate_responses": [{"request_id": "c", "choices": [
                {"index": 0, "token_ids": [9707, 13], "finish_reason": "length",
                 "logprobs": {"content": lp["content"] * 2}}]}]}
    comp["generate_responses"][0]["choices"][0]["logprobs"]["content"][1] = {
        "token_id": 13, "logprob": -0.1, "top_logprobs": []}
    r = json.loads(svc.derender(json.dumps(comp).encode()).body)
    clp = r["choices"][0]["logprobs"]
    assert clp["tokens"] == ["token_id:9707", "token_id:13"]
    assert clp["text_offset"] == [0, len("token_id:9707")]
    assert clp["top_logprobs"][0] == {"token_id:9707": -0.5, "token_id:13": -2.0}


def test_no_subcommand_names_the_command_not_an_internal_dest():
    """``derender-worker`` alone says a COMMAND is required (was argparse's dest, ``cmd``)."""
    line = _one_error_line(_cli(), "required: COMMAND", "derender-worker --help")
    assert "cmd" not in line.split(" (usage")[0]
