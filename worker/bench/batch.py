"""``derender-worker bench batch`` (``python -m worker.bench.batch``): batch-mode throughput and memory on generated logs.

Generates JSONL logs of parsed Qwen3 chat derender bodies (``worker.bench.core.build_bodies``:
``--tokens`` output tokens with reasoning, content and a Hermes tool call; each body's prompt
padded to ``--prompt-tokens`` ids, as RL rollouts carry long prompts) cycled until the file
reaches the wanted size, then runs ``derender-worker batch`` on them as subprocesses (the demo's
served model) and prints, per run: records/s (from the batch summary: derender time, without
start-up), wall seconds, and the peak resident memory of the batch process tree (sampled from
``/proc`` every 0.1 s: the parent alone, and the parent plus its worker processes).

Runs: ``local1`` (``--workers 1``), ``local2`` (``--workers 2``), ``ray`` (``--engine ray
--workers 2`` on a local Ray started by the run; its RSS covers the driver only) on a
``--speed-mb`` log (for Ray, whose run includes its actors' start-up, the time to the first
results and the rate from then on are printed as well); ``memory`` (``--workers 2``) on a ``--size-mb`` log (default 1 GiB) to show
that memory is bounded by the records in flight, not the input size. The generated files live in
``--dir`` (a temporary folder by default) and are deleted unless ``--keep``. Nothing is asserted:
figures go to docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from worker.bench.core import DEMO, build_bodies
from worker.config import load_config_file
from worker.core.service import DerenderService
from worker.offline.ray_engine import run_ray
from worker.offline.summary import summary_lines

MODES = ("local1", "local2", "ray", "memory")


def generate(path: Path, size_bytes: int, tokens: int, prompt_tokens: int, distinct: int = 64) -> int:
    """Write a JSONL log of at least ``size_bytes``; returns the number of lines."""
    service = DerenderService(load_config_file(DEMO / "models.json"))
    bodies = []
    for raw in build_bodies(service, "qwen3", tokens, distinct):
        b = json.loads(raw)
        ids = b["prompt_token_ids"]
        b["prompt_token_ids"] = (ids * (prompt_tokens // len(ids) + 1))[:prompt_tokens]
        b["prompt_tokens"] = prompt_tokens
        bodies.append(json.dumps(b, separators=(",", ":")).encode() + b"\n")
    n = 0
    written = 0
    with open(path, "wb") as f:
        while written < size_bytes:
            line = bodies[n % len(bodies)]
            f.write(line)
            written += len(line)
            n += 1
    return n


def _tree_rss_kib(pid: int) -> tuple[int, int]:
    """(RSS of ``pid``, RSS of ``pid`` + its descendants) in KiB, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/status") as fh:
                m = re.search(r"VmRSS:\s+(\d+)", fh.read())
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
        rss[int(d)] = int(m.group(1)) if m else 0
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return rss.get(pid, 0), total


def run(mode: str, src: Path, out: Path) -> dict:
    """Run one batch subprocess; returns its figures. Raises ``RuntimeError`` when it fails."""
    args = [sys.executable, "-m", "worker.cli", "batch", str(src), "-o", str(out), "--config",
            str(DEMO / "models.json"), "--no-progress"]
    args += {"local1": ["--workers", "1"], "local2": ["--workers", "2"], "memory": ["--workers", "2"],
             "ray": ["--engine", "ray", "--workers", "2"]}[mode]
    if mode == "ray":  # run_ray in a child of this module, to print the actors' start-up time
        args = [sys.executable, "-m", "worker.bench.batch", "--ray-child", str(src), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_parent = peak_tree = 0
    while proc.poll() is None:
        p, t = _tree_rss_kib(proc.pid)
        peak_parent, peak_tree = max(peak_parent, p), max(peak_tree, t)
        time.sleep(0.1)
    err = proc.stderr.read() if proc.stderr else ""
    wall = time.perf_counter() - t0
    m = re.search(r"batch: (\d+) records, (\d+) ok.*?; ([\d.]+) s \(([\d.]+) records/s\)", err)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"{mode}: batch exited {proc.returncode}: {err[-1500:]}")
    startup = re.search(r"start-up ([\d.]+) s", err)
    return {"startup_s": float(startup.group(1)) if startup else None, "mode": mode, "records": int(m.group(1)), "ok": int(m.group(2)), "seconds": float(m.group(3)),
            "records_per_s": float(m.group(4)), "wall_s": round(wall, 1),
            "peak_rss_parent_mib": round(peak_parent / 1024), "peak_rss_tree_mib": round(peak_tree / 1024)}


