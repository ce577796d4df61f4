"""Baselines: every one verifies, orders follow the topology, and the simulator agrees with hand counts."""

from __future__ import annotations

import pytest
import torch
from test_executor import expected, make_inputs, run_threads
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
from taccl_py.baselines._orders import nic_orders, nic_ranks, node_ranks, rail_nics
from taccl_py.baselines.hierarchical import local_rings, machines_local_rings
from taccl_py.baselines.tree import MAX_TREE_CHUNKS, default_tree_channels, default_tree_chunks
from taccl_py.errors import ArgumentError
from taccl_py.simulate import simulate
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import load_cluster
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology, route

from helpers import assert_valid_algorithm, builtin_machine_params, covering_product

COLLECTIVES = ("allgather", "reducescatter", "allreduce")
# direct: alltoall only; doubling: across machines only, verified in tests/test_doubling.py
KINDS = tuple(kind.value for kind in BaselineKind if kind not in (BaselineKind.DIRECT, BaselineKind.DOUBLING))


def _cases(collectives=COLLECTIVES):
    return [(kind, c) for c in collectives for kind in KINDS if kind != "tree" or c == "allreduce"]


# 32 ranks (12 s of the sweep's 17) with --runslow: 16 already takes the one-channel path above 8.
@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 16, pytest.param(32, marks=pytest.mark.slow)])
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


# The default run builds every (kind, collective) on some machine and every machine with some of them
# (``covering_product``); --runslow the whole product.
@pytest.mark.parametrize(("name", "kind", "collective"), covering_product(builtin_machine_params(), _cases()))
def test_baselines_verify_on_one_builtin_machine(name, kind, collective):
    assert_valid_algorithm(build_baseline(kind, _builtin(name, 1), collective))


