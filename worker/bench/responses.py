"""Responses API benchmark (issue 14): the Responses paths (and the Anthropic Messages paths,
issue 26) next to chat, same token ids.

``derender-worker bench responses`` (also ``python -m worker.bench.responses`` and, for old
command lines, ``python -m worker.bench_responses``) ``[--tokenizer DIR] [--tokens 256] [--stream-tokens 2048]
[--seconds 3] [--repeat 3]`` prints, in this one process (Qwen3 tokenizer, qwen3 reasoning +
hermes tools, ``--tool-call-streaming incremental``):

* per record: ``DerenderService.derender`` of the same outputs (reasoning, an answer, a tool
  call) as a chat body and as a Responses body: records and output tokens per second of thread
  CPU time (runs interleaved);
* per chunk: a ``--stream-tokens`` output streamed in 1-token chunks through
  ``derender_stream`` (chat) and ``derender_responses_stream`` (Responses, the piece log kept in
  memory: only an item's close and the terminal event read it), with logprobs off and with
  ``top_logprobs`` 20: the median per-chunk thread CPU time around chunks 16, 256, 1024 and the last
  (median over the chunk and the 7 before it, across repeats), the ratio last/first (flat work
  per chunk: <= 1.5 expected), the stored state size and the piece log's final size, and the
  terminal chunk's reply size (it repeats the whole response).

Nothing is asserted; targets and figures live in docs/performance.md and docs/responses.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from worker.bench.core import build_bodies, messages_body, responses_body
from worker.bench.stream import build_output, stream_bodies, stream_pass
from worker.config import ServedModelConfig
from worker.core.service import DerenderService

_DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "demo_data" / "qwen3"


def _rate(service: DerenderService, bodies: list[bytes], kind: str, seconds: float, repeats: int) -> float:
    """Records per second of this thread's CPU time (``time.thread_time``: other jobs on a shared
    machine do not count), median of ``repeats`` runs of ``seconds`` of CPU time each."""
    runs = []
    for _ in range(repeats):
        n, t0 = 0, time.thread_time()
        while time.thread_time() - t0 < seconds:
            for b in bodies:
                service.derender(b, kind)
            n += len(bodies)
        runs.append(n / (time.thread_time() - t0))
    return statistics.median(runs)


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench responses``."""
    ap.add_argument("--tokenizer", default=str(_DEMO_TOKENIZER), help="tokenizer directory (default: the demo's Qwen3)")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per record (per-record pass)")
    ap.add_argument("--stream-tokens", type=int, default=2048, help="output tokens of the per-chunk pass (1-token chunks)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of each timed per-record run")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each path, in both passes (chat and Responses interleaved)")


def main(argv: list[str] | None = None) -> int:
    """``python -m worker.bench.responses [flags]``."""
    ap = argparse.ArgumentParser(prog="derender-worker bench responses", description=__doc__.splitlines()[0])
    add_args(ap)
    return run_suite(ap.parse_args(argv))


def run_suite(args: argparse.Namespace) -> int:
    """Print the figures of the module docstring; returns 0, or 1 when the bench body does not
    parse as expected."""
    svc = DerenderService([ServedModelConfig(name="qwen3", tokenizer=args.tokenizer, reasoning_parser="qwen3",
                                             tool_parser="hermes", enable_auto_tool_choice=True,
                                             tool_call_streaming="incremental")])
    svc.preload()
    chat = build_bodies(svc, "qwen3", args.tokens, 32)
    resp = [responses_body(b) for b in chat]
    out = json.loads(svc.derender(resp[0], "responses").body)
    if [it["type"] for it in out.get("output", [])] != ["reasoning", "message", "function_call"]:
        print(f"bench body not parsed as expected: {json.dumps(out)[:300]}", file=sys.stderr)
        return 1
    msgs = [messages_body(b) for b in chat]  # issue 26: the Anthropic Messages path on the same ids
    out = json.loads(svc.derender(msgs[0], "messages").body)
    if [c["type"] for c in out.get("content", [])] != ["thinking", "text", "tool_use"]:
        print(f"bench body not parsed as expected: {json.dumps(out)[:300]}", file=sys.stderr)
        return 1
    print(f"per record: {args.tokens} output tokens (reasoning + answer + tool call), qwen3 + hermes, 1 process "
          f"(chat, Responses and Messages runs interleaved, medians of {args.repeat})")
    runs: dict[str, list[float]] = {"chat": [], "responses": [], "messages": []}
    for _ in range(args.repeat):  # interleaved: a load change on a shared machine hits all
        for kind, bodies in (("chat", chat), ("responses", resp), ("messages", msgs)):
            runs[kind].append(_rate(svc, bodies, kind, args.seconds, 1))
    for kind, rs in runs.items():
        r = statistics.median(rs)
        print(f"  {kind:10s}: {r:8.0f} records/s  {r * args.tokens:10.0f} output tokens/s  "
              f"(runs: {', '.join(f'{x:.0f}' for x in rs)})")
    tok = svc.runtime("qwen3").tokenizer
    prompt, ids = build_output(tok, args.stream_tokens)
    print(f"per chunk: {len(ids)} tokens in 1-token chunks, state decoded/encoded per chunk, {args.repeat} repeats")
    for kind in ("chat", "responses", "messages"):
        for top in ((0,) if kind == "messages" else (0, 20)):
            s = stream_pass(svc, stream_bodies(prompt, ids, kind, top), kind, args.repeat)
            m = s["marks"]
            cells = "  ".join(f"#{x}: {s['lat'][x] * 1e6:6.1f} us" for x in m)
            print(f"  {kind:10s} top_logprobs {top:2d}: {cells}  ratio last/first {s['lat'][m[-1]] / s['lat'][m[0]]:.2f}"
                  f"; state max {max(s['sizes'])} B"
                  + (f", piece log {s['log']} B" if kind != "chat" else "")
                  + f", last reply {s['last_reply']} B, whole stream {s['total'] * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
