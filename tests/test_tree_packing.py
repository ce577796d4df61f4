"""Spanning-tree packing: trees are arborescences, the LP meets the cut bound where the graph allows, and
integral packings, routings and the baseline follow from it deterministically."""

from __future__ import annotations

import pytest

from taccl_py.baselines import best_baselines, build_baseline
from taccl_py.baselines.packing import default_packing_chunkup, packing_graph
from taccl_py.bounds import lower_bound
from taccl_py.simulate import simulate
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.sketch import auto_sketch
from taccl_py.stages.tree_packing import integral_loads, pack_trees, packed_routing
from taccl_py.topology import load_topology

from helpers import assert_arborescence, assert_valid_algorithm

SIZE = 10**9


def _graph(name: str, nodes: int):
    topology = load_topology(name, nodes=nodes)
    return topology, build_logical_graph(topology, auto_sketch(topology))


@pytest.mark.parametrize(("name", "nodes"), [("dgx-a100", 2), ("dgx2", 1), ("ndv2", 2)])
def test_the_packing_meets_the_cut_bound_where_the_sketch_allows_it(name, nodes):
    topology, graph = _graph(name, nodes)
    packing = pack_trees(graph)
    bound = lower_bound(topology, "allgather", SIZE)
    per_rank_bytes = SIZE / topology.num_ranks
    assert packing.converged
    assert packing.load_us_per_byte * per_rank_bytes == pytest.approx(bound.bandwidth_time_us, rel=1e-6)
    assert packing.lower_bound_us_per_byte <= packing.load_us_per_byte * (1 + 1e-9)


def test_every_tree_is_a_spanning_arborescence_and_weights_sum_to_one():
    _, graph = _graph("ndv2", 1)  # four orbits, several trees each
    packing = pack_trees(graph)
    totals = [0.0] * len(packing.roots)
    for (i, tree), weight in zip(packing.columns, packing.weights):
        assert_arborescence(graph, packing.roots[i], tree)
        totals[i] += weight
    assert totals == pytest.approx([1.0] * len(packing.roots))
    assert sum(w > 0 for w in packing.weights) > len(packing.roots)  # a single tree per root would not do


def test_a_round_budget_stops_early_with_a_valid_bound():
    _, graph = _graph("ndv2", 1)
    full, cut = pack_trees(graph), pack_trees(graph, max_rounds=1)
    assert not cut.converged and cut.rounds == 1
    assert cut.load_us_per_byte >= full.load_us_per_byte * (1 - 1e-9)
    assert cut.lower_bound_us_per_byte <= full.load_us_per_byte * (1 + 1e-9)


@pytest.mark.parametrize("chunkup", [1, 2, 3, 6])
def test_integral_packings_hold_chunkup_trees_per_root_and_never_beat_the_lp(chunkup):
    _, graph = _graph("ndv2", 1)
    packing = pack_trees(graph)
    chosen, load, status = integral_loads(packing, chunkup)
    assert [len(trees) for trees in chosen] == [chunkup] * len(packing.roots)
    assert load >= packing.load_us_per_byte * (1 - 1e-9)
    assert status in ("optimal", "node limit", "rounded")


def test_more_trees_per_rank_come_closer_to_the_fractional_optimum():
    _, graph = _graph("ndv2", 1)
    packing = pack_trees(graph)
    one, eight = integral_loads(packing, 1)[1], integral_loads(packing, 8)[1]
    assert eight < one


def test_a_packed_routing_is_deterministic_and_roots_each_chunk_at_its_rank():
    _, graph = _graph("dgx2", 2)
    first = packed_routing(pack_trees(graph), 2, 1e6, 2.5e5)
    again = packed_routing(pack_trees(graph), 2, 1e6, 2.5e5)
    assert first.trees == again.trees and first.objective_us == again.objective_us
    assert len(first.trees) == graph.num_ranks * 2
    for chunk, tree in enumerate(first.trees):
        assert_arborescence(graph, first.root(chunk), tree)
    assert first.status.startswith("tree packing")


# AllReduce packs both phases (a reduce-scatter and an allgather packing): the default run checks it on
# two NDv2s (16 GPUs, 3 s on 2 cores); two DGX-2s (32 GPUs: 25 s for AllReduce, 6-13 s for each phase
# alone) run with --runslow.
@pytest.mark.parametrize(
    ("name", "collective"),
    [
        ("ndv2", "allreduce"),
        pytest.param("dgx2", "allgather", marks=pytest.mark.slow),
        pytest.param("dgx2", "reducescatter", marks=pytest.mark.slow),
        pytest.param("dgx2", "allreduce", marks=pytest.mark.slow),
    ],
)
def test_the_trees_baseline_verifies_and_beats_rings_at_large_sizes_on_two_machines(name, collective):
    topology = load_topology(name, nodes=2)
    trees = build_baseline("trees", topology, collective, size_bytes=SIZE)
    assert_valid_algorithm(trees)
    assert trees.meta("baseline") == "trees"
    ring = build_baseline("ring", topology, collective)
    assert simulate(trees, topology, SIZE).time_us < simulate(ring, topology, SIZE).time_us


def test_the_default_chunkup_is_the_fewest_trees_near_the_optimum():
    topology = load_topology("dgx-a100", nodes=2)
    assert default_packing_chunkup(pack_trees(packing_graph(topology))) == 1  # one tree per rank meets the bound


def test_best_baselines_consider_packed_trees():
    topology = load_topology("ndv2", nodes=2)  # 16 GPUs: as many trees as two DGX-2s' 32 in a quarter the time
    lines: list[str] = []
    best_baselines(topology, "allgather", (SIZE,), progress=lines.append)
    assert any(line.startswith("baseline trees-") for line in lines)
