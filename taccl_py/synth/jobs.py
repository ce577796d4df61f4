"""Run a synthesis's independent jobs (candidates, baselines) in this process or in worker processes.

Every job is a picklable callable taking a progress callback. With one job slot they run here,
in order, their progress lines passed on as they come. With more, they run in worker processes
started by forkserver (spawn where there is none), so threads or CUDA state of the parent never
reach a worker; a worker collects its progress lines and the parent passes them on when the job
finishes, since a caller's callback (a CLI closure, a logger) need not pickle. Results come back
in job order either way, and every job fixes its own solver state (work budgets, HiGHS's thread
pool), so the answer does not depend on the number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

from taccl_py.errors import ArgumentError

__all__ = ["Job", "available_cores", "check_jobs", "run_jobs"]

T = TypeVar("T")
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


def _collecting(job: Job) -> tuple[object, tuple[str, ...]]:
    """Run ``job`` in a worker and return its value with the progress lines it wrote."""
    lines: list[str] = []
    value = job(lines.append)
    return value, tuple(lines)


def _exit_on_interrupt() -> None:
    """Make Ctrl-C end this worker at once and quietly: the parent reports it, once."""
    signal.signal(signal.SIGINT, lambda _signal, _frame: os._exit(128 + signal.SIGINT))


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def run_jobs(jobs: Sequence[Job], workers: int, progress: Callable[[str], None] | None) -> list:
    """Return the values of ``jobs`` in order, running up to ``workers`` of them at a time.

    ``workers`` 1 (or a single job) runs them here; a job's exception is raised here either way.
    """
    if workers <= 1 or len(jobs) <= 1:
        return [job(progress) for job in jobs]
    values: list[object] = [None] * len(jobs)
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(jobs)), mp_context=_context(), initializer=_exit_on_interrupt
    )
    with pool:
        futures = {pool.submit(_collecting, job): index for index, job in enumerate(jobs)}
        for future in as_completed(futures):
            value, lines = future.result()
            values[futures[future]] = value
            if progress is not None:
                for line in lines:
                    progress(line)
    return values
