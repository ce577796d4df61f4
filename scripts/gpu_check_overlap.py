"""scripts/gpu_check.py's overlap check: compute issued after an async routed all_reduce runs while it does.

On the ``taccl`` default group, each rank issues ``dist.all_reduce(async_op=True)`` at a size the
library routes, then a compute kernel (``torch.cuda._sleep``) on its current stream, then waits on
the Work. CUDA events time, from an event recorded just before the issue: when the compute kernel
starts (an event on the caller's stream just before it), when it ends, and when the all_reduce
ends (an event on a probe stream made to wait on the Work). The group issues routed calls on its
internal stream, so the compute must start before the all_reduce ends; had the call run on the
caller's stream, the compute would start only after it. The same steps with ``wait`` before the
compute are the serialized baseline, and the compute lasts about as long as the all_reduce alone.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from gpu_check_cases import MAX_CHECK_BYTES, expects_routing

from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator.selection import AlgorithmChoices

__all__ = ["OverlapTimes", "check_overlap", "overlap_lines"]

#: Sizes (bytes) tried before ``--sizes``, largest first: the all_reduce must outlast the host's issue of it.
OVERLAP_SIZES = (MAX_CHECK_BYTES, 16 * 2**20, 4 * 2**20, 2**20)
#: Timed repetitions of each variant (after one untimed warm-up); the median is reported.
TRIALS = 5
#: ``torch.cuda._sleep`` cycles of the probe that measures the GPU's cycles per millisecond.
PROBE_CYCLES = 10_000_000
#: Longest compute kernel (ms): a slow loopback all_reduce must not make the check run for minutes.
MAX_COMPUTE_MS = 2000.0


@dataclass(frozen=True)
class OverlapTimes:
    """One rank's medians, in ms after the all_reduce was issued; ``routed``: every call ran our algorithm."""

    rank: int
    size_bytes: int
    all_reduce_ms: float  # serialized: the all_reduce alone
    compute_ms: float  # the compute kernel alone
    serialized_ms: float  # wait, then compute: both done
    overlapped_ms: float  # compute, then wait: both done
    compute_start_ms: float  # overlapped: when the compute kernel started
    all_reduce_end_ms: float  # overlapped: when the all_reduce ended
    routed: bool

    @property
    def overlaps(self) -> bool:
        """Return True when the compute kernel started before the all_reduce ended."""
        return self.routed and self.compute_start_ms < self.all_reduce_end_ms


def overlap_size_bytes(choices: AlgorithmChoices, sizes: Sequence[int]) -> int | None:
    """Return the largest size in OVERLAP_SIZES or ``sizes`` (at most MAX_CHECK_BYTES) the library routes, or None."""
    routed = [s for s in (*OVERLAP_SIZES, *sizes) if s % 4 == 0 and s <= MAX_CHECK_BYTES]
    routed = [s for s in routed if expects_routing(choices, Collective.ALLREDUCE, s, "sum")]
    return max(routed, default=None)


def _timed_step(tensor: torch.Tensor, cycles: int, overlapped: bool) -> tuple[float, float, float, float]:
    """Return (compute start, compute end, all_reduce end, both done) in ms after the issue, for one step."""
    caller, probe = torch.cuda.current_stream(), torch.cuda.Stream()
    start, compute_start, compute_end, reduced, done = (torch.cuda.Event(enable_timing=True) for _ in range(5))
    start.record(caller)
    work = dist.all_reduce(tensor, async_op=True)
    if not overlapped:
        work.wait()  # the caller's stream waits here: serialized
    compute_start.record(caller)
    torch.cuda._sleep(cycles)
    compute_end.record(caller)
    with torch.cuda.stream(probe):  # the probe alone waits for the all_reduce: its end, not the compute's
        work.wait()
        reduced.record(probe)
    work.wait()
    done.record(caller)
    torch.cuda.synchronize()
    return tuple(start.elapsed_time(e) for e in (compute_start, compute_end, reduced, done))


