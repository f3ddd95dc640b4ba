"""Environment variables of the command line (issue 16, operator defect 1): every spelling of
every flag reads ``DERENDER_<SPELLING>`` (``--tool-call-parser`` -> ``DERENDER_TOOL_CALL_PARSER``;
the older dest-named variable such as ``DERENDER_TOOL_PARSER`` still works); two spellings set to
different values, and a ``DERENDER_*`` name that nothing reads, are one line and exit 2 instead
of being ignored without a word."""
from __future__ import annotations

import argparse
import json
import os
import re

import pytest

from tests.harness.cli import QWEN3, REPO, cli, one_error_line
from worker.cli import COMMANDS, _build_parser, parse_args
from worker.flags import RESERVED_ENV, env_vars, known_env, unknown_env

EXAMPLES = REPO / "worker" / "demo_data" / "examples.jsonl"


@pytest.fixture(autouse=True)
def _no_derender_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("DERENDER_"):
            monkeypatch.delenv(k)


def _env_flags():
    """(subcommand, action) for every flag that reads the environment."""
    _, subs = _build_parser()
    for name, p in subs.items():
        for a in p._actions:
            if a.option_strings and getattr(a, "env", True) is not False and a.dest not in ("help", argparse.SUPPRESS) \
                    and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                yield name, a


def test_every_long_spelling_names_a_variable():
    seen = 0
    for cmd, a in _env_flags():
        names = env_vars(a)
        longs = [o for o in a.option_strings if o.startswith("--")
                 and not (isinstance(a, argparse.BooleanOptionalAction) and o.startswith("--no-"))]
        assert names[0] == "DERENDER_" + longs[0][2:].replace("-", "_").upper(), (cmd, a.option_strings)
        for o in longs:
            assert "DERENDER_" + o[2:].replace("-", "_").upper() in names, (cmd, o)
        assert "DERENDER_" + a.dest.upper() in names, (cmd, a.dest)  # the name read before stays
        seen += 1
    assert seen > 100


@pytest.mark.parametrize("var", ["DERENDER_TOOL_CALL_PARSER", "DERENDER_TOOL_PARSER"])
@pytest.mark.parametrize("cmd", [["run"], ["batch", "in", "-o", "out"], ["bench"]])
def test_tool_call_parser_reads_both_names(monkeypatch, cmd, var):
    monkeypatch.setenv(var, "hermes")
    args, _ = parse_args(cmd)
    assert args.tool_parser == "hermes"


def test_aliases_read_their_own_names(monkeypatch):
    monkeypatch.setenv("DERENDER_NUM_WORKERS", "3")  # --num-workers = --num-threads
    assert parse_args(["run"])[0].num_threads == 3
    monkeypatch.setenv("DERENDER_NUM_THREADS", "3")  # the same value twice: fine
    assert parse_args(["run"])[0].num_threads == 3


def test_the_new_name_turns_tool_parsing_on(tmp_path):
    """The issue's case: ``DERENDER_TOOL_CALL_PARSER=hermes`` used to leave tool parsing off (raw
    ``<tool_call>`` text in content, finish_reason stop, exit 0)."""
    body = next(json.loads(ln)["body"] for ln in EXAMPLES.read_text().splitlines() if "tools" in ln)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps(body | {"model": "q"}) + "\n")
    p = cli("batch", str(src), "-o", str(out), "--tokenizer", QWEN3, "--reasoning-parser", "qwen3",
            "--served-model-name", "q", "--workers", "1",
            env={"DERENDER_TOOL_CALL_PARSER": "hermes", "DERENDER_ENABLE_AUTO_TOOL_CHOICE": "1"})
    assert p.returncode == 0, p.stderr
    choice = json.loads(out.read_text())["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"], choice
    assert "<tool_call>" not in (choice["message"]["content"] or "")


def test_two_spellings_with_different_values_are_one_line():
    line = one_error_line(cli("run", env={"DERENDER_TOOL_CALL_PARSER": "hermes", "DERENDER_TOOL_PARSER": "qwen3_xml"}),
                          "DERENDER_TOOL_CALL_PARSER='hermes'", "DERENDER_TOOL_PARSER='qwen3_xml'")
    assert "different values" in line
    # a flag on the command line wins over the environment, conflicting or not
    args, _ = parse_args(["run", "--tool-call-parser", "hermes"])
    assert args.tool_parser == "hermes"


@pytest.mark.parametrize("var,close", [("DERENDER_TOOL_CALL_PARSERS", "DERENDER_TOOL_CALL_PARSER"),
                                       ("DERENDER_DRAIN_TIMEOUT_S", "DERENDER_DRAIN_TIMEOUT"),
                                       ("DERENDER_FROBNICATE", None)])
@pytest.mark.parametrize("cmd", [["run"], ["batch", "-", "-o", "-"], ["demo"], ["bench"]])
def test_a_name_no_flag_reads_is_one_line(cmd, var, close):
    line = one_error_line(cli(*cmd, env={var: "1"}), var, "read by no flag of any subcommand")
    if close:
        assert f"did you mean {close}?" in line


def test_a_flag_of_another_subcommand_is_not_refused(monkeypatch):
    """``DERENDER_INPUT_TOPIC`` (a ``run`` flag) in the environment of ``batch``: compose files
    share one environment between services, so a name any subcommand reads is accepted."""
    monkeypatch.setenv("DERENDER_INPUT_TOPIC", "x")
    parse_args(["batch", "in", "-o", "out"])


@pytest.mark.parametrize("var", sorted(RESERVED_ENV))
def test_reserved_names_are_accepted(monkeypatch, var):
    if var not in ("DERENDER_LOG_LEVEL", "DERENDER_LOG_FORMAT"):  # those two are checked as values
        monkeypatch.setenv(var, "1")
    assert unknown_env(known_env(list(_build_parser()[1].values()))) is None
    parse_args(["run"])


def test_help_works_whatever_the_environment_holds():
    p = cli("run", "--help", env={"DERENDER_NO_SUCH_THING": "1"})
    assert p.returncode == 0 and "usage:" in p.stdout


def test_readme_lists_the_reserved_names():
    """The environment paragraph of docs/configuration.md (the README's former Configuration
    section) names every reserved variable (and the rule)."""
    text = (REPO / "docs" / "configuration.md").read_text()
    para = text[text.index("**Environment.**"):]
    para = para[:para.index("\n\n")]
    assert set(re.findall(r"DERENDER_[A-Z_]+", para)) >= set(RESERVED_ENV), para
    assert "DERENDER_TOOL_CALL_PARSER" in para and "exit status 2" in para


def test_every_subcommand_is_covered():
    assert set(COMMANDS) == {"run", "batch", "demo", "bench", "broker", "schemas"}
