"""Parser benchmark: parse throughput (output tokens/s) of every parser family.

``derender-worker bench parsers [--tokens 1000] [--repeats 5] [--only NAME]`` (also ``python -m worker.bench.parsers``) runs every
reasoning parser alone, every tool parser alone (request with tools, ``tool_choice: "auto"``) and
every reasoning + tool pairing (``worker.parsers.examples``) over one output of exactly
``--tokens`` tokens: the family's template padded with prose, tokenized with the demo Qwen3
tokenizer plus the family's markers as special tokens. The token-aligned text deltas are decoded
once (``IncrementalDetokenizer``, special tokens kept); then the parser stack alone is timed
(a) over the whole output as one delta (non-streaming) and (b) over 1-token deltas (streaming),
``initial_state`` to ``finish``. Figures are output tokens / median time over the repeats.

The ``check`` column shows what was parsed (calls found, reasoning chars) and ``ok`` when that is
the template's expected structure and the streaming result equals the non-streaming one; a broken
template shows ``BAD``. Nothing is asserted: the figures are targets, not tests.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from worker.core.detokenize import IncrementalDetokenizer
from worker.core.tokenizers import FastTokenizer, Tokenizer
from worker.parsers import make_reasoning_parser, make_tool_parser
from worker.parsers.base import RequestContext
from worker.parsers.examples import MARKERS, PAD_C, PAD_R, PROSE, Case, Example, cases
from worker.parsers.stack import ParserStack

DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "demo_data" / "qwen3" / "tokenizer.json"
#: share of the padding that goes to the reasoning slot when a template has both slots
REASONING_SHARE = 0.7


@functools.cache
def family_tokenizer(markers: tuple[str, ...], path: str = str(DEMO_TOKENIZER)) -> Tokenizer:
    """The Qwen3 tokenizer at ``path`` with the markers of families ``markers`` added as special
    tokens, wrapped by ``FastTokenizer.from_fast``."""
    fast = HFTokenizer.from_file(path)
    extra = [m for key in markers for m in MARKERS[key]]
    if extra:
        fast.add_special_tokens(list(dict.fromkeys(extra)))
    return FastTokenizer.from_fast(fast, path=f"<qwen3+{'+'.join(markers)}>")


def build_ids(tok: Tokenizer, ex: Example, n_tokens: int) -> list[int]:
    """Token ids of ``ex``'s template with its padding slots filled with prose so the output has
    exactly ``n_tokens`` ids (the markup is never cut; a template longer than ``n_tokens`` is
    returned unpadded)."""
    parts: list[tuple[str, str]] = []  # (kind, text): kind "text" | "R" | "C"
    rest = ex.template
    while rest:
        i_r, i_c = rest.find(PAD_R), rest.find(PAD_C)
        hits = [(i, k, s) for i, k, s in ((i_r, "R", PAD_R), (i_c, "C", PAD_C)) if i >= 0]
        if not hits:
            parts.append(("text", rest))
            break
        i, kind, slot = min(hits)
        if i:
            parts.append(("text", rest[:i]))
        parts.append((kind, ""))
        rest = rest[i + len(slot):]
    fixed = [tok.encode(t) if k == "text" else [] for k, t in parts]
    budget = max(n_tokens - sum(len(f) for f in fixed), 0)
    slots = [k for k, _ in parts if k != "text"]
    share: dict[str, int] = {}
    if "R" in slots and "C" in slots:
        share["R"] = int(budget * REASONING_SHARE)
        share["C"] = budget - share["R"]
    elif slots:
        share[slots[0]] = budget
    prose = tok.encode(PROSE)
    out: list[int] = []
    for (kind, _), ids in zip(parts, fixed, strict=True):
        if kind == "text":
            out.extend(ids)
            continue
        n = share.pop(kind, 0)  # a slot used twice is padded once
        pad = (prose * (n // len(prose) + 1))[:n]
        out.extend(pad)
    return out


def token_deltas(tok: Tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds, as vLLM streams it with ``skip_special_tokens=False``."""
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    return [detok.add([i]) for i in ids]


@dataclass
class Prepared:
    case: Case
    stack: ParserStack
    ctx: RequestContext
    ids: list[int]
    deltas: list[str]
    whole: str


def prepare(case: Case, n_tokens: int, path: str = str(DEMO_TOKENIZER)) -> Prepared:
    """Tokenizer, stack, request, output ids and their 1-token text deltas for ``case``."""
    tok = family_tokenizer(case.example.markers, path)
    stack = ParserStack(make_reasoning_parser(case.reasoning_parser, tok), make_tool_parser(case.tool_parser, tok),
                        enable_auto_tool_choice=True)
    ctx = RequestContext(tools=case.tools, tool_choice="auto" if case.tools else None,
                         chat_template_kwargs=case.example.kwargs)
    ids = build_ids(tok, case.example, n_tokens)
    deltas = token_deltas(tok, ids)
    return Prepared(case, stack, ctx, ids, deltas, "".join(deltas))


