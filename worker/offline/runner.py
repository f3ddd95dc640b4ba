"""The local batch engine: read records, derender them over worker processes, write the results
in input order through a committing sink (``worker.offline.commit``).

Memory is bounded by the number of records in flight (``max_in_flight``, default
``workers * chunksize * 4``), the Parquet row group size and the stream states of unfinished
requests, never by the input size: records are read lazily and the reader is held back while
that many results wait to be written.
"""
from __future__ import annotations

import collections
import itertools
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm

from worker.core.service import DerenderService
from worker.offline import formats
from worker.offline.commit import CommitGuard, PartSink, SingleFileSink, StdoutSink, remove_stale_temps
from worker.offline.streams import StreamLines
from worker.transport.lifetime import die_with_parent

#: distinct failure messages remembered for the summary
MAX_FAILURE_KINDS = 5

_service: DerenderService | None = None


def _pool_init(parent_pid: int) -> None:
    """Initializer of a batch pool process: die (SIGKILL, silently) with the batch process, and
    ignore SIGINT (the batch process handles Ctrl-C). When the parent is killed hard, pool
    processes would otherwise fail writing results to the gone parent and each print a
    ``BrokenPipeError`` traceback."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the prctl call
        os._exit(0)
    # Ctrl-C reaches the whole process group: the batch process handles it (exit 130, pool
    # terminated); a pool process would print a ``KeyboardInterrupt`` traceback instead
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _work(item: bytes | tuple[bytes, int]) -> tuple[bytes, int]:
    if isinstance(item, tuple):  # already a result (stream line, blank line, unreadable record)
        return item
    assert _service is not None
    res = _service.derender(item, formats.kind_of_item(item))  # kind: an OpenAI Batch url (issue 14)
    return res.body, res.status


class Tally:
    """Counts of a run: lines, status counts, and the first record of each distinct failure."""

    def __init__(self) -> None:
        self.statuses: collections.Counter[int] = collections.Counter()
        self.failures: dict[tuple[int, str], list[int]] = {}  # (status, message) -> [count, first index]

    def add(self, index: int, body: bytes, status: int) -> None:
        self.statuses[status] += 1
        if status != 200:
            key = (status, formats.error_message(body)[:200])
            f = self.failures.get(key)
            if f is not None:
                f[0] += 1
            elif len(self.failures) < MAX_FAILURE_KINDS:
                self.failures[key] = [1, index]

    def merge(self, stats: dict[str, Any]) -> None:
        """Add a completed part's counts (from ``as_stats``)."""
        for k, v in stats["statuses"].items():
            self.statuses[int(k)] += v
        for st, msg, n, first in stats["failures"]:
            f = self.failures.get((st, msg))
            if f is not None:
                f[0] += n
                f[1] = min(f[1], first)
            elif len(self.failures) < MAX_FAILURE_KINDS:
                self.failures[(st, msg)] = [n, first]

    def summary(self, seconds: float, done_here: int, skipped: int, in_fmt: str, out_fmt: str) -> dict[str, Any]:
        """The run summary (see ``run_batch``); ``done_here``: records derendered by this run."""
        return {"lines": sum(self.statuses.values()), "ok": self.statuses.get(200, 0), "skipped": skipped,
                "errors": {str(k): v for k, v in sorted(self.statuses.items()) if k != 200},
                "failures": [{"status": st, "message": msg, "count": n, "first_index": first}
                             for (st, msg), (n, first) in sorted(self.failures.items(), key=lambda x: x[1][1])],
                "seconds": round(seconds, 3), "lines_per_s": round(done_here / seconds, 1) if seconds > 0 else None,
                "input_format": in_fmt, "output_format": out_fmt}

    def as_stats(self) -> dict[str, Any]:
        return {"lines": sum(self.statuses.values()), "statuses": {str(k): v for k, v in self.statuses.items()},
                "failures": [[st, msg, n, first] for (st, msg), (n, first) in self.failures.items()]}


def _fingerprint(input_path: str, input_format: str) -> dict[str, Any]:
    st = os.stat(input_path)
    return {"input": os.path.abspath(input_path), "input_size": st.st_size, "input_mtime_ns": st.st_mtime_ns,
            "input_format": input_format}


