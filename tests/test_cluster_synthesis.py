"""Synthesis on clusters whose machines differ: symmetry that remains, relays per machine, designs per kind."""

from __future__ import annotations

import pytest
import torch
from test_executor import expected, make_inputs, run_threads

from taccl_py.bounds import lower_bounds
from taccl_py.errors import SketchError
from taccl_py.ir.collectives import Collective
from taccl_py.simulate import simulate
from taccl_py.solvers import SolverOptions
from taccl_py.stages.hierarchy import machine_classes
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.sketch import auto_sketch, check_sketch, generate_sketch, parse_sketch
from taccl_py.stages.sketch.auto import find_symmetry, relay_groups
from taccl_py.stages.tree_packing import pack_trees
from taccl_py.synth.compose import Chunking, synthesize_chunking
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import load_cluster
from taccl_py.topology.compose import machines_alike
from taccl_py.topology.model import LinkKind

from helpers import assert_valid_algorithm

SIZE = 16_000_000


@pytest.fixture(scope="module")
def two_nics_down():
    """dgx-a100 x2 with a different NIC down on each machine: no rail every machine has is spare."""
    topology = load_cluster(topology="dgx-a100", nodes=2, nics_down=["0:nic3", "1:nic5"])
    return topology, build_logical_graph(topology, auto_sketch(topology))


def test_a_mixed_cluster_keeps_the_rotations_every_machine_shares():
    alternating = load_cluster(cluster="dgx-a100:1,dgx-h100:1,dgx-a100:1,dgx-h100:1")
    assert find_symmetry(alternating) == ((1, 8), (16, 32)), "A,H,A,H: machines alike two apart"
    grouped = load_cluster(cluster="dgx-a100:2,dgx-h100:2")
    assert find_symmetry(grouped) == ((1, 8),), "A,A,H,H: no rotation of machines maps the cluster onto itself"
    assert machine_classes(build_logical_graph(grouped, auto_sketch(grouped))) == (0, 0, 2, 2)


def test_machines_that_share_nothing_keep_no_rotation(two_nics_down):
    topology, graph = two_nics_down
    assert find_symmetry(topology) == ()
    assert graph.rotations == () and len(graph.group) == 1


def test_identical_machines_built_as_a_cluster_synthesize_what_the_builtin_does():
    builtin = load_topology("ndv2", nodes=2)
    speed = builtin.vertex("n1.nic0").net_bandwidth_GBps
    cluster = load_cluster(topology="ndv2", nodes=2, nic_speeds=[f"1:nic0:{speed!r}"])
    assert cluster.name != builtin.name
    sketches = [auto_sketch(t) for t in (builtin, cluster)]
    assert sketches[0].symmetry == sketches[1].symmetry == ((8, 16),)
    assert sketches[0].internode_conn == sketches[1].internode_conn and sketches[1].node_relays == ()
    graphs = [build_logical_graph(t, s) for t, s in zip((builtin, cluster), sketches)]
    assert graphs[0].links == graphs[1].links
    chunking = Chunking(1, 1, SIZE)
    made = [synthesize_chunking(g, Collective.ALLGATHER, chunking, SolverOptions(), name="ag") for g in graphs]
    assert made[0].algorithm.ranks == made[1].algorithm.ranks


def test_a_gpu_whose_nic_is_down_relays_nothing_and_routes_skip_pcie_detours(two_nics_down):
    topology, graph = two_nics_down
    for node, dead_gpu, dead_nic in ((0, 3, "nic3"), (1, 5, "nic5")):
        groups = relay_groups(topology, node)
        assert len(groups) == 7 and all(group.nic != dead_nic for group in groups)
        assert all(dead_gpu not in group.gpus for group in groups)
        rank = node * 8 + dead_gpu
        assert not any(link.internode and rank in (link.src, link.dst) for link in graph.links)
    sketch = auto_sketch(topology)
    assert sketch.node_relays, "the machine pairs differ: their relays are listed per pair"
    crossing = [link for link in graph.links if link.internode]
    assert crossing
    for link in crossing:
        route = [topology.link(*resource) for resource in link.resources]
        kinds = [hop.kind for hop in route]
        # GPU -> its PCIe switch -> its NIC -> network -> NIC -> PCIe switch -> GPU: no host or second switch.
        assert kinds == [LinkKind.PCIE, LinkKind.PCIE, LinkKind.IB, LinkKind.IB, LinkKind.PCIE, LinkKind.PCIE], kinds
        assert not any("cpu" in end for resource in link.resources for end in resource)


