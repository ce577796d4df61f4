"""Time our collectives against torch.distributed's own on the same group: ``taccl bench``.

Every rank runs :func:`~taccl_py.runtime.communicator.timing.bench_sizes` (ours and torch's timed alternately,
the slowest rank's median per size). :func:`executor_overhead_us` measures what the executor
itself costs per round, over a transport that moves nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.communicator.timing import DEFAULT_ITERS, BenchRow, bench_sizes
from taccl_py.runtime.executor import Executor, block_layout
from taccl_py.runtime.measure.profile_model import predict_rows, ring_algorithm
from taccl_py.runtime.transports.interface import Message, Pending, Transport
from taccl_py.topology.builtins import load_topology

__all__ = [
    "BENCH_COLLECTIVES",
    "DEFAULT_ITERS",
    "BenchRow",
    "BenchSpec",
    "bench_sizes",
    "bench_worker",
    "executor_overhead_us",
    "ring_algorithm",
    "run_bench",
]

#: Collectives ``taccl bench`` times.
BENCH_COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE, Collective.ALLTOALL)
_RING_COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)


@dataclass(frozen=True)
class BenchSpec:
    """What ``taccl bench`` measures: the library, the collectives (None: those it has), the sizes."""

    library: tuple[str, ...]
    collectives: tuple[str, ...] | None
    sizes: tuple[int, ...]
    dtype: str = "float32"
    iters: int = DEFAULT_ITERS
    warmup: int = 2
    timeout_s: float = 60.0
    progress: Callable[[str], None] | None = None  # hears each size on rank 0; module-level so it pickles
    calibration: str | None = None  # a calibration file for the Communicator (read, or measured and written)
    cluster: str | None = None  # the live cluster (shorthand or file); None: TACCL_CLUSTER, else no check
    nic_down: tuple[str, ...] = ()  # NODE:NIC texts on top of ``cluster``
    nic_speed: tuple[str, ...] = ()  # NODE:NIC:GBPS texts on top of ``cluster``
    ring: bool = False  # add the rank-order rings (``ring_algorithm``) of every collective but alltoall
    topology: str | None = None  # predict every row's times on this topology (a built-in name or file)


def _library(spec: BenchSpec) -> list:
    """Return the Communicator's library: ``spec.library`` and, with ``spec.ring``, the rank-order rings."""
    if not spec.ring:
        return list(spec.library)
    world_size = dist.get_world_size() if dist.is_initialized() else int(os.environ["WORLD_SIZE"])
    return list(spec.library) + [ring_algorithm(c, world_size) for c in _RING_COLLECTIVES]


def run_bench(spec: BenchSpec, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Time ``spec`` on this rank of the group torchrun's environment describes; every rank must call it.

    Initialises torch.distributed from the environment when needed (``Communicator.from_env``).
    ``progress`` (default ``spec.progress``) hears about each size on rank 0. With
    ``spec.topology``, rank 0's rows carry the simulator's predictions (``predict_rows``).
    """
    progress = progress if progress is not None else spec.progress
    declared = {"cluster": spec.cluster, "nic_down": spec.nic_down, "nic_speed": spec.nic_speed}
    # The library's algorithms as they are: the automatic calibration would swap in the native side.
    comm = Communicator.from_env(
        _library(spec), timeout_s=spec.timeout_s, calibration=False, **(declared if spec.cluster else {})
    )
    if spec.calibration is not None:  # measured at the sizes benched, when not cached yet
        comm.load_or_calibrate(spec.calibration, spec.sizes, iters=spec.iters, warmup=spec.warmup)
    if spec.collectives is not None:
        collectives = tuple(Collective(c) for c in spec.collectives)
    else:
        collectives = tuple(c for c in BENCH_COLLECTIVES if c in comm.choices.collectives) or BENCH_COLLECTIVES
    dtype = getattr(torch, spec.dtype)
    rows: list[BenchRow] = []
    for collective in collectives:
        rows += bench_sizes(
            comm,
            collective,
            spec.sizes,
            dtype=dtype,
            iters=spec.iters,
            warmup=spec.warmup,
            progress=progress if comm.rank == 0 else None,
        )
    if spec.topology is not None and comm.rank == 0:  # the other ranks' rows are not reported
        ran = [comm.algorithm_for(Collective(row.collective), row.size_bytes) for row in rows]
        rows = predict_rows(rows, ran, load_topology(spec.topology))
    return rows


def bench_worker(rank: int, world_size: int, spec: BenchSpec) -> list[BenchRow]:
    """Entry point of one local rank started by :func:`taccl_py.runtime.launch.launch_local`."""
    return run_bench(spec)


class _Done(Pending):
    __slots__ = ()

    def wait(self, timeout_s: float) -> None:
        return None


class _NullTransport(Transport):
    """A transport whose messages complete at once and move nothing (to time the executor alone)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size, self.device, self.name = rank, world_size, torch.device("cpu"), "null"
        self._done = _Done()

    def post(self, sends: Sequence[Message], recvs: Sequence[Message]) -> tuple[Sequence[Pending], Sequence[Pending]]:
        return [self._done] * len(sends), [self._done] * len(recvs)


def executor_overhead_us(algorithm: Algorithm, rank: int = 0, iters: int = 200) -> tuple[float, float]:
    """Return (µs per round, µs per message) the executor spends itself, with one element per chunk.

    Runs rank ``rank``'s plan over a transport that completes every message at once, so what is
    timed is the replay loop, the view bookkeeping and the torch calls on one-element chunks.
    """
    _in_blocks, _out_blocks, per_block = block_layout(
        algorithm.collective, algorithm.num_ranks, algorithm.chunks_per_loop
    )
    executor = Executor(algorithm, rank, torch.float32, per_block)
    want_in, want_out = executor.expected_numels()
    input, output = torch.ones(want_in), torch.zeros(want_out)
    transport = _NullTransport(rank, algorithm.num_ranks)
    executor.run(output, input, transport)
    start = time.perf_counter()
    for _ in range(iters):
        executor.run(output, input, transport)
    per_call_us = (time.perf_counter() - start) / iters * 1e6
    rounds = max(1, len(executor.plan.rounds))
    messages = max(1, sum(len(r.sends) + len(r.recvs) for r in executor.plan.rounds))
    return per_call_us / rounds, per_call_us / messages
