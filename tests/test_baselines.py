"""Baselines: every one verifies, orders follow the topology, and the simulator agrees with hand counts."""

from __future__ import annotations

import pytest
from test_simulate import full_mesh, two_nodes_one_nic

from taccl_py.baselines import (
    BaselineKind,
    all_baselines,
    applicable_kinds,
    best_baseline,
    best_baselines,
    build_baseline,
    ring_orders,
    tree_parents,
)
from taccl_py.baselines._orders import nic_orders, node_ranks
from taccl_py.baselines.tree import MAX_TREE_CHUNKS, default_tree_chunks
from taccl_py.errors import ArgumentError
from taccl_py.simulate import simulate
from taccl_py.topology import builtin_topology_names, load_topology
from taccl_py.topology.model import Vertex, VertexKind, make_topology

from helpers import assert_valid_algorithm

COLLECTIVES = ("allgather", "reducescatter", "allreduce")
KINDS = tuple(kind.value for kind in BaselineKind)


def _cases(collectives=COLLECTIVES):
    return [(kind, c) for c in collectives for kind in KINDS if kind != "tree" or c == "allreduce"]


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 16, 32])
@pytest.mark.parametrize(("kind", "collective"), _cases())
def test_baselines_verify_on_uniform_meshes(ranks, kind, collective):
    topology = full_mesh(ranks)
    channels = None if ranks <= 8 else 1  # the default's several channels are covered at 2..8 ranks
    algorithm = build_baseline(kind, topology, collective, channels=channels)
    assert_valid_algorithm(algorithm)
    assert algorithm.num_ranks == ranks and algorithm.meta("baseline") == kind


@pytest.mark.parametrize(("kind", "collective"), _cases())
def test_baselines_verify_with_two_gpus_per_machine(kind, collective):
    algorithm = build_baseline(kind, two_nodes_one_nic(), collective)
    assert_valid_algorithm(algorithm)


def _builtin(name: str, nodes: int):
    return load_topology(name, nodes=nodes)


@pytest.mark.parametrize("name", builtin_topology_names())
@pytest.mark.parametrize(("kind", "collective"), _cases())
def test_baselines_verify_on_one_builtin_machine(name, kind, collective):
    assert_valid_algorithm(build_baseline(kind, _builtin(name, 1), collective))


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("name", builtin_topology_names())
@pytest.mark.parametrize(("kind", "collective"), _cases())
def test_baselines_verify_across_builtin_machines(name, nodes, kind, collective):
    topology = _builtin(name, nodes)
    if topology.num_ranks > 32:
        pytest.skip("above 32 ranks: covered by the slow test with default settings")
    # few channels keep the default run fast; the slow test covers the default channel counts
    chunks = 2 if kind == "tree" else 1
    assert_valid_algorithm(build_baseline(kind, topology, collective, chunks, channels=2 if nodes == 2 else 1))


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("name", builtin_topology_names())
def test_default_baselines_verify_across_builtin_machines(name, nodes):
    topology = _builtin(name, nodes)
    for collective in COLLECTIVES:
        for algorithm in all_baselines(topology, collective):
            assert_valid_algorithm(algorithm)


def test_ndv2_rings_follow_nvlink_cycles_both_ways():
    topology = load_topology("ndv2")
    rings = ring_orders(topology)
    assert len(rings) == 6  # double cycle twice per direction (twice as fast), single cycle once
    lanes = [[topology.link(f"gpu{a}", f"gpu{b}") for a, b in zip(ring, ring[1:] + ring[:1])] for ring in rings]
    for ring_links in lanes:
        assert all(link is not None and link.kind.value == "nvlink" for link in ring_links)
    assert [min(link.count for link in ring_links) for ring_links in lanes] == [2, 2, 1, 1, 2, 2]
    assert rings[1] == (rings[0][0],) + tuple(reversed(rings[0][1:]))


