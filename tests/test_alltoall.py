"""AlltoAll: its cut bound, the direct and hierarchical baselines, their MSCCL XML and the CLI."""

from __future__ import annotations

import pytest
import torch
from test_executor import expected, make_inputs, run_threads
from test_simulate import full_mesh

from taccl_py.baselines import BaselineKind, applicable_kinds, best_baselines, build_baseline
from taccl_py.baselines.alltoall import (
    alltoall_relays,
    direct_alltoall_algorithm,
    hierarchical_alltoall_algorithm,
    hierarchical_alltoall_pieces_by_size,
)
from taccl_py.bounds import lower_bound
from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.files import read_any_algorithm
from taccl_py.msccl import generate_msccl_xml, parse_msccl_xml
from taccl_py.simulate import simulate_sizes
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import load_cluster

from helpers import assert_valid_algorithm, builtin_machine_params

GB = 10**9
SIZES = (2**20, 16 * 2**20, 2**30)


def test_egress_cut_of_a_uniform_mesh():
    # each of 4 GPUs sends 3/4 of its buffer over 3 links of the mesh's bandwidth
    topology = full_mesh(4)
    bound = lower_bound(topology, "alltoall", GB)
    link = topology.links[0]
    assert bound.cut_gpus == 1 and bound.cut_capacity_GBps == pytest.approx(3 * link.bandwidth_GBps)
    assert bound.bandwidth_time_us == pytest.approx(GB * 3 / 4 / (3 * link.bandwidth_GBps * 1e3))
    assert "per-GPU" in bound.description


@pytest.mark.parametrize(
    ("name", "capacity_GBps"),
    [("ndv2", 9.524), ("dgx-a100", 192.0), ("dgx2", 76.19)],
)
def test_across_machines_one_machine_binds(name, capacity_GBps):
    # a machine's G GPUs send G (N - G) blocks of M / N bytes out over its NICs (or their PCIe links)
    topology = load_topology(name, nodes=2)
    bound = lower_bound(topology, "alltoall", GB)
    gpus, ranks = topology.gpus_per_node, topology.num_ranks
    assert bound.cut_gpus == gpus and bound.cut_capacity_GBps == pytest.approx(capacity_GBps, rel=1e-3)
    crossing_bytes = GB / ranks * gpus * (ranks - gpus)
    assert bound.bandwidth_time_us == pytest.approx(crossing_bytes / (bound.cut_capacity_GBps * 1e3))
    assert bound.description.startswith(("NIC cut: node 0", "node cut: node 0"))


def test_inside_a_machine_the_link_between_sockets_binds():
    # pcie-8gpu: 4 GPUs per PCIe switch; half the machine sends 4 x 4 blocks over one 24 GB/s PCIe link
    bound = lower_bound(load_topology("pcie-8gpu"), "alltoall", GB)
    assert bound.cut_gpus == 4 and bound.description.startswith("NUMA cut: gpu0, gpu1, gpu2, gpu3 (4 GPUs)")
    assert bound.bandwidth_time_us == pytest.approx(GB / 8 * 4 * 4 / (24.0 * 1e3))


def test_the_weakest_machine_binds_a_degraded_cluster():
    cluster = load_cluster(topology="dgx-a100", nodes=4, nics_down=["2:nic3"])
    bound = lower_bound(cluster, "alltoall", GB)
    assert bound.description == "node cut: node 2 (8 GPUs): 168 GB/s leaving over 7 pcie links"
    assert bound.cut_capacity_GBps == pytest.approx(7 * 24.0)


@pytest.mark.parametrize("name", builtin_machine_params())
def test_baselines_verify_and_never_beat_the_bound(name):
    topology = load_topology(name, nodes=2)
    algorithms = [direct_alltoall_algorithm(topology)] + [
        hierarchical_alltoall_algorithm(topology, pieces) for pieces in (1, topology.gpus_per_node)
    ]
    for algorithm in algorithms:
        assert_valid_algorithm(algorithm)
        for result in simulate_sizes(algorithm, topology, SIZES):
            assert result.time_us >= result.bound_time_us * (1 - 1e-9), (algorithm.name, result.size_bytes)


def test_on_a_mixed_cluster_with_a_nic_down():
    cluster = load_cluster("dgx-a100:1,dgx-h100:1", nics_down=["1:nic0"])
    for algorithm in (direct_alltoall_algorithm(cluster), hierarchical_alltoall_algorithm(cluster, 4)):
        assert_valid_algorithm(algorithm)
        for result in simulate_sizes(algorithm, cluster, SIZES):
            assert result.time_us >= result.bound_time_us * (1 - 1e-9)
    # nothing is relayed through the GPU whose NIC is down
    relays = alltoall_relays(cluster)
    assert all(cluster.gpu(8).rank not in pair for pair in relays.values())


