"""No orphans: the derender pool's processes end when the worker's main process ends, however
it ended (``kill -9`` included).

Why they would not by themselves: the pool runs under ``multiprocessing``'s ``forkserver``, so
pool processes are children of the fork server, not of the main process; every pool process holds
the write ends of its executor's queues and of the fork server's "alive" pipe, so when the main
process is killed none of them ever sees end-of-file, and they (and the resource tracker, whose
pipe they also hold) wait forever.

What this module does (Linux ``prctl(PR_SET_PDEATHSIG)``, see prctl(2), plus a portable check):

* ``mark_main()`` (main process, before a pool starts) records the main pid in the environment
  (``DERENDER_MAIN_PID``, inherited by the fork server) and makes the fork server import this
  module first (``set_forkserver_preload``); on import there the fork server asks for ``SIGKILL``
  when its parent, the main process, dies.
* ``guard_pool_process()`` (pool-process initializer) does the same for the pool process, whose
  parent is the fork server, and starts a daemon thread that exits the process when the main
  pid is gone (checked every ``WATCH_INTERVAL_S``; covers non-Linux systems and a parent that
  died before the ``prctl`` call).

When the pool processes are gone, the fork server and the resource tracker see end-of-file on
their pipes and exit too.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

__all__ = ["MAIN_PID_ENV", "WATCH_INTERVAL_S", "mark_main", "guard_pool_process", "die_with_parent"]

MAIN_PID_ENV = "DERENDER_MAIN_PID"
WATCH_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) exits
    (``prctl(PR_SET_PDEATHSIG)``; Linux only). Returns whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _main_pid() -> int | None:
    try:
        return int(os.environ[MAIN_PID_ENV])
    except (KeyError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (pid reused): treat as gone
        return False
    return True


def mark_main(ctx) -> None:
    """In the main process, before ``ctx`` (a ``forkserver`` multiprocessing context) starts a
    pool: record this pid for the pool and preload this module in the fork server (which makes
    it die with this process). Harmless for other start methods."""
    os.environ[MAIN_PID_ENV] = str(os.getpid())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload([__name__])


def guard_pool_process() -> None:
    """In a pool process (its initializer): die with the parent (the fork server, or the main
    process under ``spawn``) and exit when the main process is gone (watch thread)."""
    die_with_parent()
    main = _main_pid()
    if main is None:
        return
    if not _alive(main):
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            if not _alive(main):
                os._exit(1)

    threading.Thread(target=watch, name="derender-main-watch", daemon=True).start()


def _on_import() -> None:
    """Imported as the fork server's preload: die with the main process."""
    main = _main_pid()
    if main is None or main == os.getpid():
        return  # the main process itself (or a process we did not start)
    if os.getppid() == main:  # the fork server (its parent is the main process)
        die_with_parent()
        if os.getppid() != main:  # the main process died before the prctl call
            os._exit(1)


_on_import()
