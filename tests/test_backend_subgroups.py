"""The ``taccl`` backend serves ``new_group`` subgroups from the libraries made for their members.

Libraries come from ``taccl synthesize --parallel tp=4,dp=2`` on NDv2 (one folder per collective,
one subfolder per placement class), written once per session. One launch of 8 ranks makes
tensor-parallel, data-parallel, placement-matched and unmatched taccl groups and compares their
collectives with gloo groups of the same ranks; the tests below read the per-rank results.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from taccl_py.ir.collectives import Collective

from ddp_helpers import ring_library, run_on_shared_store
from helpers import ring_algorithm

torch = pytest.importorskip("torch", reason="the taccl backend needs torch")
dist = pytest.importorskip("torch.distributed", reason="the taccl backend needs torch.distributed")

WORLD = 8
#: Each layout's groups, every rank in exactly one. "placement": alone, (0, 1) times as dp-0's
#: (0, 4) does on NDv2; "unmatched": placed as no library's class is.
LAYOUTS = {
    "tp": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
    "placement": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "unmatched": [[0, 5], [1, 4], [2, 7], [3, 6]],
}
ROUTED = ("allreduce", "allgather", "reducescatter")
NUMEL = 240  # per rank: 960 B of float32, divisible by every group size


@pytest.fixture(scope="session")
def parallel_folders(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Return one ``--parallel tp=4,dp=2`` folder per routed collective, synthesized for NDv2 at 64 KB."""
    from taccl_py.cli import main

    root = tmp_path_factory.mktemp("parallel")
    folders = []
    for collective in ROUTED:
        folder = root / collective
        argv = ["synthesize", "--topology", "ndv2", "-c", collective, "--parallel", "tp=4,dp=2"]
        assert main([*argv, "--sizes", "64KB", "-o", str(folder)]) == 0
        folders.append(str(folder))
    return folders


def _library(folders: list[str]) -> list[Any]:
    """The parallel folders, ring algorithms for the world, and a group-less 2-rank all-to-all."""
    return [*folders, *ring_library(WORLD), ring_algorithm(Collective.ALLTOALL, 2)]


# -- multi-process scenarios (run inside the ranks) -----------------------------------------------


def _init(rank: int, port: int, prefix: str, library: list[Any], **options: Any) -> None:
    """Make a taccl world on the shared store under ``prefix`` (torch reuses group names after a destroy)."""
    from taccl_py.runtime.backend import register_backend

    dist.destroy_process_group()
    register_backend(library, calibration=False, **options)
    timeout = datetime.timedelta(seconds=60)
    store = dist.PrefixStore(prefix, dist.TCPStore("127.0.0.1", port, WORLD, False, timeout=timeout))
    dist.init_process_group("taccl", store=store, rank=rank, world_size=WORLD, timeout=timeout)


def _data(rank: int, numel: int, seed: int) -> Any:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed * 1009 + rank))