def _cycles_per_ms() -> float:
    """Return ``torch.cuda._sleep`` cycles per millisecond on this GPU."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(PROBE_CYCLES)
    end.record()
    end.synchronize()
    return PROBE_CYCLES / max(begin.elapsed_time(end), 1e-3)


def _medians(steps: list[tuple[float, ...]]) -> list[float]:
    return [statistics.median(column) for column in zip(*steps)]


def check_overlap(choices: AlgorithmChoices, sizes: Sequence[int], device: torch.device, reference: Any) -> list:
    """Return this rank's :class:`OverlapTimes` in a list (empty when the library routes no size of all_reduce)."""
    size_bytes = overlap_size_bytes(choices, sizes)
    if size_bytes is None:
        return []
    group, rank = dist.group.WORLD, dist.get_rank()
    generator = torch.Generator(device=device).manual_seed(7 + rank)
    tensor = torch.randint(-4, 5, (size_bytes // 4,), generator=generator, device=device).float()
    before = Counter(group.routed)
    _aligned(tensor, 1000, False, reference)  # warm-up: the executor is built, NCCL links are set up
    alone = _medians([_aligned(tensor, 1000, False, reference) for _ in range(TRIALS)])
    all_reduce_ms = alone[2]
    cycles = int(min(all_reduce_ms, MAX_COMPUTE_MS) * _cycles_per_ms())
    serialized = _medians([_aligned(tensor, cycles, False, reference) for _ in range(TRIALS)])
    overlapped = _medians([_aligned(tensor, cycles, True, reference) for _ in range(TRIALS)])
    calls = 1 + 3 * TRIALS  # the warm-up and every timed step
    routed = Counter(group.routed)[Collective.ALLREDUCE.value] - before[Collective.ALLREDUCE.value] == calls
    return [
        OverlapTimes(
            rank=rank,
            size_bytes=size_bytes,
            all_reduce_ms=all_reduce_ms,
            compute_ms=overlapped[1] - overlapped[0],
            serialized_ms=serialized[3],
            overlapped_ms=overlapped[3],
            compute_start_ms=overlapped[0],
            all_reduce_end_ms=overlapped[2],
            routed=routed,
        )
    ]


def _aligned(tensor: torch.Tensor, cycles: int, overlapped: bool, reference: Any) -> tuple[float, ...]:
    """Return one timed step, started together on every rank (an all_reduce on the reference group first)."""
    dist.all_reduce(torch.ones(1, device=tensor.device), group=reference)
    torch.cuda.synchronize()
    return _timed_step(tensor, cycles, overlapped)


def overlap_lines(times: list[OverlapTimes], world: int) -> tuple[list[str], bool]:
    """Return the report's Markdown table, one row per rank, and whether every rank overlapped."""
    lines = [
        "| rank | size B | all_reduce ms | compute ms | serialized ms | overlapped ms "
        "| compute starts ms | all_reduce ends ms | result |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in times:
        verdict = "overlaps" if t.overlaps else ("SERIAL" if t.routed else "NOT ROUTED")
        lines.append(
            f"| {t.rank} | {t.size_bytes} | {t.all_reduce_ms:.2f} | {t.compute_ms:.2f} | {t.serialized_ms:.2f} "
            f"| {t.overlapped_ms:.2f} | {t.compute_start_ms:.2f} | {t.all_reduce_end_ms:.2f} | {verdict} |"
        )
    ok = bool(times) and all(t.overlaps for t in times)
    if times:
        worst = max(times, key=lambda t: t.overlapped_ms / max(t.serialized_ms, 1e-9))
        lines.append(
            f"\nBENCHMARKS: async all_reduce of {worst.size_bytes} B on {world} ranks (taccl backend, routed): "
            f"compute issued after it started at {worst.compute_start_ms:.2f} ms, the all_reduce ended at "
            f"{worst.all_reduce_end_ms:.2f} ms; step {worst.overlapped_ms:.2f} ms overlapped vs "
            f"{worst.serialized_ms:.2f} ms serialized (worst rank {worst.rank}): "
            f"{'overlaps' if ok else 'DOES NOT OVERLAP'}"
        )
    return lines, ok
