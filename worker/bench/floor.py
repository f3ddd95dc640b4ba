"""The floor pass of ``derender-worker bench core`` (also ``python -m worker.bench.floor``): the
derender core against the tokenizer's floor.

For each output length (``--tokens``, default 256, 1024 and 4096) builds ``--distinct`` Qwen3 chat
bodies (``<think>`` reasoning over mixed English/CJK/emoji words, an answer and a Hermes tool call
closed by ``<|im_end|>``, tokenized with the demo's real Qwen3 tokenizer) and measures, in thread
CPU time, best of ``--repeats`` runs (``time.thread_time``: other processes on a shared machine
do not count, but their cache and frequency effects do):

* **core**: ``DerenderService.derender(body)`` (JSON decode, validation, detokenization, reasoning +
  tool parsing, logprobs, response encode), µs per record;
* **floor**: ``tokenizers.Tokenizer.decode`` of the same output ids (one full decode, special
  tokens skipped), µs per record, the least any derender of those ids can cost;
* **core/floor**: floor µs / core µs (1.0 = the core costs one tokenizer decode; higher is better).

  The floor stays ``tokenizers``' own decode (issue 13 defines it so), but on a byte-level
  tokenizer such as this Qwen3 one the core no longer calls it: ``FastTokenizer.raw_decode``
  decodes by per-id byte-table lookups joined and UTF-8-decoded in C (the same text, checked at
  construction and by tests/test_table_decode.py), far cheaper than ``tokenizers``' per-id
  added-vocabulary and ByteLevel passes. The core can then cost less than the floor: a ratio
  above 1.0 is expected there, not a measuring error.

Then the logprobs cost at ``--logprob-tokens`` (default 256): the same bodies with
``logprobs: true`` and ``top_logprobs`` 0 / 5 / 20 (engine ``logprobs.content`` with as many
candidates), each as a multiple of the record without logprobs, and next to it the record's
**I/O floor** (``io_floor``: msgspec's typed decode of the same body + encode of its reply, µs)
and core / I/O floor: a top-20 body is ~280 KB of JSON in and its reply ~375 KB out, which no
derender reads and writes for less.

Last the **paths pass** (issue 25; ``--no-paths`` skips it): the same ids as chat, completion,
Responses and Messages bodies (``path_body``), without logprobs and at ``top_logprobs`` 5 and 20
(Messages without only: its API has no logprobs), each as thread CPU per record, a multiple of
its own typed I/O floor (``io_floor_of``) and a multiple of chat. Prints figures only; nothing is
asserted (targets live in docs/performance.md and issues 13 and 25).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import msgspec
from tokenizers import Tokenizer as FastTokenizer

from schemas import ChatCompletionResponse, CompletionResponse, DerenderChatRequest, DerenderCompletionRequest
from schemas.messages import DerenderMessagesRequest, Message
from schemas.responses import LOGPROBS_INCLUDE, DerenderResponsesRequest, ResponseObject
from worker.config import ServedModelConfig
from worker.core.service import DerenderService

DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "demo_data" / "qwen3"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]

_WORDS = ("the user wants weather for a city so I should call the tool 天气 预报 with the city name 🌤️ and a "
          "unit then summarise the answer 東京 briefly in plain words 😀 for them").split()


def build_bodies(tok, model: str, n_tokens: int, count: int, top_logprobs: int | None = None,
                 seed: int = 0) -> tuple[list[bytes], list[list[int]]]:
    """``(bodies, output ids)``: ``count`` distinct chat derender bodies whose outputs are exactly
    ``n_tokens`` ids long (``tok``: the runtime's tokenizer). ``top_logprobs`` None: no logprobs;
    an int k: the request asks ``logprobs: true, top_logprobs: k`` and every output id carries an
    engine logprob entry with k candidates (random ids, deterministic per ``seed``). Raises
    ``ValueError`` when ``n_tokens`` < 64 (too short for the markup)."""
    if n_tokens < 64:
        raise ValueError("--tokens must be at least 64")
    rng = random.Random(seed)
    encode = tok.encode
    vocab = min(tok.vocab_size, 150000)
    prompt = encode("<|im_start|>user\nWhat's the weather like in Paris today?<|im_end|>\n<|im_start|>assistant\n")
    pad = encode(" the")
    if len(pad) != 1:
        raise ValueError("the tokenizer does not encode ' the' as one token")
    bodies, outs = [], []
    for k in range(count):
        tail = encode(f"</think>\n\nLet me check that.\n<tool_call>\n"
                      f'{{"name": "get_weather", "arguments": {{"city": "Paris {k}", "unit": "c"}}}}'
                      f"\n</tool_call>") + [tok.token_to_id("<|im_end|>")]
        head = encode("<think>\n")
        filler: list[int] = []
        i = k
        while True:  # whole words only: a cut inside a multi-byte character is not model output
            w = encode(" " + _WORDS[i % len(_WORDS)])
            if len(head) + len(filler) + len(w) + len(tail) > n_tokens:
                break
            filler.extend(w)
            i += 1
        filler.extend(pad * (n_tokens - len(head) - len(filler) - len(tail)))
        ids = head + filler + tail
        choice: dict = {"index": 0, "token_ids": ids, "finish_reason": "stop"}
        req: dict = {"model": model, "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}
        if top_logprobs is not None:
            req["logprobs"] = True
            req["top_logprobs"] = top_logprobs
            choice["logprobs"] = {"content": [
                {"token_id": t, "logprob": -0.25, "rank": 1,
                 "top_logprobs": [{"token_id": t if j == 0 else rng.randrange(vocab),
                                   "logprob": -0.25 - j, "rank": j + 1} for j in range(top_logprobs)]}
                for t in ids]}
        body = {"model": model, "prompt_tokens": len(prompt), "prompt_token_ids": prompt,
                "generate_response": {"request_id": f"bench-{k}", "choices": [choice]},
                "chat_request": req}
        bodies.append(json.dumps(body, ensure_ascii=False).encode())
        outs.append(ids)
    return bodies, outs


def cpu_us_per_call(fn, items: list, seconds: float, repeats: int) -> tuple[float, list[float]]:
    """Best (lowest) of ``repeats`` runs of thread CPU µs per ``fn(item)``, each run cycling
    through ``items`` (at least once) for at least ``seconds`` of CPU time (the best run is the one least
    disturbed by other processes' cache and frequency effects, as ``timeit`` reports). Returns
    ``(best, runs)``."""
    runs = []
    for _ in range(repeats):
        n = 0
        t0 = time.thread_time()
        while True:  # at least one pass over ``items``
            for it in items:
                fn(it)
            n += len(items)
            if time.thread_time() - t0 >= seconds:
                break
        runs.append((time.thread_time() - t0) / n * 1e6)
    return min(runs), runs


def make_service(tokenizer: str) -> DerenderService:
    """The benchmarked service: Qwen3 reasoning + Hermes tools, auto tool choice, ``max_logprobs``
    20, no ``max_model_len`` (so 4k outputs pass). Raises ``ValueError`` on a bad tokenizer."""
    svc = DerenderService([ServedModelConfig(name="qwen3", tokenizer=tokenizer, reasoning_parser="qwen3",
                                             tool_parser="hermes", enable_auto_tool_choice=True,
                                             max_logprobs=20)])
    svc.preload()
    return svc


def _check(svc: DerenderService, bodies: list[bytes]) -> None:
    for b in bodies[:2]:
        res = svc.derender(b)
        if res.is_error:
            raise RuntimeError(f"benchmark body rejected: {res.body[:300]!r}")
        msg = json.loads(res.body)["choices"][0]["message"]
        if not (msg.get("reasoning") and msg.get("tool_calls")):
            raise RuntimeError("benchmark body did not parse into reasoning + a tool call")


def run(tokenizer: str, token_counts: list[int], logprob_tokens: int, distinct: int, seconds: float,
        repeats: int) -> dict:
    """Measure (module docstring). Returns ``{"lengths": [{"tokens", "core_us", "floor_us", "ratio"}],
    "logprobs": [{"top_logprobs", "core_us", "x", "decode_us", "encode_us", "io_x"}], "no_logprobs_us",
    "no_logprobs_io": {"decode_us", "encode_us"}}`` (``io_x``: core / (decode + encode)). Raises ``RuntimeError`` if a body does not
    derender into reasoning + a tool call (the figures would be meaningless)."""

    svc = make_service(tokenizer)
    tok = svc.runtime("qwen3").tokenizer
    floor_tok = FastTokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    out: dict = {"lengths": [], "logprobs": []}
    for n in token_counts:
        bodies, outs = build_bodies(tok, "qwen3", n, distinct)
        _check(svc, bodies)
        core, _ = cpu_us_per_call(svc.derender, bodies, seconds, repeats)
        floor, _ = cpu_us_per_call(lambda ids: floor_tok.decode(ids, skip_special_tokens=True), outs,
                                   seconds, repeats)
        out["lengths"].append({"tokens": n, "core_us": core, "floor_us": floor, "ratio": floor / core})
    base = None
    for k in (None, 0, 5, 20):
        bodies, _ = build_bodies(tok, "qwen3", logprob_tokens, distinct, top_logprobs=k)
        _check(svc, bodies)
        core, _ = cpu_us_per_call(svc.derender, bodies, seconds, repeats)
        dec, enc = io_floor(svc, bodies, seconds, repeats)
        if k is None:
            base = core
            out["no_logprobs_io"] = {"decode_us": dec, "encode_us": enc}
            continue
        out["logprobs"].append({"top_logprobs": k, "core_us": core, "x": core / base, "decode_us": dec,
                                "encode_us": enc, "io_x": core / (dec + enc)})
    out["no_logprobs_us"] = base
    return out


_reply_decoder = msgspec.json.Decoder(ChatCompletionResponse)
_body_decoder = msgspec.json.Decoder(DerenderChatRequest)
_encoder = msgspec.json.Encoder()


def io_floor(svc: DerenderService, bodies: list[bytes], seconds: float, repeats: int) -> tuple[float, float]:
    """The JSON I/O floor of derendering ``bodies``: ``(decode µs, encode µs)`` per record, thread
    CPU time, best of ``repeats`` runs: msgspec's typed decode of each body
    (``schemas.DerenderChatRequest``) and encode of its reply (the service's reply decoded into
    ``schemas.ChatCompletionResponse`` Structs beforehand, then encoded alone). No derender
    can cost less than reading its input and writing its output this way."""
    replies = [_reply_decoder.decode(svc.derender(b).body) for b in bodies]
    dec, _ = cpu_us_per_call(_body_decoder.decode, bodies, seconds, repeats)
    enc, _ = cpu_us_per_call(_encoder.encode, replies, seconds, repeats)
    return dec, enc


#: API path -> (record kind, body type, reply type): the typed I/O floor of each path
PATH_TYPES = {"chat": ("chat", DerenderChatRequest, ChatCompletionResponse),
              "completion": ("completion", DerenderCompletionRequest, CompletionResponse),
              "responses": ("responses", DerenderResponsesRequest, ResponseObject),
              "messages": ("messages", DerenderMessagesRequest, Message)}
#: the ``top_logprobs`` of the paths pass (None: no logprobs); Messages has no logprobs
#: (Anthropic's Messages API carries none), so it runs without them only
PATH_LOGPROBS = (None, 5, 20)


def path_body(chat_body: bytes, api: str) -> bytes:
    """A ``build_bodies`` chat body as the ``api`` body of the same ids and engine logprobs:
    ``completion`` (``completion_request.logprobs`` = the chat ``top_logprobs``, no parsers),
    ``responses`` (tools in the Responses shape; with logprobs ``include`` asks for them and
    ``top_logprobs`` is the chat one), ``messages`` (tools in Anthropic's shape, no logprobs
    requested). Raises ``KeyError`` for another ``api``."""
    if api not in PATH_TYPES:
        raise KeyError(api)
    if api == "chat":
        return chat_body
    b = json.loads(chat_body)
    req = b.pop("chat_request")
    k = req.get("top_logprobs") if req.get("logprobs") else None
    if api == "completion":
        gr = b.pop("generate_response")
        b["generate_responses"] = [gr]
        b["prompt_tokens"], b["prompt_token_ids"] = [b["prompt_tokens"]], [b["prompt_token_ids"]]
        b["completion_request"] = {"model": b["model"], "prompt": "weather?", "max_tokens": None}
        if k is not None:
            b["completion_request"]["logprobs"] = k
    elif api == "responses":
        tools = [dict(type="function", **t["function"]) for t in req.get("tools") or []]
        b["responses_request"] = {"model": b["model"], "input": "weather?", "tools": tools}
        if k is not None:
            b["responses_request"].update(include=[LOGPROBS_INCLUDE], top_logprobs=k)
    else:
        tools = [{"name": t["function"]["name"], "input_schema": t["function"].get("parameters")}
                 for t in req.get("tools") or []]
        b = {**{x: b[x] for x in ("model", "prompt_tokens", "prompt_token_ids", "generate_response")},
             "messages_request": {"model": b["model"], "max_tokens": 4096, "messages": [], "tools": tools}}
    return json.dumps(b, ensure_ascii=False).encode()


def io_floor_of(svc: DerenderService, api: str, bodies: list[bytes], seconds: float,
                repeats: int) -> tuple[float, float]:
    """``io_floor`` of ``api`` bodies (``PATH_TYPES``: the path's typed body decode and the
    encode of its reply decoded into the path's reply Structs), ``(decode µs, encode µs)``."""
    kind, body_t, reply_t = PATH_TYPES[api]
    rdec, bdec = msgspec.json.Decoder(reply_t), msgspec.json.Decoder(body_t)
    replies = [rdec.decode(svc.derender(b, kind).body) for b in bodies]
    dec, _ = cpu_us_per_call(bdec.decode, bodies, seconds, repeats)
    enc, _ = cpu_us_per_call(_encoder.encode, replies, seconds, repeats)
    return dec, enc


def run_paths(tokenizer: str, n_tokens: int, distinct: int, seconds: float, repeats: int,
              apis: tuple[str, ...] = tuple(PATH_TYPES)) -> list[dict]:
    """The paths pass: every API path (``apis``) over the same ``n_tokens`` ids, without logprobs
    and at ``top_logprobs`` 5 and 20 (``PATH_LOGPROBS``; Messages without only). Returns rows
    ``{"api", "top_logprobs", "core_us", "decode_us", "encode_us", "io_x", "x_chat"}`` (thread
    CPU µs per record, best of ``repeats``; ``io_x``: core / (decode + encode); ``x_chat``: core
    / chat's core at the same ``top_logprobs``). Raises ``RuntimeError`` if a body is refused."""
    svc = make_service(tokenizer)
    tok = svc.runtime("qwen3").tokenizer
    rows: list[dict] = []
    for k in PATH_LOGPROBS:
        chat_bodies, _ = build_bodies(tok, "qwen3", n_tokens, distinct, top_logprobs=k)
        _check(svc, chat_bodies)
        chat_us = None
        for api in apis:
            if api == "messages" and k is not None:
                continue
            kind = PATH_TYPES[api][0]
            bodies = [path_body(b, api) for b in chat_bodies]
            for b in bodies[:2]:
                res = svc.derender(b, kind)
                if res.is_error:
                    raise RuntimeError(f"{api} benchmark body rejected: {res.body[:300]!r}")
            core, _ = cpu_us_per_call(lambda b, kind=kind: svc.derender(b, kind), bodies, seconds, repeats)
            dec, enc = io_floor_of(svc, api, bodies, seconds, repeats)
            if api == "chat":
                chat_us = core
            rows.append({"api": api, "top_logprobs": k, "core_us": core, "decode_us": dec, "encode_us": enc,
                         "io_x": core / (dec + enc), "x_chat": core / chat_us if chat_us else None})
    return rows


def print_paths(rows: list[dict], n_tokens: int, repeats: int) -> None:
    """Print ``run_paths`` rows as one table."""
    print(f"every API path at {n_tokens} tokens (same ids and parsers; thread CPU per record, best of {repeats} "
          "runs; I/O floor: msgspec typed decode of the body + encode of the reply)")
    print(f"  {'path':<11} {'top_logprobs':>12} {'core us':>9} {'I/O floor us':>13} {'x I/O floor':>12} "
          f"{'x chat':>7}")
    for x in rows:
        k = "-" if x["top_logprobs"] is None else str(x["top_logprobs"])
        xc = "-" if x["x_chat"] is None else f"{x['x_chat']:.2f}"
        print(f"  {x['api']:<11} {k:>12} {x['core_us']:9.1f} {x['decode_us'] + x['encode_us']:13.1f} "
              f"{x['io_x']:11.2f}x {xc:>7}")


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of the floor pass (prefixed ``--floor-`` so they sit beside ``bench core``'s own)."""
    ap.add_argument("--floor-tokenizer", default=str(DEMO_TOKENIZER),
                    help="a Qwen3-vocabulary tokenizer directory for the floor pass")
    ap.add_argument("--floor-tokens", type=int, nargs="+", default=[256, 1024, 4096],
                    help="output lengths of the floor pass")
    ap.add_argument("--floor-logprob-tokens", type=int, default=256, help="output length of the logprobs pass")
    ap.add_argument("--floor-distinct", type=int, default=16, help="distinct bodies cycled through")
    ap.add_argument("--floor-seconds", type=float, default=1.0, help="CPU seconds per run")
    ap.add_argument("--floor-repeats", type=int, default=5)
    ap.add_argument("--no-floor", dest="floor", action="store_false", help="skip the floor pass")
    ap.add_argument("--no-paths", dest="paths", action="store_false",
                    help="skip the paths pass (every API path, with and without logprobs)")


def run_suite(args: argparse.Namespace) -> int:
    """Print the figures (module docstring); returns 0, or 2 on a bad tokenizer/body."""
    try:
        r = run(args.floor_tokenizer, args.floor_tokens, args.floor_logprob_tokens, args.floor_distinct,
                args.floor_seconds, args.floor_repeats)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"derender-worker bench core: {e}", file=sys.stderr)
        return 2
    print("derender core vs tokenizer floor (thread CPU time, best of "
          f"{args.floor_repeats} runs; Qwen3 reasoning + Hermes call, mixed CJK/emoji)")
    for x in r["lengths"]:
        print(f"  {x['tokens']:5d} tokens: core {x['core_us']:8.1f} us   floor {x['floor_us']:7.1f} us   "
              f"core/floor {x['ratio']:.2f}")
    io0 = r["no_logprobs_io"]
    print(f"logprobs at {args.floor_logprob_tokens} tokens (no logprobs: {r['no_logprobs_us']:.1f} us; "
          f"its I/O floor {io0['decode_us'] + io0['encode_us']:.1f} us)")
    print("  (I/O floor: msgspec typed decode of the same body + encode of its reply, nothing else)")
    for x in r["logprobs"]:
        io = x["decode_us"] + x["encode_us"]
        print(f"  top_logprobs={x['top_logprobs']:2d}: {x['core_us']:8.1f} us   {x['x']:.2f}x   "
              f"I/O floor {io:7.1f} us (decode {x['decode_us']:.1f} + encode {x['encode_us']:.1f})   "
              f"core/I/O floor {x['io_x']:.2f}x")
    if getattr(args, "paths", True):
        try:
            rows = run_paths(args.floor_tokenizer, args.floor_logprob_tokens, args.floor_distinct,
                             args.floor_seconds, args.floor_repeats)
        except (ValueError, OSError, RuntimeError) as e:
            print(f"derender-worker bench core: {e}", file=sys.stderr)
            return 2
        print_paths(rows, args.floor_logprob_tokens, args.floor_repeats)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m worker.bench.floor [flags]``: the floor pass alone."""
    ap = argparse.ArgumentParser(prog="python -m worker.bench.floor", description=__doc__.splitlines()[0])
    add_args(ap)
    return run_suite(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
