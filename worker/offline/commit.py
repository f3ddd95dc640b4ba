"""Output commit of batch mode: a run never leaves a truncated or half-written file where output is
expected, and never destroys earlier output.

- ``SingleFileSink``: the output is written to a hidden temporary file next to it
  (``.NAME.<pid>.tmp``, same directory so the rename is atomic on POSIX) and renamed over
  ``NAME`` only when the run completed; on an error (a full disk included) the temporary file is
  removed and an existing ``NAME`` is untouched. After a SIGKILL the temporary file stays (it is
  never read); the next run for ``NAME`` removes those of dead processes (``remove_stale_temps``).
- ``PartSink`` (``--part-size N`` or ``--resume``): records ``[k*N, (k+1)*N)`` go to part ``k``,
  written as ``NAME.parts/part-0000k.EXT.tmp`` and renamed to ``part-0000k.EXT`` when complete
  (a ``part-0000k.json`` next to it holds the part's counts). At the end the parts are
  concatenated (JSONL: bytes; gzip members concatenate into a valid gzip file; Parquet: row group
  by row group) into ``NAME`` through the same temporary-file rename, and the parts folder is
  removed. ``NAME.parts/manifest.json`` records what the parts were made from (input path, size
  and mtime, formats, part size): ``--resume`` only reuses parts of the same input and settings.
- ``StdoutSink``: ``-o -`` writes straight to standard output (no atomicity possible).
- ``CommitGuard``: tells the signal handlers of ``batch`` when a signal must no longer interrupt
  the run: from the final rename on (the output is complete) and during the cleanup of an
  aborted run (docs/batch.md, "Output is never lost").
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from worker.offline.formats import make_writer, parquet_output_schema

PART_DIGITS = 5


def _fsync_rename(tmp: str, final: str) -> None:
    os.replace(tmp, final)
    try:
        fd = os.open(os.path.dirname(os.path.abspath(final)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory: the rename itself is done
        pass
    finally:
        os.close(fd)


def temp_path(path: str, pid: int | None = None) -> str:
    """The hidden temporary file of ``path`` written by process ``pid`` (default: this one):
    ``DIR/.NAME.<pid>.tmp``."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}.{os.getpid() if pid is None else pid}.tmp")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_stale_temps(path: str) -> list[str]:
    """Remove the temporary files of ``path`` (``.NAME.<pid>.tmp``, see ``temp_path``) left by
    runs that were killed (SIGKILL, power loss): only those whose pid is not a live process, so a
    concurrent run's file is kept. Returns the removed paths. Raises nothing for a missing or
    unreadable directory (the output check reports that)."""
    d, name = os.path.split(os.path.abspath(path))
    prefix = f".{name}."
    removed = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    for n in names:
        pid = n[len(prefix):-len(".tmp")] if n.startswith(prefix) and n.endswith(".tmp") else ""
        if not pid.isdigit() or len(pid) > 10 or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(d, n))
        except FileNotFoundError:  # another run removed it first
            continue
        removed.append(os.path.join(d, n))
    return removed


def check_output_path(path: str) -> None:
    """Check that output ``path`` can be written (``-`` = standard output: always): its folder
    exists, is a folder and takes a new file (a probe file is created and removed), and ``path``
    is not a folder. Run before the models load, so a typo costs no wait. Raises ``OSError`` with
    one message naming ``path`` as the user gave it."""
    if path == "-":
        return
    d, name = os.path.split(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"output {path!r} is a folder, not a file name")
    if not os.path.isdir(d):
        what = "is not a folder" if os.path.exists(d) else "does not exist"
        raise FileNotFoundError(f"output {path!r}: folder {d!r} {what}")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{name}.", suffix=".probe", dir=d)
    except OSError as e:
        raise OSError(f"output {path!r}: cannot create a file in {d!r}: {e.strerror or e}") from e
    os.close(fd)
    os.unlink(probe)


class CommitGuard:
    """Shared by a run and its signal handler (``worker.cli.batch``). ``committing``: the final
    output is being renamed into place (or was): it is complete, so a signal must not end the run
    as 'no output written'. ``held``: ``committing``, or the cleanup of an aborted run started: a
    handler records the signal and returns. ``deferred``: the run's main thread shares locks with
    the pool's threads (an exception raised inside ``with lock:`` may leave it held, and
    ``Pool.terminate()`` then waits forever): a handler stores the exception to raise in
    ``pending`` and the run raises it at its next safe point (``raise_pending``)."""

    def __init__(self) -> None:
        self.committing = False
        self.held = False
        self.deferred = False
        self.pending: BaseException | None = None

    def commit(self) -> None:
        """Called right before the final rename."""
        self.committing = self.held = True

    def hold(self) -> None:
        """Called when the cleanup of an aborted run starts."""
        self.held = True

    def raise_pending(self) -> None:
        """Raise the exception a handler deferred (``pending``), if any."""
        if self.pending is not None:
            exc, self.pending = self.pending, None
            raise exc


