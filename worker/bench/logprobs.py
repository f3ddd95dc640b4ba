"""``derender-worker bench logprobs`` (``python -m worker.bench.logprobs``): logprobs against their
JSON I/O floor, measured black box through ``derender-worker batch --workers 1`` (issue 25 item 1).

For each API (``chat``, ``completion``, ``responses``; Anthropic Messages carries no logprobs) and
each ``--tops`` value (``top_logprobs``; ``none`` = a record without logprobs), writes ``--records``
JSONL lines of ``--tokens``-token Qwen3 outputs with reasoning and a Hermes tool call (the bodies of
``worker.bench.floor.build_bodies``: every output id has an engine entry with k candidates), runs
``derender-worker batch --workers 1`` on them in a subprocess and reads its CPU time (user +
system, ``os.wait4``), less the CPU of the same command on an empty input (start-up and exit; the lower of two runs).
The floor is computed in this process on the same bytes: thread CPU of ``msgspec.json.decode``
(untyped) of every input line plus ``msgspec.json.encode`` of every reply the batch wrote (decoded
beforehand), nothing else; best of ``--floor-repeats``. Prints per record: product CPU, floor CPU
and their multiple, and the bytes in and out. ``--rounds`` repeats the whole table (interleave
another tree's rounds by hand for before/after). Nothing is asserted: figures go to
docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from worker.bench.floor import build_bodies
from worker.bench.floor import make_service as _make_service

APIS = ("chat", "completion", "responses")
_DEFAULT_TOKENIZER = str(Path(__file__).resolve().parent.parent / "demo_data" / "qwen3")


def as_api(chat_body: bytes, api: str, top: int | None) -> bytes:
    """A ``floor.build_bodies`` chat body as the ``api`` body of the same ids and engine logprobs:
    ``completion`` (``completion_request.logprobs`` = ``top``), ``responses`` (``include``
    ``message.output_text.logprobs`` and ``top_logprobs``), ``chat`` unchanged. Raises
    ``ValueError`` on an unknown ``api``."""
    if api == "chat":
        return chat_body
    b = json.loads(chat_body)
    req = b.pop("chat_request")
    if api == "completion":
        creq: dict = {"model": b["model"], "prompt": "weather?", "max_tokens": 4096}
        if top is not None:
            creq["logprobs"] = top
        gen = b.pop("generate_response")
        out = {"model": b["model"], "generate_responses": [gen], "prompt_tokens": [b["prompt_tokens"]],
               "prompt_token_ids": [b["prompt_token_ids"]], "completion_request": creq}
    elif api == "responses":
        tools = [dict(type="function", **t["function"]) for t in req.get("tools") or []]
        rreq: dict = {"model": b["model"], "input": "weather?", "tools": tools}
        if top is not None:
            rreq["include"] = ["message.output_text.logprobs"]
            rreq["top_logprobs"] = top
        out = dict(b, responses_request=rreq)
    else:
        raise ValueError(f"unknown api {api!r}")
    return json.dumps(out, ensure_ascii=False).encode()


def _batch_cpu_s(src: Path, out: Path, config: Path, tree: str | None = None) -> float:
    """CPU seconds (user + system) of one ``derender-worker batch --workers 1`` subprocess (the
    code of ``tree``, a source tree put first on ``PYTHONPATH``, when given). Raises
    ``RuntimeError`` when it exits non-zero."""
    args = [sys.executable, "-m", "worker.cli", "batch", str(src), "-o", str(out), "--config", str(config),
            "--workers", "1", "--no-progress", "--output-format", "jsonl"]
    env = None
    if tree:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tree)
    err = proc.stderr.read() if proc.stderr else b""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"batch exited {proc.returncode}: {err[-1500:].decode(errors='replace')}")
    return ru.ru_utime + ru.ru_stime


def io_floor_us(lines: list[bytes], replies: list[bytes], repeats: int) -> float:
    """Best of ``repeats`` thread-CPU µs per record of the JSON I/O floor: untyped
    ``msgspec.json.decode`` of each input line plus ``msgspec.json.encode`` of each reply (decoded
    before the clock starts)."""
    decode, encode = msgspec.json.decode, msgspec.json.encode
    objs = [decode(r) for r in replies]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for x in lines:
            decode(x)
        for o in objs:
            encode(o)
        best = min(best, time.thread_time() - t0)
    return best / len(lines) * 1e6


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench logprobs``."""
    ap.add_argument("--apis", default=",".join(APIS), help=f"comma-separated subset of {', '.join(APIS)}")
    ap.add_argument("--tops", default="none,0,5,20", help="top_logprobs values; 'none' = no logprobs")
    ap.add_argument("--records", type=int, default=1000, help="records per batch run")
    ap.add_argument("--distinct", type=int, default=16, help="distinct bodies cycled through")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per record")
    ap.add_argument("--tokenizer", default=_DEFAULT_TOKENIZER, help="tokenizer directory (Qwen3 family)")
    ap.add_argument("--floor-repeats", type=int, default=5, help="floor runs (best is printed)")
    ap.add_argument("--rounds", type=int, default=1, help="times the whole table is measured")
    ap.add_argument("--trees", default="",
                    help="comma-separated source trees whose batch is measured in turn, each round (e.g. a "
                         "worktree of the previous release and this one: interleaved before/after); default: this one")
    ap.add_argument("--dir", default=None,
                    help="where to write the logs and outputs, kept (default: a temporary folder, deleted at the end)")


