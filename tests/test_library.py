"""Tests of the built-in machines, load_topology, compose_nodes and nic_affinity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from taccl_py.bounds import lower_bound
from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology import (
    LinkKind,
    VertexKind,
    builtin_topology_names,
    compose_nodes,
    import_topology,
    load_topology,
    make_topology,
)
from taccl_py.topology.builtins import nic_affinity

FIXTURES = Path(__file__).parent / "fixtures"
PAIR = FIXTURES / "cli_topo" / "pair.json"
SMI_V100 = FIXTURES / "topo" / "v100-sxm2-8gpu-dgx1-style.txt"
NDV2_DOUBLE = [(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)]
NDV2_SINGLE = [(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)]


def test_builtin_names():
    assert builtin_topology_names() == (
        "dgx-a100",
        "dgx-b200",
        "dgx-h100",
        "dgx1",
        "dgx2",
        "gb200-nvl72",
        "mi300x",
        "ndv2",
        "ndv2-teccl",
        "pcie-8gpu",
    )


@pytest.mark.parametrize(
    ("alias", "name"), [("NDv4", "dgx-a100"), ("NDV2", "ndv2"), ("dgx-2", "dgx2"), ("ndv5", "dgx-h100")]
)
def test_names_and_aliases_are_case_insensitive(alias, name):
    assert load_topology(alias).name == name


def test_unknown_name_lists_the_builtins():
    with pytest.raises(
        ArgumentError,
        match=r"^nosuch: no such built-in topology or file; "
        r"expected one of dgx-a100, dgx-b200, dgx-h100, dgx1, dgx2, gb200-nvl72, mi300x, ndv2, ",
    ):
        load_topology("nosuch")


def test_load_a_topology_file_and_an_imported_file():
    assert load_topology(str(PAIR)).name == "pair"
    imported = load_topology(SMI_V100)
    assert imported.num_ranks == 8
    assert imported.links == import_topology(SMI_V100).links


@pytest.mark.parametrize("nodes", [0, -1, True, 1025])
def test_bad_node_count(nodes):
    with pytest.raises(ArgumentError, match="nodes: .* nodes; expected an integer from 1 to 1024"):
        load_topology("ndv2", nodes=nodes)


@pytest.mark.parametrize(("pairs", "us_per_mb"), [(NDV2_DOUBLE, 23), (NDV2_SINGLE, 46)])
def test_ndv2_nvlinks_are_taccls_profile(pairs, us_per_mb):
    topology = load_topology("ndv2")
    nvlinks = {link.key for link in topology.links if link.kind is LinkKind.NVLINK}
    assert len(nvlinks) == 32
    for a, b in pairs:
        for src, dst in ((a, b), (b, a)):
            link = topology.link(f"gpu{src}", f"gpu{dst}")
            assert link.kind is LinkKind.NVLINK and link.alpha_us == 0.3
            assert link.time_us(1_000_000) == pytest.approx(0.3 + us_per_mb)


def test_machine_figures():
    ndv2, dgx2, a100, h100 = (load_topology(n) for n in ("ndv2", "dgx2", "dgx-a100", "dgx-h100"))
    (nic,) = ndv2.nics()
    assert (nic.numa, nic.net_alpha_us) == (0, 0.6) and nic.net_bandwidth_GBps == pytest.approx(1e3 / 105)
    assert [v.numa for v in ndv2.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(dgx2.nics()) == 8 and dgx2.link("gpu0", "nvswitch").bandwidth_GBps == 125.0
    assert len(a100.nics()) == 8 and a100.link("gpu0", "nvswitch").bandwidth_GBps == 240.0
    assert {nic.net_bandwidth_GBps for nic in a100.nics()} == {25.0}
    assert h100.link("gpu0", "nvswitch").bandwidth_GBps == pytest.approx(18 * 20.6)
    assert {nic.net_bandwidth_GBps for nic in h100.nics()} == {50.0}
    teccl = load_topology("ndv2-teccl")
    assert {link.bandwidth_GBps for link in teccl.links if link.kind is LinkKind.NVLINK} == {50.0, 25.0}


def test_mi300x_is_a_full_xgmi_mesh():
    mi300x = load_topology("mi300x")
    xgmi = [link for link in mi300x.links if link.kind is LinkKind.XGMI]
    assert len(xgmi) == 8 * 7  # every ordered GPU pair, one link each way
    assert {(link.bandwidth_GBps, link.alpha_us, link.count) for link in xgmi} == {(48.0, 0.8, 1)}
    assert {nic.net_bandwidth_GBps for nic in mi300x.nics()} == {50.0}
    assert nic_affinity(mi300x) == {f"nic{i}": (i,) for i in range(8)}
    # AllGather of 1 GB: 7/8 GB enters each GPU over its 7 links
    bound = lower_bound(mi300x, "allgather", 10**9)
    assert bound.bandwidth_time_us == pytest.approx(7 / 8 * 1e9 / (7 * 48.0 * 1e3))
    assert "7 xgmi links" in bound.description


def test_compose_numbers_ranks_node_major_and_prefixes_names():
    machine = load_topology("ndv2")
    pair = compose_nodes(machine, 3)
    assert pair.name == "ndv2x3" and pair.nodes == 3 and pair.num_ranks == 24
    assert [v.name for v in pair.gpus[7:10]] == ["n0.gpu7", "n1.gpu0", "n1.gpu1"]
    assert [pair.node_of(r) for r in (0, 7, 8, 23)] == [0, 0, 1, 2]
    assert pair.gpu(11).local_index == 3
    assert pair.vertex("netswitch").kind is VertexKind.NET_SWITCH
    assert len(pair.links) == 3 * len(machine.links) + 2 * 3
    up, down = pair.link("n2.nic0", "netswitch"), pair.link("netswitch", "n2.nic0")
    assert (up.kind, up.alpha_us) == (LinkKind.IB, 0.6) and up.bandwidth_GBps == pytest.approx(1e3 / 105)
    assert (down.alpha_us, down.bandwidth_GBps) == (0.0, up.bandwidth_GBps)
    assert pair.link("n1.gpu0", "n1.gpu1").count == 2
    assert compose_nodes(machine, 1) is machine


def test_compose_needs_nics_with_network_figures():
    machine = load_topology(str(PAIR))
    bare = make_topology(
        "bare",
        [v for v in machine.vertices if v.kind is VertexKind.GPU],
        [l for l in machine.links if l.kind is LinkKind.NVLINK],
    )
    with pytest.raises(TopologyError, match="^bare: vertices: no NIC to join machines through"):
        compose_nodes(bare, 2)
    vertices = [replace(v, net_alpha_us=None) if v.kind is VertexKind.NIC else v for v in machine.vertices]
    mute = make_topology("mute", vertices, machine.links)
    with pytest.raises(TopologyError, match=r"^mute: nic0\.net_alpha_us: NIC without its network figure"):
        compose_nodes(mute, 2)
    assert compose_nodes(bare, 1) is bare


def test_compose_refuses_a_composed_topology():
    with pytest.raises(ArgumentError, match="topology already spans 2 nodes"):
        compose_nodes(load_topology("ndv2", nodes=2), 2)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ndv2", {"nic0": (0, 1, 2, 3)}),
        ("dgx1", {"nic0": (0, 1), "nic1": (2, 3), "nic2": (4, 5), "nic3": (6, 7)}),
        ("dgx-a100", {f"nic{i}": (i,) for i in range(8)}),
        ("pcie-8gpu", {"nic0": (0, 1, 2, 3), "nic1": (4, 5, 6, 7)}),
    ],
)
def test_nic_affinity(name, expected):
    assert nic_affinity(load_topology(name)) == expected


def test_nic_affinity_of_composed_machines_uses_global_ranks():
    assert nic_affinity(load_topology("dgx2", nodes=2))["n1.nic7"] == (30, 31)
