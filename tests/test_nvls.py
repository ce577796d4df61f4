"""Tests of NCCL's NVLS AllReduce baseline (NVLink SHARP) and the in-network reduction bound."""

from __future__ import annotations

import json

import pytest

from taccl_py.baselines.nvls import NVLS, NVLS_TREE, has_nvls, nvls_allreduce_times
from taccl_py.bounds import lower_bound
from taccl_py.bounds.reduction import in_network_reduction_bounds, reducing_switches
from taccl_py.errors import ArgumentError
from taccl_py.topology import builtin_topology_names, compose_nodes, load_topology
from taccl_py.topology.schema import SCHEMA_ID, parse_topology

M = 8 * 10**6  # bytes: 8 MB, so every term below is a round number of µs


def reducing_machine(gpus: int = 4) -> object:
    """Return ``gpus`` GPUs on an NVSwitch (α 0.5 µs, 100 GB/s per link) that reduces at 80 GB/s with α 2 µs.

    Each GPU has a NIC (10 GB/s and α 1 µs into the network) on a PCIe link (α 0.5 µs, 20 GB/s).
    """
    vertices = [{"name": f"gpu{i}", "kind": "gpu", "local_index": i} for i in range(gpus)]
    vertices += [
        {
            "name": f"nic{i}",
            "kind": "nic",
            "local_index": i,
            "net_kind": "ib",
            "net_bandwidth_GBps": 10,
            "net_alpha_us": 1,
        }
        for i in range(gpus)
    ]
    vertices.append({"name": "sw", "kind": "nvswitch", "reduce_bandwidth_GBps": 80, "reduce_alpha_us": 2})
    links = [
        {"src": f"gpu{i}", "dst": "sw", "kind": "nvswitch", "alpha_us": 0.5, "bandwidth_GBps": 100} for i in range(gpus)
    ]
    links += [
        {"src": f"gpu{i}", "dst": f"nic{i}", "kind": "pcie", "alpha_us": 0.5, "bandwidth_GBps": 20} for i in range(gpus)
    ]
    return parse_topology(json.dumps({"schema": SCHEMA_ID, "name": "reducer", "vertices": vertices, "links": links}))


def test_nvls_on_one_machine_moves_each_byte_about_once():
    (time,) = nvls_allreduce_times(reducing_machine(), [M])
    # Each GPU sends and receives M (1 + 1/4) = 10 MB at the switch's 80 GB/s: 125 µs, after the switch's 2 µs.
    assert (time.algorithm, time.alpha_us, time.switch_time_us, time.network_time_us) == (NVLS, 2.0, 125.0, 0.0)
    assert time.time_us == 127.0
    # Any AllReduce: a GPU's 8 MB leave over its 100 GB/s link after one route's α (0.5 + 0.5 µs).
    assert time.bound_time_us == pytest.approx(81.0)
    assert time.fraction_of_bound == pytest.approx(81.0 / 127.0)
    assert time.algbw_GBps == pytest.approx(M / 127.0 / 1e3)
    assert time.busbw_GBps == pytest.approx(time.algbw_GBps * 2 * 3 / 4)
    class_bound = lower_bound(reducing_machine(), "allreduce", M)  # 2 (3/4) 8 MB at 100 GB/s + 1 µs
    assert class_bound.time_us == pytest.approx(121.0) and time.bound_time_us < class_bound.time_us


@pytest.mark.parametrize(("nodes", "time_us"), [(2, 206.0), (4, 410.0)])
def test_nvls_tree_sends_each_gpus_slice_through_its_nic(nodes, time_us):
    topology = compose_nodes(reducing_machine(), nodes)
    (time,) = nvls_allreduce_times(topology, [M])
    # A GPU's route to its peer: PCIe 0.5 + NIC 1 + switch port 0 + PCIe 0.5 = 2 µs, at 10 GB/s.
    # Each tree level costs that α twice (up and down): levels = log2(machines), NCCL's log2i.
    levels = {2: 1, 4: 2}[nodes]
    assert time.algorithm == NVLS_TREE and time.alpha_us == 2.0 + 2 * levels * 2.0
    assert time.switch_time_us == 125.0
    # The slice of 2 MB at 10 GB/s, twice as much above two machines (a tree's inner machines).
    assert time.network_time_us == {2: 200.0, 4: 400.0}[nodes]
    assert time.time_us == pytest.approx(time.alpha_us + max(time.switch_time_us, time.network_time_us))
    assert time.time_us == time_us


def test_in_network_reduction_bound_takes_the_machines_nic_cut_across_machines():
    topology = compose_nodes(reducing_machine(), 2)
    (bound,) = in_network_reduction_bounds(topology, [M])
    # A machine's 8 MB leave over its four 10 GB/s NICs (200 µs) after a cross-machine route's α (2 µs).
    assert bound.time_us == pytest.approx(202.0) and bound.cut_only_time_us == pytest.approx(200.0)
    assert bound.cut_gpus == 4 and bound.description.startswith("in-network reduction bound: node 0")


def test_dgx_h100_has_nvls_and_reaches_nccls_published_bandwidth():
    assert [v.name for v in reducing_switches(load_topology("dgx-h100"))] == ["nvswitch"]
    for nodes in (1, 2, 4):
        assert has_nvls(load_topology("dgx-h100", nodes=nodes))
    (one,) = nvls_allreduce_times(load_topology("dgx-h100"), [8 * 2**30])
    assert one.algbw_GBps == pytest.approx(274.3, rel=2e-3)  # NVIDIA: ~480 GB/s busbw on 8 H100
    assert one.busbw_GBps == pytest.approx(480, rel=2e-3)
    ring_bound = lower_bound(load_topology("dgx-h100"), "allreduce", 8 * 2**30)
    assert one.time_us < ring_bound.time_us  # NVLS beats every point-to-point AllReduce there


@pytest.mark.parametrize("name", sorted(set(builtin_topology_names()) - {"dgx-h100", "dgx-b200", "gb200-nvl72"}))
def test_machines_without_a_reducing_switch_have_no_nvls(name):
    topology = load_topology(name)
    assert not has_nvls(topology) and reducing_switches(topology) == ()
    with pytest.raises(ArgumentError, match="no switch that reduces in the network; expected an NVLink SHARP"):
        nvls_allreduce_times(topology, [M])


def test_a_cluster_with_one_machine_lacking_it_has_no_nvls():
    from taccl_py.topology.cluster import load_cluster

    assert not has_nvls(load_cluster("dgx-h100:1,dgx-a100:1"))
    assert has_nvls(load_cluster("dgx-h100:2"))


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_nvls_is_never_faster_than_its_bound(nodes):
    sizes = [1_000, 10**6, 64 * 10**6, 10**9]
    for time in nvls_allreduce_times(load_topology("dgx-h100", nodes=nodes), sizes):
        assert time.time_us >= time.bound_time_us
