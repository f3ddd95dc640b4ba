"""The documented user path works as written: the producer/consumer snippet of ``docs/kafka.md``
(linked from the README), run against the embedded broker and a ``derender-worker run``
subprocess, prints the reply; its literal record and reply are what the code produces for that
record. The README and the ``docs/`` pages hold together: the README stays a first screen, a tour
and links; ``docs/README.md`` indexes every page; every relative link and anchor resolves."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.harness.docs import DOCS, headings, links, page, slug
from worker.config import ServedModelConfig
from worker.core.service import DerenderService

REPO = Path(__file__).resolve().parents[1]
KAFKA_PAGE = page("kafka.md")


def _section(title: str) -> str:
    i = KAFKA_PAGE.index(title)
    j = KAFKA_PAGE.find("\n### ", i + len(title))
    return KAFKA_PAGE[i:j if j >= 0 else None]


def _snippet() -> str:
    m = re.search(r"```python\n(.*?)```", _section("### Producer and consumer (aiokafka)"), re.S)
    assert m, "no python block in the producer/consumer section of docs/kafka.md"
    return m.group(1)


def _stream_snippet() -> str:
    text = page("streaming.md")
    i = text.index("### Producer and consumer for a stream (aiokafka)")
    m = re.search(r"```python\n(.*?)```", text[i:text.index("\n### ", i + 10)], re.S)
    assert m, "no python block in the stream producer/consumer section of docs/streaming.md"
    return m.group(1)


def test_snippet_is_about_twenty_lines():
    assert len(_snippet().strip().splitlines()) <= 25


def _literal(which: int) -> dict[str, str]:
    blocks = re.findall(r"```\n(topic .*?)```", _section("### A record and its reply"), re.S)
    assert len(blocks) == 2
    return dict(line.split(None, 1) for line in blocks[which].strip().splitlines())


def test_literal_reply_is_what_the_code_gives_for_the_literal_record():
    rec, rep = _literal(0), _literal(1)
    created = json.loads(rep["value"])["created"]
    svc = DerenderService([ServedModelConfig(name="qwen3", tokenizer=str(REPO / "worker" / "demo_data" / "qwen3"),
                                             reasoning_parser="qwen3", tool_parser="hermes",
                                             enable_auto_tool_choice=True)])
    res = svc.derender(rec["value"].encode(), created=created)
    assert res.status == 200 and res.kind == "chat"
    assert res.body.decode() == rep["value"]
    assert rec["key"] == rep["key"] == json.loads(rep["value"])["id"]


@pytest.mark.kafka
def test_snippet_gets_its_reply_from_a_running_worker(kafka_bootstrap, kafka_broker_kind, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_")}
    env |= {"PYTHONPATH": str(REPO), "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    session = "2000" if kafka_broker_kind == "tansu" else "6000"
    worker = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", "--model", "worker/demo_data/qwen3", "--served-model-name", "qwen3",
         "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
         "--stream-state", "memory", "--executor", "thread", "--num-threads", "1",
         "--group-id", f"readme-{uuid.uuid4().hex[:8]}", "--session-timeout-ms", session,
         "--heartbeat-interval-ms", "500", "--log-format", "json"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = tmp_path / "client.py"
        client.write_text(_snippet())
        p = subprocess.run([sys.executable, str(client)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=90)
        stream_client = tmp_path / "stream_client.py"
        stream_client.write_text(_stream_snippet())
        ps = subprocess.run([sys.executable, str(stream_client)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=90)
    finally:
        worker.terminate()
        log, _ = worker.communicate(timeout=30)
    assert p.returncode == 0, (p.stderr, log[-3000:])
    status, value = p.stdout.strip().split(" ", 1)
    reply = json.loads(value)
    assert status == "200" and reply["object"] == "chat.completion" and reply["model"] == "qwen3"
    assert reply["choices"][0]["message"]["reasoning"] and reply["created"] > 1_700_000_000
    # the stream snippet of docs/streaming.md: 28 ids in 5-id chunks = 6 replies whose deltas join
    # to the same message, the last one ending with the usage chunk
    assert ps.returncode == 0, (ps.stderr, log[-3000:])
    replies = [json.loads(line) for line in ps.stdout.splitlines()]
    assert len(replies) == 6 and all(isinstance(r, list) for r in replies), ps.stdout
    deltas = [c["choices"][0]["delta"] for r in replies for c in r if c["choices"]]
    message = reply["choices"][0]["message"]
    assert "".join(d.get("reasoning") or "" for d in deltas) == message["reasoning"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    assert replies[-1][-1]["choices"] == [] and replies[-1][-1]["usage"]["completion_tokens"] == 28
    assert worker.returncode == 0, log[-3000:]
    assert all(json.loads(line)["level"] for line in log.splitlines() if line.strip())  # --log-format json


def test_readme_is_a_first_screen_a_tour_and_links():
    """The README keeps its two commands, what it is, the commands table, links and the layout; the
    reference lives in docs/ (issue 16 item 4: a README a newcomer can hold)."""
    readme = page("README.md")
    assert headings(readme) == ["derender-worker", "What it is", "Commands", "A short tour", "Documentation",
                                 "Layout"]
    assert len(readme.splitlines()) <= 150
    linked = {path for path, _ in links(readme)}
    assert {f"docs/{p.name}" for p in DOCS.glob("*.md")} <= linked, "a docs page the README does not link"


def test_docs_index_links_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {path for path, _ in links(index)}
    assert {p.name for p in DOCS.glob("*.md")} - {"README.md"} <= linked


@pytest.mark.parametrize("name", ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))])
def test_relative_links_and_anchors_resolve(name):
    """Every relative link of the README and the docs pages names an existing file, and every
    anchor into a markdown page names one of its headings (GitHub's anchor rule)."""
    src = REPO / name
    text = src.read_text(encoding="utf-8")
    for path, anchor in links(text):
        target = (src.parent / path).resolve() if path else src
        assert target.exists(), f"{name}: link to missing {path}"
        if anchor and target.suffix == ".md":
            slugs = {slug(h) for h in headings(target.read_text(encoding="utf-8"))}
            assert anchor in slugs, f"{name}: no heading for #{anchor} in {path or name}"
