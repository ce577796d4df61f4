"""Tests of the cut lower bounds and the latency floor."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.topology import (
    Link,
    LinkKind,
    Vertex,
    VertexKind,
    bounds,
    load_topology,
    lower_bound,
    make_topology,
    route,
)
from taccl_py.topology.bounds import _route_links, binding_cut, latency_floor_us, lower_bounds

GB = 10**9
REL = 1e-6


def star(n: int, bandwidth_GBps: float, alpha_us: float = 0.5) -> object:
    """Return n GPUs each linked both ways to one switch at the same rate: the homogeneous case."""
    vertices = [Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i) for i in range(n)] + [
        Vertex("sw", VertexKind.NVSWITCH)
    ]
    links = []
    for i in range(n):
        links += [
            Link(f"gpu{i}", "sw", LinkKind.NVSWITCH, alpha_us, bandwidth_GBps),
            Link("sw", f"gpu{i}", LinkKind.NVSWITCH, alpha_us, bandwidth_GBps),
        ]
    return make_topology(f"star{n}", vertices, links)


def test_two_ndv2_allgather_is_bound_by_the_nic():
    topology = load_topology("ndv2", nodes=2)
    bound = lower_bound(topology, Collective.ALLGATHER, GB)
    assert bound.time_us == pytest.approx(GB / 16 * 8 / (1e3 / 105 * 1e3), rel=REL)
    assert bound.time_us == pytest.approx(52_500, rel=REL)
    assert bound.cut_gpus == 8
    assert bound.cut_capacity_GBps == pytest.approx(1e3 / 105, rel=REL)
    cut_gpus = {v.rank for v in topology.gpus if v.name in bound.cut}
    assert cut_gpus in ({*range(8)}, {*range(8, 16)})
    assert bound.description.startswith("NIC cut: node ")
    assert bound.latency_floor_us < bound.bandwidth_time_us == bound.time_us


def test_one_dgx2_allgather_is_bound_by_one_gpus_ingress():
    bound = lower_bound(load_topology("dgx2"), "allgather", GB)
    assert bound.time_us == pytest.approx(15 / 16 * GB / (125 * 1e3), rel=REL)
    assert bound.time_us == pytest.approx(7_500, rel=REL)
    assert bound.cut_gpus == 15 and bound.cut_capacity_GBps == pytest.approx(125.0)
    assert bound.description.startswith("per-GPU ingress cut: every GPU but gpu")


@pytest.mark.parametrize("n", [2, 3, 8])
def test_homogeneous_topology_gives_the_textbook_bound(n):
    topology = star(n, 20.0)
    size = 64 * 10**6
    textbook = (n - 1) / n * size / (20.0 * 1e3)
    for collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        assert lower_bound(topology, collective, size).bandwidth_time_us == pytest.approx(textbook, rel=REL)
    assert lower_bound(topology, Collective.ALLREDUCE, size).bandwidth_time_us == pytest.approx(2 * textbook, rel=REL)


@pytest.mark.parametrize(("name", "nodes"), [("ndv2", 1), ("ndv2", 2), ("dgx2", 2), ("dgx-a100", 2), ("pcie-8gpu", 2)])
def test_allreduce_is_reducescatter_plus_allgather(name, nodes):
    topology = load_topology(name, nodes=nodes)
    rs, ag, ar = (
        lower_bound(topology, c, GB) for c in (Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.ALLREDUCE)
    )
    assert ar.bandwidth_time_us == pytest.approx(rs.bandwidth_time_us + ag.bandwidth_time_us, rel=REL)
    assert ar.time_us == pytest.approx(rs.time_us + ag.time_us, rel=REL)
    assert ar.cut == ag.cut


def test_time_is_the_larger_of_the_cut_bound_and_the_latency_floor():
    topology = load_topology("ndv2", nodes=2)
    tiny, big = lower_bounds(topology, Collective.ALLGATHER, [16, GB])
    assert tiny.time_us == tiny.latency_floor_us > tiny.bandwidth_time_us
    assert big.time_us == big.bandwidth_time_us
    assert tiny.latency_floor_us == pytest.approx(3.2)  # a GPU on NUMA 1 crosses the host link on both sides


@pytest.mark.parametrize(("name", "floor_us"), [("dgx2", 0.3), ("ndv2", 0.6), ("pcie-8gpu", 2.5)])
def test_latency_floor(name, floor_us):
    assert latency_floor_us(load_topology(name)) == pytest.approx(floor_us)


def brute_force_ratio(topology, reverse: bool) -> float:
    """Return max over vertex sets S missing a GPU of |GPUs in S| / capacity crossing S."""
    names = [v.name for v in topology.vertices]
    gpus = {v.name for v in topology.gpus}
    best = 0.0
    for size in range(1, len(names)):
        for chosen in itertools.combinations(names, size):
            inside = set(chosen)
            count = len(inside & gpus)
            if not count or gpus <= inside:
                continue
            crossing = sum(
                link.bandwidth_GBps
                for link in topology.links
                if ((link.dst if reverse else link.src) in inside)
                and ((link.src if reverse else link.dst) not in inside)
            )
            best = max(best, count / crossing)
    return best


def random_topology(seed: int):
    """Return 5 GPUs hanging off 1 or 2 of 3 randomly joined switches, random one-way rates."""
    rng = random.Random(seed)
    gpus = [Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i) for i in range(5)]
    switches = [Vertex(f"sw{k}", VertexKind.PCIE_SWITCH) for k in range(3)]
    links = [
        Link(a.name, b.name, LinkKind.PCIE, 0.5, rng.uniform(1, 30))
        for a, b in itertools.permutations(switches, 2)
        if rng.random() < 0.7
    ]
    for gpu in gpus:
        for switch in rng.sample(switches, rng.choice([1, 2])):
            links += [
                Link(gpu.name, switch.name, LinkKind.PCIE, 0.5, rng.uniform(1, 30)),
                Link(switch.name, gpu.name, LinkKind.PCIE, 0.5, rng.uniform(1, 30)),
            ]
    return make_topology(f"random{seed}", gpus + switches, links)


# Connected draws; in seeds 3, 23, 25, 46 and 48 no candidate set (one GPU, all but one GPU)
# is optimal in one direction, so the max-flow rounds must find the binding set.
@pytest.mark.parametrize("seed", [0, 1, 3, 6, 23, 25, 46, 48])
@pytest.mark.parametrize("reverse", [False, True])
def test_max_flow_finds_the_brute_force_optimum(seed, reverse):
    topology = random_topology(seed)
    cut = binding_cut(topology, reverse=reverse)
    routed = make_topology("routed", topology.vertices, _route_links(topology))
    assert cut.cut_gpus / cut.capacity_GBps == pytest.approx(brute_force_ratio(routed, reverse), rel=1e-9)


@pytest.mark.parametrize(("name", "nodes"), [("ndv2", 2), ("dgx-a100", 2), ("dgx2", 1), ("pcie-8gpu", 3)])
def test_bound_counts_exactly_the_links_routes_hold(name, nodes):
    topology = load_topology(name, nodes=nodes)
    used = {
        key
        for a in range(topology.num_ranks)
        for b in range(topology.num_ranks)
        if a != b
        for key in route(topology, a, b).resources
    }
    assert {link.key for link in _route_links(topology)} == used


def test_every_nic_carries_traffic_on_dgx_a100():
    used = {link.key for link in _route_links(load_topology("dgx-a100", nodes=2))}
    assert all((f"n0.nic{i}", "netswitch") in used for i in range(8))


def test_results_are_python_floats():
    bound = lower_bound(load_topology("dgx1", nodes=2), "reducescatter", 64 * 10**6)
    assert all(
        type(x) is float
        for x in (bound.time_us, bound.bandwidth_time_us, bound.latency_floor_us, bound.cut_capacity_GBps)
    )
    assert type(bound.cut_gpus) is int and isinstance(bound.cut, tuple)


def test_one_gpu_needs_no_time():
    gpu = Vertex("gpu0", VertexKind.GPU, local_index=0, rank=0)
    bound = lower_bound(make_topology("solo", [gpu], []), "allgather", GB)
    assert (bound.time_us, bound.cut_gpus, bound.cut) == (0.0, 0, ())


@pytest.mark.parametrize(
    ("collective", "size", "message"),
    [
        ("broadcast", GB, "collective: unknown collective 'broadcast'"),
        ("allgather", 0, "size_bytes: size 0; expected an integer number of bytes >= 1"),
    ],
)
def test_bad_arguments(collective, size, message):
    with pytest.raises(ArgumentError, match=message):
        lower_bound(load_topology("ndv2"), collective, size)


@pytest.mark.parametrize(("name", "nodes"), [("ndv2", 3), ("dgx-a100", 2), ("dgx1", 2)])
@pytest.mark.parametrize("reverse", [False, True])
def test_checking_one_machine_of_identical_machines_gives_the_same_cut(name, nodes, reverse, monkeypatch):
    topology = load_topology(name, nodes=nodes)
    assert len(bounds._sinks(topology, bounds._flow_graph(_route_links(topology), reverse))) == topology.gpus_per_node
    shortcut = binding_cut(topology, reverse=reverse)
    monkeypatch.setattr(bounds, "_sinks", lambda topology, graph: [v.name for v in topology.gpus])
    full = binding_cut(topology, reverse=reverse)
    assert shortcut.cut_gpus / shortcut.capacity_GBps == pytest.approx(full.cut_gpus / full.capacity_GBps, rel=1e-12)


def test_machines_that_differ_are_all_checked():
    pair = load_topology("ndv2", nodes=2)
    slower = [replace(link, bandwidth_GBps=1.0) if link.key == ("n1.gpu3", "n1.gpu7") else link for link in pair.links]
    uneven = make_topology("uneven", pair.vertices, slower, nodes=2)
    assert len(bounds._sinks(uneven, bounds._flow_graph(_route_links(uneven), False))) == 16


@pytest.mark.parametrize(
    ("spec", "nics_down", "sink_nodes"),
    [("dgx-a100:2,dgx-h100:2", (), (0, 2)), ("dgx-a100:4", ("2:nic3",), (0, 2)), ("dgx-a100:3", ("1:nic0",), (0, 1))],
)
@pytest.mark.parametrize("reverse", [False, True])
def test_one_machine_of_each_kind_is_checked_and_gives_the_same_cut(spec, nics_down, sink_nodes, reverse, monkeypatch):
    from taccl_py.topology.cluster import load_cluster

    topology = load_cluster(spec, nics_down=nics_down)
    sinks = bounds._sinks(topology, bounds._flow_graph(_route_links(topology), reverse))
    assert sinks == [v.name for v in topology.gpus if v.node in sink_nodes]
    shortcut = binding_cut(topology, reverse=reverse)
    monkeypatch.setattr(bounds, "_sinks", lambda topology, graph: [v.name for v in topology.gpus])
    assert binding_cut(topology, reverse=reverse) == shortcut


@pytest.mark.parametrize(("spec", "nics_down"), [("ndv2:2", ()), ("dgx-a100:2,dgx-h100:1", ("0:nic1",))])
def test_the_bounds_of_every_collective_at_once_are_each_collectives_bounds(spec, nics_down):
    from taccl_py.topology.bounds import lower_bounds_by_collective
    from taccl_py.topology.cluster import load_cluster

    topology, sizes = load_cluster(spec, nics_down=nics_down), (1, 10**6, GB)
    together = lower_bounds_by_collective(topology, tuple(Collective), sizes)
    assert together == {collective: lower_bounds(topology, collective, sizes) for collective in Collective}
    assert list(together) == list(Collective)
    with pytest.raises(ArgumentError, match="collective: unknown collective 'broadcast'"):
        lower_bounds_by_collective(topology, ("broadcast",), sizes)
