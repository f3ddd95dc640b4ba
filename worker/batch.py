"""Batch mode: ``derender-worker batch LOG.jsonl[.gz] -o OUT.jsonl`` derenders a generation log
offline through the same core as the Kafka worker.

Input: one derender body per line (``DerenderChatRequest`` or ``DerenderCompletionRequest``
JSON, told apart by shape: ``generate_response`` vs ``generate_responses``); gzip input is
recognised by its ``.gz`` suffix; ``-`` reads standard input.
Output: one line per input line, in input order: the OpenAI response, or an OpenAI error object
(``{"error": {...}}``) for a bad line. A bad line never stops the file.
Streamed logs: a line that is a streaming chunk body (``generate_chunk``: a
``DerenderChatStreamRequest`` / ``DerenderCompletionStreamRequest``) is derendered in input order
in the parent process, with the stream state kept in memory per request id
(``DerenderService.derender_stream``; the state is dropped when every choice of the request has
finished); its output line is a JSON list of the OpenAI stream chunks it produced (possibly
``[]``; the last chunk of a request carries ``usage``), or an error object. Chunks of one request
must appear in order; requests may interleave; chat vs completion is told by
``completion_request`` on the request's first chunk (chat otherwise).
A line holding a JSON *array* of streaming chunk bodies is one whole streamed request (the
format of the parity suite's ``to_requests.py --stream``): its output line is the JSON array of
every OpenAI chunk derendered for it, in order (an error object in the array where a chunk was
refused; ``stream_state`` in the bodies is ignored: the state is kept here).
A blank line gets an error object, so output line N always answers input line N.
``created`` in the output is the body's engine value, else 0 (never the clock: the same log
always gives the same output bytes).
Work is spread over processes (``--workers``, default: all cores); the served models are loaded
once in the parent and shared with the forked workers. A progress bar shows on a terminal;
a summary goes to standard error at the end.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import io
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Iterator

import msgspec

from worker.config import models_from_args
from worker.core.service import DerenderService, error_body

_service: DerenderService | None = None


def add_batch_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``batch`` (the model flags are added by ``worker.config.add_model_args``)."""
    ap.add_argument("input", help="JSONL log of derender bodies (.gz ok; - for stdin)")
    ap.add_argument("-o", "--output", required=True, help="output JSONL (- for stdout)")
    ap.add_argument("--workers", type=int, default=0, help="processes (default: all cores; 1 = in-process)")
    ap.add_argument("--chunksize", type=int, default=16, help="lines handed to a worker at a time")
    ap.add_argument("--no-progress", action="store_true", help="never show a progress bar")


def _open_input(path: str) -> io.BufferedReader:
    if path == "-":
        return sys.stdin.buffer
    if path.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _lines(path: str) -> Iterator[bytes]:
    with _open_input(path) as f:
        for raw in f:
            yield raw.strip()


def _work(line: bytes | tuple[bytes, int]) -> tuple[bytes, int]:
    if isinstance(line, tuple):  # a stream line, already derendered in the parent
        return line
    assert _service is not None
    res = _service.derender(line)
    return res.body, res.status


class _ChunkProbe(msgspec.Struct):
    generate_chunk: msgspec.Raw = msgspec.Raw()
    request_id: str | None = None


class _ChunkRid(msgspec.Struct):
    request_id: str | None = None


_chunk_probe = msgspec.json.Decoder(_ChunkProbe)
_chunk_rid = msgspec.json.Decoder(_ChunkRid)