def make_sink(output_path: str, output_format: str, *, part_size: int | None, resume: bool,
              input_path: str, input_format: str, row_group_rows: int, keep_parts: bool = False,
              guard: CommitGuard | None = None):
    """The committing sink for an output path (see ``worker.offline.commit``; ``guard`` is told
    right before the final rename). Raises
    ``ValueError`` for ``--resume`` with standard input/output or a mismatching parts folder."""
    gz = output_path.endswith(".gz") and output_format != "parquet"
    if output_path == "-":
        if resume or part_size:
            raise ValueError("--resume/--part-size need a file output, not -o -")
        return StdoutSink(output_format, gz, row_group_rows)
    remove_stale_temps(output_path)  # of runs killed with SIGKILL (dead pids only)
    if resume or part_size:
        if input_path == "-":
            raise ValueError("--resume/--part-size need a file input, not -")
        return PartSink(output_path, output_format, part_size or DEFAULT_PART_SIZE,
                        _fingerprint(input_path, input_format), resume, gz, row_group_rows, keep_parts,
                        guard)
    return SingleFileSink(output_path, output_format, gz, row_group_rows, guard)


DEFAULT_PART_SIZE = 100_000


class _Progress:
    """tqdm over input bytes (JSONL: compressed bytes for .gz) or rows (Parquet), with a total
    and ETA when the size is known; ``None`` when off."""

    def __init__(self, enabled: bool, input_path: str, input_format: str):
        self.bar = None
        self.pos = 0
        self._shown = 0
        if not enabled:
            return
        if input_format == "parquet":
            self.bar = tqdm(total=formats.parquet_num_rows(input_path), unit="row", file=sys.stderr,
                            dynamic_ncols=True)
        else:
            total = os.path.getsize(input_path) if input_path != "-" and os.path.isfile(input_path) else None
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                            dynamic_ncols=True)

    def tick(self, lines: int) -> None:
        if self.bar is not None and self.pos != self._shown:
            self.bar.update(self.pos - self._shown)
            self._shown = self.pos
            # a string: tqdm formats an int postfix as '2e+4'
            self.bar.set_postfix_str(f"records={lines}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _records(input_path: str, input_format: str, prog: _Progress, batch_rows: int,
             abort_fd: int | None = None) -> Iterator[tuple[bytes | tuple[bytes, int], str | None]]:
    if input_format == "parquet":
        def on_batch(n: int) -> None:
            prog.pos += n
        yield from formats.read_parquet(input_path, batch_rows, on_batch)
        return
    f, raw = formats.open_input(input_path, abort_fd)
    reader = formats.read_openai_batch(f) if input_format == "openai-batch" else formats.read_jsonl(f)
    try:
        for i, rec in enumerate(reader):
            if raw is not None and i % 64 == 0:
                prog.pos = raw.tell()
            yield rec
        if raw is not None:
            prog.pos = raw.tell()
    finally:
        if raw is not None:  # standard input stays open
            f.close()
            raw.close()


#: seconds a wait for the pool's next result lasts before a deferred signal is looked at
POLL_S = 0.2


