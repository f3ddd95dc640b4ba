"""Streaming benchmark: per-chunk latency and state size of a long Qwen3 stream.

``derender-worker bench stream [--tokenizer tests/data/tokenizers/qwen3] [--tokens 2048]
[--repeat 5]`` (also ``python -m worker.bench.stream``) streams a Qwen3 output (``<think>`` reasoning, a short answer, then a Hermes
``<tool_call>`` and ``<|im_end|>``) in 1-token chunks through ``DerenderService.derender_stream``
(qwen3 reasoning + hermes tools, ``logprobs`` off), decoding and re-encoding the msgpack state on
every chunk as the Kafka worker does with Redis, twice: with the request's settings inside the
state (one value), and with them stored apart, once (``derender_stream(settings_aside=True)``, as
the Kafka worker and batch do; issue 13 item 4). Prints the median per-chunk thread CPU time
around chunks 16, 256, 1024 and 2048 (median over the chunk and the 7 before it, across repeats),
the ratio last/first (should stay <= 1.5: work per chunk is O(delta), not O(stream)), and the
encoded state size at those chunks and its maximum; then the same stream with 1,024 stop strings
(64 KiB of stop text) both ways (stored apart, the per-chunk state stays <= 4 KiB).

``--redis URL`` adds a pass that checkpoints through Redis on every chunk, as a worker
taking the stream over would: read the state (``RedisStateStore.get``), derender, write it back
fenced on the sequence number (``commit``; the settings, when apart, with the first chunk's
write only); it prints the per-chunk latency of that loop and the Redis memory the stream's key
uses (``MEMORY USAGE``) at the same chunks, both ways. (The Kafka worker adds its replay window
of recent reply values to the stored record; that is transport, not core state.)

``--redis-burst N`` (``--burst-chunks``, default 3; ``--burst-call``: each stream one long hermes
tool call whose body spills to the stream's pieces) runs only the burst pass
(``worker.bench.redis_burst``): N streams opened at once through one in-process worker, a private
redis-server and the embedded broker; it prints the Redis commands per chunk (``INFO
commandstats``: EVALSHA and each ``redis.call`` in it counted) and per command.

The first pass prints the one per-chunk figure per API (chat, Responses, Messages; issue 25 item 3):
the same 2,048 ids in 1-token chunks through ``derender_stream`` as the Kafka worker calls it (kind
header, ``seq``, ``pieces=True``, ``settings_aside=True``; the state decoded and re-encoded every
chunk): thread CPU of the whole stream over its chunks, best of ``--repeat``, against the 40 µs
target (``--per-chunk-only``: only that).

A Responses pass streams the same ids as a chat stream and as a Responses API stream
(``derender_responses_stream``, piece log in memory), logprobs off and ``top_logprobs`` 20, and
prints the per-chunk thread CPU time at the same chunks for both, first and last and their ratio
(flat over the stream: the Responses state does not grow with the output).

A last pass measures ``--tool-call-streaming``: a tool call with a long argument (a file
``content`` of ~``--call-tokens`` tokens) in a Hermes JSON call (``hermes``) and a Qwen3-Coder XML
call (``qwen3_coder``), streamed in 1-token chunks in both modes; it prints the delay from the
call's first argument token (JSON: the arguments' ``{``; XML: the first parameter's value) to the
first argument delta the client gets, in tokens and in microseconds (wall time of the chunks in
between, that one included), plus the number of argument deltas.

The never-closed pass (``--call-words``, default 20,000; 0 skips it): a call whose string
argument never ends, in 1-token chunks in both modes, for one representative of each engine kind
that buffers an open call (hermes: tagged; mistral and llama3_json: jsontail; pythonic: marker;
openai: Harmony, text mode; a hermes stream with ``tool_choice: required``, whose content is held
for JSON parsing; a hermes stream with a stop string) with append-only pieces
(``derender_stream(pieces=True)``: what the parsers no longer read leaves the state; the pieces
kept in memory as the piece stores keep them, and the request's settings stored apart, once, as
the Kafka worker does), and for hermes also with the state as one value
(the open call's body inside it): thread CPU µs per chunk over the first and last 5% of the
chunks (per chunk the fastest of 3 passes), their ratio, and the state size at the end (issue
13's targets, pieces: ratio <= 1.3, state <= 4 KiB).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from worker.config import ServedModelConfig
from worker.core.responses import memory_reader
from worker.core.service import DerenderService
from worker.state.redis_store import RedisSettings, RedisStateStore, StateStoreError, StateWrite

_DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "demo_data" / "qwen3"
_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "notes": {"type": "string"}},
                   "required": ["city"]}}}]
_REASON = ("The user asks about the weather in Paris, so I should call the weather tool with the city "
           "name. Let me think about which unit they prefer and whether any extra context helps. ")


def build_output(tok, n_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, output ids of exactly ``n_tokens``): reasoning, answer, one tool call, EOS."""
    prompt = tok.encode("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    head = tok.encode("<think>\n")
    tail_text = ("\n</think>\n\nI'll look that up for you.\n<tool_call>\n"
                 + json.dumps({"name": "get_weather", "arguments": {
                     "city": "Paris", "notes": "metric units, include humidity and wind; " * 12}})
                 + "\n</tool_call>")
    tail = tok.encode(tail_text) + [tok.token_to_id("<|im_end|>")]
    body: list[int] = []
    chunk = tok.encode(_REASON)
    while len(head) + len(body) + len(tail) < n_tokens:
        body.extend(chunk)
    body = body[: n_tokens - len(head) - len(tail)]
    return prompt, head + body + tail


#: the ``_TOOLS`` function in the Responses API's tool shape (``type`` beside the function fields)
RESPONSES_TOOLS = [{"type": "function", **{k: v for k, v in t["function"].items()}} for t in _TOOLS]


def stream_bodies(prompt: list[int], out: list[int], kind: str, top: int) -> list[bytes]:
    """1-token chunk bodies of output ``out`` for ``kind`` ``chat`` (``chat_request``),
    ``responses`` (``responses_request``, Responses tool shape) or ``messages``
    (``messages_request``, Anthropic tool shape, no logprobs), the request on the first chunk
    only; ``top``: ``top_logprobs`` (0: no logprobs; else engine entries with ``top``
    candidates)."""
    bodies = []
    for i, t in enumerate(out):
        ch: dict = {"index": 0, "token_ids": [t], "finish_reason": "stop" if i == len(out) - 1 else None}
        if top:
            ch["logprobs"] = {"content": [{"token_id": t, "logprob": -0.5, "top_logprobs": [
                {"token_id": t, "logprob": -0.5}] + [{"token_id": 1000 + j, "logprob": -3.0 - j, "rank": j + 1}
                                                    for j in range(top - 1)]}]}
        b: dict = {"model": "qwen3", "stream": True,
                   "generate_chunk": {"request_id": f"bench-{kind}", "choices": [ch]}}
        if i == 0:
            b["prompt_token_ids"] = prompt
            b["prompt_tokens"] = len(prompt)
            if kind == "chat":
                b["chat_request"] = {"model": "qwen3", "messages": [], "tool_choice": "auto", "logprobs": bool(top),
                                     "top_logprobs": top or None, "tools": _TOOLS}
            elif kind == "messages":  # issue 26: Anthropic tools; the Messages API has no logprobs
                b["messages_request"] = {"model": "qwen3", "max_tokens": len(out), "messages": [],
                                         "tools": [{"name": t["name"], "input_schema": t.get("parameters")}
                                                   for t in RESPONSES_TOOLS]}
            else:
                b["responses_request"] = {"model": "qwen3", "input": "weather?", "tools": RESPONSES_TOOLS,
                                          "include": ["message.output_text.logprobs"] if top else None,
                                          "top_logprobs": top or None}
        bodies.append(json.dumps(b).encode())
    return bodies


def stream_pass(svc: DerenderService, bodies: list[bytes], kind: str, repeat: int) -> dict:
    """Stream ``bodies`` (``stream_bodies``) ``repeat`` + 1 times (the first warms caches)
    through ``derender_stream`` (chat), ``derender_responses_stream`` (Responses) or
    ``derender_messages_stream`` (Messages; the piece log in memory), timing each chunk in thread CPU seconds. Returns ``{"marks": chunk numbers (16,
    256, 1024 and the last, those within the stream), "lat": {mark: median seconds over the
    mark's chunk and the 7 before it, across repeats}, "sizes": state bytes per chunk, "log":
    final piece log bytes (Responses), "last_reply": terminal reply bytes, "total": summed
    median seconds}``. Raises ``RuntimeError`` when a chunk is refused."""
    n = len(bodies)
    times = [[0.0] * repeat for _ in range(n)]
    sizes = [0] * n
    log_len = last_reply = 0
    for r in range(repeat + 1):  # the first pass warms caches
        state, log = None, bytearray()
        for i, b in enumerate(bodies):
            t0 = time.thread_time()
            if kind == "chat":
                res, state = svc.derender_stream(b, state)
            elif kind == "messages":
                res = svc.derender_messages_stream(b, state, memory_reader(log))
                state = res.state
                log += res.log_append
            else:
                res = svc.derender_responses_stream(b, state, memory_reader(log))
                state = res.state
                log += res.log_append
            dt = time.thread_time() - t0
            if res.is_error:
                raise RuntimeError(f"{kind} chunk {i} refused: {res.body[:300]!r}")
            if r:
                times[i][r - 1] = dt
            sizes[i] = len(state)
            last_reply = len(res.body)
        log_len = len(log)
    marks = sorted({m for m in (16, 256, 1024) if m < n} | {n})
    lat = {m: statistics.median([x for i in range(max(0, m - 8), m) for x in times[i]]) for m in marks}
    return {"marks": marks, "lat": lat, "sizes": sizes, "log": log_len, "last_reply": last_reply,
            "total": sum(statistics.median(t) for t in times)}


#: issue 25 item 3: what one chunk of a 2,048-token stream may cost, per API (thread CPU µs)
CHUNK_TARGET_US = 40.0


def worker_path_pass(svc: DerenderService, prompt: list[int], out: list[int], repeat: int) -> dict[str, float]:
    """The one per-chunk figure per API (issue 25 item 3): ``out`` in 1-token chunks
    (``stream_bodies``, logprobs off) through ``derender_stream`` exactly as the Kafka worker
    calls it (``transport.jobs``: the kind header, ``seq``, ``pieces=True`` with the pieces kept
    in memory as the piece stores keep them, ``settings_aside=True``), the stored state decoded
    and re-encoded on every chunk. Returns ``{api: µs}``: thread CPU of the whole stream / its
    chunks, the fastest of ``repeat`` passes after a warm-up pass. Raises ``RuntimeError`` when a
    chunk is refused."""
    got = {}
    for kind in ("chat", "responses", "messages"):
        bodies = stream_bodies(prompt, out, kind, 0)
        best = float("inf")
        for r in range(repeat + 1):  # the first pass warms caches
            state, log = None, bytearray()
            t0 = time.thread_time()
            for i, b in enumerate(bodies):
                res, state = svc.derender_stream(b, state, seq=i, kind=kind + "-stream", pieces=True,
                                                 reader=memory_reader(log), settings_aside=True)
                if res.is_error:
                    raise RuntimeError(f"{kind} chunk {i} refused: {res.body[:300]!r}")
                log[res.pieces_len - len(res.append):] = res.append
            if r:
                best = min(best, time.thread_time() - t0)
        got[kind] = best / len(bodies) * 1e6
    return got


def print_worker_path(svc: DerenderService, prompt: list[int], out: list[int], repeat: int) -> None:
    """Print ``worker_path_pass``'s figures, one line per API, against ``CHUNK_TARGET_US``."""
    print(f"per chunk as the Kafka worker calls the core: {len(out)}-token stream (qwen3 reasoning + hermes "
          "call), 1-token chunks, state decoded and encoded every chunk, pieces and settings stored apart; "
          f"thread CPU of the whole stream / chunks, best of {repeat}")
    for kind, us in worker_path_pass(svc, prompt, out, repeat).items():
        print(f"  {kind:9s}: {us:6.1f} us/chunk  ({'within' if us <= CHUNK_TARGET_US else 'ABOVE'} the "
              f"{CHUNK_TARGET_US:.0f} us target)")


def add_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``bench stream``."""
    ap.add_argument("--tokenizer", default=str(_DEMO_TOKENIZER), help="tokenizer directory (default: the demo's Qwen3)")
    ap.add_argument("--redis", metavar="URL", default=None,
                    help="also checkpoint every chunk through this Redis (e.g. redis://127.0.0.1:6379/0)")
    ap.add_argument("--tokens", type=int, default=2048, help="output tokens of the stream, sent in 1-token chunks")
    ap.add_argument("--repeat", type=int, default=5, help="timed passes over the stream (after one warm-up pass)")
    ap.add_argument("--per-chunk-only", action="store_true",
                    help="print only the per-chunk figure per API (chat, Responses, Messages) and exit")
    ap.add_argument("--call-tokens", type=int, default=400, help="argument length of the tool-call delay pass")
    ap.add_argument("--call-words", type=int, default=20000,
                    help="words of the never-closed call pass (0: skip it)")
    ap.add_argument("--redis-burst", type=int, default=0, metavar="N",
                    help="only the burst pass: Redis commands per chunk when N streams open at once "
                         "(a private redis-server and the embedded broker; worker.bench.redis_burst)")
    ap.add_argument("--burst-chunks", type=int, default=3, help="chunks per stream of --redis-burst")
    ap.add_argument("--burst-call", action="store_true",
                    help="--redis-burst streams are one long hermes tool call each (their body spills to "
                         "the streams' pieces: the piece writes' commands are counted too)")


def main(argv: list[str] | None = None) -> int:
    """``python -m worker.bench.stream [flags]``."""
    ap = argparse.ArgumentParser(prog="derender-worker bench stream", description=__doc__.splitlines()[0])
    add_args(ap)
    return run_suite(ap.parse_args(argv))


def run_suite(args: argparse.Namespace) -> int:
    """Run the passes of the module docstring and print their figures; returns 0, or 1 when a
    chunk does not derender. With ``--redis-burst N``, only the burst pass."""
    if args.redis_burst > 0:
        return _burst(args)
    svc = DerenderService([ServedModelConfig(name="qwen3", tokenizer=args.tokenizer, reasoning_parser="qwen3",
                                             tool_parser="hermes", enable_auto_tool_choice=True)])
    svc.preload()
    tok = svc.runtime("qwen3").tokenizer
    prompt, out = build_output(tok, args.tokens)
    try:
        print_worker_path(svc, prompt, out, args.repeat)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    if args.per_chunk_only:
        return 0
    rid = "bench-stream"
    bodies = []
    for i, t in enumerate(out):
        last = i == len(out) - 1
        b = {"model": "qwen3", "stream": True,
             "generate_chunk": {"request_id": rid, "choices": [{"index": 0, "token_ids": [t],
                                                                 "finish_reason": "stop" if last else None}]}}
        if i == 0:
            b["prompt_token_ids"] = prompt
            b["prompt_tokens"] = len(prompt)
            b["chat_request"] = {"model": "qwen3", "messages": [{"role": "user", "content": "weather?"}],
                                 "tools": _TOOLS, "tool_choice": "auto"}
        bodies.append(json.dumps(b).encode())
    n = len(bodies)
    marks = [m for m in (16, 256, 1024, 2048) if m <= n] or [n]
    if marks[-1] != n and n not in marks:
        marks.append(n)
    final = None
    for aside in (False, True):
        got = _settings_pass(svc, bodies, marks, args.repeat, aside)
        if got is None:
            return 1
        lat, sizes, final, stored = got
        how = ("write-once settings stored apart (as the Kafka worker and batch: derender_stream("
               f"settings_aside=True), {stored} B once)" if aside else "settings inside the state (one value)")
        print(f"stream: {n} tokens in 1-token chunks, qwen3 reasoning + hermes tool call, state msgpack "
              f"decode/encode per chunk, {args.repeat} repeats; {how}")
        for m in marks:
            print(f"  chunk {m:5d}: {lat[m] * 1e6:8.1f} us/chunk   state {sizes[m - 1]:6d} B")
        ratio = lat[marks[-1]] / lat[marks[0]]
        print(f"  ratio last/first: {ratio:.2f}  (<= 1.5 expected)")
        print(f"  state size: max {max(sizes)} B, mean {sum(sizes) // n} B")
    calls = sum(len(c['choices'][0]['delta'].get('tool_calls') or []) for c in final if c['choices'])
    print(f"  check: {len(final)} OpenAI chunks out for {n} input chunks (an input chunk whose text is held "
          f"back, e.g. inside the tool call's body or a split marker, yields none), {calls} tool call "
          f"fragment(s), usage {final[-1].get('usage')}")
    _stop_strings(svc, bodies, marks, args.repeat)
    _responses_next_to_chat(svc, prompt, out, args.repeat)
    _tool_delay(args.tokenizer, args.call_tokens)
    if args.call_words:
        _never_closed(args.tokenizer, args.call_words)
    if args.redis:
        return asyncio.run(_redis_pass(svc, bodies, marks, args.redis))
    return 0


def _settings_pass(svc: DerenderService, bodies: list[bytes], marks: list[int], repeat: int, aside: bool):
    """Stream ``bodies`` ``repeat`` + 1 times (the first warms caches) through ``derender_stream``
    (``settings_aside``: the write-once settings stored apart, as the Kafka worker does; the
    settings cache of ``svc`` has them), thread CPU time per chunk. Returns ``(lat, sizes, chunks,
    settings bytes)``: ``lat`` {mark: median seconds over the mark's chunk and the 7 before it,
    across repeats}, ``sizes`` the per-chunk state bytes, ``chunks`` the last run's OpenAI
    chunks; None (printed) when a chunk is refused."""
    n = len(bodies)
    times = [[0.0] * repeat for _ in range(n)]
    sizes = [0] * n
    chunks: list = []
    stored = b""
    for r in range(repeat + 1):
        state = None
        chunks = []
        for i, b in enumerate(bodies):
            t0 = time.thread_time()
            res, state = svc.derender_stream(b, state, settings_aside=aside)
            dt = time.thread_time() - t0
            if res.is_error or res.needs_settings:
                print(res.body.decode() or "needs its settings", file=sys.stderr)
                return None
            stored = res.settings or stored
            if r > 0:
                times[i][r - 1] = dt
            sizes[i] = len(state)
            chunks.extend(json.loads(res.body))
    lat = {m: statistics.median([x for i in range(max(0, m - 8), m) for x in times[i]]) for m in marks}
    return lat, sizes, chunks, len(stored)


#: the stop-strings pass: 1,024 stop strings of 64 characters (64 KiB of stop text: the most a
#: request may carry, ``worker.core.derender.MAX_STOP_STRINGS`` / ``MAX_STOP_CHARS``), none in the output
STOP_STRINGS = [f"{i:04d}" + "~" * 60 for i in range(1024)]


def with_stop_strings(bodies: list[bytes]) -> list[bytes]:
    """``bodies`` with ``STOP_STRINGS`` in the first chunk's ``chat_request``."""
    first = json.loads(bodies[0])
    first["chat_request"]["stop"] = STOP_STRINGS
    return [json.dumps(first).encode(), *bodies[1:]]


def _stop_strings(svc: DerenderService, bodies: list[bytes], marks: list[int], repeat: int) -> None:
    """The same stream with ``STOP_STRINGS`` in its request: per-chunk thread CPU and state size
    with the settings inside the state (every chunk decodes and re-encodes 64 KiB) and stored
    apart (issue 13 item 4: the per-chunk state stays <= 4 KiB)."""
    bodies = with_stop_strings(bodies)
    print(f"the same stream with {len(STOP_STRINGS)} stop strings ({sum(map(len, STOP_STRINGS))} characters), "
          "thread CPU per chunk")
    for aside in (False, True):
        got = _settings_pass(svc, bodies, marks, repeat, aside)
        if got is None:
            return
        lat, sizes, _, stored = got
        cells = "  ".join(f"#{m}: {lat[m] * 1e6:7.1f}" for m in marks)
        how = f"settings apart ({stored} B once)" if aside else "settings inside"
        print(f"  {how:28s}: us/chunk {cells}; state max {max(sizes)} B")


def _burst(args: argparse.Namespace) -> int:
    # deferred: the burst pass needs the Kafka transport (aiokafka, the worker); the other passes do not
    from tokenizers import Tokenizer  # deferred: as above (its own tokenizer, for the chunk bodies)

    from worker.bench.redis_burst import run_burst_pass  # deferred: as above
    models = [ServedModelConfig(name="qwen3", tokenizer=args.tokenizer, reasoning_parser="qwen3",
                                tool_parser="hermes", enable_auto_tool_choice=True)]
    tok = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    run_burst_pass(models, tok, args.redis_burst, max(1, args.burst_chunks), call=args.burst_call)
    return 0


_CODE_LINE = "def add(a, b):\n    return a + b  # simple helper used by the service layer\n"
_FILE_TOOL = [{"type": "function", "function": {
    "name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}}]


def _call_text(fmt: str, content: str) -> tuple[str, str]:
    """(output text, the text that starts the call's first argument) for ``fmt``."""
    if fmt == "hermes":
        head = '<tool_call>\n{"name": "write_file", "arguments": '
        return (head + json.dumps({"content": content, "path": "src/util.py"}) + "}\n</tool_call>", head)
    head = "<tool_call>\n<function=write_file>\n<parameter=content>\n"
    return (head + content + "\n</parameter>\n<parameter=path>\nsrc/util.py\n</parameter>\n</function>\n"
            "</tool_call>", head)


def _responses_next_to_chat(svc: DerenderService, prompt: list[int], out: list[int], repeat: int) -> None:
    """The same output as chat and as a Responses stream (``stream_pass``, thread CPU time),
    logprobs off and ``top_logprobs`` 20: per-chunk figures at the marks, first and last, and
    their ratio (flat work per chunk: <= 1.5 expected)."""
    print(f"chat and Responses API streams of the same {len(out)} ids, 1-token chunks, thread CPU time "
          f"({repeat} repeats)")
    for top in (0, 20):
        for kind in ("chat", "responses"):
            s = stream_pass(svc, stream_bodies(prompt, out, kind, top), kind, repeat)
            m = s["marks"]
            cells = "  ".join(f"#{x}: {s['lat'][x] * 1e6:6.1f}" for x in m)
            print(f"  {kind:9s} top_logprobs {top:2d}: us/chunk {cells}  first {s['lat'][m[0]] * 1e6:.1f} us, "
                  f"last {s['lat'][m[-1]] * 1e6:.1f} us, ratio last/first {s['lat'][m[-1]] / s['lat'][m[0]]:.2f}; "
                  f"state max {max(s['sizes'])} B" + (f", piece log {s['log']} B" if kind == "responses" else ""))


def _tool_delay(tokenizer: str, call_tokens: int) -> None:
    """Print the first-argument delay of both ``--tool-call-streaming`` modes (module docstring)."""
    print(f"tool-call streaming: one call with a ~{call_tokens}-token argument, 1-token chunks; delay from the "
          "call's first argument token to the first argument delta")
    for fmt in ("hermes", "qwen3_coder"):
        for mode in ("whole", "incremental"):
            svc = DerenderService([ServedModelConfig(name="m", tokenizer=tokenizer, tool_parser=fmt,
                                                     enable_auto_tool_choice=True, tool_call_streaming=mode)])
            svc.preload()
            tok = svc.runtime("m").tokenizer
            line_tokens = max(1, len(tok.encode(_CODE_LINE)))
            text, head = _call_text(fmt, _CODE_LINE * max(1, call_tokens // line_tokens))
            ids = tok.encode(text) + [tok.token_to_id("<|im_end|>")]
            first = next(i for i in range(len(ids)) if len(tok.decode(ids[: i + 1])) > len(head))
            bodies = []
            for i, t in enumerate(ids):
                b = {"model": "m", "stream": True, "generate_chunk": {"request_id": "bench-tool", "choices": [
                    {"index": 0, "token_ids": [t], "finish_reason": "stop" if i == len(ids) - 1 else None}]}}
                if i == 0:
                    b["prompt_token_ids"] = tok.encode("<|im_start|>assistant\n")
                    b["chat_request"] = {"model": "m", "messages": [{"role": "user", "content": "write it"}],
                                         "tools": _FILE_TOOL, "tool_choice": "auto"}
                bodies.append(json.dumps(b).encode())
            runs = []
            for _ in range(4):  # the first run warms caches
                state, times, at, pieces = None, [], None, 0
                for i, b in enumerate(bodies):
                    t0 = time.perf_counter()
                    res, state = svc.derender_stream(b, state)
                    times.append(time.perf_counter() - t0)
                    for c in json.loads(res.body):
                        for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
                            if tc["function"].get("arguments"):
                                pieces += 1
                                at = i if at is None else at
                runs.append((at, sum(times[first:at + 1]), pieces))
            at, _, pieces = runs[-1]
            us = statistics.median(r[1] for r in runs[1:]) * 1e6
            print(f"  {fmt:12s} {mode:12s}: first argument token #{first}, first argument delta at #{at}: "
                  f"delay {at - first:4d} tokens, {us:9.1f} us; {pieces} argument delta(s) for {len(ids)} tokens")


#: never-closed pass: one representative of each engine kind that buffers an open call (label,
#: tool parser, request fields, the output's text up to the never-ending string argument)
_OPEN_CALLS = [
    ("hermes (tagged)", "hermes", {}, '<tool_call>\n{"name": "write_file", "arguments": {"content": "'),
    ("mistral (jsontail)", "mistral", {}, '[TOOL_CALLS][{"name": "write_file", "arguments": {"content": "'),
    ("llama3_json (jsontail)", "llama3_json", {}, '{"name": "write_file", "parameters": {"content": "'),
    ("pythonic (marker)", "pythonic", {}, '[write_file(content="'),
    ("openai (Harmony)", "openai", {}, "<|channel|>commentary to=functions.write_file <|constrain|>json"
     '<|message|>{"content": "'),
    ("hermes required", "hermes", {"tool_choice": "required"},
     '[{"name": "write_file", "parameters": {"content": "'),
    ("hermes + stop", "hermes", {"stop": ["NEVER_SAID"]},
     '<tool_call>\n{"name": "write_file", "arguments": {"content": "'),
]


def _never_closed(tokenizer: str, words: int) -> None:
    """Print per-chunk CPU µs over the first and last 5% of a tool call that never closes (an
    agent writing a ~``words``-word file: e.g. ``<tool_call>`` then ``{"name": "write_file",
    "arguments": {"content": "...`` in 1-token chunks, no end), in both
    ``--tool-call-streaming`` modes, with their ratio and the state size at the end (what is
    decoded and re-encoded every chunk; issue 13's target: ratio <= 1.3, state <= 4 KiB). One
    representative per engine kind (``_OPEN_CALLS``: tagged, jsontail, marker, Harmony in text
    mode, a required ``tool_choice``'s held content, a stream with stop strings), with pieces;
    the hermes call also with the state as one value (the open call's body inside it)."""
    print(f"never-closed call: write_file with a ~{words}-word content string, 1-token chunks, "
          "thread CPU time per chunk (state decode + derender + encode)")
    text = " ".join(_CODE_LINE.split()[i % len(_CODE_LINE.split())] for i in range(words))
    for label, parser, extra, head_text in _OPEN_CALLS:
        for mode in ("whole", "incremental"):
            svc = DerenderService([ServedModelConfig(name="m", tokenizer=tokenizer, tool_parser=parser,
                                                     enable_auto_tool_choice=True, tool_call_streaming=mode)])
            svc.preload()
            tok = svc.runtime("m").tokenizer
            ids = tok.encode(head_text + text)
            head = {"model": "m", "stream": True, "prompt_token_ids": tok.encode("<|im_start|>assistant\n"),
                    "chat_request": {"model": "m", "messages": [{"role": "user", "content": "write it"}],
                                     "tools": _FILE_TOOL, "tool_choice": "auto", **extra}}
            bodies = []
            for i, t in enumerate(ids):
                b = dict(head) if i == 0 else {"model": "m", "stream": True}
                b["generate_chunk"] = {"request_id": "bench-open", "choices": [{"index": 0, "token_ids": [t]}]}
                bodies.append(json.dumps(b).encode())
            for pieces in ((False, True) if label.startswith("hermes (") else (True,)):
                if not _open_pass(svc, bodies, label, mode, pieces):
                    return


def _open_pass(svc: DerenderService, bodies: list[bytes], label: str, mode: str, pieces: bool,
               passes: int = 3) -> bool:
    """One never-closed stream (``_never_closed``), run ``passes`` times: print its figures
    (per chunk the fastest pass, so a burst of load on the shared cores during one pass does not
    show as a trend); False when a chunk fails."""
    best: list[float] = []
    for _ in range(passes):
        state = None
        log = bytearray()  # the pieces, kept as the piece stores do (written at the recorded offset)
        times = []
        for body in bodies:
            t0 = time.thread_time()
            res, state = svc.derender_stream(body, state, pieces=pieces, settings_aside=pieces)
            if pieces and res.needs_pieces is None and state is not None:
                log[res.pieces_len - len(res.append):] = res.append
            times.append(time.thread_time() - t0)
            if res.is_error or res.needs_pieces is not None:
                print(res.body.decode() or f"needs pieces {res.needs_pieces}", file=sys.stderr)
                return False
        best = list(map(min, best, times)) if best else times
    k = max(1, len(best) // 20)
    first, last = statistics.median(best[:k]) * 1e6, statistics.median(best[-k:]) * 1e6
    how = "pieces" if pieces else "one value"
    print(f"  {label:22s} {mode:12s} {how:9s}: {len(bodies)} chunks; first 5% {first:7.1f} us/chunk, last 5% "
          f"{last:7.1f} us/chunk, ratio {last / first:.2f}; state at the end {len(state)} B"
          + (f" (pieces {len(log)} B)" if pieces else "") + f"; whole call {sum(best):.1f} s")
    return True


async def _redis_pass(svc: DerenderService, bodies: list[bytes], marks: list[int], url: str) -> int:
    """Every chunk: get state from Redis, derender, put it back (fenced); print latency and the
    key's Redis memory at ``marks``, with the settings inside the state and stored apart (written
    once, with the first chunk's checkpoint: ``StateWrite.settings``; the settings cache of
    ``svc`` has them, as a worker continuing its own stream), without and with
    ``STOP_STRINGS``. Returns 0, or 1 when Redis does not answer."""

    store = RedisStateStore.from_settings(RedisSettings(url=url))
    rid = "bench-stream-redis"
    try:
        await store.ping()
        for stops, aside in ((False, False), (False, True), (True, False), (True, True)):
            await store.delete(rid)
            lat: list[float] = []
            mem: dict[int, int] = {}
            side = 0
            for i, b in enumerate(with_stop_strings(bodies) if stops else bodies):
                t0 = time.perf_counter()
                stored = await store.get(rid) if i else None
                res, state = svc.derender_stream(b.replace(b'"bench-stream"', b'"bench-stream-redis"'),
                                                 stored.state if stored else None, settings_aside=aside)
                if res.is_error or state is None:
                    print(res.body.decode(), file=sys.stderr)
                    return 1
                await store.commit([StateWrite(rid, state, i, settings=res.settings, settings_kept=aside)])
                lat.append(time.perf_counter() - t0)
                if i + 1 in marks:
                    mem[i + 1] = int(await store.client.memory_usage(store.key(rid)) or 0)
                if i == 0 and aside:
                    side = int(await store.client.memory_usage(store.key(rid) + ":settings") or 0)
            how = f"settings apart (written once: redis key {side} B)" if aside else "settings inside the state"
            how += f"; {len(STOP_STRINGS)} stop strings (64 KiB)" if stops else ""
            print(f"redis checkpoint per chunk ({url}): get + derender + fenced put; {how}")
            for m in marks:
                window = lat[max(0, m - 8):m]
                print(f"  chunk {m:5d}: {statistics.median(window) * 1e6:8.1f} us/chunk   "
                      f"redis key {mem.get(m, 0):6d} B")
            print(f"  ratio last/first: {statistics.median(lat[-8:]) / statistics.median(lat[:8]):.2f}")
            await store.delete(rid)
    except StateStoreError as e:
        print(f"redis pass skipped: {e}", file=sys.stderr)
        return 1
    finally:
        await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