# Four machines with --runslow (24 s): the builders' cross-machine code is the same as at two. At two,
# a covering of machines and (kind, collective) as above.
@pytest.mark.parametrize("nodes", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize(("name", "kind", "collective"), covering_product(builtin_machine_params(), _cases()))
def test_baselines_verify_across_builtin_machines(name, nodes, kind, collective):
    topology = _builtin(name, nodes)
    if topology.num_ranks > 32:
        pytest.skip("above 32 ranks: covered by the slow test with default settings")
    # few channels keep the default run fast; the slow test covers the default channel counts
    chunks = 2 if kind == "tree" else 1
    assert_valid_algorithm(build_baseline(kind, topology, collective, chunks, channels=2 if nodes == 2 else 1))


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("name", builtin_machine_params())
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
    ring = build_baseline("ring", topology, "allgather")
    result = simulate(ring, topology, size, model="chunks")
    nic_GBps = topology.vertex("n0.nic0").net_bandwidth_GBps
    nic_time_us = 15 / 16 * size / (nic_GBps * 1e3)  # 15 steps, each M/16 bytes leave every machine
    assert result.time_us == pytest.approx(nic_time_us, rel=1e-3)
    assert 0.5 < result.fraction_of_bound < 0.56
    # MSCCL's loop over 2 MiB slices adds one ring's fill per pass: under 1% at 1 GB
    assert simulate(ring, topology, size).time_us == pytest.approx(nic_time_us, rel=1e-2)


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


def test_a_tree_over_msccls_threadblock_limit_competes_with_fewer_channels():
    from taccl_py.synth.candidates import exportable

    # DGX-A100 x2: 16 trees (2 per rail) need 65 threadblocks per GPU, one over MSCCL's 64.
    topology = load_topology("dgx-a100", nodes=2)
    unlimited = build_baseline("tree", topology, "allreduce", 1)
    assert not exportable(unlimited)
    lines: list[str] = []
    best_baselines(topology, "allreduce", (10**3,), progress=lines.append, keep=exportable)
    # the 16 trees are simulated too (the fastest baseline is compared with, loadable or not), then the kept ones
    whole, tree = [line.split()[1].rstrip(":") for line in lines if line.startswith("baseline tree-")]
    channels = int(tree.split("-")[1].removesuffix("ch"))
    assert whole.startswith("tree-16ch") and channels < 16
    kept = build_baseline("tree", topology, "allreduce", 1, channels=channels)
    assert exportable(kept)
    assert simulate(kept, topology, 10**3).time_us == pytest.approx(
        simulate(unlimited, topology, 10**3).time_us, rel=0.01
    )


def test_applicable_kinds():
    assert applicable_kinds(full_mesh(4), "allgather") == (BaselineKind.RING, BaselineKind.TREES)
    assert applicable_kinds(load_topology("ndv2", nodes=2), "allreduce") == (
        BaselineKind.RING,
        BaselineKind.TREE,
        BaselineKind.HIERARCHICAL,
        BaselineKind.TREES,
        BaselineKind.DOUBLING,
    )


@pytest.mark.parametrize(
    ("kind", "collective", "options", "message"),
    [
        ("tree", "allgather", {}, "no tree baseline for allgather"),
        ("ring", "alltoall", {}, "no ring baseline for alltoall"),
        ("direct", "allgather", {}, "no direct baseline for allgather"),
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


# -- clusters: machines of different kinds, NICs down or slower ----------------------------------------

A100_NIC_DOWN = {"topology": "dgx-a100", "nodes": 4, "nics_down": ["1:nic3"]}
H100_NIC_DOWN = {"topology": "dgx-h100", "nodes": 2, "nics_down": ["1:nic3"]}
TARGET_CLUSTERS = {
    "mixed": {"cluster": "dgx-a100:2,dgx-h100:2"},
    "a100-nic-down": A100_NIC_DOWN,
    "ndv2-half-nic": {"topology": "ndv2", "nodes": 2, "nic_speeds": ["1:nic0:4.76"]},
}


def _crossings(topology, pairs):
    """Return the (src, dst) rank pairs of ``pairs`` in different machines, with their routes."""
    return [(a, b, route(topology, a, b)) for a, b in pairs if topology.node_of(a) != topology.node_of(b)]


def _ring_hops(rings):
    return [(a, b) for ring in rings for a, b in zip(ring, ring[1:] + ring[:1])]


def test_rails_leave_out_a_nic_down_on_any_machine():
    rails = rail_nics(load_cluster(**A100_NIC_DOWN))
    assert [len(node) for node in rails] == [7] * 4
    assert all(f"n{node}.nic3" not in names for node, names in enumerate(rails))
    assert rails[2] == tuple(f"n2.nic{i}" for i in (0, 1, 2, 4, 5, 6, 7))
    mixed = rail_nics(load_cluster("dgx-a100:1,ndv2:1"))  # the NDv2 has one NIC: one rail
    assert mixed == (("n0.nic0",), ("n1.nic0",))


@pytest.mark.parametrize("spec", [H100_NIC_DOWN, A100_NIC_DOWN], ids=["h100-nic-down", "a100-nic-down"])
def test_rings_and_trees_cross_machines_only_next_to_working_nics(spec):
    topology = load_cluster(**spec)
    endpoints = [nic_ranks(topology, node) for node in range(topology.nodes)]
    if spec is H100_NIC_DOWN:
        assert 11 not in endpoints[1]  # n1.gpu3 lost its only close NIC
    rings = ring_orders(topology)
    assert len(rings) == 7
    tree_edges = [
        (child, parent)
        for channel in range(default_tree_channels(topology))
        for child, parent in tree_parents(topology, channel).items()
        if parent is not None
    ]
    assert default_tree_channels(topology) == 14
    for hops in (_ring_hops(rings), tree_edges + [(p, c) for c, p in tree_edges]):
        crossings = _crossings(topology, hops)
        assert crossings
        for a, b, path in crossings:
            assert a in endpoints[topology.node_of(a)] and b in endpoints[topology.node_of(b)]
            assert LinkKind.HOST not in {link.kind for link in path.links}  # no detour to another GPU's NIC
    # every working NIC that carries a ring carries one, each way
    leaving = [
        link.src
        for _, _, path in _crossings(topology, _ring_hops(rings))
        for link in path.links
        if link.dst == "netswitch"
    ]
    entering = [
        link.dst
        for _, _, path in _crossings(topology, _ring_hops(rings))
        for link in path.links
        if link.src == "netswitch"
    ]
    assert len(set(leaving)) == len(leaving) and len(set(entering)) == len(entering)


def test_hierarchical_rings_follow_each_machine_kinds_links():
    topology = load_cluster("dgx-a100:1,ndv2:1")
    rings = machines_local_rings(topology)
    ndv2 = load_topology("ndv2")
    assert rings[1] == local_rings(ndv2) and rings[0] != rings[1]
    for ring in rings[1]:  # NVLink all the way round inside the NDv2 (machine 0's A100 order would not be)
        assert all(ndv2.link(f"gpu{a}", f"gpu{b}") is not None for a, b in zip(ring, ring[1:] + ring[:1]))
    algorithm = build_baseline("hierarchical", topology, "allreduce")
    assert_valid_algorithm(algorithm)
    assert "n1: " in algorithm.meta("local_rings")
    inputs = make_inputs(algorithm, 3, torch.float32, seed=5)
    kept = [tensor.clone() for tensor in inputs]
    for got, want in zip(run_threads(algorithm, inputs, 3), expected(algorithm, kept, "sum")):
        assert torch.equal(got, want)


def test_a_ring_too_long_for_msccl_is_spread_over_channels_at_the_same_time():
    from taccl_py.synth.candidates import exportable

    topology = full_mesh(34)  # AllReduce: 2 x 33 = 66 sends in one threadblock, over MSCCL's 64 steps
    whole = build_baseline("ring", topology, "allreduce", channels=1)
    spread = build_baseline("ring", topology, "allreduce", channels=1, max_transfers_per_threadblock=28)
    assert not exportable(whole) and exportable(spread)
    assert spread.name == "ring-1ch-1p-tb28" and spread.num_channels == 3
    assert max(len(tb.steps) for program in spread.ranks for tb in program.threadblocks) <= 64
    assert simulate(spread, topology, 10**6).time_us == pytest.approx(simulate(whole, topology, 10**6).time_us)


def _switch(n: int):
    """Return ``n`` GPUs on one switch."""
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(n)]
    up = [Link(f"gpu{r}", "sw", LinkKind.NVSWITCH, 0.7, 20.0) for r in range(n)]
    down = [Link("sw", f"gpu{r}", LinkKind.NVSWITCH, 0.0, 20.0) for r in range(n)]
    return make_topology(f"switch{n}", [*gpus, Vertex("sw", VertexKind.NVSWITCH)], up + down)


def test_size_bands_take_the_spread_ring_where_the_whole_one_does_not_load(monkeypatch):
    from taccl_py.synth.candidates import exportable

    monkeypatch.setattr("taccl_py.baselines.choice.applicable_kinds", lambda *_: (BaselineKind.RING,))
    topology = _switch(34)  # two rings (one per direction), each 66 sends per threadblock in an AllReduce
    ((loadable, result),) = best_baselines(topology, "allreduce", (10**6,), keep=exportable)
    ((whole, fastest),) = best_baselines(topology, "allreduce", (10**6,))
    assert loadable.name == whole.name + "-tb28" and exportable(loadable)
    assert result.time_us == pytest.approx(fastest.time_us)


@pytest.mark.parametrize(("kind", "collective"), [("ring", "allreduce"), ("hierarchical", "allreduce")])
def test_spread_baselines_compute_the_collective(kind, collective):
    algorithm = build_baseline(kind, two_nodes_one_nic(), collective, max_transfers_per_threadblock=1)
    assert algorithm.name.endswith("-tb1") and algorithm.meta("transfers_per_threadblock") == "1"
    inputs = make_inputs(algorithm, 3, torch.float32, seed=7)
    kept = [tensor.clone() for tensor in inputs]
    for got, want in zip(run_threads(algorithm, inputs, 3), expected(algorithm, kept, "sum")):
        assert torch.equal(got, want)


def test_only_rings_and_hierarchical_baselines_spread():
    with pytest.raises(ArgumentError, match="tree allreduce with max_transfers_per_threadblock"):
        build_baseline("tree", full_mesh(4), "allreduce", max_transfers_per_threadblock=28)


# AllReduce runs a reduce-scatter and an allgather lap; hierarchical ReduceScatter shares its builder with AllGather
CLUSTER_CASES = [
    ("ring", "allreduce"),
    ("tree", "allreduce"),
    ("hierarchical", "allreduce"),
    ("hierarchical", "reducescatter"),
]


@pytest.mark.parametrize("name", sorted(TARGET_CLUSTERS))
@pytest.mark.parametrize(("kind", "collective"), CLUSTER_CASES)
def test_baselines_verify_and_simulate_on_target_clusters(name, kind, collective):
    topology = load_cluster(**TARGET_CLUSTERS[name])
    algorithm = build_baseline(kind, topology, collective, 2 if kind == "tree" else 1, channels=1)
    assert_valid_algorithm(algorithm)
    result = simulate(algorithm, topology, 16 << 20)
    assert result.bound_time_us <= result.time_us * (1 + 1e-9)  # never faster than the cut bound


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TARGET_CLUSTERS))
def test_default_baselines_verify_on_target_clusters(name):
    topology = load_cluster(**TARGET_CLUSTERS[name])
    for collective in COLLECTIVES:
        for algorithm in all_baselines(topology, collective, size_bytes=64 << 20):
            assert_valid_algorithm(algorithm)
            assert simulate(algorithm, topology, 64 << 20).fraction_of_bound > 0.2