def _stream_request_id(line: bytes) -> str | None:
    """The request id of a streaming chunk line, "" when it has none, None for other lines."""
    if b'"generate_chunk"' not in line:
        return None
    try:
        p = _chunk_probe.decode(line)
        raw = bytes(p.generate_chunk)
        if not raw or raw == b"null":
            return None
        return _chunk_rid.decode(raw).request_id or ""
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _with_streams(service: DerenderService, lines: Iterator[bytes]) -> Iterator[bytes | tuple[bytes, int]]:
    """Pass non-stream lines through; derender stream chunk lines here, in input order, with
    the per-request state in memory (see module docstring)."""
    states: dict[str, bytes] = {}
    for line in lines:
        if not line:
            yield error_body("empty input line", 400), 400
            continue
        if line[:1] == b"[":
            yield _stream_list(service, line)
            continue
        rid = _stream_request_id(line)
        if rid is None:
            yield line
            continue
        res, new_state = service.derender_stream(line, states.get(rid))
        if new_state is not None:
            if res.done:
                states.pop(rid, None)
            else:
                states[rid] = new_state
        yield res.body, res.status


_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def _stream_list(service: DerenderService, line: bytes) -> tuple[bytes, int]:
    """A JSON array of one request's chunk bodies -> (JSON array of all its OpenAI chunks, status:
    200, or the first error's status)."""
    try:
        bodies = _raw_list.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return error_body(f"invalid stream list line: {e}", 400), 400
    parts: list[bytes] = []
    state: bytes | None = None
    status = 200
    for raw in bodies:
        res, new_state = service.derender_stream(bytes(raw), state)
        if res.is_error:
            status = status if status != 200 else res.status
            parts.append(res.body)
        else:
            body = bytes(res.body).strip()
            if body != b"[]":
                parts.append(body[1:-1])
        if new_state is not None:
            state = new_state
    return b"[" + b",".join(parts) + b"]", status


def run_batch(service: DerenderService, input_path: str, output_path: str, workers: int = 0,
              chunksize: int = 16, progress: bool | None = None) -> dict:
    """Derender every line of ``input_path`` into ``output_path`` (same order).

    Returns a summary dict: ``lines``, ``ok``, ``errors`` (count by status), ``seconds``,
    ``lines_per_s``. Raises ``OSError`` when the input cannot be opened or the output written."""
    global _service
    _service = service
    service.preload()
    workers = workers or (os.cpu_count() or 1)
    if progress is None:
        progress = sys.stderr.isatty()
    statuses: collections.Counter[int] = collections.Counter()
    t0 = time.perf_counter()
    out = sys.stdout.buffer if output_path == "-" else open(output_path, "wb")
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(unit="line", file=sys.stderr)
    try:
        if workers == 1:
            results: Iterator[tuple[bytes, int]] = map(_work, _with_streams(service, _lines(input_path)))
            pool = None
        else:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            pool = mp.get_context("fork").Pool(workers)
            results = pool.imap(_work, _with_streams(service, _lines(input_path)), chunksize=chunksize)
        for body, status in results:
            out.write(body)
            out.write(b"\n")
            statuses[status] += 1
            if bar is not None:
                bar.update(1)
        if pool is not None:
            pool.close()
            pool.join()
    finally:
        if bar is not None:
            bar.close()
        if out is not sys.stdout.buffer:
            out.close()
    dt = time.perf_counter() - t0
    n = sum(statuses.values())
    return {"lines": n, "ok": statuses.get(200, 0),
            "errors": {str(k): v for k, v in sorted(statuses.items()) if k != 200},
            "seconds": round(dt, 3), "lines_per_s": round(n / dt, 1) if dt > 0 else None}


def main_batch(args: argparse.Namespace) -> int:
    """``derender-worker batch``: returns 0 when the file was processed (bad lines included),
    2 on a configuration or I/O error."""
    try:
        service = DerenderService(models_from_args(args))
        summary = run_batch(service, args.input, args.output, args.workers, args.chunksize,
                            progress=False if args.no_progress else None)
    except (ValueError, OSError) as e:
        print(f"derender-worker batch: {e}", file=sys.stderr)
        return 2
    errs = ", ".join(f"{k}: {v}" for k, v in summary["errors"].items()) or "none"
    print(f"batch: {summary['lines']} lines, {summary['ok']} ok, errors {errs}; "
          f"{summary['seconds']} s ({summary['lines_per_s']} lines/s)", file=sys.stderr)
    return 0


__all__ = ["run_batch", "main_batch", "add_batch_args", "error_body"]