def test_multi_node_rings_enter_and_leave_each_machine_next_to_the_channel_nic():
    topology = load_topology("dgx-a100", nodes=2)
    rings = ring_orders(topology)
    assert len(rings) == 8  # one per NIC
    per_node = topology.gpus_per_node
    for node in range(2):
        exits, entries = [], []
        for nic, ring in enumerate(rings):
            segment = [r for r in ring if topology.node_of(r) == node]
            assert sorted(segment) == list(node_ranks(topology, node))
            assert ring.index(segment[0]) % per_node == 0  # a machine's GPUs are consecutive in the ring
            entries.append(segment[0])
            exits.append(segment[-1])
            assert segment[-1] == nic_orders(topology, node)[nic][0]  # leaves next to NIC `nic`
        assert len(set(exits)) == 8 and len(set(entries)) == 8  # every NIC carries one ring each way


def test_single_nic_machines_get_a_forward_and_a_reverse_ring():
    topology = load_topology("ndv2", nodes=2)
    forward, backward = ring_orders(topology)
    assert backward == (forward[0],) + tuple(reversed(forward[1:]))
    near_nic = set(nic_orders(topology, 0)[0][:4])  # GPUs 0-3 share the NIC's CPU
    segment = forward[:8]
    assert segment[0] in near_nic and segment[-1] in near_nic


def test_ring_allgather_across_two_ndv2_is_nic_bound():
    topology = load_topology("ndv2", nodes=2)
    size = 10**9
    result = simulate(build_baseline("ring", topology, "allgather"), topology, size)
    nic_GBps = topology.vertex("n0.nic0").net_bandwidth_GBps
    nic_time_us = 15 / 16 * size / (nic_GBps * 1e3)  # 15 steps, each M/16 bytes leave every machine
    assert result.time_us == pytest.approx(nic_time_us, rel=1e-3)
    assert 0.5 < result.fraction_of_bound < 0.56


@pytest.mark.parametrize("ranks", [2, 3, 6, 8, 9])
def test_trees_span_every_rank_and_complement_each_other(ranks):
    topology = full_mesh(ranks)
    trees = [tree_parents(topology, channel) for channel in (0, 1)]
    for parents in trees:
        assert set(parents) == set(range(ranks))
        roots = [r for r, p in parents.items() if p is None]
        assert len(roots) == 1
        for rank in parents:  # every rank reaches the root
            seen = set()
            while parents[rank] is not None:
                assert rank not in seen
                seen.add(rank)
                rank = parents[rank]
    inner = [{p for p in parents.values() if p is not None} for parents in trees]
    if ranks % 2 == 0:
        assert not inner[0] & inner[1]


def test_multi_node_trees_chain_inside_machines_from_the_nic_gpu():
    topology = load_topology("dgx1", nodes=2)
    parents = tree_parents(topology, 2)  # first tree shape, second NIC
    head0, head1 = nic_orders(topology, 0)[1][0], nic_orders(topology, 1)[1][0]
    assert parents[head0] is None and parents[head1] == head0
    for rank, parent in parents.items():
        if rank not in (head0, head1):
            assert topology.node_of(parent) == topology.node_of(rank)


def test_single_machine_meshes_use_chains_for_trees():
    topology = load_topology("ndv2")
    parents = tree_parents(topology, 0)
    children = [p for p in parents.values() if p is not None]
    assert len(set(children)) == 7 and max(children.count(p) for p in children) == 1  # a path
    assert all(topology.link(f"gpu{r}", f"gpu{p}").count == 2 for r, p in parents.items() if p is not None)


def test_chunk_and_channel_counts_shape_the_algorithm():
    topology = full_mesh(4)
    ring = build_baseline("ring", topology, "allgather", 3, channels=2)
    assert (ring.chunks_per_loop, ring.num_channels, ring.name) == (4 * 2 * 3, 2, "ring-2ch-3p")
    tree = build_baseline("tree", topology, "allreduce", 5, channels=3)
    assert (tree.chunks_per_loop, tree.num_channels) == (15, 3)
    hier = build_baseline("hierarchical", load_topology("ndv2", nodes=2), "allreduce", 2, channels=2)
    assert hier.num_channels == 3  # two local rings and the ring across machines
    assert_valid_algorithm(hier)


