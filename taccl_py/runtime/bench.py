"""Time our collectives against torch.distributed's own on the same group: ``taccl bench``.

Every rank runs :func:`~taccl_py.runtime.timing.bench_sizes` (ours and torch's timed alternately,
the slowest rank's median per size). :func:`executor_overhead_us` measures what the executor
itself costs per round, over a transport that moves nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.executor import Executor, block_layout
from taccl_py.runtime.timing import DEFAULT_ITERS, BenchRow, bench_sizes
from taccl_py.runtime.transport import Message, Pending, Transport

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
_I, _O = Buffer.INPUT, Buffer.OUTPUT


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


def run_bench(spec: BenchSpec, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Time ``spec`` on this rank of the group torchrun's environment describes; every rank must call it.

    Initialises torch.distributed from the environment when needed (``Communicator.from_env``).
    ``progress`` (default ``spec.progress``) hears about each size on rank 0.
    """
    progress = progress if progress is not None else spec.progress
    declared = {"cluster": spec.cluster, "nic_down": spec.nic_down, "nic_speed": spec.nic_speed}
    comm = Communicator.from_env(list(spec.library), timeout_s=spec.timeout_s, **(declared if spec.cluster else {}))
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
    return rows


def bench_worker(rank: int, world_size: int, spec: BenchSpec) -> list[BenchRow]:
    """Entry point of one local rank started by :func:`taccl_py.runtime.launch.launch_local`."""
    return run_bench(spec)


def ring_algorithm(collective: Collective, num_ranks: int, chunks_per_rank: int = 1) -> Algorithm:
    """Return a one-channel ring over ranks 0..N-1 in rank order (allreduce in place: RS then AG).

    Each rank's block is cut into ``chunks_per_rank`` chunks that travel as separate messages.

    >>> from taccl_py.verify import verify_algorithm
    >>> verify_algorithm(ring_algorithm(Collective.ALLREDUCE, 4, 2)).ok
    True
    """
    if collective not in _RING_COLLECTIVES:
        raise ArgumentError(None, "collective", f"{collective.value}", "allgather, reducescatter or allreduce")
    n, k = num_ranks, chunks_per_rank
    items: list[Transfer | LocalCopy] = []
    buffer = _O if collective is Collective.ALLGATHER else _I
    if collective is Collective.ALLGATHER:
        items += [LocalCopy(r, (_I, j), (_O, r * k + j)) for r in range(n) for j in range(k)]
    if collective in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        for step in range(n - 1):
            for r in range(n):
                block = (r - step - 1) % n
                items += [
                    Transfer(r, (r + 1) % n, (_I, block * k + j), (_I, block * k + j), reduce=True) for j in range(k)
                ]
    if collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        # rank r holds block r whole (its own, or the reduce-scatter's result) and passes it on
        for step in range(n - 1):
            for r in range(n):
                block = (r - step) % n
                items += [Transfer(r, (r + 1) % n, (buffer, block * k + j), (buffer, block * k + j)) for j in range(k)]
    if collective is Collective.REDUCESCATTER:
        items += [LocalCopy(r, (_I, r * k + j), (_O, j)) for r in range(n) for j in range(k)]
    inplace = collective is Collective.ALLREDUCE
    return lower_plan(f"ring-{collective.value}-{n}x{k}", collective, n, n * k, items, inplace=inplace)


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
