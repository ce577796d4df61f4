"""Run a function on N local processes joined in a gloo (or NCCL) group: tests, benchmarks, ``taccl bench``.

The parent opens a TCPStore on 127.0.0.1 with port 0 (the OS picks a free one) and gives each
child the environment torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT, with the parent's store
as the agent store); the child initialises torch.distributed from it and calls
``fn(rank, world_size, *args)``. The
parent waits until every rank reported or the join deadline passed, and returns one
:class:`RankOutcome` per rank: the value, or the traceback, exit code and time of a rank that
failed, died or hung. :func:`run_local` raises when any rank failed, naming it. A rank still
running at the deadline is asked for the Python stacks of all its threads (``faulthandler`` on
SIGUSR1, where the platform has it) before it is terminated, and they join its error: a hang in a
collective says where it waited.

Children start from a fork server that has imported torch once, so N ranks start in well under
a second each. ``fn`` must be importable by name (a module-level function).
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing
import os
import queue as queue_module
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taccl_py.errors import ArgumentError, TransportError

__all__ = [
    "RankOutcome",
    "launch_local",
    "run_local",
    "DEFAULT_JOIN_TIMEOUT_S",
    "FAILURE_GRACE_S",
    "FORKSERVER_PRELOAD",
]

#: How long the parent waits for all ranks by default (seconds).
DEFAULT_JOIN_TIMEOUT_S = 120.0
#: After one rank failed, how long the others get to report before they are terminated (seconds).
FAILURE_GRACE_S = 15.0
#: How long a hung rank gets to write its stacks before it is terminated (seconds).
_STACK_DUMP_WAIT_S = 1.0
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)
#: What the fork server imports before it forks ranks. torch._dynamo too: DDP imports it in its
#: constructor, seconds per rank on a busy machine, once here. A process has one fork server, and
#: only the preload set when it starts counts: where a synthesis with jobs started it, ranks import
#: these themselves (correct, seconds slower each). Every launch sets this list, so a caller that
#: wants more preloaded starts the server itself (``multiprocessing.forkserver.ensure_running``).
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "taccl_py.runtime"]


@dataclass(frozen=True)
class RankOutcome:
    """What one rank did: ``value`` when ``ok``, else ``error`` (a traceback or why it vanished)."""

    rank: int
    ok: bool
    value: Any = None
    error: str | None = None
    exitcode: int | None = None
    elapsed_s: float = 0.0


def _torchrun_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """Return the variables torchrun gives a worker, pointing at the parent's store (the agent store)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def _child(
    rank: int,
    world_size: int,
    port: int,
    backend: str | None,
    pg_timeout_s: float,
    fn: Callable[..., Any],
    args: tuple,
    results: Any,
    stack_path: str,
) -> None:
    start = time.perf_counter()
    if _STACK_SIGNAL is not None:
        # kept open for the life of the process: faulthandler writes to its descriptor from the handler
        stack_file = open(stack_path, "w")  # noqa: SIM115
        faulthandler.register(_STACK_SIGNAL, file=stack_file, all_threads=True)
    try:
        import torch
        import torch.distributed as dist

        os.environ.update(_torchrun_environment(rank, world_size, port))
        if "GLOO_SOCKET_IFNAME" not in os.environ and Path("/sys/class/net/lo").exists():
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on loopback
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        if backend is not None:
            dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=pg_timeout_s))
        value = fn(rank, world_size, *args)
        results.put((rank, True, value, None, time.perf_counter() - start))
    except BaseException:  # report everything, including SystemExit, to the parent
        results.put((rank, False, None, traceback.format_exc(), time.perf_counter() - start))
        return
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError:  # a peer already gone; the result is in
            pass


def _context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


def _collect(processes: list[Any], results: Any, deadline: float) -> tuple[dict[int, RankOutcome], int | None]:
    """Gather outcomes until all ranks reported, died, or the deadline (shortened after a failure).

    Also returns the first rank that failed (None: none did), which cut the deadline short.
    """
    outcomes: dict[int, RankOutcome] = {}
    world_size = len(processes)
    first_failed = None
    while len(outcomes) < world_size and time.monotonic() < deadline:
        try:
            rank, ok, value, error, elapsed_s = results.get(timeout=0.05)
            outcomes[rank] = RankOutcome(rank, ok, value, error, None, elapsed_s)
            if not ok:
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
                first_failed = rank if first_failed is None else first_failed
            continue
        except queue_module.Empty:
            pass
        for rank, process in enumerate(processes):
            if rank not in outcomes and process.exitcode is not None:
                try:  # a result may still be in the pipe
                    got = results.get(timeout=0.5)
                    outcomes[got[0]] = RankOutcome(got[0], got[1], got[2], got[3], None, got[4])
                except queue_module.Empty:
                    outcomes[rank] = RankOutcome(
                        rank, False, None, f"exited with code {process.exitcode} without a result", process.exitcode
                    )
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
                    first_failed = rank if first_failed is None else first_failed
    return outcomes, first_failed