def test_tree_pipeline_depth_grows_with_size():
    topology = load_topology("ndv2", nodes=2)
    depths = [default_tree_chunks(topology, size, 2) for size in (10**3, 10**6, 10**9)]
    assert depths[0] == 1 and depths[-1] == MAX_TREE_CHUNKS and depths == sorted(depths)


def test_best_baseline_is_the_fastest_applicable_one():
    topology = load_topology("ndv2", nodes=2)
    size = 32 * 10**6
    algorithm, result = best_baseline(topology, "allreduce", size)
    times = {a.name: simulate(a, topology, size).time_us for a in all_baselines(topology, "allreduce", size)}
    assert result.time_us == pytest.approx(min(times.values()))
    assert algorithm.name == min(times, key=times.get)
    lines = []
    per_size = best_baselines(topology, "allreduce", (10**3, size), progress=lines.append)
    assert per_size[1][1].time_us == pytest.approx(result.time_us)
    assert any(line.startswith("baseline ring-") for line in lines)


def test_applicable_kinds():
    assert applicable_kinds(full_mesh(4), "allgather") == (BaselineKind.RING, BaselineKind.TREES)
    assert applicable_kinds(load_topology("ndv2", nodes=2), "allreduce") == (
        BaselineKind.RING,
        BaselineKind.TREE,
        BaselineKind.HIERARCHICAL,
        BaselineKind.TREES,
    )


@pytest.mark.parametrize(
    ("kind", "collective", "options", "message"),
    [
        ("tree", "allgather", {}, "no tree baseline for allgather"),
        ("ring", "alltoall", {}, "no ring baseline for alltoall"),
        ("hierarchical", "alltoall", {}, "no hierarchical baseline for alltoall"),
        ("star", "allgather", {}, "unknown baseline 'star'"),
        ("ring", "gather", {}, "unknown collective 'gather'"),
        ("ring", "allgather", {"channels": 0}, "0 channels; expected 1..32"),
        ("tree", "allreduce", {"channels": 33}, "33 channels; expected 1..32"),
        ("ring", "allgather", {"chunks": 0}, "0 chunks"),
        ("tree", "allreduce", {"chunks": MAX_TREE_CHUNKS + 1}, f"{MAX_TREE_CHUNKS + 1} chunks"),
        ("trees", "alltoall", {}, "no trees baseline for alltoall"),
        ("trees", "allgather", {"channels": 0}, "0 trees per rank; expected 1..32"),
        ("trees", "allgather", {"chunks": 33}, "33 chunks; expected 1..32 pieces per tree"),
    ],
)
def test_bad_baseline_requests_are_argument_errors(kind, collective, options, message):
    with pytest.raises(ArgumentError, match=message):
        build_baseline(kind, full_mesh(4), collective, **options)


def test_one_gpu_has_no_baseline():
    single = make_topology("one", [Vertex("gpu0", VertexKind.GPU, local_index=0, rank=0)], [])
    with pytest.raises(ArgumentError, match="at least 2 GPUs"):
        build_baseline("ring", single, "allgather")


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
@pytest.mark.parametrize("chunks", [1, 3])
def test_ring_steps_per_threadblock_is_a_floor_of_the_exported_ring(collective, chunks):
    from taccl_py.baselines.ring import ring_steps_per_threadblock
    from taccl_py.msccl import generate_msccl_xml

    algorithm = build_baseline("ring", load_topology("ndv2"), collective, chunks)
    most = max(tb.count("<step ") for tb in generate_msccl_xml(algorithm).split("<tb ")[1:])
    floor = ring_steps_per_threadblock(collective, 8, chunks)
    assert floor <= most <= floor + chunks  # AllReduce adds one step per piece
