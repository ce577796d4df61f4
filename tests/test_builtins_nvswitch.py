"""Tests of the NVLink5 built-in machines (DGX B200, GB200 NVL72) and the H200 / B200 / NVL72 names."""

from __future__ import annotations

import pytest

from taccl_py.baselines.nvls import has_nvls
from taccl_py.bounds.reduction import in_network_reduction_bounds, reducing_switches
from taccl_py.cli import main
from taccl_py.topology import builtin_topology_names, load_topology
from taccl_py.topology.builtins import builtin_topology_name, nic_affinity
from taccl_py.topology.model import LinkKind, VertexKind
from taccl_py.topology.model import route as route_of
from taccl_py.topology.rates import nccl_nvlink_bw_GBps

NVLINK5_LINKS = 18  # NVLinks per Blackwell GPU, one to each NVSwitch chip
NVLINK5_GBPS = 18 * 40.1  # NCCL SM100_NVLINK_BW 40.1 GB/s per link, per direction
NEW = {"dgx-b200": 8, "gb200-nvl72": 72}


@pytest.mark.parametrize(("name", "gpus"), sorted(NEW.items()))
def test_each_new_machine_is_a_builtin_and_loads(name, gpus):
    assert name in builtin_topology_names()
    topology = load_topology(name)
    assert topology.num_ranks == gpus and topology.nodes == 1
    assert len(topology.nics()) == gpus  # one 400 Gb/s NIC per GPU
    assert all(nic.net_bandwidth_GBps == 50.0 for nic in topology.nics())


def test_two_nvl72_racks_are_144_gpus_joined_by_the_network():
    topology = load_topology("gb200-nvl72", nodes=2)
    assert (topology.num_ranks, topology.nodes, topology.gpus_per_node) == (144, 2, 72)
    assert len([v for v in topology.vertices if v.kind is VertexKind.NET_SWITCH]) == 1
    # GPUs of different racks share no NVLink: their routes leave through a NIC
    route = route_of(topology, 0, 72)
    assert any(link.kind is LinkKind.IB for link in route.links)
    assert not any(link.kind is LinkKind.NVSWITCH for link in route.links[1:-1])


@pytest.mark.parametrize("name", sorted(NEW))
def test_every_gpu_has_18_nvlink5_to_the_switch_both_ways(name):
    topology = load_topology(name)
    assert NVLINK5_GBPS == pytest.approx(NVLINK5_LINKS * nccl_nvlink_bw_GBps(100))
    (switch,) = [v for v in topology.vertices if v.kind is VertexKind.NVSWITCH]
    for gpu in topology.gpus:
        for link in (topology.link(gpu.name, switch.name), topology.link(switch.name, gpu.name)):
            assert link.kind is LinkKind.NVSWITCH and link.count == NVLINK5_LINKS
            assert link.bandwidth_GBps == pytest.approx(NVLINK5_GBPS) and link.alpha_us == 0.3


@pytest.mark.parametrize(("name", "nodes"), [("dgx-b200", 1), ("dgx-b200", 2), ("gb200-nvl72", 1), ("gb200-nvl72", 2)])
def test_the_nvswitch_reduces_in_the_network(name, nodes):
    topology = load_topology(name, nodes=nodes)
    switches = reducing_switches(topology)
    assert len(switches) == nodes and all(s.kind is VertexKind.NVSWITCH for s in switches)
    assert has_nvls(topology)
    # the switch reduces no faster than the GPU's port into it
    assert all(0 < s.reduce_bandwidth_GBps < NVLINK5_GBPS for s in switches)


def test_the_reduction_rates_follow_the_cited_busbw():
    # DGX B200: 830 GB/s busbw on 8 GPUs (nccl#1807); algbw = busbw * N / (2 (N - 1)); per port algbw (1 + 1/N)
    b200 = 830 * 8 / (2 * 7) * (1 + 1 / 8)
    # NVL72: 429.37 GB/s algbw on 72 GPUs (coreweave/nccl-tests#43)
    nvl72 = 429.37 * (1 + 1 / 72)
    for name, expected in (("dgx-b200", b200), ("gb200-nvl72", nvl72)):
        (switch,) = reducing_switches(load_topology(name))
        assert switch.reduce_bandwidth_GBps == pytest.approx(expected, abs=0.05)
        assert switch.reduce_alpha_us == pytest.approx(23 / 3.4 * 0.6, abs=0.005)


def test_in_network_reduction_bound_of_an_nvl72_at_1_gib():
    size = 2**30
    (bound,) = in_network_reduction_bounds(load_topology("gb200-nvl72"), [size])
    per_gpu_us = size / (18 * 40.1 * 1e9) * 1e6  # one GPU's NVSwitch port, bytes over bytes/s
    assert bound.time_us == pytest.approx(0.3 + 0.3 + per_gpu_us, rel=1e-12)
    assert bound.cut_gpus == 1


def test_each_nvl72_nic_is_nearest_its_own_gpu():
    affinity = nic_affinity(load_topology("gb200-nvl72"))
    assert affinity == {f"nic{k}": (k,) for k in range(72)}


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("h200", "dgx-h100"),
        ("DGX-H200", "dgx-h100"),
        ("b200", "dgx-b200"),
        ("gb200", "gb200-nvl72"),
        ("NVL72", "gb200-nvl72"),
    ],
)
def test_aliases_resolve(alias, name):
    assert builtin_topology_name(alias) == name
    assert load_topology(alias).num_ranks == load_topology(name).num_ranks


def test_h200_is_the_dgx_h100_machine():
    h200, h100 = load_topology("h200"), load_topology("dgx-h100")
    assert (h200.name, h200.vertices, h200.links) == (h100.name, h100.vertices, h100.links)


def test_topo_list_shows_the_new_machines(capsys):
    assert main(["topo", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "b200" in rows["dgx-b200"] and "nvl72" in rows["gb200-nvl72"] and "h200" in rows["dgx-h100"]


@pytest.mark.parametrize(("argv", "gpus"), [(["dgx-b200"], 8), (["gb200-nvl72", "--nodes", "2"], 144)])
def test_topo_show_prints_the_bounds(capsys, argv, gpus):
    assert main(["topo", "show", *argv]) == 0
    out = capsys.readouterr().out
    assert "lower bounds" in out and "allreduce (in-network)" in out
    assert f"every GPU but {'n0.' if gpus > 8 else ''}gpu0 ({gpus - 1} GPUs)" in out
    assert "NCCL NVLS allreduce, modelled" in out
