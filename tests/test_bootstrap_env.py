"""Every subcommand that takes ``--bootstrap-servers`` reads the same variables (issue 23, operator
item 1): ``DERENDER_BOOTSTRAP_SERVERS``, then ``KAFKA_BOOTSTRAP_SERVERS``, a flag winning; ``demo``
and ``bench kafka`` used to ignore both. ``demo --no-worker`` without a broker is one error line
(it used to start a broker of its own, wait there 60 s for a worker that could not be on it and
print "0/6 ... OK" with exit 1), and a demo that got no reply says FAILED and why.

Real parts: the command-line parser, the console entry point as a subprocess and the session's
Kafka-protocol broker."""
from __future__ import annotations

import argparse
import os
import uuid

import pytest

from tests.harness.cli import cli, one_error_line
from worker.cli import _build_parser, parse_args
from worker.cli.demo import DEMO_DIR, load_examples
from worker.flags import nested_parsers


@pytest.fixture(autouse=True)
def _no_broker_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("DERENDER_") or k == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(k)


def _commands_with_bootstrap() -> list[list[str]]:
    """The command lines (subcommand, or subcommand + suite) whose parser has --bootstrap-servers."""
    _, subs = _build_parser()
    out = []
    for name, p in subs.items():
        for q in (p, *nested_parsers(p)):
            if "--bootstrap-servers" in q._option_string_actions:
                out.append([name] if q is p else [name, q.prog.split()[-1]])
    return out


def test_the_commands_with_the_flag_are_found():
    found = _commands_with_bootstrap()
    for cmd in (["run"], ["demo"], ["bench"], ["bench", "kafka"], ["bench", "drain"]):
        assert cmd in found, found


@pytest.mark.parametrize("cmd", _commands_with_bootstrap() + [["bench", "--kafka"]], ids=" ".join)
def test_every_bootstrap_flag_reads_both_variables(monkeypatch, cmd):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-env:9092")
    assert parse_args(cmd)[0].bootstrap_servers == "kafka-env:9092"
    monkeypatch.setenv("DERENDER_BOOTSTRAP_SERVERS", "derender-env:9092")  # the project's own name wins
    assert parse_args(cmd)[0].bootstrap_servers == "derender-env:9092"
    given = [*cmd[:1], "--bootstrap-servers", "flag:9092", *cmd[1:]] if cmd[0] == "bench" and len(cmd) == 1 \
        else [*cmd, "--bootstrap-servers", "flag:9092"]
    assert parse_args(given)[0].bootstrap_servers == "flag:9092"  # the flag wins over both


@pytest.mark.parametrize("cmd", [["demo"], ["bench", "kafka"], ["bench", "drain"]], ids=" ".join)
def test_without_a_variable_the_embedded_broker_is_used(cmd):
    assert parse_args(cmd)[0].bootstrap_servers is None  # None: start the embedded broker
    assert parse_args(["run"])[0].bootstrap_servers == "localhost:9092"


def test_an_empty_kafka_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "")
    assert parse_args(["run"])[0].bootstrap_servers == "localhost:9092"
    assert parse_args(["demo"])[0].bootstrap_servers is None


def test_help_names_both_variables():
    _, subs = _build_parser()
    for cmd in _commands_with_bootstrap():
        p = subs[cmd[0]]
        if len(cmd) > 1:
            p = next(q for q in nested_parsers(p) if q.prog.split()[-1] == cmd[1])
        a = p._option_string_actions["--bootstrap-servers"]
        if a.default is argparse.SUPPRESS:
            continue  # bench core/kafka's copy of bench's own flag
        assert "DERENDER_BOOTSTRAP_SERVERS" in a.help and "KAFKA_BOOTSTRAP_SERVERS" in a.help, (cmd, a.help)


def test_a_nested_suite_reads_its_flags_variables(monkeypatch):
    """``bench drain``'s own flags read ``DERENDER_*`` like a subcommand's (they were not read)."""
    monkeypatch.setenv("DERENDER_REQUESTS", "123")
    assert parse_args(["bench", "drain"])[0].requests == 123
    monkeypatch.setenv("DERENDER_RATE", "7")  # a suite's copy of bench's flag keeps the order flag > env
    assert parse_args(["bench", "--rate", "5", "kafka"])[0].rate == 5.0
    assert parse_args(["bench", "kafka"])[0].rate == 7.0


def test_no_worker_without_a_broker_is_one_line():
    p = cli("demo", "--no-worker", "--timeout", "60", timeout=60)
    one_error_line(p, "--no-worker needs", "--bootstrap-servers", "KAFKA_BOOTSTRAP_SERVERS")
    assert "examples derendered OK" not in p.stdout


def test_no_worker_uses_the_variable_and_says_failed(kafka_bootstrap):
    """``demo --no-worker`` with the broker in ``KAFKA_BOOTSTRAP_SERVERS`` publishes there; with no
    worker on that topic its last lines say FAILED, how many got no reply, and what to check."""
    u = uuid.uuid4().hex[:8]
    p = cli("demo", "--no-worker", "--quiet", "--timeout", "3", "--input-topic", f"nw-in-{u}",
            "--reply-topic", f"nw-rep-{u}", env={"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}, timeout=120)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"to nw-in-{u} on {kafka_bootstrap}" in p.stdout, p.stdout
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    n = len(load_examples(DEMO_DIR / "examples.jsonl"))
    assert lines[-2] == f"FAILED: 0/{n} examples derendered OK ({n} without a reply within --timeout 3s, " \
                        "0 with an error status)", lines[-2:]
    assert "examples derendered OK in" not in p.stdout
    assert lines[-1].startswith(f"no reply at all on nw-rep-{u} within --timeout 3s: is a worker pool") \
        and f"consuming nw-in-{u} on {kafka_bootstrap}" in lines[-1], lines[-1]