@contextmanager
def atomic_file(path: str, before_rename: Callable[[], None] | None = None) -> Iterator[IO[bytes]]:
    """Open a temporary file next to ``path`` (``temp_path``) for writing; on a clean exit flush,
    fsync, call ``before_rename`` (``CommitGuard.commit`` for the final output) and rename it to
    ``path``; on an exception remove it (``path`` untouched) and re-raise. The temporary file is
    removed even when closing it fails again (a full disk: ``close()`` flushes the buffer and
    raises ``ENOSPC`` a second time)."""
    tmp = temp_path(path)
    f = open(tmp, "wb")
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        if before_rename is not None:
            before_rename()
        _fsync_rename(tmp, path)
    except BaseException:
        try:
            f.close()
        except OSError:  # flushing the buffer fails again (ENOSPC): the first error is re-raised below
            pass
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


class _Part:
    """One open part: its writer and the context of its atomic file."""

    def __init__(self, path: str, fmt: str, gz: bool, row_group_rows: int,
                 before_rename: Callable[[], None] | None = None):
        self._cm = atomic_file(path, before_rename)
        self.f = self._cm.__enter__()
        try:
            self.writer = make_writer(fmt, self.f, gz, row_group_rows)
        except BaseException as e:  # the temporary file goes too
            self.abort(e)
            raise

    def commit(self) -> None:
        self.writer.close()
        self._cm.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        try:
            self._cm.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException as e:  # the context re-raises exc after cleaning up: expected
            if e is not exc:
                raise


class SingleFileSink:
    """The whole output as one part committed by rename (see the module docstring). ``guard``:
    told right before the final rename (``CommitGuard.commit``)."""

    part_size: int | None = None

    def __init__(self, path: str, fmt: str, gz: bool = False, row_group_rows: int = 4096,
                 guard: CommitGuard | None = None):
        self.path, self.fmt, self.gz, self.rgr = path, fmt, gz, row_group_rows
        self.guard = guard
        self._part: _Part | None = None

    def _before_rename(self) -> None:
        if self.guard is not None:
            self.guard.commit()

    def is_done(self, k: int) -> bool:
        """Never: a single file is always written whole."""
        return False

    def done_stats(self, k: int) -> dict[str, Any]:
        raise KeyError(k)

    def open_part(self, k: int):
        """The writer of the (only) part."""
        self._part = _Part(self.path, self.fmt, self.gz, self.rgr, self._before_rename)
        return self._part.writer

    def commit_part(self, k: int, stats: dict[str, Any]) -> None:
        """Nothing yet: the file is committed by ``finish``."""

    def finish(self, n_parts: int) -> None:
        """Rename the output into place (an empty output when no record was read)."""
        if self._part is None:
            self.open_part(0)
        assert self._part is not None
        self._part.commit()
        self._part = None

    def abort(self, exc: BaseException) -> None:
        """Remove the temporary file; an existing output stays as it was."""
        if self._part is not None:
            self._part.abort(exc)
            self._part = None


class StdoutSink(SingleFileSink):
    """``-o -``: results go straight to standard output."""

    def __init__(self, fmt: str, gz: bool = False, row_group_rows: int = 4096):
        super().__init__("-", fmt, gz, row_group_rows)
        self._writer = None

    def open_part(self, k: int):
        self._writer = make_writer(self.fmt, sys.stdout.buffer, self.gz, self.rgr)
        return self._writer

    def finish(self, n_parts: int) -> None:
        if self._writer is None:
            self.open_part(0)
        self._writer.close()  # type: ignore[union-attr]
        sys.stdout.buffer.flush()

    def abort(self, exc: BaseException) -> None:
        sys.stdout.buffer.flush()


def _only_own_files(d: str) -> bool:
    """Whether folder ``d`` holds only files a part-file run writes (``part-*``, hidden ``.tmp``
    files): what a run that failed before writing its manifest leaves."""
    return all(os.path.isfile(os.path.join(d, n)) and (n.startswith("part-") or n.endswith(".tmp"))
               for n in os.listdir(d))


def part_ext(fmt: str, gz: bool) -> str:
    """File name suffix of a part: ``.parquet``, or ``.jsonl`` (+ ``.gz``)."""
    return ".parquet" if fmt == "parquet" else ".jsonl" + (".gz" if gz else "")


