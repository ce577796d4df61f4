"""Tests of the shortcuts that keep ``taccl topo show`` fast: GPU classes, the integer max-flow, one route pass."""

from __future__ import annotations

from fractions import Fraction

import networkx as nx
import pytest

from taccl_py.baselines.nvls import nvls_allreduce_times
from taccl_py.bounds import alltoall as alltoall_bound
from taccl_py.bounds import binding_cut, lower_bounds_by_collective
from taccl_py.bounds import cut as bounds_cut
from taccl_py.bounds.cut import route_links
from taccl_py.bounds.reduction import in_network_reduction_bounds
from taccl_py.bounds.symmetry import gpu_classes, is_automorphism
from taccl_py.ir.collectives import Collective
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import load_cluster

SIZES = (1_000, 10**6, 64 * 10**6, 10**9)


def _per_gpu_classes(topology, graph, gpus):
    """Every GPU its own class: the per-GPU computation the shortcut replaces."""
    return {gpu: (gpu, {}) for gpu in gpus}


def _clusters():
    return {
        "dgx-a100x2-nic3-down": load_cluster(topology="dgx-a100", nodes=2, nics_down=["1:nic3"]),
        "mi300x": load_topology("mi300x"),
        "mi300x-x2-nic2-down": load_cluster(topology="mi300x", nodes=2, nics_down=["0:nic2"]),
        "dgx1": load_topology("dgx1"),
        "ndv2x2": load_topology("ndv2", nodes=2),
    }


CLUSTERS = _clusters()


@pytest.mark.parametrize("name", ["dgx-a100x2-nic3-down", "mi300x"])
def test_class_shortcut_gives_the_per_gpu_alltoall_bound(name, monkeypatch):
    topology = CLUSTERS[name]
    links = route_links(topology)
    shortcut_cut = alltoall_bound.alltoall_cut(topology, links)
    shortcut = lower_bounds_by_collective(topology, [Collective.ALLTOALL], SIZES)
    monkeypatch.setattr(alltoall_bound, "gpu_classes", _per_gpu_classes)
    assert alltoall_bound.alltoall_cut(topology, links) == shortcut_cut
    assert lower_bounds_by_collective(topology, [Collective.ALLTOALL], SIZES) == shortcut


@pytest.mark.parametrize("name", ["dgx-a100x2-nic3-down", "mi300x"])
@pytest.mark.parametrize("direction", ["leaving", "entering"])
def test_every_gpus_cut_is_its_class_representatives_by_networkx(name, direction):
    topology = CLUSTERS[name]
    forward = alltoall_bound._graph(route_links(topology))
    graph = forward if direction == "leaving" else forward.reverse(copy=True)
    names = [v.name for v in topology.gpus]
    classes = gpu_classes(topology, forward, names)
    for gpu in names:
        network = graph.copy()
        network.add_edge("source", gpu)  # no capacity: infinite to networkx
        network.add_edges_from((other, "sink") for other in names if other != gpu)
        value, (_, far) = nx.minimum_cut(network, "source", "sink")
        first = classes[gpu][0]
        assert alltoall_bound._min_cut(graph, [first], [n for n in names if n != first])[0] == Fraction(
            value, graph.graph["scale"]
        )
        mine, sink_side = alltoall_bound._max_flow(graph, [gpu], [n for n in names if n != gpu])
        assert (mine, sink_side) == (value, frozenset(far) - {"sink"})


def test_gpus_near_a_nic_that_is_down_form_their_own_class():
    topology = CLUSTERS["dgx-a100x2-nic3-down"]
    graph = alltoall_bound._graph(route_links(topology))
    classes = gpu_classes(topology, graph, [v.name for v in topology.gpus])
    firsts = {first for first, _ in classes.values()}
    # Each machine's GPUs are separate classes (machines stay put); on node 1 the GPUs beside the
    # PCIe switch of nic3 differ from the rest.
    assert {classes[v.name][0] for v in topology.gpus if v.node == 0} == {"n0.gpu0"}
    assert len({classes[v.name][0] for v in topology.gpus if v.node == 1}) > 1
    assert len(firsts) < topology.num_ranks
    for gpu, (first, mapping) in classes.items():
        assert mapping.get(first, first) == gpu
        assert is_automorphism(topology, graph, mapping)