def _compare(rank: int, group: Any, gloo: Any, seed: int) -> list[str]:
    """all_reduce, all_gather_into_tensor and reduce_scatter_tensor on ``group`` against ``gloo`` (same ranks)."""
    size, problems = dist.get_world_size(group), []
    ours, reference = _data(rank, NUMEL, seed), _data(rank, NUMEL, seed)
    dist.all_reduce(ours, group=group)
    dist.all_reduce(reference, group=gloo)
    pairs = [("all_reduce", ours, reference)]
    shard = _data(rank, NUMEL // size, seed + 1)
    ours, reference = torch.empty(NUMEL), torch.empty(NUMEL)
    dist.all_gather_into_tensor(ours, shard, group=group)
    dist.all_gather_into_tensor(reference, shard, group=gloo)
    pairs.append(("all_gather_into_tensor", ours, reference))
    full = _data(rank, NUMEL, seed + 2)
    ours, reference = torch.empty(NUMEL // size), torch.empty(NUMEL // size)
    dist.reduce_scatter_tensor(ours, full, group=group)
    dist.reduce_scatter_tensor(reference, full, group=gloo)
    pairs.append(("reduce_scatter_tensor", ours, reference))
    for name, got, expected in pairs:
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
            problems.append(f"{name} on {dist.get_process_group_ranks(group)}: {(got - expected).abs().max()}")
    return problems


def _alltoall(rank: int, group: Any, gloo: Any) -> list[str]:
    size = dist.get_world_size(group)
    data = _data(rank, 4 * size, 77)
    ours, reference = torch.empty_like(data), torch.empty_like(data)
    dist.all_to_all_single(ours, data, group=group)
    dist.all_to_all_single(reference, data, group=gloo)
    return [] if torch.equal(ours, reference) else [f"all_to_all_single on {dist.get_process_group_ranks(group)}"]


def _summary(group: Any, problems: list[str]) -> dict[str, Any]:
    from taccl_py.runtime.backend import TacclProcessGroup

    return {
        "problems": problems,
        "is_taccl_group": isinstance(group, TacclProcessGroup),
        "global_ranks": list(group.global_ranks),
        "routed": dict(group.routed),
        "delegated": dict(group.delegated),
        "matches": {m.collective.value: (m.kind.value, m.representative) for m in group.library_matches},
    }


def _subgroup_scenarios(rank: int, world: int, port: int, folders: list[str]) -> dict[str, Any]:
    _init(rank, port, "plain/", _library(folders))
    results: dict[str, Any] = {}
    world_gloo = dist.new_group(backend="gloo")
    results["world"] = _summary(dist.group.WORLD, _compare(rank, dist.group.WORLD, world_gloo, 1))
    for seed, (layout, groups) in enumerate(LAYOUTS.items()):
        made = [(dist.new_group(ranks), dist.new_group(ranks, backend="gloo")) for ranks in groups]
        mine, gloo = next(pair for pair, ranks in zip(made, groups) if rank in ranks)
        problems = _compare(rank, mine, gloo, 10 + seed)
        if layout == "placement":
            problems += _alltoall(rank, mine, gloo)
        results[layout] = _summary(mine, problems)
    # the live cluster (NDv2, as the libraries record): subgroups resolve the job's cluster
    _init(rank, port, "cluster/", list(folders), cluster="ndv2")
    groups = LAYOUTS["tp"]
    made = [(dist.new_group(ranks), dist.new_group(ranks, backend="gloo")) for ranks in groups]
    mine, gloo = made[rank // 4]
    results["cluster_tp"] = _summary(mine, _compare(rank, mine, gloo, 20))
    results["cluster_tp"]["fingerprint"] = mine._cluster.fingerprint if mine._cluster else None
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def subgroup_results(parallel_folders: list[str]) -> list[dict[str, Any]]:
    return run_on_shared_store(_subgroup_scenarios, WORLD, parallel_folders)


# -- multi-process tests --------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["world", *LAYOUTS, "cluster_tp"])
def test_group_collectives_equal_gloo(subgroup_results: list[dict[str, Any]], layout: str) -> None:
    for rank, result in enumerate(subgroup_results):
        summary = result[layout]
        assert summary["is_taccl_group"], f"rank {rank}: {layout} is not a TacclProcessGroup"
        assert summary["problems"] == [], f"rank {rank}: {summary['problems']}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["tp", "dp", "cluster_tp"])
def test_parallel_groups_route_through_their_own_libraries(subgroup_results: list[dict[str, Any]], layout: str) -> None:
    for rank, result in enumerate(subgroup_results):
        summary = result[layout]
        assert summary["routed"] == dict.fromkeys(ROUTED, 1), f"rank {rank}: {summary}"
        assert summary["delegated"] == {}, f"rank {rank}: {summary}"
        assert summary["matches"] == dict.fromkeys(ROUTED, ("exact", None)), f"rank {rank}: {summary['matches']}"


@pytest.mark.multiprocess
def test_subgroup_resolves_the_jobs_cluster(subgroup_results: list[dict[str, Any]]) -> None:
    from taccl_py.runtime.communicator.live_cluster import declare_cluster
    from taccl_py.topology.fingerprint import cluster_fingerprint

    expected = cluster_fingerprint(declare_cluster("ndv2", (), ()).topology)
    assert {result["cluster_tp"]["fingerprint"] for result in subgroup_results} == {expected}


@pytest.mark.multiprocess
def test_placement_match_routes_and_says_so(subgroup_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(subgroup_results):
        summary = result["placement"]
        placed = {c: ("placement", [0, 4]) for c in ROUTED}
        matches = {c: (kind, list(rep) if rep else rep) for c, (kind, rep) in summary["matches"].items()}
        first_ranks = summary["global_ranks"] == [0, 1]
        # the group-less 2-rank all-to-all serves only the job's first two ranks
        assert matches == placed | ({"alltoall": ("first ranks", None)} if first_ranks else {}), f"rank {rank}"
        routed = dict.fromkeys(ROUTED, 1) | ({"alltoall": 1} if first_ranks else {})
        assert summary["routed"] == routed, f"rank {rank}: {summary}"
        assert summary["delegated"] == ({} if first_ranks else {"alltoall": 1}), f"rank {rank}: {summary}"


@pytest.mark.multiprocess
def test_unmatched_group_delegates(subgroup_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(subgroup_results):
        summary = result["unmatched"]
        assert summary["matches"] == {} and summary["routed"] == {}, f"rank {rank}: {summary}"
        assert summary["delegated"] == dict.fromkeys(ROUTED, 1), f"rank {rank}: {summary}"


@pytest.mark.multiprocess
def test_world_group_runs_its_group_less_library(subgroup_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(subgroup_results):
        summary = result["world"]
        assert summary["global_ranks"] == list(range(WORLD)), f"rank {rank}: {summary}"
        assert summary["routed"] == dict.fromkeys(ROUTED, 1), f"rank {rank}: {summary}"
        assert summary["matches"] == dict.fromkeys(ROUTED, ("first ranks", None)), f"rank {rank}: {summary}"


# -- in-process tests -----------------------------------------------------------------------------


def _matches(library: Any, ranks: list[int]) -> dict[str, str]:
    from taccl_py.runtime.communicator.group_match import group_candidates

    candidates, matches = group_candidates(library, ranks, WORLD)
    assert {c.collective for c in candidates} == {m.collective for m in matches}
    return {m.collective.value: m.describe() for m in matches}


def test_group_candidates_tiers(parallel_folders: list[str]) -> None:
    allreduce = parallel_folders[0]
    assert _matches(allreduce, [4, 5, 6, 7]) == {
        "allreduce": f"allreduce: exact ({Path(allreduce) / 'tp-0' / 'allreduce.library.json'})"
    }
    assert "exact" in _matches(allreduce, [3, 7])["allreduce"] and "dp-1" in _matches(allreduce, [3, 7])["allreduce"]
    assert "placement match of [1, 5]" in _matches(allreduce, [0, 2])["allreduce"]
    assert _matches(allreduce, [0, 5]) == {}
    assert _matches(allreduce, [0, 1, 2, 3, 4, 5, 6, 7]) == {}  # no 8-rank library in the folder


def test_group_less_library_serves_only_the_first_ranks() -> None:
    pair = [ring_algorithm(Collective.ALLREDUCE, 2)]
    assert _matches(pair, [0, 1]) == {"allreduce": f"allreduce: first ranks ({pair[0].name})"}
    assert _matches(pair, [2, 3]) == {}
    assert _matches(pair, [1, 0]) == {}


def test_library_for_another_job_size_serves_no_group(parallel_folders: list[str]) -> None:
    from taccl_py.runtime.communicator.group_match import group_candidates

    assert group_candidates(parallel_folders[0], [0, 1, 2, 3], 16) == ((), ())


def test_members_exchange_ports_for_the_nodes_they_are_on() -> None:
    from taccl_py.runtime.backend.group import _exchange_on_store

    store = dist.HashStore()
    store.set("taccl/nic-ports/1", '["seen on node 1"]')
    texts = _exchange_on_store(store, 0, (2, 5), 8, 4, '["seen on node 0"]')
    # node 0 is rank 0's node: member 2 stands in for it; node 1's first rank 4 takes member 5's view
    assert texts == ['["seen on node 0"]'] * 4 + ['["seen on node 1"]'] * 4
    lone = _exchange_on_store(dist.HashStore(), 0, (0,), 8, 4, "[1]")
    assert lone == ["[1]"] * 4 + ["[]"] * 4