class PartSink(SingleFileSink):
    """Numbered part files, each renamed into ``NAME.parts/`` when complete; assembled into
    ``NAME`` at the end (see the module docstring).

    ``fingerprint``: what the parts are made from (JSON-able dict), stored in the manifest.
    ``resume``: reuse the complete parts of an earlier run with the same fingerprint; raises
    ``ValueError`` when the manifest differs. Without ``resume`` an earlier parts folder is
    cleared first. ``keep_parts``: leave the parts folder after assembly."""

    def __init__(self, path: str, fmt: str, part_size: int, fingerprint: dict[str, Any], resume: bool,
                 gz: bool = False, row_group_rows: int = 4096, keep_parts: bool = False,
                 guard: CommitGuard | None = None):
        super().__init__(path, fmt, gz, row_group_rows, guard)
        if part_size < 1:
            raise ValueError(f"--part-size must be >= 1 (got {part_size})")
        self.part_size = part_size
        self.keep_parts = keep_parts
        self.dir = path + ".parts"
        self.ext = part_ext(fmt, gz)
        self.fingerprint = dict(fingerprint, part_size=part_size, output_format=fmt, gzip=gz)
        self._stats: dict[int, dict[str, Any]] = {}
        manifest = os.path.join(self.dir, "manifest.json")
        if resume and os.path.isfile(manifest):
            with open(manifest, encoding="utf-8") as fh:
                old = json.load(fh)
            if old != self.fingerprint:
                diff = sorted(k for k in set(old) | set(self.fingerprint) if old.get(k) != self.fingerprint.get(k))
                raise ValueError(f"cannot resume: {self.dir} was made from a different input or settings "
                                 f"({', '.join(diff)} differ); remove it or run without --resume")
            self._load_done()
        else:
            if os.path.exists(self.dir):
                if not os.path.isfile(manifest) and not _only_own_files(self.dir):
                    raise ValueError(f"{self.dir} exists and is not a parts folder of this tool (no "
                                     "manifest.json): not touching it")
                shutil.rmtree(self.dir)  # a run that failed before its manifest was written: start over
            os.makedirs(self.dir)
            try:
                with atomic_file(manifest) as fh:
                    fh.write(json.dumps(self.fingerprint, sort_keys=True, indent=1).encode())
            except BaseException:  # (a full disk) no folder without a manifest stays behind
                shutil.rmtree(self.dir, ignore_errors=True)
                raise
        for name in os.listdir(self.dir):  # temporary files of an interrupted run
            if name.endswith(".tmp"):
                os.unlink(os.path.join(self.dir, name))

    def part_path(self, k: int) -> str:
        """Path of the complete part ``k``."""
        return os.path.join(self.dir, f"part-{k:0{PART_DIGITS}d}{self.ext}")

    def _stats_path(self, k: int) -> str:
        return os.path.join(self.dir, f"part-{k:0{PART_DIGITS}d}.json")

    def _load_done(self) -> None:
        for name in os.listdir(self.dir):
            if name.startswith("part-") and name.endswith(".json"):
                k = int(name[5:5 + PART_DIGITS])
                if os.path.isfile(self.part_path(k)):
                    with open(os.path.join(self.dir, name), encoding="utf-8") as fh:
                        self._stats[k] = json.load(fh)

    def is_done(self, k: int) -> bool:
        """Whether part ``k`` was completed (by this or an earlier run)."""
        return k in self._stats

    def done_stats(self, k: int) -> dict[str, Any]:
        """Counts of a completed part (``lines``, ``statuses``, ``failures``)."""
        return self._stats[k]

    def open_part(self, k: int):
        """A writer on the temporary file of part ``k``."""
        tmp_final = self.part_path(k)
        self._part = _Part(tmp_final, self.fmt, self.gz, self.rgr)
        self._part_k = k
        return self._part.writer

    def commit_part(self, k: int, stats: dict[str, Any]) -> None:
        """Write the part's counts, then rename the part into place (its presence marks it done)."""
        assert self._part is not None and self._part_k == k
        with atomic_file(self._stats_path(k)) as fh:
            fh.write(json.dumps(stats).encode())
        self._part.commit()
        self._part = None
        self._stats[k] = stats

    def finish(self, n_parts: int) -> None:
        """Assemble parts ``0..n_parts-1`` into the output (atomic rename) and remove the folder.
        Raises ``RuntimeError`` when a part is missing."""
        if self._part is not None:
            raise RuntimeError("a part is still open")
        missing = [k for k in range(n_parts) if not os.path.isfile(self.part_path(k))]
        if missing:
            raise RuntimeError(f"parts {missing[:5]} missing in {self.dir}")
        with atomic_file(self.path, self._before_rename) as out:
            if self.fmt == "parquet":
                self._assemble_parquet(out, n_parts)
            else:
                for k in range(n_parts):
                    with open(self.part_path(k), "rb") as fh:
                        shutil.copyfileobj(fh, out, 1 << 20)
                if n_parts == 0 and self.gz:
                    make_writer(self.fmt, out, True).close()
        if not self.keep_parts:
            shutil.rmtree(self.dir)

    def _assemble_parquet(self, out: IO[bytes], n_parts: int) -> None:
        # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
        import pyarrow.parquet as pq

        w = pq.ParquetWriter(out, parquet_output_schema(), compression="zstd")
        for k in range(n_parts):
            pf = pq.ParquetFile(self.part_path(k))
            for i in range(pf.num_row_groups):
                w.write_table(pf.read_row_group(i))
        w.close()


__all__ = ["CommitGuard", "atomic_file", "temp_path", "remove_stale_temps", "check_output_path", "SingleFileSink", "PartSink", "StdoutSink", "part_ext"]
