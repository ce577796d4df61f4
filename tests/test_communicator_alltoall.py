"""Communicator.all_to_all on gloo: equal to torch's all_to_all_single; uneven splits and bad calls."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from taccl_py.baselines import direct_alltoall_algorithm
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.communicator.calibration import CalibrationPoint
from taccl_py.topology import load_topology

from helpers import LogLines, chunked_alltoall_algorithm, ring_algorithm
from mp_utils import assert_no_mismatches, run_ranks

A2A = Collective.ALLTOALL
#: Where the test library switches from one chunk per block to two (bytes, nccl-tests size).
BAND_EDGE_BYTES = 4096
#: Dtypes gloo's all_to_all_single moves (it copies bytes; every dtype the executor runs).
DTYPES = ("float32", "float64", "int64", "int32", "bfloat16", "float16")


def alltoall_library(n: int) -> AlgorithmLibrary:
    """Return a library: one chunk per block below BAND_EDGE_BYTES, two chunks per block from there."""
    one = direct_alltoall_algorithm(load_topology("dgx-a100")) if n == 8 else ring_algorithm(A2A, n)
    bands = (
        SizeBand(0, BAND_EDGE_BYTES, one, "one.json"),
        SizeBand(BAND_EDGE_BYTES, None, chunked_alltoall_algorithm(n, 2), "two.json"),
    )
    return AlgorithmLibrary("test", 1, A2A, n, bands)


def _data(rank: int, shape: tuple[int, ...], dtype: Any, seed: int) -> torch.Tensor:
    """Return rank ``rank``'s seeded random input: normal floats, or integers in -1000..1000, never all zeros."""
    generator = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1001, shape, generator=generator).to(dtype)


def _mismatch(label: str, ours: torch.Tensor, reference: torch.Tensor) -> list[str]:
    if torch.equal(ours, reference):
        return []
    bad = (ours != reference).nonzero()
    return [f"{label}: {bad.shape[0]} of {ours.numel()} elements differ from torch's all_to_all_single"]


def _compare_case(
    comm: Communicator, rank: int, shape: tuple[int, ...], dtype: Any, seed: int, splits: list[int] | None = None
) -> list[str]:
    """Run all_to_all with ``comm`` and torch's all_to_all_single on the same input; return mismatches."""
    data = _data(rank, shape, dtype, seed)
    kept = data.clone()
    ours = torch.full(shape, 77, dtype=dtype)
    comm.all_to_all(ours, data, splits, splits)
    reference = torch.empty(shape, dtype=dtype)
    dist.all_to_all_single(reference, kept)
    problems = _mismatch(f"{dtype} shape={shape}", ours, reference)
    return problems + ([] if torch.equal(data, kept) else [f"{dtype} shape={shape}: the input was modified"])


def _sweep(comm: Communicator, rank: int, world: int) -> list[str]:
    """Every dtype at block sizes that divide the two-chunk algorithm and sizes that do not, on both bands."""
    problems = []
    for seed, dtype_name in enumerate(DTYPES):
        dtype = getattr(torch, dtype_name)
        for rows, cols in ((1, 1), (7, 1), (3, 5), (1000, 1), (2048, 3)):
            problems += _compare_case(comm, rank, (world * rows, cols), dtype, seed * 100 + rows)
    return problems


def _routed_algorithms(comm: Communicator) -> set[str]:
    """Return the names of the algorithms the Communicator compiled executors for."""
    names = {id(c.algorithm): c.algorithm.name for c in comm.choices.candidates if c.algorithm is not None}
    return {names[key[0]] for key in comm._executors}


def _uneven_case(comm: Communicator, rank: int, world: int) -> list[str]:
    """Split sizes (uneven, then equal): torch's own all_to_all_single runs, with one log line for three calls."""
    sends = [(rank + peer) % 3 + 1 for peer in range(world)]  # rows rank sends to each peer
    receives = [(peer + rank) % 3 + 1 for peer in range(world)]  # rows each peer sends to rank
    problems = []
    for seed in (1, 2):
        data = _data(rank, (sum(sends), 2), torch.float32, 500 + seed)
        ours, reference = torch.zeros(sum(receives), 2), torch.zeros(sum(receives), 2)
        comm.all_to_all(ours, data, receives, sends)
        dist.all_to_all_single(reference, data, receives, sends)
        problems += _mismatch(f"uneven splits, call {seed}", ours, reference)
    # equal split sizes too: a rank cannot tell whether the others' are equal
    before = dict(comm._executors)
    problems += _compare_case(comm, rank, (world * 5,), torch.int64, 3, [5] * world)
    if comm._executors.keys() != before.keys():
        problems.append("a call with equal split sizes compiled an executor")
    return problems


