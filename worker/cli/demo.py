"""``derender-worker demo``: the whole pipeline on one machine with nothing but the pip install.

Starts the embedded Tansu broker (``worker.transport.broker``; or uses ``--bootstrap-servers``),
creates the topics, publishes the shipped Qwen3 engine outputs (``worker/demo_data/examples.jsonl``:
one ``{"kind": "chat"|"completion"|"responses"|"messages", "title": str, "body": {...derender body...}}`` per line),
runs a ``KafkaDerenderWorker`` in-process with ``worker/demo_data/models.json``, reads the replies
back and prints each OpenAI response as pretty JSON under its title. Exit status 0 only when
every example got a non-error (``derender-status: 200``) reply in time, the last line then
``N/N examples derendered OK``; otherwise 1 and a ``FAILED: ...`` line (``failure_line``).
``--no-worker`` needs ``--bootstrap-servers`` (or its variables): exit 2 without it.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from worker.config import load_config_file
from worker.flags import add_bootstrap_servers_arg
from worker.transport.broker import TansuBroker
from worker.transport.consumer import KafkaDerenderWorker
from worker.transport.records import HDR_CORRELATION_ID, HDR_KIND, HDR_STATUS
from worker.transport.settings import WorkerSettings
from worker.transport.topics import ensure_topics

log = logging.getLogger(__name__)

HELP = "embedded broker + worker on shipped Qwen3 examples"
DEMO_DIR = Path(__file__).resolve().parent.parent / "demo_data"


def add_demo_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``derender-worker demo`` (all optional)."""
    ap.add_argument("--examples", default=str(DEMO_DIR / "examples.jsonl"), help="JSONL of demo engine outputs")
    ap.add_argument("--config", default=str(DEMO_DIR / "models.json"), help="served-model config (JSON)")
    add_bootstrap_servers_arg(ap, None, "use this Kafka instead of starting the embedded Tansu broker "
                                        "(needed with --no-worker: the broker of the running pool)")
    ap.add_argument("--executor", choices=["thread", "process"], default="thread",
                    help="derender pool kind (thread starts fastest)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all replies")
    ap.add_argument("--quiet", action="store_true", help="print one status line per example, not the JSON")
    ap.add_argument("--no-worker", action="store_true",
                    help="only publish and read replies: a worker pool (derender-worker run) elsewhere "
                         "serves --input-topic / --reply-topic (the compose.yaml pipeline)")
    ap.add_argument("--input-topic", default="engine-outputs", help="with --no-worker: topic to publish to")
    ap.add_argument("--reply-topic", default="derender-replies", help="with --no-worker: topic to read")