def test_trees_baseline_on_a_small_mixed_cluster_with_a_nic_down():
    topology = load_cluster("dgx-a100:1,ndv2:1", nics_down=["0:nic0"])
    algorithm = build_baseline("trees", topology, "allreduce")
    assert_valid_algorithm(algorithm)
    assert simulate(algorithm, topology, 16 << 20).fraction_of_bound > 0.5


def test_ring_built_for_the_nic_down_cluster_beats_the_healthy_ring_on_it():
    degraded = load_cluster(**A100_NIC_DOWN)
    built_here = build_baseline("ring", degraded, "allgather")
    healthy = build_baseline("ring", load_topology("dgx-a100", nodes=4), "allgather")
    assert built_here.num_channels == 7 and healthy.num_channels == 8
    size = 256 << 20
    here, there = simulate(built_here, degraded, size), simulate(healthy, degraded, size)
    # the healthy rings push two channels through n1.nic2 each way; seven rails keep one per NIC
    assert there.time_us > 1.5 * here.time_us
    assert here.fraction_of_bound > 0.7


@pytest.mark.parametrize(("kind", "collective"), [("ring", "allgather"), ("tree", "allreduce")])
def test_nic_down_baselines_export_to_msccl_and_read_back_verified(kind, collective):
    from taccl_py.msccl import generate_msccl_xml, parse_msccl_xml

    topology = load_cluster(**A100_NIC_DOWN)
    algorithm = build_baseline(kind, topology, collective, channels=2)
    text = generate_msccl_xml(algorithm)
    imported = parse_msccl_xml(text)
    assert_valid_algorithm(imported)
    assert imported.num_ranks == 32 and generate_msccl_xml(imported) == text
    # the simulator times the imported algorithm as it timed the built one
    assert simulate(imported, topology, 16 << 20).time_us == pytest.approx(
        simulate(algorithm, topology, 16 << 20).time_us
    )