def _error_cases(comm: Communicator, world: int) -> None:
    """Bad calls raise the project's error on every rank before any message is sent."""
    with pytest.raises(
        ArgumentError, match=rf"all_to_all.output: {3 * world} elements for an input of {2 * world} on {world} ranks"
    ):
        comm.all_to_all(torch.zeros(3 * world), torch.zeros(2 * world))
    with pytest.raises(ArgumentError, match=rf"all_to_all.input: {world + 1} rows do not split into {world} equal"):
        comm.all_to_all(torch.zeros(world + 1), torch.zeros(world + 1))
    with pytest.raises(ArgumentError, match="all_to_all: output is torch.float64 but input is torch.float32"):
        comm.all_to_all(torch.zeros(world, dtype=torch.float64), torch.zeros(world))
    with pytest.raises(ArgumentError, match=rf"all_to_all.input_split_sizes: \[1, 1\]; expected {world} sizes"):
        comm.all_to_all(torch.zeros(2), torch.zeros(2), [1, 1], [1, 1])
    with pytest.raises(ArgumentError, match=r"all_to_all.output_split_sizes: .* add up to 0; expected the 4 rows"):
        comm.all_to_all(torch.zeros(4), torch.zeros(4), [0] * world, None)
    with pytest.raises(ArgumentError, match="all_to_all.output: dtype torch.uint8 is not supported"):
        comm.all_to_all(torch.zeros(world, dtype=torch.uint8), torch.zeros(world, dtype=torch.uint8))


def _calibration_case(comm: Communicator, rank: int, world: int) -> list[str]:
    """alltoall calibrates like the others; where native measured faster, torch's collective runs."""
    measured = comm.calibrate([BAND_EDGE_BYTES * 4], collectives=["alltoall"], iters=1, warmup=0)
    problems = [] if [p.collective for p in measured.points] == ["alltoall"] else [f"calibrated {measured.points}"]
    size = BAND_EDGE_BYTES * 4
    forced = (CalibrationPoint("alltoall", size, measured.points[0].algorithm, 1e6, 1.0),)
    comm.calibration = replace(measured, points=forced)
    if comm.algorithm_for(A2A, size) is not None:
        problems.append(f"calibrated to native at {size} B, still runs {comm.algorithm_for(A2A, size).name}")
    before = dict(comm._executors)
    problems += _compare_case(comm, rank, (world * size // 4 // world, 1), torch.float32, 900)
    if comm._executors.keys() != before.keys():
        problems.append("a size calibrated to native compiled an executor")
    comm.calibration = None
    return problems


def alltoall_worker(rank: int, world: int, with_checks: bool) -> list[str]:
    """Worker: the dtype/size sweep, then (``with_checks``) uneven splits, bad calls and calibration."""
    handler = LogLines()
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    library = alltoall_library(world)
    comm = Communicator(None, library, timeout_s=60)
    problems = _sweep(comm, rank, world)
    expected = {band.algorithm.name for band in library.bands}
    if _routed_algorithms(comm) != expected:
        problems.append(f"ran {sorted(_routed_algorithms(comm))}, expected both bands {sorted(expected)}")
    if not with_checks:
        return problems
    problems += _uneven_case(comm, rank, world)
    _error_cases(comm, world)
    problems += _compare_case(comm, rank, (world * 3,), torch.float32, 4)  # the group is still in step
    problems += _calibration_case(comm, rank, world)
    given = [m for m in handler.messages if "with split sizes" in m]
    if rank and given:  # rank 0 speaks for the group; the others log the line at DEBUG
        problems.append(f"a split-sizes line on rank {rank}, not only on rank 0: {given}")
    elif not rank and (len(given) != 1 or "using torch.distributed's own all_to_all_single" not in given[0]):
        problems.append(f"expected one split-sizes log line, got {given}")
    if any("no taccl algorithm" in m for m in handler.messages):
        problems.append(f"a fallback line for calls the library covers: {handler.messages}")
    return problems


@pytest.mark.multiprocess
def test_all_to_all_equals_torch_on_4_ranks_with_uneven_splits_and_bad_calls() -> None:
    assert_no_mismatches(run_ranks(alltoall_worker, 4, True))


@pytest.mark.multiprocess
def test_all_to_all_equals_torch_on_8_ranks() -> None:
    assert_no_mismatches(run_ranks(alltoall_worker, 8, False))
