"""The derender pool of a Kafka worker: a process pool (``forkserver``; each process builds its
own ``DerenderService`` once) or a thread pool sharing one service, plus the one-process
quarantine pool that reruns a record alone after a pool process died, and the pool restart.

Used by ``worker.transport.consumer.KafkaDerenderWorker``; the functions it runs are in
``worker.transport.jobs``."""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from worker.config import ServedModelConfig
from worker.core.service import DerenderService, error_body_for, record_api
from worker.transport.jobs import (
    JobOutcome,
    StreamOutcome,
    derender_job,
    derender_stream_job,
    proc_init,
    proc_job,
    proc_jobs,
    proc_ping,
    proc_stream_job,
)
from worker.transport.lifetime import mark_main

log = logging.getLogger(__name__)

__all__ = ["DerenderPool"]


def _mp_context():
    """The pool's multiprocessing context (``forkserver`` on Linux, else ``spawn``), set up so
    that its processes end with this one (``worker.transport.lifetime``)."""
    ctx = multiprocessing.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
    mark_main(ctx)
    return ctx


class DerenderPool:
    """Runs derender jobs off the event loop.

    ``models``: served models (a process pool builds a ``DerenderService`` from them in each
    process). ``service``: an object with ``derender(body, kind)``/``derender_stream(...)`` to use
    instead (forces threads). ``executor``: an existing ``concurrent.futures.Executor`` (not shut
    down here). ``num_workers``/``executor_kind`` (``process``/``thread``) as in ``WorkerSettings``."""

    def __init__(self, models: list[ServedModelConfig] | None, service: Any, executor: cf.Executor | None,
                 num_workers: int, executor_kind: str):
        self.models = models
        self.service = service
        self.executor = executor
        self.own_executor = executor is None
        self.num_workers = num_workers
        self.executor_kind = executor_kind
        self._job_fn: Callable[..., JobOutcome] | None = None
        self._jobs_fn: Callable[..., list[JobOutcome]] | None = None
        self._stream_fn: Callable[..., Any] | None = None
        self._qpool: cf.ProcessPoolExecutor | None = None  # quarantine for crash retries
        self.on_restart: Callable[[], Any] | None = None  # called after each restart() (metrics)
        self._qlock: asyncio.Lock | None = None

    @property
    def is_process(self) -> bool:
        """True when jobs run in a process pool."""
        return isinstance(self.executor, cf.ProcessPoolExecutor)

    # -- creation ------------------------------------------------------------------------------
    def make(self) -> None:
        """Create the executor (unless one was given) and pick the job functions."""
        self._make_inner()
        if self._job_fn is proc_job:
            self._stream_fn = proc_stream_job
            self._jobs_fn = proc_jobs
        else:
            svc = self.service
            self._stream_fn = lambda v, s, q, k, c=None, p=None, o=None: derender_stream_job(svc, v, s, q, k, c, p, o)
            fn = self._job_fn
            self._jobs_fn = lambda items: [fn(v, k, c) for v, k, c in items]

    def _make_inner(self) -> None:
        if self.executor is not None:
            self._job_fn = (lambda v, k, c=None: derender_job(self.service, v, k, c)) if self.service else proc_job
            return
        if self.service is not None or self.executor_kind == "thread":
            if self.service is None:
                self.service = DerenderService(self.models)
            self.executor = cf.ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="derender")
            svc = self.service
            self._job_fn = lambda v, k, c=None: derender_job(svc, v, k, c)
            return
        self.executor = cf.ProcessPoolExecutor(max_workers=self.num_workers, mp_context=_mp_context(),
                                               initializer=proc_init, initargs=(self.models,))
        self._job_fn = proc_job

    async def warm_up(self) -> None:
        """Load the models now (so configuration errors surface at startup, not on the first
        message): ``preload()`` the thread-mode service, or start every pool process (each
        preloads in its initializer). Raises what ``preload`` raises (``ValueError`` on a bad
        model config) or ``BrokenProcessPool`` when the pool initializer fails."""
        preload = getattr(self.service, "preload", None)
        if preload is not None and not self.is_process:
            t0 = time.perf_counter()
            await asyncio.get_running_loop().run_in_executor(self.executor, preload)
            log.info("models loaded in %.2fs", time.perf_counter() - t0)
        if self.is_process:
            # ping until every process answered (each one preloads in its initializer first)
            loop = asyncio.get_running_loop()
            t0 = time.perf_counter()
            n = self.num_workers
            pids: set[int] = set()
            while len(pids) < n and time.perf_counter() - t0 < 300:
                pids.update(await asyncio.gather(*(loop.run_in_executor(self.executor, proc_ping, 0.05)
                                                   for _ in range(n))))
            log.info("derender pool ready: %d processes in %.2fs", len(pids), time.perf_counter() - t0)

    def restart(self) -> None:
        """Replace a broken process pool by a new one (the old one is shut down without waiting)."""
        log.error("derender process pool broke; starting a new one")
        old = self.executor
        self.executor = None
        self.make()
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)
        if self.on_restart is not None:
            self.on_restart()

    def _restart_if_broken(self) -> None:
        if self.is_process and getattr(self.executor, "_broken", False):
            self.restart()

    def shutdown(self) -> None:
        """Shut down the quarantine pool and (when created here) the executor, waiting for them."""
        if self._qpool is not None:
            self._qpool.shutdown(wait=True, cancel_futures=True)
            self._qpool = None
        if self.own_executor and self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None

    # -- jobs ----------------------------------------------------------------------------------
    def chunk_size(self, total: int) -> int:
        """Messages per executor call: 1 for threads; for processes, enough to split a fetched
        batch of ``total`` messages evenly over the pool, at most 16 (amortizes pickling/IPC)."""
        if not self.is_process:
            return 1
        return max(1, min(16, -(-total // self.num_workers)))

    def _submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """``run_in_executor(self.executor, fn, *args)`` that never raises. A pool found broken
        at submission (a process died while idle: OOM killer, ``kill -9``) is restarted and the
        call submitted again: no record was running, so none is at fault. Any other failure to
        submit (or a second broken pool) is returned as the future's exception, for the caller's
        per-record handling (``outcome``: rerun alone, quarantine)."""
        loop = asyncio.get_running_loop()
        try:
            try:
                return loop.run_in_executor(self.executor, fn, *args)
            except BrokenProcessPool:
                log.error("derender process pool found broken (a process died while idle); restarting it")
                self._restart_if_broken()
                return loop.run_in_executor(self.executor, fn, *args)
        except Exception as e:  # the executor is shut down or broken again: the records' outcome says so
            fut = loop.create_future()
            fut.set_exception(e)
            return fut

    def submit_batch(self, items: list[tuple[bytes | None, str | None, int | None]]) -> asyncio.Future:
        """Run ``[(value, kind, created), ...]`` as one executor call -> future of ``list[JobOutcome]``
        (never raises: a failure to submit is the future's exception, see ``_submit``)."""
        return self._submit(self._jobs_fn, items)

    async def stream(self, value, state, seq, kind, created: int | None = None,
                     pieces: tuple[int, bytes] | None = None, settings: bytes | None = None) -> StreamOutcome:
        """Derender one stream chunk in the pool (state travels both ways; ``pieces``: stored
        piece bytes an earlier ``needs_pieces`` asked for; ``settings``: the stream's stored
        write-once settings, ``needs_settings``) -> ``StreamOutcome``; a pool process
        dying during the call or a failed call becomes a 500 outcome (a pool found broken before
        the call is restarted first: ``_submit``)."""
        try:
            return await self._submit(self._stream_fn, value, state, seq, kind, created, pieces, settings)
        except BrokenProcessPool:
            # maybe another record's doing (or the OOM killer's): rerun this chunk alone; only a
            # chunk that kills the quarantine process too ends its stream
            log.error("derender process died while a stream chunk (seq %s) was in the pool; retrying it in "
                      "quarantine", seq)
            self._restart_if_broken()
            out = await self._quarantined(proc_stream_job, (value, state, seq, kind, created, pieces, settings),
                                          f"a stream chunk (seq {seq})")
            if out is not None:
                return out
            return StreamOutcome(error_body_for(record_api(kind, value or b"", state),
                                                "internal error: derender process died", 500), 500, False,
                                 None, None, crash="derender process died")
        except Exception as e:
            return StreamOutcome(error_body_for(record_api(kind, value or b"", state),
                                                f"internal error: {type(e).__name__}: {e}", 500), 500, False,
                                 None, None, crash=repr(e))

    async def outcome(self, future: asyncio.Future, index: int, value: bytes | None, kind: str | None, where: str,
                      created: int | None = None) -> JobOutcome:
        """Await a job's derender: outcome ``index`` of executor call ``future`` (``submit_batch``:
        a list of ``JobOutcome``). When a pool process died (``BrokenProcessPool``:
        segfault, OOM kill...), restart the pool and rerun this message alone in a one-process
        quarantine pool, one message at a time, so only the message that kills it again is
        dead-lettered (``derender-crashed``) and messages that merely shared the broken pool are
        answered. Any other failure of the (batch) call is not this record's: it is rerun alone,
        and only when that fails too does it get a 500. ``where``: the record's
        ``topic[partition]@offset`` for the logs."""
        try:
            return (await future)[index]
        except BrokenProcessPool:
            log.error("derender process died while %s was in the pool; retrying it in quarantine", where)
            self._restart_if_broken()
            return await self.quarantine(value, kind, where, created)
        except Exception as e:
            log.error("derender call with %s failed (%s: %s); rerunning that record alone", where,
                      type(e).__name__, e)
        try:
            return await self._submit(self._job_fn, value, kind, created)
        except BrokenProcessPool:
            self._restart_if_broken()
            return await self.quarantine(value, kind, where, created)
        except Exception as e:
            log.exception("derender job failed on %s", where)
            return JobOutcome(error_body_for(record_api(kind, value or b""), f"internal error: {type(e).__name__}: {e}",
                                             500), 500,
                              None, None, False, crash=repr(e))

    async def quarantine(self, value: bytes | None, kind: str | None, where: str,
                         created: int | None = None) -> JobOutcome:
        """Derender one record alone in a dedicated one-process pool (serialized by a lock). A
        crash there convicts it: returns an outcome with ``crash="derender-crashed"``."""
        out = await self._quarantined(proc_job, (value, kind, created), where)
        return out if out is not None else JobOutcome(b"", 500, None, None, False, crash="derender-crashed")

    async def _quarantined(self, fn: Callable[..., Any], args: tuple, where: str) -> Any:
        """``fn(*args)`` alone in the one-process quarantine pool -> its result, or None when the
        process died on it (or there are no models to build a quarantine process from)."""
        if self.models is None:  # no models to build a quarantine service from
            return None
        if self._qlock is None:
            self._qlock = asyncio.Lock()
        async with self._qlock:
            if self._qpool is not None and getattr(self._qpool, "_broken", False):
                # its process died while idle (OOM killer, kill -9): not this record's doing
                log.error("quarantine derender process found dead; starting a new one")
                self._qpool.shutdown(wait=False, cancel_futures=True)
                self._qpool = None
            if self._qpool is None:
                self._qpool = cf.ProcessPoolExecutor(max_workers=1, mp_context=_mp_context(),
                                                     initializer=proc_init, initargs=(self.models,))
            try:
                return await asyncio.get_running_loop().run_in_executor(self._qpool, fn, *args)
            except BrokenProcessPool:
                log.error("derender process died again on %s: poison message", where)
                self._qpool.shutdown(wait=False, cancel_futures=True)
                self._qpool = None
                return None