def ray_child(src: str, out: str) -> int:
    """``--ray-child SRC OUT``: ``batch --engine ray --workers 2`` through ``run_ray``, printing the
    batch summary and the time to the first results (the actors' start-up)."""
    service = DerenderService(load_config_file(DEMO / "models.json"))
    s = run_ray(service, src, out, workers=2, batch_size=256, progress=False)
    for line in summary_lines(s, out):
        print(line, file=sys.stderr)
    print(f"batch: start-up {s['startup_s']} s", file=sys.stderr)
    return 0


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench batch``."""
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    ap.add_argument("--speed-mb", type=float, default=16, help="log size of the throughput runs (MiB)")
    ap.add_argument("--size-mb", type=float, default=1024, help="log size of the memory run (MiB)")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per record")
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="prompt ids per record")
    ap.add_argument("--dir", default=None, help="where to generate the logs (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated logs and outputs")


def run_suite(args: argparse.Namespace) -> int:
    """Generate the logs, run the chosen modes, print one line per run; returns 0, or 2 on an
    unknown mode."""
    modes = [m for m in args.modes.split(",") if m]
    bad = set(modes) - set(MODES)
    if bad:
        print(f"derender-worker bench batch: unknown modes {sorted(bad)}", file=sys.stderr)
        return 2
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_batch_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"bench_batch: {os.cpu_count()} cores; records: {args.tokens} output tokens (reasoning + content + tool "
          f"call), {args.prompt_tokens} prompt ids; logs in {work}", flush=True)
    created: list[Path] = []
    try:
        for mode in modes:
            mb = args.size_mb if mode == "memory" else args.speed_mb
            src = work / f"log-{mb:g}mb.jsonl"
            if not src.exists():
                t0 = time.perf_counter()
                n = generate(src, int(mb * 2**20), args.tokens, args.prompt_tokens)
                created.append(src)
                print(f"  generated {src.name}: {n} records, {src.stat().st_size / 2**20:.0f} MiB "
                      f"in {time.perf_counter() - t0:.0f} s", flush=True)
            out = work / f"out-{mode}.jsonl"
            created.append(out)
            r = run(mode, src, out)
            print(f"  {mode:7s} {src.stat().st_size / 2**20:6.0f} MiB  {r['records']:7d} records  "
                  f"{r['records_per_s']:7.0f} records/s  ({r['seconds']} s derendering, {r['wall_s']} s wall)  "
                  f"peak RSS parent {r['peak_rss_parent_mib']} MiB, with workers {r['peak_rss_tree_mib']} MiB"
                  + (f"; first results after {r['startup_s']} s (actors loading tokenizers), "
                     f"{(r['records'] / max(1e-9, r['seconds'] - r['startup_s'])):.0f} records/s from then on"
                     if r["startup_s"] is not None else ""), flush=True)
    finally:
        if not args.keep:
            for p in created:
                p.unlink(missing_ok=True)
            if args.dir is None:
                try:
                    work.rmdir()
                except OSError:
                    pass
    return 0



def main(argv: list[str] | None = None) -> int:
    """``python -m worker.bench.batch [flags]`` (also ``--ray-child SRC OUT``, used by the ray mode)."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--ray-child"]:
        return ray_child(argv[1], argv[2])
    ap = argparse.ArgumentParser(prog="derender-worker bench batch", description=__doc__.splitlines()[0])
    add_args(ap)
    return run_suite(ap.parse_args(argv))

if __name__ == "__main__":
    sys.exit(main())
