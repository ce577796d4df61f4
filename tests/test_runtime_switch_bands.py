"""Bands whose algorithm has switch steps (NVLink SHARP) run the group's own collective, never an error.

The library is for a 2-GPU NVSwitch machine that reduces in the network (tests/fixtures/topo/nvls-2gpu.json):
a ring below 4 KiB, an NVLS reduce-store AllReduce from there up. On gloo the switch band runs gloo's
all_reduce (on NCCL it would be NCCL's, which runs NVLS there).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand
from taccl_py.runtime.communicator.selection import collect_algorithms
from taccl_py.simulate import simulate
from taccl_py.topology.schema import read_topology
from taccl_py.verify import verify_algorithm

from ddp_helpers import init_taccl_group, run_on_shared_store
from helpers import FIXTURES, ring_algorithm
from mp_utils import assert_no_mismatches, run_ranks

WORLD = 2
EDGE_BYTES = 4096  # the switch band starts here


def _switch_allreduce(world: int = WORLD) -> Algorithm:
    """Rank r reduce-stores slice r over the whole machine, in place (NCCL's NVLS AllReduce shape)."""
    group = tuple(range(world))
    ranks = tuple(
        RankProgram(
            r,
            (
                Threadblock(
                    0, (Step(OpType.SWITCH_REDUCE_STORE, Buffer.INPUT, r, Buffer.INPUT, r),), switch_group=group
                ),
            ),
            world,
            world,
        )
        for r in group
    )
    return Algorithm("nvls-ar", Collective.ALLREDUCE, world, world, ranks, inplace=True)


def _library() -> AlgorithmLibrary:
    bands = (
        SizeBand(0, EDGE_BYTES, ring_algorithm(Collective.ALLREDUCE, WORLD), "ring"),
        SizeBand(EDGE_BYTES, None, _switch_allreduce(), "nvls"),
    )
    return AlgorithmLibrary("nvls-2gpu", 1, Collective.ALLREDUCE, WORLD, bands)


def test_the_switch_algorithm_is_real_on_the_2_gpu_nvswitch():
    """The band is a verified schedule the simulator times as switch traffic (so a library may pick it)."""
    algorithm = _switch_allreduce()
    assert verify_algorithm(algorithm).ok and algorithm.uses_switch
    result = simulate(algorithm, read_topology(FIXTURES / "topo" / "nvls-2gpu.json"), 2**26, model="chunks")
    assert result.time_us > 0


def test_collect_algorithms_makes_a_switch_band_native_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="taccl_py.runtime.communicator.selection"):
        choices = collect_algorithms(_library(), WORLD)
    small = choices.select(Collective.ALLREDUCE, 64)
    large = choices.select(Collective.ALLREDUCE, 2**20)
    assert small.algorithm is not None and small.algorithm.name == ring_algorithm(Collective.ALLREDUCE, 2).name
    assert large.algorithm is None and (large.min_bytes, large.max_bytes) == (EDGE_BYTES, None)
    lines = [r.getMessage() for r in caplog.records if "switch steps" in r.getMessage()]
    assert len(lines) == 1 and "sizes from 4096 B up run the group's own collective" in lines[0]


def _communicator_worker(rank: int, world: int) -> list[str]:
    import torch

    from taccl_py.runtime.communicator import Communicator

    comm = Communicator(None, _library(), timeout_s=30)
    problems = []
    for numel in (4, 64, 4096):  # 16 B and 256 B: the ring; 16 KiB: the switch band
        size = numel * 4
        runs = comm.algorithm_for(Collective.ALLREDUCE, size)
        want_ring = size < EDGE_BYTES
        if (runs is not None) != want_ring:
            problems.append(f"{size} B runs {runs and runs.name}; expected {'the ring' if want_ring else 'native'}")
        tensor = torch.arange(numel, dtype=torch.float32) * (rank + 1)
        comm.all_reduce(tensor)
        expected = torch.arange(numel, dtype=torch.float32) * sum(range(1, world + 1))
        if not torch.equal(tensor, expected):
            problems.append(f"all_reduce of {size} B gave {tensor[:4].tolist()}...")
    return problems


@pytest.mark.multiprocess
def test_a_communicator_runs_the_switch_band_natively():
    assert_no_mismatches(run_ranks(_communicator_worker, WORLD))


def _backend_worker(rank: int, world: int, port: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    pg = init_taccl_group(rank, world, port, _library())
    results: dict[str, Any] = {"problems": []}
    for numel in (8, 4096):  # 32 B: routed to the ring; 16 KiB: the switch band, to the inner backend
        tensor = torch.full((numel,), float(rank + 1))
        dist.all_reduce(tensor)
        if not torch.equal(tensor, torch.full((numel,), float(sum(range(1, world + 1))))):
            results["problems"].append(f"all_reduce of {numel * 4} B gave {tensor[:4].tolist()}")
        results[numel] = (pg.routed["allreduce"], pg.delegated["allreduce"])
    dist.destroy_process_group()
    return results


@pytest.mark.multiprocess
def test_the_taccl_backend_hands_the_switch_band_to_its_inner_backend():
    results = run_on_shared_store(_backend_worker, WORLD)
    assert_no_mismatches([r["problems"] for r in results])
    for r in results:
        assert r[8] == (1, 0)  # the ring ran
        assert r[4096] == (1, 1)  # the switch band went to gloo
