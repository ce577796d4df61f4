"""The ``taccl`` backend's all_to_all_single and all_to_all: routed through the library's alltoall, equal to gloo's.

One launch of 4 ranks re-initialises torch.distributed with ``init_process_group("taccl")`` on a
library holding only an alltoall algorithm and runs every scenario against a plain gloo group of
the same ranks; the tests below read the per-rank results.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from ddp_helpers import WORLD_SIZE, init_taccl_group, run_on_shared_store
from helpers import LogLines, chunked_alltoall_algorithm

torch = pytest.importorskip("torch", reason="the taccl backend needs torch")
dist = pytest.importorskip("torch.distributed", reason="the taccl backend needs torch.distributed")

#: (dtype, shape) of the equal-split calls: blocks that divide the two-chunk algorithm and blocks that do not.
EQUAL_CASES = (
    ("float32", (WORLD_SIZE * 7,)),
    ("float64", (WORLD_SIZE * 250, 3)),
    ("int64", (WORLD_SIZE * 5,)),
    ("int32", (WORLD_SIZE * 64,)),
    ("bfloat16", (WORLD_SIZE * 33, 2)),
)


def _data(rank: int, shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1001, shape, generator=generator).to(dtype)


def _equal_split_cases(rank: int, gloo: Any) -> list[str]:
    """all_to_all_single (sync, async) on the taccl group against gloo's."""
    problems = []
    for seed, (dtype_name, shape) in enumerate(EQUAL_CASES):
        dtype = getattr(torch, dtype_name)
        data = _data(rank, shape, dtype, seed)
        ours, reference = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
        if seed % 2:
            dist.all_to_all_single(ours, data, async_op=True).wait()
        else:
            dist.all_to_all_single(ours, data)
        dist.all_to_all_single(reference, data, group=gloo)
        if not torch.equal(ours, reference):
            problems.append(f"all_to_all_single {dtype_name} {shape}")
    return problems


def _list_and_functional_cases(rank: int, gloo: Any) -> list[str]:
    """The list form (``dist.all_to_all``) and the functional ``all_to_all_single`` against gloo's."""
    import torch.distributed._functional_collectives as funcol

    problems = []
    inputs = [_data(rank, (3, 5), torch.int64, 30 + peer) for peer in range(WORLD_SIZE)]
    ours = [torch.zeros(3, 5, dtype=torch.int64) for _ in range(WORLD_SIZE)]
    reference = [torch.zeros(3, 5, dtype=torch.int64) for _ in range(WORLD_SIZE)]
    dist.all_to_all(ours, inputs)
    dist.all_to_all(reference, inputs, group=gloo)
    if not all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True)):
        problems.append("all_to_all (list) int64")
    data = _data(rank, (WORLD_SIZE * 40,), torch.float32, 40)
    ours_single = funcol.wait_tensor(funcol.all_to_all_single(data, None, None, dist.group.WORLD))
    reference_single = funcol.wait_tensor(funcol.all_to_all_single(data, None, None, gloo))
    if not torch.equal(ours_single, reference_single):
        problems.append("functional all_to_all_single float32")
    return problems


def _uneven_split_cases(rank: int, gloo: Any) -> list[str]:
    """Split sizes, uneven twice and equal once, run on the inner backend (one log line) and equal gloo's."""
    sends = [(rank + peer) % 3 + 1 for peer in range(WORLD_SIZE)]
    receives = [(peer + rank) % 3 + 1 for peer in range(WORLD_SIZE)]
    problems = []
    for seed in (20, 21):
        data = _data(rank, (sum(sends),), torch.float32, seed)
        ours, reference = torch.zeros(sum(receives)), torch.zeros(sum(receives))
        dist.all_to_all_single(ours, data, receives, sends)
        dist.all_to_all_single(reference, data, receives, sends, group=gloo)
        if not torch.equal(ours, reference):
            problems.append(f"all_to_all_single uneven splits, seed {seed}")
    rows = [6] * WORLD_SIZE  # equal split sizes: a rank cannot tell whether the others' are equal
    data = _data(rank, (sum(rows), 4), torch.float32, 9)
    ours, reference = torch.zeros_like(data), torch.zeros_like(data)
    dist.all_to_all_single(ours, data, rows, rows)
    dist.all_to_all_single(reference, data, rows, rows, group=gloo)
    if not torch.equal(ours, reference):
        problems.append("all_to_all_single with equal split sizes")
    return problems


def _alltoall_scenarios(rank: int, world_size: int, port: int) -> dict[str, Any]:
    handler = LogLines()
    logging.getLogger("taccl_py.runtime.backend").addHandler(handler)
    pg = init_taccl_group(rank, world_size, port, [chunked_alltoall_algorithm(world_size, 2)])
    gloo = dist.new_group(backend="gloo")
    results: dict[str, Any] = {"problems": _equal_split_cases(rank, gloo)}
    results["equal_counts"] = (dict(pg.routed), dict(pg.delegated))
    before = (Counter(pg.routed), Counter(pg.delegated))
    results["problems"] += _list_and_functional_cases(rank, gloo)
    results["list_counts"] = (dict(pg.routed - before[0]), dict(pg.delegated - before[1]))
    before = (Counter(pg.routed), Counter(pg.delegated))
    results["problems"] += _uneven_split_cases(rank, gloo)
    results["uneven_counts"] = (dict(pg.routed - before[0]), dict(pg.delegated - before[1]))
    results["log"] = [m for m in handler.messages if "with split sizes" in m]
    dist.barrier()
    return results


@pytest.fixture(scope="module")
def alltoall_results() -> list[dict[str, Any]]:
    return run_on_shared_store(_alltoall_scenarios, WORLD_SIZE)


@pytest.mark.multiprocess
def test_all_to_all_single_is_routed_and_equals_gloo(alltoall_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(alltoall_results):
        assert result["problems"] == [], f"rank {rank}: {result['problems']}"
        routed, delegated = result["equal_counts"]
        assert routed == {"alltoall": len(EQUAL_CASES)}, f"rank {rank}: routed {routed}"
        assert delegated == {}, f"rank {rank}: delegated {delegated}"


@pytest.mark.multiprocess
def test_the_list_form_is_routed_and_the_functional_collective_delegated(
    alltoall_results: list[dict[str, Any]],
) -> None:
    # torch's functional all_to_all_single fills in equal split sizes, and calls with split sizes are delegated
    for rank, result in enumerate(alltoall_results):
        assert result["problems"] == [], f"rank {rank}: {result['problems']}"
        routed, delegated = result["list_counts"]
        assert routed == {"alltoall": 1} and delegated == {"alltoall": 1}, f"rank {rank}: {routed}, {delegated}"


@pytest.mark.multiprocess
def test_split_sizes_run_on_the_inner_backend_with_one_log_line(alltoall_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(alltoall_results):
        routed, delegated = result["uneven_counts"]
        assert routed == {} and delegated == {"alltoall": 3}, f"rank {rank}: routed {routed}, delegated {delegated}"
        if rank:  # rank 0 speaks for the group; the others log the line at DEBUG
            assert result["log"] == [], f"rank {rank}: {result}"
        else:
            assert len(result["log"]) == 1 and "inner gloo backend's own" in result["log"][0], f"rank 0: {result}"