def _work_chunk(items: list[bytes | tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    return [_work(item) for item in items]


def _chunks(items: Iterator[Any], n: int) -> Iterator[list[Any]]:
    """Lists of ``n`` items (the last one shorter), as ``Pool.imap``'s ``chunksize`` makes them."""
    while chunk := list(itertools.islice(items, n)):
        yield chunk


def _polled(results: Any, guard: CommitGuard | None) -> Iterator[tuple[bytes, int]]:
    """The results of ``Pool.imap`` over chunks (its ``IMapIterator``, whose ``next`` takes a
    timeout: with ``chunksize`` > 1 ``imap`` returns a plain generator), flattened; each wait lasts
    ``POLL_S`` at most and is preceded by ``CommitGuard.raise_pending``."""
    while True:
        if guard is not None:
            guard.raise_pending()
        try:
            chunk = results.next(POLL_S)
        except mp.TimeoutError:  # (multiprocessing's own, not the built-in TimeoutError)
            continue
        except StopIteration:
            return
        yield from chunk


#: seconds an aborted run waits for ``Pool.terminate``, which can block for ever when a worker it
#: killed held a queue lock (cpython#96995); the pool's handler threads are daemons and its
#: workers die with this process (``die_with_parent``), so the run goes on without it
TERMINATE_WAIT_S = 10.0


def _terminate(pool: Any, wait_s: float = TERMINATE_WAIT_S) -> bool:
    """``pool.terminate()`` in a daemon thread, waited for at most ``wait_s`` seconds; returns
    whether it finished (False: stuck, cpython#96995, and said so on standard error)."""
    t = threading.Thread(target=pool.terminate, name="batch-pool-terminate", daemon=True)
    t.start()
    t.join(wait_s)
    if t.is_alive():
        print(f"derender-worker batch: the worker pool did not stop within {wait_s:g} s "
              "(a worker died holding a queue lock, cpython#96995); exiting without it", file=sys.stderr)
        return False
    return True


def _abort(exc: BaseException, guard: CommitGuard | None, sink: SingleFileSink, pool: Any,
           aborted: threading.Event, abort_w: int, window: threading.Semaphore, max_in_flight: int) -> None:
    """Clean up an aborted run: stop the reader (``feed`` in the pool's task thread or in this
    one, waiting on the window or on standard input), terminate the pool, remove the temporary
    output. ``guard`` is held first, so a signal during the cleanup does not cut it short."""
    if guard is not None:
        guard.hold()
    aborted.set()
    os.write(abort_w, b"x")  # a read of standard input returns end of input (formats.AbortableFd)
    try:
        if pool is not None:
            window.release(max_in_flight + 1)  # wake a task thread waiting on the full window
            _terminate(pool)  # joins the task thread: it returns once woken
    finally:
        sink.abort(exc)


def _formats(input_path: str, output_path: str, input_format: str | None,
             output_format: str | None) -> tuple[str, str]:
    """``(input format, output format)`` of a run, detected where not given. Raises
    ``ValueError`` for an unknown format, ``FileNotFoundError`` for a missing input file."""
    in_fmt = input_format or formats.detect_input_format(input_path)
    if in_fmt not in formats.INPUT_FORMATS:
        raise ValueError(f"unknown input format {in_fmt!r} (one of {', '.join(formats.INPUT_FORMATS)})")
    out_fmt = output_format or formats.output_format_for(output_path, in_fmt)
    if out_fmt not in formats.OUTPUT_FORMATS:
        raise ValueError(f"unknown output format {out_fmt!r} (one of {', '.join(formats.OUTPUT_FORMATS)})")
    if in_fmt != "parquet" and input_path != "-" and not os.path.isfile(input_path):
        raise FileNotFoundError(f"input {input_path!r} not found")
    return in_fmt, out_fmt


def run_batch(service: DerenderService, input_path: str, output_path: str, workers: int = 0,
              chunksize: int = 16, progress: bool | None = None, *, input_format: str | None = None,
              output_format: str | None = None, part_size: int | None = None, resume: bool = False,
              row_group_rows: int = 4096, max_in_flight: int | None = None,
              keep_parts: bool = False, guard: CommitGuard | None = None) -> dict[str, Any]:
    """Derender every record of ``input_path`` into ``output_path``, in input order.

    Formats default to ``formats.detect_input_format`` / ``formats.output_format_for``; gzip
    output when a JSONL name ends in ``.gz``. ``part_size``/``resume``: numbered part files
    (``worker.offline.commit.PartSink``); a resumed run skips completed parts (their stream-chunk
    records are replayed for state only). ``progress``: None = on a terminal only. ``guard``:
    told right before the final rename and when the cleanup of an aborted run starts (the
    signal handlers of ``worker.cli.batch`` read it).

    Returns the summary: ``lines``, ``ok``, ``errors`` (count by status), ``failures`` (up to
    ``MAX_FAILURE_KINDS`` of ``{"status", "message", "count", "first_index"}``), ``skipped``
    (records in reused parts), ``seconds``, ``lines_per_s`` (records derendered by this run per
    second), ``input_format``, ``output_format``. Raises ``OSError`` when the input cannot be read
    or the output written, ``ValueError`` for bad settings; the output is then left as it was."""
    global _service
    _service = service
    in_fmt, out_fmt = _formats(input_path, output_path, input_format, output_format)
    service.preload()
    workers = workers or (os.cpu_count() or 1)
    max_in_flight = max(max_in_flight or max(64, workers * chunksize * 4), 2 * chunksize)
    if progress is None:
        progress = sys.stderr.isatty()
    sink = make_sink(output_path, out_fmt, part_size=part_size, resume=resume, input_path=input_path,
                     input_format=in_fmt, row_group_rows=row_group_rows, keep_parts=keep_parts, guard=guard)
    psize = sink.part_size
    tally = Tally()
    part_tally = Tally()
    skipped = 0
    t0 = time.perf_counter()
    prog = _Progress(progress, input_path, in_fmt)
    streams = StreamLines(service)
    pending: collections.deque[tuple[int, str | None]] = collections.deque()
    window = threading.Semaphore(max_in_flight)
    #: set when the run is aborted (Ctrl-C, SIGTERM, an error): the pool's task thread, which runs
    #: ``feed`` and may wait on a full window, stops instead, so ``pool.terminate()`` can join it
    aborted = threading.Event()
    #: written to when the run is aborted: wakes a read of standard input waiting for data (in the
    #: task thread, which ``pool.terminate()`` joins, or in this one), whatever the writer does
    abort_r, abort_w = os.pipe()
    n_read = 0

    def feed() -> Iterator[bytes | tuple[bytes, int]]:
        nonlocal n_read, skipped
        for idx, (item, cid) in enumerate(_records(input_path, in_fmt, prog, min(1024, max_in_flight), abort_r)):
            n_read = idx + 1
            if psize and sink.is_done(idx // psize):
                streams.replay(item)
                skipped += 1
                continue
            routed = streams.route(item)
            if workers > 1:
                window.acquire()
                if aborted.is_set():
                    return
            pending.append((idx, cid))
            yield routed

    pool = None
    cur_part = -1
    writer = None
    written: set[int] = set()
    done_here = 0
    try:
        if workers == 1:
            results: Iterator[tuple[bytes, int]] = map(_work, feed())
        else:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            if guard is not None:
                guard.deferred = True  # signals are raised at safe points of _polled (CommitGuard)
            pool = mp.get_context("fork").Pool(workers, initializer=_pool_init, initargs=(os.getpid(),))
            results = _polled(pool.imap(_work_chunk, _chunks(feed(), chunksize)), guard)
        for body, status in results:
            idx, cid = pending.popleft()
            if workers > 1:
                window.release()
            k = idx // psize if psize else 0
            if k != cur_part:
                if writer is not None:
                    sink.commit_part(cur_part, part_tally.as_stats())
                    part_tally = Tally()
                writer = sink.open_part(k)
                written.add(k)
                cur_part = k
            writer.write(idx, body, status, cid)
            tally.add(idx, body, status)
            part_tally.add(idx, body, status)
            prog.tick(n_read)
        if pool is not None:
            pool.close()
            pool.join()
            pool = None
            if guard is not None:
                guard.deferred = False
                guard.raise_pending()
        prog.tick(n_read)
        if writer is not None:
            sink.commit_part(cur_part, part_tally.as_stats())
        n_parts = -(-n_read // psize) if psize else 1
        done_here = sum(tally.statuses.values())
        for k in range(n_parts if psize else 0):
            if k not in written and sink.is_done(k):
                tally.merge(sink.done_stats(k))
        sink.finish(n_parts)
    except BaseException as e:
        _abort(e, guard, sink, pool, aborted, abort_w, window, max_in_flight)
        raise
    finally:
        prog.close()
        os.close(abort_r)
        os.close(abort_w)
    return tally.summary(time.perf_counter() - t0, done_here, skipped, in_fmt, out_fmt)