def test_one_nic_down_uses_the_rails_every_machine_has_and_keeps_the_machine_rotation():
    topology = load_cluster(topology="dgx-a100", nodes=2, nics_down=["1:nic3"])
    sketch = auto_sketch(topology)
    assert sketch.internode_conn == tuple((k, k) for k in range(8) if k != 3)
    assert sketch.node_relays == ()
    assert (8, 16) in sketch.symmetry
    graph = build_logical_graph(topology, sketch)
    assert graph.rotations == sketch.symmetry
    # The graph keeps the rotation, so synthesis learns that the machines differ from the topology.
    assert not machines_alike(topology)


@pytest.mark.parametrize(
    ("options", "alike"),
    [
        ({"topology": "dgx-a100", "nodes": 2}, True),
        ({"cluster": "dgx-a100:2"}, True),
        ({"cluster": "dgx-a100:1,dgx-h100:1"}, False),
        ({"topology": "ndv2", "nodes": 2, "nic_speeds": ["1:nic0:4.76"]}, False),
    ],
)
def test_machines_alike_tells_copies_from_machines_that_differ(options, alike):
    assert machines_alike(load_cluster(**options)) is alike


def test_synthesis_on_machines_that_differ_is_verified_correct_and_within_the_bound(two_nics_down):
    topology, graph = two_nics_down
    candidate = synthesize_chunking(graph, Collective.ALLGATHER, Chunking(1, 2, SIZE), SolverOptions(), name="ag")
    algorithm = candidate.algorithm
    assert_valid_algorithm(algorithm)
    bound = lower_bounds(topology, "allgather", [SIZE])[0]
    result = simulate(algorithm, topology, SIZE, bound_time_us=bound.time_us)
    assert result.time_us >= bound.time_us * (1 - 1e-9)
    # A guard against gross regressions: one chunking, no symmetry, no baseline to fall back on (0.45 measured).
    assert result.fraction_of_bound > 0.35, result.fraction_of_bound
    numel = 3 * algorithm.chunks_per_loop
    inputs = make_inputs(algorithm, numel, torch.float32, seed=7)
    kept = [t.clone() for t in inputs]
    for got, want in zip(run_threads(algorithm, inputs, numel), expected(algorithm, kept, "sum")):
        assert torch.equal(got, want)


def test_tree_packing_sends_less_through_a_slower_nic():
    # Slow enough to bind (at 12.5 GB/s the NVSwitch ports are still the busiest resource), fast enough
    # that routes still take it (at 3 GB/s they detour over PCIe to the next NIC).
    topology = load_cluster(topology="dgx-a100", nodes=2, nic_speeds=["1:nic0:10"])
    graph = build_logical_graph(topology, auto_sketch(topology))
    packing = pack_trees(graph)
    resources: dict = {}
    for link in graph.links:
        for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
            resources.setdefault(res, (len(resources), bw))
    busy_us = torch.tensor(packing.weights, dtype=torch.float64) @ torch.from_numpy(packing.column_loads)

    def carried(res: tuple[str, str]) -> float:
        index, bw = resources[res]
        return float(busy_us[index]) * bw  # µs per byte times GB/s: bytes, up to a constant

    slow, fast = carried(("netswitch", "n1.nic0")), carried(("netswitch", "n1.nic1"))
    assert slow < 0.75 * fast, (slow, fast)
    routes = [link for link in graph.links if ("netswitch", "n1.nic0") in link.resources]
    assert routes and all(10.0 in link.resource_bandwidths_GBps for link in routes), "loads use each link's own speed"


def test_node_relays_round_trip_and_are_checked():
    topology = load_cluster(topology="dgx-a100", nodes=2, nics_down=["0:nic3", "1:nic5"])
    sketch = auto_sketch(topology)
    again = check_sketch(parse_sketch(generate_sketch(sketch), "again.json"), topology)
    assert again.node_relays == sketch.node_relays and again.internode_conn == sketch.internode_conn
    bad = parse_sketch('{"schema": "taccl-sketch/1", "node_relays": [{"from": 0, "to": 2, "conn": {"0": [0]}}]}')
    with pytest.raises(SketchError, match="node_relays"):
        check_sketch(bad, topology)
    with pytest.raises(SketchError, match="node_relays"):
        parse_sketch('{"schema": "taccl-sketch/1", "node_relays": [{"from": 0, "conn": {"0": [0]}}]}')