def _dump_stacks(processes: list[Any], hung: list[int]) -> None:
    """Ask the ``hung`` ranks to write their threads' stacks, and give them a moment to."""
    if _STACK_SIGNAL is None or not hung:
        return
    for rank in hung:
        try:
            os.kill(processes[rank].pid, _STACK_SIGNAL)
        except (OSError, TypeError):  # already gone, or never started
            pass
    time.sleep(_STACK_DUMP_WAIT_S)


def _hang_report(timeout_s: float, first_failed: int | None, stack_path: Path) -> str:
    """Return why a rank was terminated, with the stacks it wrote (if any)."""
    if first_failed is None:
        why = f"did not finish within {timeout_s:g} s (terminated)"
    else:
        why = f"still running {FAILURE_GRACE_S:g} s after rank {first_failed} failed (terminated)"
    stacks = stack_path.read_text(errors="replace").strip() if stack_path.exists() else ""
    return f"{why}; its threads when stopped:\n{stacks}" if stacks else why


def launch_local(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    backend: str | None = "gloo",
    timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
    pg_timeout_s: float = 60.0,
) -> list[RankOutcome]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes; return every rank's outcome.

    Parameters
    ----------
    fn : callable
        A module-level function (the children import it by name); its return value must pickle.
    world_size : int
        Number of processes (ranks).
    args : sequence
        Extra arguments for ``fn`` (picklable).
    backend : str or None
        torch.distributed backend the children initialise before calling ``fn`` ("gloo" by
        default); None leaves it to ``fn`` (the environment is torchrun's, so ``init_method="env://"``
        and :meth:`Communicator.from_env` work).
    timeout_s : float
        Join deadline: ranks still running after it are terminated and reported as hung.
    pg_timeout_s : float
        The process group's timeout (store connection and collectives).

    Returns
    -------
    list of RankOutcome
        One per rank, in rank order.
    """
    import torch.distributed as dist

    if world_size < 1:
        raise ArgumentError(None, "world_size", f"{world_size}", "at least 1 process")
    store = dist.TCPStore(
        "127.0.0.1", 0, world_size + 1, True, timeout=datetime.timedelta(seconds=pg_timeout_s), wait_for_workers=False
    )
    context = _context()
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="taccl-ranks-") as stacks_dir:
        stack_paths = [Path(stacks_dir) / f"rank{rank}.stacks" for rank in range(world_size)]
        processes = [
            context.Process(
                target=_child,
                args=(rank, world_size, store.port, backend, pg_timeout_s, fn, tuple(args), results, str(path)),
                daemon=True,
            )
            for rank, path in enumerate(stack_paths)
        ]
        for process in processes:
            process.start()
        outcomes: dict[int, RankOutcome] = {}
        first_failed = None
        try:
            outcomes, first_failed = _collect(processes, results, time.monotonic() + timeout_s)
            _dump_stacks(processes, [r for r, p in enumerate(processes) if r not in outcomes and p.is_alive()])
        finally:
            for process in processes:
                if process.is_alive():
                    process.terminate()
            for process in processes:
                process.join(5)
        for rank, process in enumerate(processes):
            if rank not in outcomes:
                report = _hang_report(timeout_s, first_failed, stack_paths[rank])
                outcomes[rank] = RankOutcome(rank, False, None, report, process.exitcode)
    del store
    return [outcomes[rank] for rank in range(world_size)]


def run_local(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), **kwargs: Any) -> list[Any]:
    """Run ``fn`` like :func:`launch_local` and return the ranks' values; raise TransportError naming failed ranks."""
    outcomes = launch_local(fn, world_size, args, **kwargs)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        first = failed[0]
        others = f" (and ranks {[o.rank for o in failed[1:]]})" if len(failed) > 1 else ""
        raise TransportError(f"rank {first.rank} of {world_size} failed{others}:\n{first.error}")
    return [o.value for o in outcomes]
