"""``derender-worker bench`` / ``bench core``: single-core derender throughput on parsed chat outputs.

Builds N distinct Qwen3 chat outputs of exactly ``--tokens`` output tokens each (reasoning in
``<think>``, an answer, and a Hermes tool call, closed by ``<|im_end|>``), tokenized with the real
Qwen3 tokenizer shipped for the demo, wraps each in a ``DerenderChatRequest`` body (with prompt
ids and the OpenAI request carrying tools), and times ``DerenderService.derender`` (JSON decode,
validation, detokenization, reasoning + tool parsing, response encode) in this one process.
Prints responses/s and output tokens/s, then the same for the same ids as Responses API bodies
(``responses_request``, issue 14) next to them; nothing is asserted (targets live in
docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from worker.bench import floor
from worker.config import ServedModelConfig, load_config_file, models_from_args
from worker.core.service import DerenderService
from worker.flags import startup_error

DEMO = Path(__file__).resolve().parent.parent / "demo_data"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]

_WORDS = ("the user wants weather for a city so I should call the tool with the city name and a unit "
          "then summarise the answer briefly in plain words for them").split()


def build_bodies(service: DerenderService, model: str, n_tokens: int, count: int) -> list[bytes]:
    """``count`` distinct chat derender bodies whose outputs are exactly ``n_tokens`` ids long.
    Raises ``ValueError`` when ``n_tokens`` is too small to hold the markup (< 64)."""
    if n_tokens < 64:
        raise ValueError("--tokens must be at least 64")
    tok = service.runtime(model).tokenizer
    encode = tok.encode
    prompt = encode("<|im_start|>user\nWhat's the weather like in Paris today?<|im_end|>\n<|im_start|>assistant\n")
    bodies = []
    for k in range(count):
        tail = encode(f"</think>\n\nLet me check that.\n<tool_call>\n"
                      f'{{"name": "get_weather", "arguments": {{"city": "Paris {k}", "unit": "c"}}}}'
                      f"\n</tool_call><|im_end|>")
        head = encode("<think>\n")
        filler: list[int] = []
        i = k
        while len(head) + len(filler) + len(tail) < n_tokens:
            filler.extend(encode(" " + _WORDS[i % len(_WORDS)]))
            i += 1
        ids = (head + filler)[: n_tokens - len(tail)] + tail
        body = {"model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
                "generate_response": {"request_id": f"bench-{k}", "choices": [
                    {"index": 0, "token_ids": ids, "finish_reason": "stop"}]},
                "chat_request": {"model": model, "messages": [{"role": "user", "content": "weather?"}],
                                 "tools": TOOLS}}
        bodies.append(json.dumps(body).encode())
    return bodies


def responses_body(chat_body: bytes) -> bytes:
    """A ``build_bodies`` chat body turned into the Responses body of the same ids (the tools in
    the Responses API's shape)."""
    b = json.loads(chat_body)
    tools = [dict(type="function", **t["function"]) for t in b.pop("chat_request").get("tools") or []]
    b["responses_request"] = {"model": b["model"], "input": "weather?", "tools": tools}
    return json.dumps(b).encode()


def messages_body(chat_body: bytes) -> bytes:
    """A ``build_bodies`` chat body turned into the Anthropic Messages body of the same ids (the
    tools in Anthropic's shape, issue 26)."""
    b = json.loads(chat_body)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"].get("parameters")}
             for t in b.pop("chat_request").get("tools") or []]
    b["messages_request"] = {"model": b["model"], "max_tokens": 4096, "messages": [], "tools": tools}
    return json.dumps(b).encode()


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench core`` (the model flags, as in ``run``/``batch``, are added by
    ``worker.config.add_model_args``; without ``--model``/``--tokenizer``/``--config`` the demo's
    Qwen3 model is benchmarked)."""
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per response")
    ap.add_argument("--distinct", type=int, default=64, help="distinct bodies cycled through")
    ap.add_argument("--seconds", type=float, default=5.0, help="time per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    floor.add_args(ap)


def run_bench(service: DerenderService, model: str, tokens: int, distinct: int, seconds: float,
              repeats: int, kind: str = "chat") -> dict:
    """Time derenders of ``build_bodies`` outputs as ``kind`` ``chat`` bodies or ``responses``
    bodies (``responses_body``, the same ids); returns ``{"responses_per_s": median,
    "tokens_per_s": median, "runs": [...], "parsed": bool}`` (``parsed``: the bodies came out as
    reasoning + a tool call, i.e. the model has Qwen3/Hermes-style parsers; other models derender
    the same ids as plain text). Raises ``RuntimeError`` if a body does not derender (the
    benchmark would be meaningless)."""
    bodies = build_bodies(service, model, tokens, distinct)
    if kind == "responses":
        bodies = [responses_body(b) for b in bodies]
    for b in bodies[:2]:
        res = service.derender(b, kind)
        if res.is_error:
            raise RuntimeError(f"benchmark body rejected: {res.body[:300]!r}")
    out = json.loads(service.derender(bodies[0], kind).body)
    if kind == "responses":
        types = [it["type"] for it in out.get("output", [])]
        parsed = "reasoning" in types and "function_call" in types
    else:
        msg = out["choices"][0]["message"]
        parsed = bool(msg.get("reasoning") and msg.get("tool_calls"))
    runs = []
    for _ in range(repeats):
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            for b in bodies:
                service.derender(b, kind)
            n += len(bodies)
        dt = time.perf_counter() - t0
        runs.append(n / dt)
    med = statistics.median(runs)
    return {"responses_per_s": med, "tokens_per_s": med * tokens, "runs": runs, "parsed": parsed}


def bench_models(args: argparse.Namespace) -> tuple[list[ServedModelConfig], str]:
    """``(served models, served name to benchmark)`` from the model flags: ``--config`` /
    ``--model`` / ``--tokenizer`` as in ``run``, else the demo's Qwen3 config; the name is the
    first ``--served-model-name``, else the first model's. Raises ``ValueError``."""
    if not (args.config or args.tokenizer or args.model):
        models = load_config_file(DEMO / "models.json")
    else:
        models = models_from_args(args)
    name = args.served_model_name[0] if args.served_model_name else models[0].name
    return models, name


