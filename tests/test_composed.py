"""Composed routes past ``MAX_ROUTED_CHUNKS``: one machine's design replicated, no whole-graph routing.

The cap is lowered so that two and four machines exercise what 256 and 512 GPUs take.
"""

from __future__ import annotations

import pytest

from taccl_py.ir.collectives import Collective
from taccl_py.placement.groups import group_topology
from taccl_py.synth import synthesize
from taccl_py.synth.candidates import candidate_chunkings
from taccl_py.topology import load_topology

from helpers import assert_valid_algorithm

MB = 1_000_000


@pytest.fixture
def small_cap(monkeypatch):
    """Set the routed-chunk cap to 8, so any machine set of more than 8 GPUs is composed."""
    monkeypatch.setattr("taccl_py.synth.compose.MAX_ROUTED_CHUNKS", 8)
    monkeypatch.setattr("taccl_py.synth.candidates.MAX_ROUTED_CHUNKS", 8)

    def no_whole_graph(*_args, **_kwargs):
        raise AssertionError("routed on the whole graph past the cap")

    monkeypatch.setattr("taccl_py.synth.compose.pack_trees", no_whole_graph)
    monkeypatch.setattr("taccl_py.synth.compose.route_candidates", no_whole_graph)


def test_past_the_cap_every_candidate_is_composed_from_one_machines_design(small_cap):
    topology = load_topology("dgx-h100", nodes=2)
    result = synthesize(topology, "allgather", size_bytes=64 * MB)
    assert result.candidates and all(name.startswith("c1p") for name in result.candidates)
    assert all(name.endswith(":hierarchical") for name in result.candidates), result.candidates
    assert_valid_algorithm(result.algorithm)
    choice = result.choices[0]
    assert choice.synthesized is not None and 0.5 < choice.synthesized.fraction_of_bound <= 1.0


def test_past_the_cap_one_gpu_per_machine_writes_the_best_baseline(small_cap):
    machines = load_topology("dgx-h100", nodes=16)
    rail = group_topology(machines, [8 * node for node in range(16)], name="rail0")  # 16 machines, one GPU each
    result = synthesize(rail, "allgather", size_bytes=MB)
    assert result.candidates == ()
    choice = result.choices[0]
    assert choice.baseline_chosen and result.algorithm is choice.chosen


def test_composed_candidates_are_capped_by_their_sends(small_cap, monkeypatch):
    from taccl_py.bounds import lower_bounds
    from taccl_py.stages.logical import build_logical_graph
    from taccl_py.stages.sketch import auto_sketch

    monkeypatch.setattr("taccl_py.synth.candidates.MAX_COMPOSED_SENDS", 16**2 * 2)
    topology = load_topology("dgx-h100", nodes=2)
    graph = build_logical_graph(topology, auto_sketch(topology))
    (bound,) = lower_bounds(topology, "allgather", [1024 * MB])
    chunkings = candidate_chunkings(graph, Collective.ALLGATHER, bound)
    assert chunkings and {(c.chunkup, c.pieces) for c in chunkings} <= {(1, 1), (1, 2)}
    # An AllReduce walks two phases' sends, so it takes half as many pieces.
    (bound,) = lower_bounds(topology, "allreduce", [1024 * MB])
    chunkings = candidate_chunkings(graph, Collective.ALLREDUCE, bound)
    assert {(c.chunkup, c.pieces) for c in chunkings} == {(1, 1)}
    # Where the size's chunkings all pipeline (DGX-H100 x4 at 64 MB: bandwidth-bound, a chunk in
    # one slice) and the cap takes them all, one piece per chunk is still tried.
    monkeypatch.setattr("taccl_py.synth.candidates.MAX_COMPOSED_SENDS", 32**2 * 2)
    topology = load_topology("dgx-h100", nodes=4)
    graph = build_logical_graph(topology, auto_sketch(topology))
    (bound,) = lower_bounds(topology, "allreduce", [64 * MB])
    gathers = candidate_chunkings(graph, Collective.ALLGATHER, bound)
    assert gathers and all(c.pieces > 1 for c in gathers)
    chunkings = candidate_chunkings(graph, Collective.ALLREDUCE, bound)
    assert {(c.chunkup, c.pieces) for c in chunkings} == {(1, 1)}