def parse(p: Prepared, chunks: list[tuple[str, list[int]]]) -> tuple[str, str, list[tuple[str, Any]]]:
    """Run the stack over ``chunks`` ((text, token ids) pairs) and collect reasoning, content and
    calls ``(name, arguments)`` (arguments JSON-decoded, or the raw text when it is not JSON)."""
    stack = p.stack
    st = stack.initial_state(p.ctx)
    reasoning, content = [], []
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}

    def take(d):
        reasoning.append(d.reasoning)
        content.append(d.content)
        for c in d.tool_calls:
            if c.name is not None:
                names[c.index] = c.name
            args.setdefault(c.index, []).append(c.arguments)

    for text, ids in chunks:
        take(stack.feed(st, text, ids))
    take(stack.finish(st))
    calls = []
    for i in sorted(args):
        raw = "".join(args[i])
        try:
            calls.append((names.get(i, "?"), json.loads(raw)))
        except ValueError:
            calls.append((names.get(i, "?"), raw))
    return "".join(reasoning), "".join(content), calls


def whole_chunks(p: Prepared) -> list[tuple[str, list[int]]]:
    return [(p.whole, p.ids)]


def stream_chunks(p: Prepared) -> list[tuple[str, list[int]]]:
    return [(d, [i]) for d, i in zip(p.deltas, p.ids, strict=True)]


def check(p: Prepared) -> tuple[bool, str]:
    """(ok, summary): the parsed structure matches the template's expectation and streaming gives
    the non-streaming result."""
    r, c, calls = parse(p, whole_chunks(p))
    same = parse(p, stream_chunks(p)) == (r, c, calls)
    ex = p.case.example
    names = {t["function"]["name"] for t in (p.case.tools or [])}
    ok = same and len(calls) == ex.calls and all(n in names and isinstance(a, dict) for n, a in calls)
    if p.case.reasoning_parser is not None:
        ok = ok and (len(r) > 0 if ex.reasoning else (r == "" and "</think>" in c))
    summary = f"calls={len(calls)} reasoning={len(r)}ch"
    if not same:
        summary += " stream!=whole"
    return ok, summary


def _time(p: Prepared, chunks: list[tuple[str, list[int]]], repeats: int) -> float:
    stack, ctx = p.stack, p.ctx
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        st = stack.initial_state(ctx)
        for text, ids in chunks:
            stack.feed(st, text, ids)
        stack.finish(st)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench parsers``."""
    ap.add_argument("--tokens", type=int, default=1000, help="output length in tokens (default 1000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per mode; the median is reported")
    ap.add_argument("--only", action="append", default=None,
                    help="run only this family (case name, e.g. qwen3+hermes, or a parser name); repeatable")


def main(argv: list[str] | None = None) -> int:
    """``python -m worker.bench.parsers [flags]``."""
    ap = argparse.ArgumentParser(prog="derender-worker bench parsers", description=__doc__.splitlines()[0])
    add_args(ap)
    return run_suite(ap.parse_args(argv))


def run_suite(args: argparse.Namespace) -> int:
    """Time every selected family and print one row each; returns 0, or 2 when ``--only`` matches
    no family."""
    selected = [c for c in cases() if not args.only or c.name in args.only
                or c.reasoning_parser in args.only or c.tool_parser in args.only]
    if not selected:
        print(f"no family matches {args.only}", file=sys.stderr)
        return 2
    width = max(len(c.name) for c in selected)
    header = f"{'family':<{width}}  {'kind':<9}  {'tokens':>6}  {'non-stream tok/s':>16}  {'stream tok/s':>12}  check"
    print(header)
    print("-" * len(header))
    bad = 0
    for case in selected:
        p = prepare(case, args.tokens)
        ok, summary = check(p)
        bad += not ok
        n = len(p.ids)
        whole = _time(p, whole_chunks(p), args.repeats)
        stream = _time(p, stream_chunks(p), args.repeats)
        print(f"{case.name:<{width}}  {case.kind:<9}  {n:>6}  {n / whole:>16,.0f}  {n / stream:>12,.0f}  "
              f"{'ok ' if ok else 'BAD'} {summary}", flush=True)
    if bad:
        print(f"\n{bad} famil{'y' if bad == 1 else 'ies'} did not parse into the expected structure (BAD)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
