"""Batch mode: ``derender-worker batch LOG -o OUT`` derenders a generation log offline through the
same core as the Kafka worker. This module holds the command line; the engine lives in
``worker.offline`` (formats, output commit, stream lines, local runner, Ray Data, summary).

Input: plain JSONL (one derender body per line: ``DerenderChatRequest`` /
``DerenderCompletionRequest``, told apart by shape; streaming chunk bodies; or a JSON array of
one request's chunk bodies, see ``worker.offline.streams``), OpenAI Batch JSONL (``custom_id`` +
``body``), or Parquet (one row per request, columns named as the body's fields); gzip JSONL told
by its content (RFC 1952 magic bytes); ``-`` reads standard input. Formats: ``worker.offline.formats``.
Output: one result per input record, in input order: the OpenAI response, or an OpenAI error
object for a bad record (a bad record never stops the file); ``created`` in the output is the
body's engine value, else 0 (never the clock: the same log always gives the same output bytes); JSONL (gzip when the name ends in
``.gz``), OpenAI Batch output lines, or Parquet. The output file is committed atomically (or in
numbered part files with ``--part-size``/``--resume``): a failed or interrupted run never leaves
a half-written output and never destroys an earlier one (``worker.offline.commit``).

Exit status: 0 when the input was processed and at least one record succeeded (or the input was
empty); 1 when no record succeeded, or any failed with ``--fail-on-error`` (the output is
written either way: failed records hold their error objects); 2 on a configuration or I/O error
(no output written); 130 on Ctrl-C, 143 on SIGTERM (the temporary output removed, completed
parts kept; a SIGTERM from the final rename on lets the run complete with its own status:
``_OnSigterm``); 141 (128 + SIGPIPE), quietly, when the reader of ``-o -``
went away (``| head``). A summary goes to standard error: counts, the distinct failures with their
first record, and how to list the failed records.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from worker.config import add_model_args, models_from_args
from worker.core.service import DerenderService, error_body
from worker.flags import add_vllm_noop_args
from worker.offline import formats
from worker.offline.commit import CommitGuard, check_output_path
from worker.offline.ray_engine import run_ray
from worker.offline.runner import DEFAULT_PART_SIZE, run_batch
from worker.offline.summary import exit_status, summary_lines


def _int_at_least(lo: int):
    """An argparse type: an integer >= ``lo`` (a 0 chunk size hung the pool, a negative worker
    count reached multiprocessing). Raises ``ValueError`` with the bound."""
    def conv(text: str) -> int:
        v = int(text)
        if v < lo:
            raise ValueError(f"must be >= {lo}")
        return v
    conv.__name__ = "int"
    return conv


HELP = "derender generation logs (JSONL/.gz, OpenAI Batch, Parquet) into responses (local or Ray)"


def add_args(ap: argparse.ArgumentParser) -> None:
    """Every flag of ``batch``: the model flags (as ``run``), ``add_batch_args``, and the vLLM flags
    accepted without effect."""
    add_model_args(ap)
    add_batch_args(ap)
    add_vllm_noop_args(ap)


def add_batch_args(ap: argparse.ArgumentParser) -> None:
    """Flags of ``batch`` (the model flags are added by ``worker.config.add_model_args``)."""
    ap.add_argument("input", help="generation log: JSONL (gzip ok; - for stdin), OpenAI Batch JSONL, or Parquet")
    ap.add_argument("-o", "--output", required=True,
                    help="output: JSONL (.gz -> gzip), OpenAI Batch JSONL, or .parquet (- for stdout)")
    ap.add_argument("--input-format", choices=("auto",) + formats.INPUT_FORMATS, default="auto",
                    help="default: parquet by name (.parquet/.pq), else openai-batch when the first line has "
                         "custom_id and body, else jsonl")
    ap.add_argument("--output-format", choices=("auto",) + formats.OUTPUT_FORMATS, default="auto",
                    help="default: parquet by name, else openai-batch after OpenAI Batch input, else jsonl")
    ap.add_argument("--engine", choices=("local", "ray"), default="local",
                    help="local: processes on this machine; ray: Ray Data actors (pip install 'derender-worker[ray]')")
    ap.add_argument("--ray-address", default=None,
                    help="Ray cluster address for --engine ray (default: RAY_ADDRESS, else a local Ray)")
    ap.add_argument("--workers", type=_int_at_least(0), default=0,
                    help="processes (local) or actors (ray); default: all cores; 1 = in-process")
    ap.add_argument("--chunksize", type=_int_at_least(1), default=16, help="records handed to a worker at a time")
    ap.add_argument("--max-in-flight", type=_int_at_least(0), default=0,
                    help="records read ahead of the output at most (default: workers*chunksize*4, >= 64)")
    ap.add_argument("--row-group-size", type=_int_at_least(1), default=4096, help="Parquet output rows per row group")
    ap.add_argument("--part-size", type=_int_at_least(0), default=0,
                    help="write numbered part files of N records (OUT.parts/), each renamed when complete, "
                         "assembled into OUT at the end")
    ap.add_argument("--resume", action="store_true",
                    help=f"part-file output (--part-size, default {DEFAULT_PART_SIZE}); reuse the parts an "
                         "earlier run with the same input and settings completed")
    ap.add_argument("--keep-parts", action="store_true", help="keep OUT.parts/ after assembling OUT")
    ap.add_argument("--fail-on-error", action="store_true", help="exit 1 when any record failed")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar with total and ETA on standard error (default: on a terminal)")


class Terminated(BaseException):
    """Raised in the main process of ``batch`` by SIGTERM (``kill PID``, a job scheduler's stop),
    so the output is cleaned up as on Ctrl-C instead of the process dying with its temporary file
    in place. A ``BaseException`` like ``KeyboardInterrupt``: no ``except Exception`` swallows it."""


class _OnSigterm:
    """The SIGTERM handler of ``batch`` (see ``CommitGuard``): raises ``Terminated`` once; while
    the guard is ``deferred`` hands it to the run instead (``pending``); while the guard is held
    (the output being renamed into place or complete, or the cleanup of an aborted run under way),
    and for any later SIGTERM, only records it (``received``), so the rename or the cleanup
    completes (docs/batch.md, "Exit status and summary")."""

    def __init__(self, main_pid: int, guard: CommitGuard):
        self.main_pid, self.guard, self.received = main_pid, guard, False

    def __call__(self, signum, frame) -> None:
        if os.getpid() != self.main_pid:  # a forked pool process inherited the handler: die as by default
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        first, self.received = not self.received, True
        if not first or self.guard.held:
            return
        if self.guard.deferred:
            self.guard.pending = Terminated()
            return
        self.guard.hold()  # the cleanup this starts is not cut short by another SIGTERM
        raise Terminated()


def main_batch(args: argparse.Namespace) -> int:
    """``derender-worker batch``: see the module docstring for the exit status."""
    parts_note = " (completed parts kept: rerun with --resume)" if args.resume or args.part_size else ""
    guard = CommitGuard()
    if threading.current_thread() is not threading.main_thread():  # signal handlers: main thread only
        return _main_batch(args, parts_note, guard)
    handler = _OnSigterm(os.getpid(), guard)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        rc = _main_batch(args, parts_note, guard)
        if handler.received and guard.committing and rc != 2:
            print("derender-worker batch: SIGTERM received after the output was written; the run completed",
                  file=sys.stderr)
        return rc
    except Terminated:
        print(f"derender-worker batch: terminated (SIGTERM); no output written{parts_note}", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main_batch(args: argparse.Namespace, parts_note: str, guard: CommitGuard) -> int:
    try:
        check_output_path(args.output)  # before the models load (seconds): a typo costs no wait
        service = DerenderService(models_from_args(args))
        kw = dict(input_format=None if args.input_format == "auto" else args.input_format,
                  output_format=None if args.output_format == "auto" else args.output_format,
                  row_group_rows=args.row_group_size)
        if args.engine == "ray":
            if args.resume or args.part_size:
                raise ValueError("--resume/--part-size work with --engine local only")
            summary = run_ray(service, args.input, args.output, workers=args.workers,
                              batch_size=args.chunksize * 16, address=args.ray_address,
                              progress=args.progress, guard=guard, **kw)
        else:
            summary = run_batch(service, args.input, args.output, args.workers, args.chunksize,
                                progress=args.progress, part_size=args.part_size or None, resume=args.resume,
                                max_in_flight=args.max_in_flight or None, keep_parts=args.keep_parts, guard=guard,
                                **kw)
    except BrokenPipeError:
        # ``-o - | head``: the reader went away, as it may; quiet, like other filters (the status
        # a shell reports for a process killed by SIGPIPE). stdout is pointed at /dev/null so the
        # interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (ValueError, OSError, EOFError, RuntimeError, ImportError) as e:
        print(f"derender-worker batch: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"derender-worker batch: interrupted; no output written{parts_note}", file=sys.stderr)
        return 128 + signal.SIGINT
    for line in summary_lines(summary, args.output):
        print(line, file=sys.stderr)
    return exit_status(summary, args.fail_on_error)


__all__ = ["HELP", "add_args", "run_batch", "main_batch", "add_batch_args", "error_body", "summary_lines", "exit_status"]
