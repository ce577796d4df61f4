"""Time a Communicator's collective against torch.distributed's own on the same group.

Each iteration times one call of ours and one of torch's, alternately, after a barrier, and takes
the slowest rank's time; a size reports the median over iterations, so both sides see the same
machine noise. Used by ``taccl bench`` and by calibration; it needs only the Communicator's
methods, so the Communicator can calibrate itself through it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.ir.collectives import Collective

__all__ = ["DEFAULT_ITERS", "BenchRow", "bench_sizes"]

#: Timed iterations per size (each: one call of ours and one of torch's).
DEFAULT_ITERS = 10


@dataclass(frozen=True)
class BenchRow:
    """One size: the median time (µs, slowest rank) of our collective and of torch's.

    The predicted times (µs) are the simulator's on a given topology, when one was given
    (:mod:`taccl_py.runtime.measure.profile_model`).
    """

    collective: str
    size_bytes: int
    algorithm: str
    ours_time_us: float
    torch_time_us: float
    ours_predicted_us: float | None = None
    torch_predicted_us: float | None = None

    @property
    def ours_algbw_GBps(self) -> float:
        """Return size / our time in GB/s (1 GB = 1e9 bytes)."""
        return self.size_bytes / self.ours_time_us / 1e3

    @property
    def torch_algbw_GBps(self) -> float:
        """Return size / torch's time in GB/s."""
        return self.size_bytes / self.torch_time_us / 1e3

    @property
    def speedup(self) -> float:
        """Return torch's time over ours (> 1: we are faster)."""
        return self.torch_time_us / self.ours_time_us


def _tensors(collective: Collective, size_bytes: int, world_size: int, dtype: Any, device: Any) -> tuple[Any, Any]:
    """Return (output, input) for a call of nccl-tests size ``size_bytes`` (rounded down to whole shards).

    An alltoall's shard is one peer's block: its input and output hold one per rank.
    """
    element = torch.empty((), dtype=dtype).element_size()
    shard = max(1, size_bytes // element // (1 if collective is Collective.ALLREDUCE else world_size))
    generator = torch.Generator().manual_seed(world_size)
    if collective is Collective.ALLGATHER:
        return torch.empty(shard * world_size, dtype=dtype, device=device), torch.randn(shard, generator=generator).to(
            dtype
        ).to(device)
    if collective is Collective.REDUCESCATTER:
        return torch.empty(shard, dtype=dtype, device=device), torch.randn(shard * world_size, generator=generator).to(
            dtype
        ).to(device)
    if collective is Collective.ALLTOALL:
        return torch.empty(shard * world_size, dtype=dtype, device=device), torch.randn(
            shard * world_size, generator=generator
        ).to(dtype).to(device)
    tensor = torch.randn(shard, generator=generator).to(dtype).to(device)
    return tensor, tensor


def _time_pair(
    ours: Callable[[], None], theirs: Callable[[], None], group: Any, iters: int, device: Any
) -> tuple[float, float]:
    """Return the median slowest-rank time (µs) of ``ours`` and ``theirs``, timed alternately.

    On a GPU both are timed to the end of their device work: NCCL calls return once enqueued.
    """
    finish = torch.cuda.synchronize if torch.device(device).type == "cuda" else _nothing
    samples: list[tuple[float, float]] = []
    for _ in range(iters):
        times = []
        for fn in (ours, theirs):
            finish()
            dist.barrier(group)
            finish()
            start = time.perf_counter()
            fn()
            finish()
            times.append((time.perf_counter() - start) * 1e6)
        slowest = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        samples.append((float(slowest[0]), float(slowest[1])))
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def _nothing() -> None:
    return None


def bench_sizes(
    comm: Any,
    collective: Collective,
    sizes: Sequence[int],
    *,
    dtype: Any = torch.float32,
    iters: int = DEFAULT_ITERS,
    warmup: int = 2,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Time ``collective`` at each size (bytes, nccl-tests convention) with ``comm`` and with torch.

    Every rank of ``comm``'s group must call this with the same arguments; all get the same rows.
    A size with no algorithm in ``comm``'s library reports torch against itself (algorithm "torch").
    """
    rows = []
    device = comm.transport.device
    for size_bytes in sizes:
        output, input = _tensors(collective, size_bytes, comm.world_size, dtype, device)
        actual = (
            output.numel() * output.element_size()
            if collective is Collective.ALLGATHER
            else input.numel() * input.element_size()
        )
        algorithm = comm.algorithm_for(collective, actual)
        ours = _caller(comm, collective, output, input, use_torch=False)
        theirs = _caller(comm, collective, output, input, use_torch=True)
        for _ in range(warmup):
            ours()
            theirs()
        ours_us, torch_us = _time_pair(ours, theirs, comm.group, iters, device)
        rows.append(BenchRow(collective.value, actual, algorithm.name if algorithm else "torch", ours_us, torch_us))
        if progress is not None:
            progress(f"{collective.value} {actual} B: ours {ours_us:.0f} us, torch {torch_us:.0f} us")
    return rows


def _caller(comm: Any, collective: Collective, output: Any, input: Any, use_torch: bool) -> Callable[[], None]:
    if use_torch:
        return lambda: comm._torch_collective(collective, output, input, "sum")
    if collective is Collective.ALLGATHER:
        return lambda: comm.all_gather(output, input)
    if collective is Collective.REDUCESCATTER:
        return lambda: comm.reduce_scatter(output, input)
    if collective is Collective.ALLTOALL:
        return lambda: comm.all_to_all(output, input)
    return lambda: comm.all_reduce(output)