def _write_config(path: Path, tokenizer: str) -> None:
    path.write_text(json.dumps({"qwen3": {"tokenizer": tokenizer, "reasoning_parser": "qwen3",
                                          "tool_parser": "hermes", "enable_auto_tool_choice": True,
                                          "max_logprobs": 20}}))


def run_suite(args: argparse.Namespace) -> int:
    """Print one line per (api, top): product and floor CPU per record and their multiple;
    returns 0, 1 when a batch output is not replies, or 2 on a bad flag value. The generated
    files are deleted at the end unless ``--dir`` names where to keep them."""
    apis = [a for a in args.apis.split(",") if a]
    try:
        tops = [None if t == "none" else int(t) for t in args.tops.split(",") if t]
    except ValueError:
        print(f"derender-worker bench logprobs: bad --tops {args.tops!r}", file=sys.stderr)
        return 2
    if set(apis) - set(APIS) or args.records < 1:
        print(f"derender-worker bench logprobs: --apis must be a subset of {APIS}, --records >= 1", file=sys.stderr)
        return 2
    trees = [os.path.abspath(t) for t in args.trees.split(",") if t] or [None]
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_logprobs_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _measure(args, apis, tops, trees, work)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def _measure(args: argparse.Namespace, apis: list[str], tops: list[int | None], trees: list, work: Path) -> int:
    """The rounds of ``run_suite`` in ``work``; returns 0, or 1 when a batch output is not replies."""
    config = work / "models.json"
    _write_config(config, args.tokenizer)
    tok = _make_service(args.tokenizer).runtime("qwen3").tokenizer
    empty = work / "empty.jsonl"
    empty.write_bytes(b"")
    print(f"bench_logprobs: batch --workers 1, {args.records} records of {args.tokens} tokens (Qwen3 reasoning + "
          f"hermes call) per run, CPU less an empty run's; floor = msgspec untyped decode of each line + encode "
          f"of each reply; load average {os.getloadavg()[0]:.2f}", flush=True)
    for rnd in range(args.rounds):
        for api in apis:
            for top in tops:
                bodies, _ = build_bodies(tok, "qwen3", args.tokens, args.distinct, top_logprobs=top)
                lines = [as_api(b, api, top) for b in bodies]
                lines = [lines[i % len(lines)] for i in range(args.records)]
                src = work / f"{api}-{top}.jsonl"
                out = work / f"{api}-{top}.out.jsonl"
                src.write_bytes(b"\n".join(lines) + b"\n")
                fl = None
                for tree in trees:
                    base = min(_batch_cpu_s(empty, work / "empty.out.jsonl", config, tree) for _ in range(2))
                    cpu = _batch_cpu_s(src, out, config, tree)
                    replies = out.read_bytes().splitlines()
                    if len(replies) != len(lines) or b'"error"' in replies[0][:40]:
                        print(f"  {api} top {top}: bad output: {replies[0][:300]!r}", file=sys.stderr)
                        return 1
                    if cpu - base < base:  # start-up's own swing (~0.1-0.3 s) would be the figure
                        print(f"  round {rnd + 1} {api:10s} top {str(top):4s}: too few records: the run took "
                              f"{cpu:.2f} s of CPU against {base:.2f} s of start-up; raise --records "
                              f"(figures are read once the records cost more than start-up)", flush=True)
                        continue
                    prod = (cpu - base) / len(lines) * 1e6
                    if fl is None:
                        fl = io_floor_us(lines, replies, args.floor_repeats)
                    kb_in = sum(map(len, lines)) / len(lines) / 1024
                    kb_out = sum(map(len, replies)) / len(replies) / 1024
                    label = f" [{tree}]" if tree else ""
                    print(f"  round {rnd + 1} {api:10s} top {str(top):4s}: product {prod:8.1f} us/record  floor "
                          f"{fl:7.1f} us  {prod / fl:5.2f}x   ({kb_in:.0f} KB in, {kb_out:.0f} KB out; start-up "
                          f"{base:.2f} s; load {os.getloadavg()[0]:.2f}){label}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m worker.bench.logprobs``."""
    ap = argparse.ArgumentParser(prog="python -m worker.bench.logprobs", description=__doc__.split("\n")[0])
    add_args(ap)
    return run_suite(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