def test_a_permutation_that_breaks_a_link_is_no_automorphism():
    topology = CLUSTERS["dgx-a100x2-nic3-down"]
    graph = alltoall_bound._graph(route_links(topology))
    # n1.gpu0 and n1.gpu6 hang off PCIe switches with and without a working NIC
    assert not is_automorphism(topology, graph, {"n1.gpu0": "n1.gpu6", "n1.gpu6": "n1.gpu0"})
    assert not is_automorphism(topology, graph, {"n0.gpu0": "n1.gpu0", "n1.gpu0": "n0.gpu0"})  # machines stay


@pytest.mark.parametrize("name", sorted(CLUSTERS))
@pytest.mark.parametrize("reverse", [False, True])
def test_class_shortcut_gives_the_per_gpu_binding_cut(name, reverse, monkeypatch):
    topology = CLUSTERS[name]
    shortcut = binding_cut(topology, reverse=reverse)
    monkeypatch.setattr(bounds_cut, "gpu_classes", _per_gpu_classes)
    assert binding_cut(topology, reverse=reverse) == shortcut


def test_topo_show_finds_the_routes_once(monkeypatch, capsys):
    import taccl_py.bounds as bounds_package
    import taccl_py.bounds.reduction as reduction
    import taccl_py.cli.topo as cli_topo
    from taccl_py.cli import main

    calls = []

    def counted(topology):
        calls.append(topology.name)
        return route_links(topology)

    for module in (bounds_package, reduction, cli_topo):
        monkeypatch.setattr(module, "route_links", counted)
    assert main(["topo", "show", "dgx-h100", "--nodes", "2"]) == 0
    assert "allreduce (in-network)" in capsys.readouterr().out
    assert len(calls) == 1


def test_precomputed_routes_and_bounds_give_what_is_computed_afresh():
    topology = load_topology("dgx-h100", nodes=2)
    links = route_links(topology)
    collectives = tuple(Collective)
    assert lower_bounds_by_collective(topology, collectives, SIZES, links=links) == lower_bounds_by_collective(
        topology, collectives, SIZES
    )
    in_network = in_network_reduction_bounds(topology, SIZES, links=links)
    assert in_network == in_network_reduction_bounds(topology, SIZES)
    assert nvls_allreduce_times(topology, SIZES, bounds=in_network) == nvls_allreduce_times(topology, SIZES)


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_class_shortcut_gives_the_per_gpu_latency_floor(name, monkeypatch):
    import taccl_py.bounds as bounds_package

    topology = CLUSTERS[name]
    links = route_links(topology)
    shortcut = bounds_package.route_latency_floor_us(topology, links)
    monkeypatch.setattr(bounds_package, "gpu_classes", _per_gpu_classes)
    assert bounds_package.route_latency_floor_us(topology, links) == shortcut


def test_latency_floor_classes_keep_every_alpha():
    # n1.nic3 down on dgx-a100 x2 leaves its PCIe switch's GPUs a longer way out of the machine
    topology = CLUSTERS["dgx-a100x2-nic3-down"]
    graph = nx.DiGraph()
    graph.add_weighted_edges_from(((k.src, k.dst, k.alpha_us) for k in route_links(topology)), weight="alpha_us")
    classes = gpu_classes(topology, graph, [v.name for v in topology.gpus])
    for gpu, (first, mapping) in classes.items():
        lengths = nx.single_source_dijkstra_path_length(graph, first, weight="alpha_us")
        mapped = {mapping.get(name, name): length for name, length in lengths.items()}
        assert mapped == nx.single_source_dijkstra_path_length(graph, gpu, weight="alpha_us")
