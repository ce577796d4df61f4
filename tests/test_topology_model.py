"""Tests of taccl_py.topology.model over the built-in machines: views, validation, routes."""

from __future__ import annotations

import pytest

from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology import Link, LinkKind, Vertex, VertexKind, load_topology, make_topology, route


def kinds(r) -> list[str]:
    return [link.kind.value for link in r.links]


def test_views_of_a_builtin_machine():
    topology = load_topology("ndv2")
    assert [v.rank for v in topology.gpus] == list(range(8))
    assert topology.num_ranks == 8 and topology.gpus_per_node == 8 and topology.nodes == 1
    assert topology.gpu(5).name == "gpu5" and topology.node_of(5) == 0
    assert [nic.name for nic in topology.nics()] == ["nic0"]
    assert topology.link("gpu0", "gpu1").count == 2
    assert topology.link("gpu0", "gpu5") is None
    assert topology.graph.number_of_edges() == len(topology.links)
    with pytest.raises(ArgumentError, match=r"rank: rank 8 out of range; expected 0\.\.7"):
        topology.gpu(8)
    with pytest.raises(ArgumentError, match=r"vertex: no vertex 'gpu9'"):
        topology.vertex("gpu9")


def test_route_over_a_direct_nvlink():
    r = route(load_topology("ndv2"), 0, 1)
    assert kinds(r) == ["nvlink"]
    assert r.alpha_us == pytest.approx(0.3)
    assert r.bandwidth_GBps == pytest.approx(1e3 / 23)
    assert r.time_us(1_000_000) == pytest.approx(0.3 + 23)


def test_route_without_nvlink_goes_through_pcie_and_the_host_link():
    r = route(load_topology("ndv2"), 0, 5)
    assert kinds(r) == ["pcie", "host", "pcie"]
    assert [link.src for link in r.links] == ["gpu0", "cpu0", "cpu1"]
    assert r.bandwidth_GBps == pytest.approx(12.0)


def test_route_across_nodes_goes_through_both_nics_and_the_network_switch():
    topology = load_topology("ndv2", nodes=2)
    r = route(topology, 0, 8)
    vertices = [r.links[0].src] + [link.dst for link in r.links]
    assert vertices == ["n0.gpu0", "n0.cpu0", "n0.nic0", "netswitch", "n1.nic0", "n1.cpu0", "n1.gpu0"]
    assert "ib" in kinds(r)
    assert r.alpha_us == pytest.approx(2.6)  # TACCL's remote alpha, GPU to GPU
    assert r.bandwidth_GBps == pytest.approx(1e3 / 105)
    assert ("n0.nic0", "netswitch") in r.resources


def test_route_through_an_nvswitch_holds_two_links():
    r = route(load_topology("dgx2"), 3, 12)
    assert kinds(r) == ["nvswitch", "nvswitch"]
    assert [r.links[0].src, r.links[0].dst, r.links[1].dst] == ["gpu3", "nvswitch", "gpu12"]
    assert r.alpha_us == pytest.approx(0.3)
    assert r.bandwidth_GBps == pytest.approx(125.0)


@pytest.mark.parametrize(
    ("name", "alpha_us"),
    [
        ("ndv2", 2.6),
        ("dgx1", 2.6),
        ("dgx2", 2.6),
        ("ndv2-teccl", 1.3),
        ("dgx-a100", 2.7),
        ("dgx-h100", 2.7),
        ("pcie-8gpu", 2.7),
    ],
)
def test_cross_node_route_from_a_nic_local_gpu_costs_the_published_alpha(name, alpha_us):
    topology = load_topology(name, nodes=2)
    assert route(topology, 0, topology.gpus_per_node).alpha_us == pytest.approx(alpha_us)


def test_route_to_itself_is_refused():
    with pytest.raises(ArgumentError, match="route from rank 2 to itself"):
        route(load_topology("ndv2"), 2, 2)


def test_unreachable_gpu_is_a_topology_error():
    gpus = [Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i) for i in range(3)]
    links = [Link("gpu0", "gpu1", LinkKind.NVLINK, 0.3, 25.0), Link("gpu1", "gpu0", LinkKind.NVLINK, 0.3, 25.0)]
    topology = make_topology("island", gpus, links)
    with pytest.raises(TopologyError, match="no path from GPU rank 0 to rank 2"):
        route(topology, 0, 2)


def test_make_topology_rejects_a_repeated_rank():
    gpus = [
        Vertex("gpu0", VertexKind.GPU, local_index=0, rank=0),
        Vertex("gpu1", VertexKind.GPU, local_index=1, rank=0),
    ]
    with pytest.raises(TopologyError, match=r"GPU ranks \[0, 0\] are not 0\.\.1 each once"):
        make_topology("twice", gpus, [])