def load_examples(path: str | Path) -> list[dict]:
    """Read the demo JSONL. Raises ``ValueError`` naming the line on a malformed entry."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from e
            if not isinstance(ex, dict) or ex.get("kind") not in ("chat", "completion", "responses", "messages") \
                    or "body" not in ex:
                raise ValueError(f"{path}:{n}: expected {{kind: chat|completion|responses|messages, title, body}}")
            out.append(ex)
    if not out:
        raise ValueError(f"{path}: no examples")
    return out


def pretty(obj, indent: int = 0) -> str:
    """Indented JSON, except that each per-token logprob entry stays on one line (a chat
    ``logprobs.content`` item, a completion ``logprobs`` list element), so long logprob blocks
    stay readable on a terminal."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict) and obj:
        items = []
        for k, v in obj.items():
            if k in ("content", "top_logprobs", "tokens", "token_logprobs", "text_offset") and isinstance(v, list) \
                    and v and not isinstance(v[0], str | type(None)) or (k == "tokens" and isinstance(v, list)):
                body = (",\n" + inner + "  ").join(json.dumps(x, ensure_ascii=False) for x in v)
                items.append(f'{inner}{json.dumps(k)}: [\n{inner}  {body}\n{inner}]')
            else:
                items.append(f"{inner}{json.dumps(k)}: {pretty(v, indent + 1)}")
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj:
        return "[\n" + ",\n".join(inner + pretty(x, indent + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def _request_id(ex: dict, i: int) -> str:
    body = ex["body"]
    rid = (body.get("generate_response") or {}).get("request_id")
    if not rid and body.get("generate_responses"):
        rid = body["generate_responses"][0].get("request_id")
    return rid or f"demo-{i}"


async def _demo(args: argparse.Namespace, bootstrap: str, examples: list[dict]) -> int:
    run = uuid.uuid4().hex[:8]
    if args.no_worker:
        inp, reply, dlq = args.input_topic, args.reply_topic, "derender-dlq"
    else:
        inp, reply, dlq = f"demo-engine-outputs-{run}", f"demo-replies-{run}", f"demo-dlq-{run}"
    models = load_config_file(args.config)
    await ensure_topics(bootstrap, {inp: 2, reply: 1, dlq: 1})

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for i, ex in enumerate(examples):
            await producer.send_and_wait(
                inp, json.dumps(ex["body"]).encode(), key=_request_id(ex, i).encode(),
                headers=[("content-type", b"application/json"), (HDR_KIND, ex["kind"].encode()),
                         (HDR_CORRELATION_ID, f"{run}:{i}".encode()), ("reply-topic", reply.encode())])
    finally:
        await producer.stop()
    print(f"published {len(examples)} engine outputs to {inp} on {bootstrap}", flush=True)

    settings = WorkerSettings(bootstrap_servers=bootstrap, input_topic=inp, reply_topic=reply,
                              dead_letter_topic=dlq, group_id=f"demo-{run}", executor=args.executor,
                              num_workers=2, heartbeat_interval_ms=500,
                              # Tansu joins a group in about half the session timeout; Kafka wants >= 6 s
                              session_timeout_ms=10000 if args.bootstrap_servers else 2000,
                              commit_interval_ms=100)
    replies: dict[int, tuple[int, dict]] = {}
    t0 = time.perf_counter()
    consumer = AIOKafkaConsumer(reply, dlq, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        async with (contextlib.nullcontext() if args.no_worker else KafkaDerenderWorker(settings, models)) as worker:
            deadline = time.monotonic() + args.timeout
            while len(replies) < len(examples) and time.monotonic() < deadline:
                for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                    for m in msgs:
                        h = dict(m.headers or ())
                        if tp.topic == dlq:
                            if h.get(HDR_CORRELATION_ID, b"").decode(errors="replace").startswith(f"{run}:"):
                                log.error("dead letter: %s", h.get("x-dlq-reason"))
                            continue
                        try:
                            cid_run, _, cid_i = h[HDR_CORRELATION_ID].decode().partition(":")
                            if cid_run != run:
                                continue  # a reply to an earlier demo run on the same topic
                            idx = int(cid_i)
                        except (KeyError, ValueError, UnicodeDecodeError):
                            log.error("reply without a usable correlation-id: %r", h)
                            continue
                        replies[idx] = (int(h.get(HDR_STATUS, b"0")), json.loads(m.value))
    finally:
        await consumer.stop()
    elapsed = time.perf_counter() - t0

    ok = 0
    for i, ex in enumerate(examples):
        status, body = replies.get(i, (None, None))
        good = status == 200
        ok += good
        print(f"{'' if args.quiet else chr(10)}=== [{i + 1}/{len(examples)}] {ex.get('title', '')} "
              f"({ex['kind']}) -> {'no reply' if status is None else f'status {status}'}", flush=True)
        if body is not None and not args.quiet:
            print(pretty(body), flush=True)
    stats = f" (worker stats: {worker.stats.as_dict()})" if worker is not None else ""
    if ok == len(examples):
        print(f"\n{ok}/{len(examples)} examples derendered OK in {elapsed:.2f}s{stats}", flush=True)
        return 0
    print(f"\n{failure_line(len(examples), len(replies), ok, args.timeout)}{stats}", flush=True)
    if not replies:
        print(f"no reply at all on {reply} within --timeout {args.timeout:g}s: "
              + (f"is a worker pool (derender-worker run) consuming {inp} on {bootstrap}?" if args.no_worker
                 else "see the worker's log lines above"), flush=True)
    return 1


def failure_line(total: int, answered: int, ok: int, timeout_s: float) -> str:
    """The demo's last line when not every example got a 200 reply: ``FAILED: <ok>/<total>
    examples derendered OK (<n> without a reply within --timeout <s>s, <m> with an error status)``."""
    return (f"FAILED: {ok}/{total} examples derendered OK ({total - answered} without a reply within "
            f"--timeout {timeout_s:g}s, {answered - ok} with an error status)")


def main_demo(args: argparse.Namespace) -> int:
    """Run the demo (see the module docstring). Returns 0 when every example got a 200 reply,
    1 otherwise, 2 when the examples/config cannot be read, no broker can be started, or
    ``--no-worker`` names no broker."""
    try:
        examples = load_examples(args.examples)
    except (OSError, ValueError) as e:
        log.error("cannot read demo examples: %s", e)
        return 2
    if args.no_worker and not args.bootstrap_servers:
        log.error("--no-worker needs the broker of the running worker pool: --bootstrap-servers HOST:PORT "
                  "(env DERENDER_BOOTSTRAP_SERVERS or KAFKA_BOOTSTRAP_SERVERS); an embedded broker started "
                  "here would have no worker")
        return 2
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        if not bootstrap:
            try:
                bootstrap = stack.enter_context(TansuBroker()).bootstrap_servers
            except (FileNotFoundError, RuntimeError, TimeoutError) as e:
                log.error("cannot start the embedded Tansu broker: %s", e)
                return 2
        try:
            return asyncio.run(_demo(args, bootstrap, examples))
        except (OSError, ValueError, KafkaError) as e:
            log.error("demo failed: %s: %s", type(e).__name__, e)
            return 2