def test_relays_sit_next_to_the_nics():
    a100 = alltoall_relays(load_topology("dgx-a100", nodes=2))
    # one NIC per GPU: block for (m, j) crosses rail j from GPU j to GPU j, nothing handed on
    assert a100[0, 11] == (3, 11) and a100[1, 2] == (10, 2)
    ndv2 = alltoall_relays(load_topology("ndv2", nodes=2))
    # one NIC near GPUs 0-3: those four share the relaying on both sides
    assert {pair for pair in ndv2.values()} == {(a, b) for a, b in zip(range(4), range(8, 12))} | {
        (a, b) for a, b in zip(range(8, 12), range(4))
    }
    assert ndv2[0, 12] == (0, 8)


def test_hierarchical_pieces_follow_the_size():
    topology = load_topology("dgx-a100", nodes=2)
    groups = hierarchical_alltoall_pieces_by_size(topology, [2**20, 2**16 * 2**8, 2**30])
    # MSCCL pipelines sends between machines (msccl-net), so a parcel's pieces cross the NIC without
    # paying α each, and gathering overlaps the crossing at every size: the most pieces win
    assert groups == {8: [2**20, 2**24, 2**30]}
    serialized = [
        simulate_sizes(hierarchical_alltoall_algorithm(topology, p), topology, [2**20], model="msccl") for p in (1, 8)
    ]
    # with every send serialized the pieces' α make one piece faster at 1 MiB
    assert serialized[0][0].time_us < serialized[1][0].time_us
    large = hierarchical_alltoall_algorithm(topology, 1)
    assert simulate_sizes(large, topology, [2**30])[0].fraction_of_bound > 0.99
    # over whole chunks (our executor) the 8-piece pipeline is the one that reaches the bound
    assert (
        simulate_sizes(hierarchical_alltoall_algorithm(topology, 8), topology, [2**30], model="chunks")[
            0
        ].fraction_of_bound
        > 0.99
    )


def test_hierarchical_computes_the_alltoall():
    algorithm = hierarchical_alltoall_algorithm(load_topology("ndv2", nodes=2), 2)
    numel = 6
    inputs = make_inputs(algorithm, numel, torch.float32, seed=16)
    outputs = run_threads(algorithm, inputs, numel)
    for got, want in zip(outputs, expected(algorithm, inputs, "sum")):
        assert torch.equal(got, want)


def test_hierarchical_round_trips_through_msccl_xml():
    topology = load_topology("dgx2", nodes=2)
    algorithm = hierarchical_alltoall_algorithm(topology, 4)
    back = parse_msccl_xml(generate_msccl_xml(algorithm), "hierarchical.xml")
    assert_valid_algorithm(back)
    assert back.collective.value == "alltoall" and back.chunks_per_loop == algorithm.chunks_per_loop
    # several dependencies of one step become nops in XML: the steps change, the schedule does not
    before, after = (simulate_sizes(a, topology, SIZES) for a in (algorithm, back))
    assert [r.time_us for r in after] == pytest.approx([r.time_us for r in before])


def test_kinds_and_best_baselines():
    one, two = load_topology("ndv2"), load_topology("ndv2", nodes=2)
    assert applicable_kinds(one, "alltoall") == (BaselineKind.DIRECT,)
    assert applicable_kinds(two, "alltoall") == (BaselineKind.DIRECT, BaselineKind.HIERARCHICAL)
    found = best_baselines(two, "alltoall", SIZES)
    assert [algorithm.name for algorithm, _ in found] == ["direct-1p"] * 3  # the fluid model shares NICs freely
    assert all(result.fraction_of_bound > 0.99 for _, result in found)


@pytest.mark.parametrize(
    ("kind", "nodes", "options", "message"),
    [
        ("ring", 2, {}, "no ring baseline for alltoall; expected direct or hierarchical for alltoall"),
        ("direct", 2, {"chunks": 2}, "direct alltoall with chunks or channels"),
        ("hierarchical", 1, {}, "1 machine; expected 2 or more machines"),
        ("hierarchical", 2, {"chunks": 9}, "9 pieces; expected 1..8 messages per parcel"),
    ],
)
def test_bad_requests(kind, nodes, options, message):
    with pytest.raises(ArgumentError, match=message):
        build_baseline(kind, load_topology("ndv2", nodes=nodes), "alltoall", **options)


def test_cli_writes_verifies_and_simulates_alltoall(tmp_path, capsys):
    path = tmp_path / "a2a.xml"
    assert main(["baseline", "hierarchical", "-t", "dgx-a100", "--nodes", "2", "-c", "alltoall", "-o", str(path)]) == 0
    assert read_any_algorithm(path).collective.value == "alltoall"
    assert main(["verify", str(path)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(path), "-t", "dgx-a100", "--nodes", "2", "--sizes", "1MB"]) == 0
    assert "direct-1p" in capsys.readouterr().out  # the best baseline is named beside it
    bad = tmp_path / "bad.xml"
    assert main(["baseline", "direct", "-t", "ndv2", "-c", "alltoall", "--chunks", "2", "-o", str(bad)]) == 2
    assert "direct alltoall with chunks or channels" in capsys.readouterr().err
    assert not bad.exists()
