"""Pipeline placement: optimal against brute force, NVLink chains, NIC-near boundaries, CLI."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from taccl_py.baselines._orders import nic_ranks
from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.placement import (
    EXACT_MAX_GPUS_PER_NODE,
    PlacementResult,
    pipeline_time_us,
    place_pipeline,
    stage_cost_matrix_us,
)
from taccl_py.topology import load_topology, route
from taccl_py.topology.cluster import load_cluster
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology

MB = 1_000_000


def _toy(nodes: int, gpus: int, seed: int, net_GBps: float = 12.5) -> Topology:
    """Return ``nodes`` identical machines of ``gpus`` GPUs (random all-pairs links, one NIC each)."""
    rng = random.Random(seed)
    pair = {
        (i, j): (rng.uniform(0.1, 2.0), rng.choice([5.0, 10.0, 20.0, 40.0]))
        for i, j in itertools.permutations(range(gpus), 2)
    }
    to_nic = {i: (rng.uniform(0.5, 1.0), rng.choice([5.0, 12.0, 24.0])) for i in range(gpus)}
    vertices, links = [], []
    for node in range(nodes):
        prefix = f"n{node}." if nodes > 1 else ""
        for i in range(gpus):
            vertices.append(Vertex(f"{prefix}gpu{i}", VertexKind.GPU, node=node, local_index=i, rank=node * gpus + i))
        vertices.append(Vertex(f"{prefix}nic", VertexKind.NIC, node=node, local_index=0))
        for (i, j), (alpha, bandwidth) in pair.items():
            links.append(Link(f"{prefix}gpu{i}", f"{prefix}gpu{j}", LinkKind.NVLINK, alpha, bandwidth))
        for i, (alpha, bandwidth) in to_nic.items():
            links.append(Link(f"{prefix}gpu{i}", f"{prefix}nic", LinkKind.PCIE, alpha, bandwidth))
            links.append(Link(f"{prefix}nic", f"{prefix}gpu{i}", LinkKind.PCIE, alpha, bandwidth))
    if nodes > 1:
        vertices.append(Vertex("netswitch", VertexKind.NET_SWITCH))
        for node in range(nodes):
            links.append(Link(f"n{node}.nic", "netswitch", LinkKind.IB, 1.0, net_GBps))
            links.append(Link("netswitch", f"n{node}.nic", LinkKind.IB, 0.0, net_GBps))
    return make_topology(f"toy{nodes}x{gpus}s{seed}", vertices, links, nodes=nodes)


def _brute_force_us(topology, stages: int, size: int, node_ordered: bool) -> float:
    costs = stage_cost_matrix_us(topology, size)
    best = float("inf")
    for order in itertools.permutations(range(topology.num_ranks), stages):
        nodes = [topology.node_of(r) for r in order]
        if node_ordered and any(a > b for a, b in zip(nodes, nodes[1:])):
            continue
        best = min(best, sum(costs[a, b] for a, b in zip(order, order[1:])))
    return float(best)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gpus", [4, 5, 6])
def test_single_node_placement_is_optimal_against_brute_force(gpus: int, seed: int) -> None:
    topology = _toy(1, gpus, seed)
    for stages in range(1, gpus + 1):
        result = place_pipeline(topology, stages, activation_bytes=MB)
        assert result.time_us == pytest.approx(_brute_force_us(topology, stages, MB, node_ordered=False), rel=1e-12)
        assert len(set(result.stage_ranks)) == stages
        assert result.time_us == pytest.approx(pipeline_time_us(topology, result.stage_ranks, MB))


@pytest.mark.parametrize(("nodes", "gpus", "seed"), [(2, 3, 0), (2, 3, 1), (3, 2, 2), (2, 4, 3)])
def test_multi_node_placement_is_optimal_over_node_ordered_blocks(nodes: int, gpus: int, seed: int) -> None:
    topology = _toy(nodes, gpus, seed)
    for stages in range(1, topology.num_ranks + 1):
        result = place_pipeline(topology, stages, activation_bytes=MB)
        assert result.time_us == pytest.approx(_brute_force_us(topology, stages, MB, node_ordered=True), rel=1e-12)


def test_multi_node_placement_matches_unrestricted_brute_force_when_the_network_is_dearest() -> None:
    small = _toy(2, 3, 7, net_GBps=1.0)
    costs = stage_cost_matrix_us(small, MB)
    inter = min(costs[a, b] for a in range(3) for b in range(3, 6))
    intra = max(costs[a, b] for a in range(3) for b in range(3) if a != b)
    assert inter > 4 * intra  # so crossing the network twice never beats crossing it once
    for stages in range(1, 7):
        result = place_pipeline(small, stages, activation_bytes=MB)
        assert result.time_us == pytest.approx(_brute_force_us(small, stages, MB, node_ordered=False), rel=1e-12)


def test_ndv2_four_stages_match_brute_force() -> None:
    topology = load_topology("ndv2")
    result = place_pipeline(topology, 4)
    assert result.time_us == pytest.approx(_brute_force_us(topology, 4, 16 * MB, node_ordered=False), rel=1e-12)


def test_ndv2_eight_stages_ride_double_nvlinks_only() -> None:
    topology = load_topology("ndv2")
    result = place_pipeline(topology, 8)
    for a, b in zip(result.stage_ranks, result.stage_ranks[1:]):
        (link,) = route(topology, a, b).links  # a direct link ...
        assert link.kind is LinkKind.NVLINK and link.count == 2  # ... on a double NVLink: a Hamiltonian path
    assert result.gain > 1.0
    assert result.naive_time_us == pytest.approx(pipeline_time_us(topology, range(8)))


def test_two_ndv2_boundary_stages_sit_next_to_the_nic() -> None:
    topology = load_topology("ndv2", nodes=2)
    result = place_pipeline(topology, 16)
    crossings = [h for h in result.hops if topology.node_of(h.src_rank) != topology.node_of(h.dst_rank)]
    assert len(crossings) == 1
    (hop,) = crossings
    nic_numa = topology.nics(0)[0].numa
    assert topology.gpu(hop.src_rank).numa == nic_numa and topology.gpu(hop.dst_rank).numa == nic_numa
    assert "host" not in hop.link_kinds  # no socket crossing on the way to the NIC
    assert all(kinds == ("nvlink",) for kinds in (h.link_kinds for h in result.hops if h is not hop))
    assert result.gain > 1.0


def test_placement_keeps_the_naive_order_when_nothing_is_gained() -> None:
    result = place_pipeline(load_topology("dgx-a100", nodes=2), 16)
    assert result.stage_ranks == tuple(range(16))
    assert result.gain == 1.0


def test_heuristic_beyond_exact_limit_is_valid_and_never_worse_than_naive() -> None:
    topology = _toy(1, EXACT_MAX_GPUS_PER_NODE + 2, 11)
    result = place_pipeline(topology, topology.num_ranks)
    assert result.method == "heuristic"
    assert sorted(result.stage_ranks) == list(range(topology.num_ranks))
    assert result.time_us <= result.naive_time_us
    with pytest.raises(ArgumentError, match="at most 16 GPUs per node"):
        place_pipeline(topology, 4, method="exact")


def test_heuristic_is_never_better_than_exact_on_small_instances() -> None:
    topology = _toy(2, 4, 5)
    for stages in (3, 6, 8):
        exact = place_pipeline(topology, stages, activation_bytes=MB)
        heuristic = place_pipeline(topology, stages, activation_bytes=MB, method="heuristic")
        assert heuristic.time_us >= exact.time_us - 1e-9


def test_result_formats_per_node_device_lists_and_rank_list() -> None:
    result = place_pipeline(load_topology("ndv2", nodes=2), 16)
    lists = result.cuda_visible_devices()
    assert set(lists) == {0, 1}
    for node, text in lists.items():
        assert sorted(int(x) for x in text.split(",")) == list(range(8))
    assert result.rank_list() == ",".join(str(r) for r in result.stage_ranks)
    assert json.loads(json.dumps(result.to_json_dict()))["stage_ranks"] == list(result.stage_ranks)
    assert isinstance(result, PlacementResult)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stages": 0}, "stages: 0 stages"),
        ({"stages": 9}, "stages: 9 stages; expected 1..8"),
        ({"stages": 4, "activation_bytes": 0}, "activation_bytes"),
        ({"stages": 4, "method": "fastest"}, "unknown method 'fastest'"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        place_pipeline(load_topology("ndv2"), **kwargs)


def test_pipeline_time_rejects_repeated_ranks() -> None:
    with pytest.raises(ArgumentError, match="distinct ranks"):
        pipeline_time_us(load_topology("ndv2"), [0, 1, 0])


def test_cli_place_prints_order_device_lists_and_gain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", "ndv2", "--nodes", "2", "--stages", "16"]) == 0
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES (node 1):" in out
    assert "rank list:" in out and "gain" in out


def test_cli_place_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", "ndv2", "--stages", "4", "--activation-size", "1MB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stages"] == 4 and data["activation_bytes"] == MB and len(data["hops"]) == 3


def test_cli_place_bad_stage_count_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", "ndv2", "--stages", "9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ndv2: stages: 9 stages")


def test_chain_tables_return_paths_with_the_tabled_cost() -> None:
    from taccl_py.placement.chains import exact_chains, heuristic_chains, path_cost

    costs = stage_cost_matrix_us(_toy(1, 5, 4), MB)
    for table in (exact_chains(costs), heuristic_chains(costs)):
        for first, last, length in itertools.product(range(5), range(5), range(1, 6)):
            value = table.cost[first, last, length]
            if value != float("inf"):
                path = table.paths(first, last, length)
                assert (path[0], path[-1], len(set(path))) == (first, last, length)
                assert path_cost(costs, path) == pytest.approx(value)


# -- clusters ---------------------------------------------------------------------------------------------


def _crossing_hops(topology, result):
    return [hop for hop in result.hops if topology.node_of(hop.src_rank) != topology.node_of(hop.dst_rank)]


@pytest.mark.parametrize(
    ("machine", "down"), [("dgx1", ["1:nic0", "1:nic1"]), ("dgx-h100", ["1:nic0"])], ids=["dgx1", "dgx-h100"]
)
def test_stage_boundaries_sit_next_to_the_nics_that_work(machine, down):
    topology = load_cluster(topology=machine, nodes=2, nics_down=down)
    result = place_pipeline(topology, topology.num_ranks)
    (hop,) = _crossing_hops(topology, result)
    for rank in (hop.src_rank, hop.dst_rank):
        assert rank in nic_ranks(topology, topology.node_of(rank))
    assert hop.link_kinds == ("pcie", "pcie", "ib", "ib", "pcie", "pcie")  # GPU, its NIC, the network, a NIC, GPU
    # the other NICs are as fast as the lost ones: the placement loses nothing against the healthy pair
    healthy = place_pipeline(load_topology(machine, nodes=2), topology.num_ranks)
    assert result.time_us == pytest.approx(healthy.time_us, rel=1e-9)
    assert result.time_us == pytest.approx(pipeline_time_us(topology, result.stage_ranks), rel=1e-9)


def test_placement_on_a_mixed_cluster_uses_each_machines_links():
    topology = load_cluster("dgx-a100:1,ndv2:1")
    result = place_pipeline(topology, 16)
    assert sorted(result.stage_ranks) == list(range(16))
    assert result.time_us < result.naive_time_us
    assert result.cuda_visible_devices().keys() == {0, 1}
    # inside the NDv2 every boundary rides NVLink; the A100's ride its NVSwitch
    ndv2_hops = [hop for hop in result.hops if topology.node_of(hop.src_rank) == topology.node_of(hop.dst_rank) == 1]
    assert len(ndv2_hops) == 7 and all(hop.link_kinds == ("nvlink",) for hop in ndv2_hops)
    (crossing,) = _crossing_hops(topology, result)
    assert crossing.dst_rank in nic_ranks(topology, 1)
