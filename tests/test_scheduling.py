"""Contiguity and exact times: merges on slow links, replay, and agreement with the simulator."""

from __future__ import annotations

import pytest

from taccl_py.ir.collectives import Collective
from taccl_py.simulate import simulate
from taccl_py.solvers import SolverOptions
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.lower_schedule import lower_schedule
from taccl_py.stages.ordering import order_sends
from taccl_py.stages.routing import greedy_routing
from taccl_py.stages.scheduling import MAX_MILP_SENDS, replay_groups, schedule_sends
from taccl_py.stages.sketch.model import Sketch
from taccl_py.topology import load_topology

from helpers import assert_valid_algorithm

KB, MB = 1000, 1_000_000
OPTIONS = SolverOptions(time_limit_s=0.5)


def ordering_for(name: str, nodes: int, size: float, chunkup: int = 1, pieces: int = 1):
    topology = load_topology(name, nodes=nodes)
    graph = build_logical_graph(topology, Sketch())
    chunk = size / (graph.num_ranks * chunkup)
    routing = greedy_routing(graph, chunkup, chunk, chunk / pieces)
    return topology, order_sends(routing, pieces, chunk / pieces)


def test_singles_replay_the_ordering_exactly():
    _, ordering = ordering_for("ndv2", 2, 64 * MB, 1, 2)
    groups = tuple((i,) for i in range(len(ordering.sends)))
    start, end = replay_groups(ordering, groups)
    assert max(end) == pytest.approx(ordering.makespan_us)


def test_merges_on_slow_links_at_small_sizes():
    _, ordering = ordering_for("ndv2", 2, 16 * KB)
    assert len(ordering.sends) <= MAX_MILP_SENDS
    schedule = schedule_sends(ordering, OPTIONS)
    assert schedule.makespan_us <= ordering.makespan_us + 1e-9
    merged = [g for g in schedule.groups if len(g) > 1]
    assert merged, "several pieces cross the network together"
    graph = ordering.routing.graph
    for group in merged:
        assert len({ordering.sends[i].link for i in group}) == 1
        assert (
            graph.links[ordering.sends[group[0]].link].internode
            or graph.links[ordering.sends[group[0]].link].alpha_us > 0
        )


def test_groups_partition_the_sends():
    _, ordering = ordering_for("ndv2", 2, 1 * MB, 1, 2)
    schedule = schedule_sends(ordering, OPTIONS)
    members = sorted(i for group in schedule.groups for i in group)
    assert members == list(range(len(ordering.sends)))
    assert schedule.status in ("none", "milp", "greedy")


def test_cyclic_merges_are_refused():
    _, ordering = ordering_for("ndv2", 1, 1 * MB)
    sends = ordering.sends
    # merge a send with the send that forwards its own piece: the group would wait for itself
    child = next(i for i, s in enumerate(sends) if s.parent is not None)
    groups = tuple((i,) for i in range(len(sends)) if i not in (child, sends[child].parent)) + (
        (sends[child].parent, child),
    )
    assert replay_groups(ordering, groups) is None


@pytest.mark.parametrize(
    "name, nodes, size, collective",
    [
        ("ndv2", 2, 4 * KB, Collective.ALLGATHER),
        ("ndv2", 2, 16 * MB, Collective.ALLGATHER),
        ("dgx2", 1, 1 * MB, Collective.REDUCESCATTER),
    ],
)
def test_schedule_matches_the_simulator(name, nodes, size, collective):
    topology = load_topology(name, nodes=nodes)
    graph = build_logical_graph(topology, Sketch())
    if collective is Collective.REDUCESCATTER:
        graph = graph.reverse()
    chunk = size / graph.num_ranks
    ordering = order_sends(greedy_routing(graph, 1, chunk, chunk), 1, chunk)
    schedule = schedule_sends(ordering, OPTIONS)
    algorithm = lower_schedule("t", collective, [schedule])
    assert_valid_algorithm(algorithm)
    assert simulate(algorithm, topology, int(size)).time_us == pytest.approx(schedule.makespan_us, rel=1e-6)
