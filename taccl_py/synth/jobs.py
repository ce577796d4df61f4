"""Run a synthesis's independent jobs (candidates, baselines) in this process or in worker processes.

Every job is a picklable callable taking a progress callback. With one job slot they run here,
in order, their progress lines passed on as they come. With more, they run in worker processes
started by forkserver (spawn where there is none), so threads or CUDA state of the parent never
reach a worker; a worker puts its progress lines on a queue that the parent drains while it
waits, and the parent passes them to the caller's callback as they come (a callback, such as a
list's ``append``, need not pickle, and always runs in the caller's process). Results come back
in job order either way, and every job fixes its own solver state (work budgets, HiGHS's thread
pool), so the answer does not depend on the number of workers.

The parent alone decides when workers stop: they ignore Ctrl-C, the parent ends them (SIGTERM,
then SIGKILL) when it leaves ``run_jobs`` by any exception, KeyboardInterrupt included, and a
worker whose parent died (SIGKILL, a crash) exits by itself. No signal handler of the calling
process is touched: turning SIGTERM into an exception is the caller's (the CLI's) choice.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import TypeVar

from taccl_py.errors import ArgumentError
from taccl_py.gc_tuning import collect_cycles_rarely

__all__ = ["Job", "available_cores", "check_jobs", "run_jobs"]

T = TypeVar("T")
_POLL_S = 0.2  # how often the parent passes on its workers' progress lines
_STOP_WAIT_S = 2.0  # how long a worker has to exit after SIGTERM before it gets SIGKILL
_ORPHAN_EXIT = 128 + signal.SIGHUP  # a worker's status when it exits because its parent died
Job = Callable[[Callable[[str], None] | None], T]


def available_cores() -> int:
    """Return the number of cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_jobs(jobs: int | None) -> int:
    """Return ``jobs``, or ``available_cores()`` for None; raise ``ArgumentError`` unless it is a positive int."""
    if jobs is None:
        return available_cores()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ArgumentError(None, "jobs", f"{jobs!r} jobs", "a positive number of worker processes")
    return jobs


def _reporting(job: Job, lines: object | None) -> object:
    """Run ``job`` in a worker with its progress lines put on the queue ``lines`` (None: no progress)."""
    return job(None if lines is None else lines.put)


def _prepare_worker() -> None:
    """Make this worker ignore Ctrl-C (the parent reports it, once, and ends us), collect rarely, exit with its parent.

    A forkserver worker's parent process is the forkserver, which outlives the caller while any worker
    lives, so the kernel's parent-death signal cannot help; multiprocessing's parent sentinel is a pipe
    the caller holds open, readable once the caller is gone.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    collect_cycles_rarely()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent.sentinel,), name="parent-watch", daemon=True).start()


def _exit_with_parent(sentinel: int) -> None:
    """Wait until the parent process is gone, then end this worker at once (its results have no reader)."""
    multiprocessing.connection.wait([sentinel])
    os._exit(_ORPHAN_EXIT)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the jobs not started and end ``pool``'s workers now: SIGTERM, then SIGKILL after ``_STOP_WAIT_S``."""
    # The executor has no public handle on its processes before Python 3.14's terminate_workers.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(_STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _pass_on(lines: object, progress: Callable[[str], None]) -> None:
    """Pass every line waiting on the queue ``lines`` to ``progress``."""
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return
        progress(line)


def run_jobs(
    jobs: Sequence[Job],
    workers: int,
    progress: Callable[[str], None] | None,
    costs: Sequence[float] | None = None,
) -> list:
    """Return the values of ``jobs`` in order, running up to ``workers`` of them at a time.

    ``workers`` 1 (or a single job) runs them here; a job's exception is raised here either way.
    Progress lines of workers reach ``progress`` (in this process) within ``_POLL_S`` seconds.
    ``costs`` estimate each job's work (any unit); workers take the costliest first (ties in job
    order), so that a long job does not start last and run alone.
    """
    if workers <= 1 or len(jobs) <= 1:
        return [job(progress) for job in jobs]
    context = _context()
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context, initializer=_prepare_worker)
    try:
        values = _collect(pool, context, jobs, progress, costs)
    except BaseException:
        # Waiting for the running jobs (the executor's own exit) could take minutes: end them.
        _stop_workers(pool)
        raise
    pool.shutdown()
    return values


def _collect(
    pool: ProcessPoolExecutor,
    context: multiprocessing.context.BaseContext,
    jobs: Sequence[Job],
    progress: Callable[[str], None] | None,
    costs: Sequence[float] | None,
) -> list:
    """Return the values of ``jobs`` run on ``pool``, in job order, passing their progress lines on as they come."""
    values: list[object] = [None] * len(jobs)
    with contextlib.ExitStack() as stack:
        # The manager's server process ignores SIGINT (CPython bpo-36368): Ctrl-C stays one line.
        lines = None if progress is None else stack.enter_context(context.Manager()).Queue()
        order = range(len(jobs)) if costs is None else sorted(range(len(jobs)), key=lambda i: -costs[i])
        futures = {pool.submit(_reporting, jobs[index], lines): index for index in order}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                if lines is not None:
                    _pass_on(lines, progress)
                for future in done:
                    values[futures[future]] = future.result()
        except BaseException:
            # End the workers while the manager still runs: a worker that unpickles a queued job's
            # progress queue after the manager stopped dies with a traceback on the user's terminal.
            _stop_workers(pool)
            raise
    return values