def run_suite(args: argparse.Namespace) -> int:
    """Print single-core throughput figures; returns 0, or 2 (one line) on a configuration error."""
    try:
        models, name = bench_models(args)
        service = DerenderService(models)
        service.preload()
        r = run_bench(service, name, args.tokens, args.distinct, args.seconds, args.repeats)
    except (ValueError, OSError, RuntimeError) as e:
        return startup_error("derender-worker bench", str(e))
    try:
        rr: dict | None = run_bench(service, name, args.tokens, args.distinct, args.seconds, args.repeats,
                                    "responses")
        skipped = ""
    except RuntimeError as e:  # a model whose config refuses the Responses body: chat figures stand
        rr, skipped = None, str(e)
    print(f"derender bench: model={name} output_tokens={args.tokens} (reasoning + content + tool call), "
          f"1 process")
    print(f"  responses/s: {r['responses_per_s']:.0f}  (runs: {', '.join(f'{x:.0f}' for x in r['runs'])})")
    print(f"  output tokens/s: {r['tokens_per_s']:.0f}")
    if rr is not None:
        print(f"  Responses API (/v1/responses bodies of the same ids): {rr['responses_per_s']:.0f} records/s, "
              f"{rr['tokens_per_s']:.0f} output tokens/s, {rr['responses_per_s'] / r['responses_per_s']:.2f}x chat "
              f"(runs: {', '.join(f'{x:.0f}' for x in rr['runs'])})")
    else:
        print(f"  Responses API pass skipped: {skipped[:200]}")
    if not r["parsed"]:
        print("  note: the bodies (Qwen3 <think> + Hermes <tool_call> markup) were not parsed into reasoning + "
              "a tool call with this model's parsers")
    return floor.run_suite(args) if args.floor else 0
