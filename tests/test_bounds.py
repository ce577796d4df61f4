"""Tests of the cut lower bounds and the latency floor."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from taccl_py.bounds import binding_cut, latency_floor_us, lower_bound, lower_bounds
from taccl_py.bounds import cut as bounds_cut
from taccl_py.bounds.cut import route_links
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.topology import (
    Link,
    LinkKind,
    Vertex,
    VertexKind,
    load_topology,
    make_topology,
    route,
)

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
    assert bound.bandwidth_time_us == pytest.approx(GB / 16 * 8 / (1e3 / 105 * 1e3), rel=REL)
    assert bound.cut_only_time_us == pytest.approx(52_500, rel=REL)  # the figure before issue 30
    assert bound.time_us == bound.bandwidth_time_us + bound.cut_alpha_us
    assert bound.cut_gpus == 8
    assert bound.cut_capacity_GBps == pytest.approx(1e3 / 105, rel=REL)
    cut_gpus = {v.rank for v in topology.gpus if v.name in bound.cut}
    assert cut_gpus in ({*range(8)}, {*range(8, 16)})
    assert bound.description.startswith("NIC cut: node ")
    assert bound.latency_floor_us < bound.bandwidth_time_us == bound.cut_only_time_us < bound.time_us


def test_one_dgx2_allgather_is_bound_by_one_gpus_ingress():
    bound = lower_bound(load_topology("dgx2"), "allgather", GB)
    assert bound.bandwidth_time_us == pytest.approx(15 / 16 * GB / (125 * 1e3), rel=REL)
    assert bound.cut_only_time_us == pytest.approx(7_500, rel=REL)
    assert bound.time_us == pytest.approx(7_500 + 0.3, rel=REL)  # one NVSwitch route's α
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
    assert ar.cut_only_time_us == pytest.approx(rs.cut_only_time_us + ag.cut_only_time_us, rel=REL)
    assert ar.cut_alpha_us == min(rs.cut_alpha_us, ag.cut_alpha_us) > 0  # one α: the phases may overlap
    assert ar.time_us == pytest.approx(ar.bandwidth_time_us + ar.cut_alpha_us, rel=REL)
    assert ar.cut == ag.cut
    assert ar.description.startswith("reducescatter + allgather class bound")


def test_time_is_the_larger_of_the_cut_bound_with_its_alpha_and_the_latency_floor():
    topology = load_topology("ndv2", nodes=2)
    tiny, big = lower_bounds(topology, Collective.ALLGATHER, [16, GB])
    assert tiny.time_us == tiny.latency_floor_us > tiny.bandwidth_time_us + tiny.cut_alpha_us
    assert tiny.cut_only_time_us == tiny.latency_floor_us
    assert big.time_us == big.bandwidth_time_us + big.cut_alpha_us
    assert big.cut_only_time_us == big.bandwidth_time_us
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
    routed = make_topology("routed", topology.vertices, route_links(topology))
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
    assert {link.key for link in route_links(topology)} == used


def test_every_nic_carries_traffic_on_dgx_a100():
    used = {link.key for link in route_links(load_topology("dgx-a100", nodes=2))}
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
    graph = bounds_cut._flow_graph(route_links(topology), reverse)
    assert len(bounds_cut._sinks(topology, graph)) == topology.gpus_per_node
    shortcut = binding_cut(topology, reverse=reverse)
    monkeypatch.setattr(bounds_cut, "_sinks", lambda topology, graph: [v.name for v in topology.gpus])
    full = binding_cut(topology, reverse=reverse)
    assert shortcut.cut_gpus / shortcut.capacity_GBps == pytest.approx(full.cut_gpus / full.capacity_GBps, rel=1e-12)


def test_machines_that_differ_are_all_checked():
    pair = load_topology("ndv2", nodes=2)
    slower = [replace(link, bandwidth_GBps=1.0) if link.key == ("n1.gpu3", "n1.gpu7") else link for link in pair.links]
    uneven = make_topology("uneven", pair.vertices, slower, nodes=2)
    assert len(bounds_cut._sinks(uneven, bounds_cut._flow_graph(route_links(uneven), False))) == 16


@pytest.mark.parametrize(
    ("spec", "nics_down", "sink_nodes"),
    [("dgx-a100:2,dgx-h100:2", (), (0, 2)), ("dgx-a100:4", ("2:nic3",), (0, 2)), ("dgx-a100:3", ("1:nic0",), (0, 1))],
)
@pytest.mark.parametrize("reverse", [False, True])
def test_one_machine_of_each_kind_is_checked_and_gives_the_same_cut(spec, nics_down, sink_nodes, reverse, monkeypatch):
    from taccl_py.topology.cluster import load_cluster

    topology = load_cluster(spec, nics_down=nics_down)
    sinks = bounds_cut._sinks(topology, bounds_cut._flow_graph(route_links(topology), reverse))
    assert sinks == [v.name for v in topology.gpus if v.node in sink_nodes]
    shortcut = binding_cut(topology, reverse=reverse)
    monkeypatch.setattr(bounds_cut, "_sinks", lambda topology, graph: [v.name for v in topology.gpus])
    assert binding_cut(topology, reverse=reverse) == shortcut


@pytest.mark.parametrize(("spec", "nics_down"), [("ndv2:2", ()), ("dgx-a100:2,dgx-h100:1", ("0:nic1",))])
def test_the_bounds_of_every_collective_at_once_are_each_collectives_bounds(spec, nics_down):
    from taccl_py.bounds import lower_bounds_by_collective
    from taccl_py.topology.cluster import load_cluster

    topology, sizes = load_cluster(spec, nics_down=nics_down), (1, 10**6, GB)
    together = lower_bounds_by_collective(topology, tuple(Collective), sizes)
    assert together == {collective: lower_bounds(topology, collective, sizes) for collective in Collective}
    assert list(together) == list(Collective)
    with pytest.raises(ArgumentError, match="collective: unknown collective 'broadcast'"):
        lower_bounds_by_collective(topology, ("broadcast",), sizes)


def two_pairs() -> object:
    """Return GPUs 0-1 and 2-3 paired by NVLink (α 0.2 µs, 100 GB/s), all four on a PCIe switch at 10 GB/s.

    The switch links of gpu1 and gpu2 are quicker (α 0.1 µs) than gpu0's and gpu3's (0.5 µs), so
    the cheapest route between the pairs (gpu1 -> gpu2, 0.2 µs) is cheaper than the latency floor
    (gpu0 -> gpu3 relayed through gpu1 and gpu2: 0.2 + 0.1 + 0.1 + 0.2 = 0.6 µs).
    """
    vertices = [Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i) for i in range(4)]
    vertices.append(Vertex("sw", VertexKind.PCIE_SWITCH))
    links = []
    for a, b in ((0, 1), (2, 3)):
        links += [
            Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, 0.2, 100.0),
            Link(f"gpu{b}", f"gpu{a}", LinkKind.NVLINK, 0.2, 100.0),
        ]
    for i, alpha_us in enumerate((0.5, 0.1, 0.1, 0.5)):
        links += [
            Link(f"gpu{i}", "sw", LinkKind.PCIE, alpha_us, 10.0),
            Link("sw", f"gpu{i}", LinkKind.PCIE, alpha_us, 10.0),
        ]
    return make_topology("two-pairs", vertices, links)


def test_the_alpha_term_is_the_cheapest_route_across_the_binding_cut():
    topology = two_pairs()
    ag, rs, ar = (lower_bound(topology, c, 4 * 10**6) for c in ("allgather", "reducescatter", "allreduce"))
    # AllGather: one pair's 2 GPUs send their 1 MB each over 20 GB/s of switch links: 100 µs.
    assert {v.rank for v in topology.gpus if v.name in ag.cut} in ({0, 1}, {2, 3})
    assert (ag.bandwidth_time_us, ag.cut_alpha_us, ag.latency_floor_us) == pytest.approx((100.0, 0.2, 0.6))
    assert (ag.time_us, ag.cut_only_time_us) == pytest.approx((100.2, 100.0))
    assert (rs.time_us, rs.cut_alpha_us, rs.cut_only_time_us) == pytest.approx((100.2, 0.2, 100.0))
    assert (ar.time_us, ar.cut_alpha_us, ar.cut_only_time_us) == pytest.approx((200.2, 0.2, 200.0))
    tiny = lower_bound(topology, "allgather", 4)  # the floor binds where the bytes are few
    assert tiny.time_us == pytest.approx(0.6) and tiny.cut_alpha_us == pytest.approx(0.2)


def test_the_old_cut_only_bound_is_kept_beside_the_new():
    for bound in lower_bounds(load_topology("ndv2", nodes=2), "allreduce", [16, 10**6, GB]):
        assert bound.cut_only_time_us == max(bound.bandwidth_time_us, bound.latency_floor_us)
        assert bound.time_us == max(bound.bandwidth_time_us + bound.cut_alpha_us, bound.latency_floor_us)
        assert bound.time_us >= bound.cut_only_time_us
    assert bound.cut_alpha_us > 0 and bound.time_us > bound.cut_only_time_us


def test_allreduce_bound_is_named_as_a_class_bound():
    from taccl_py.bounds import ALLREDUCE_BOUND_NOTE, bound_label

    assert bound_label(Collective.ALLREDUCE) == "RS+AG bound" and bound_label("allgather") == "bound"
    assert "ReduceScatter+AllGather class bound" in ALLREDUCE_BOUND_NOTE
    assert lower_bound(load_topology("dgx-h100"), "allreduce", GB).description.startswith(
        "reducescatter + allgather class bound"
    )


# Sizes across the latency and bandwidth regimes; machines of every kind of cut (NIC, per-GPU, host link).
VALIDITY_SIZES = (1_000, 64_000, 1_000_000, 16_000_000, 256_000_000)
VALIDITY_MACHINES = [("ndv2", 1), ("ndv2", 2), ("dgx-h100", 1), ("dgx-h100", 2), ("dgx2", 1), ("pcie-8gpu", 2)]
# --runslow only (7 s of the 13 on 2 cores): dgx-h100 x2's NIC cut and switch schedules are ndv2 x2's NIC
# cut and dgx-h100 x1's switch; dgx2's per-GPU cut is dgx-h100 x1's. The default run keeps the other four.
SLOW_VALIDITY_MACHINES = {("dgx-h100", 2), ("dgx2", 1)}


@pytest.mark.parametrize(
    ("name", "nodes"),
    [pytest.param(*m, marks=pytest.mark.slow) if m in SLOW_VALIDITY_MACHINES else m for m in VALIDITY_MACHINES],
    ids=[f"{n}x{k}" for n, k in VALIDITY_MACHINES],
)
def test_no_shipped_algorithm_or_baseline_beats_the_bound(name, nodes):
    from taccl_py.baselines import BaselineKind, applicable_kinds, build_baseline
    from taccl_py.bounds.reduction import in_network_reduction_bounds
    from taccl_py.ir.library import read_library, shipped_library_paths
    from taccl_py.simulate import simulate_sizes

    topology = load_topology(name, nodes=nodes)
    checked = 0
    for path in shipped_library_paths(name, nodes):
        library = read_library(path)
        collective = library.collective
        bounds = dict(zip(VALIDITY_SIZES, lower_bounds(topology, collective, VALIDITY_SIZES)))
        if collective is Collective.ALLREDUCE:  # holds for every AllReduce, in the network or not
            inr = dict(zip(VALIDITY_SIZES, in_network_reduction_bounds(topology, VALIDITY_SIZES)))
        runs = []
        for band in library.bands:
            if band.native:  # NCCL's own algorithm runs there: nothing of ours to check
                continue
            sizes = [
                s for s in VALIDITY_SIZES if band.min_bytes <= s and (band.max_bytes is None or s < band.max_bytes)
            ]
            runs.append((band.algorithm, sizes))
        for kind in (BaselineKind.RING, BaselineKind.TREE):
            if kind in applicable_kinds(topology, collective):
                runs.append((build_baseline(kind, topology, collective), list(VALIDITY_SIZES)))
        for algorithm, sizes in runs:
            for result in simulate_sizes(algorithm, topology, sizes) if sizes else ():
                bound = bounds[result.size_bytes]
                message = f"{algorithm.name} at {result.size_bytes} B: {result.time_us} < {bound.time_us} µs"
                # a switch schedule (NVLink SHARP) is held to the in-network bound only, as NCCL's NVLS is
                if not algorithm.reduces_in_switch:
                    assert result.time_us >= bound.time_us * (1 - 1e-12), message
                assert result.bound_time_us <= result.time_us * (1 + 1e-12), message
                if collective is Collective.ALLREDUCE:
                    assert result.time_us >= inr[result.size_bytes].time_us * (1 - 1e-12), message
                checked += 1
    assert checked >= 30  # native bands (NCCL faster there) hold nothing of ours to check
