"""A phase keeps the fastest routing the MSCCL runtimes can load, not merely the fastest routing."""

from __future__ import annotations

import pytest

from taccl_py.ir.collectives import Collective
from taccl_py.solvers import SolverOptions
from taccl_py.stages.logical import build_logical_graph, phase_graphs
from taccl_py.stages.lower_schedule import busiest_threadblocks, lower_schedule
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth import compose
from taccl_py.synth.compose import Chunking
from taccl_py.topology import load_topology

OPTIONS = SolverOptions()
CHUNKING = Chunking(1, 2, 4_000_000)


def _allgather_phase():
    """Return the AllGather phase ``_schedule_phase`` picks on NDv2 (the schedule alone)."""
    topology = load_topology("ndv2")
    schedule, _ = compose._schedule_phase(build_logical_graph(topology, auto_sketch(topology)), CHUNKING, OPTIONS)
    return schedule


def test_a_phase_fits_until_a_threadblock_has_more_steps_than_msccl_allows(monkeypatch):
    schedule = _allgather_phase()
    assert compose._phase_fits_msccl(schedule)
    monkeypatch.setattr("taccl_py.msccl.limits.MAX_STEPS_PER_THREADBLOCK", 1)
    assert not compose._phase_fits_msccl(schedule)


def test_the_fastest_routing_that_does_not_fit_gives_way_to_the_next(monkeypatch):
    fastest = _allgather_phase()
    fits = compose._phase_fits_msccl
    refused = fastest.routing.trees
    monkeypatch.setattr(compose, "_phase_fits_msccl", lambda s: s.routing.trees != refused and fits(s))
    second = _allgather_phase()
    assert second.routing.trees != fastest.routing.trees
    assert fits(second)
    assert second.makespan_us >= fastest.makespan_us


def test_when_no_routing_fits_the_fastest_is_kept(monkeypatch):
    fastest = _allgather_phase()
    monkeypatch.setattr(compose, "_phase_fits_msccl", lambda schedule: False)
    kept = _allgather_phase()
    assert kept.routing.trees == fastest.routing.trees
    assert kept.makespan_us == fastest.makespan_us


def _busiest_threadblocks(schedule) -> int:
    """Return the most threadblocks a GPU gets when ``schedule`` is lowered alone, as the phase check lowers it."""
    collective = Collective.REDUCESCATTER if schedule.routing.graph.reversed else Collective.ALLGATHER
    algorithm = lower_schedule("phase", collective, [schedule])
    return max(len(program.threadblocks) for program in algorithm.ranks)


@pytest.mark.parametrize(
    "machine, nodes, collective, chunking",
    [
        pytest.param("ndv2", 1, "allgather", Chunking(2, 8, 4_000_000), id="ndv2-spilled"),  # 40 transfers on a link
        pytest.param("dgx-h100", 2, "allgather", CHUNKING, id="dgx-h100x2"),
        pytest.param("dgx-a100", 2, "reducescatter", CHUNKING, id="dgx-a100x2-reversed"),
    ],
)
def test_threadblocks_are_counted_as_the_lowering_makes_them(machine, nodes, collective, chunking):
    topology = load_topology(machine, nodes=nodes)
    graph = build_logical_graph(topology, auto_sketch(topology))
    graph = phase_graphs(graph, Collective(collective))[0]
    schedule, _ = compose._schedule_phase(graph, chunking, OPTIONS)
    assert busiest_threadblocks(schedule) == _busiest_threadblocks(schedule) > 2


def test_a_phase_over_the_threadblock_limit_is_refused_before_it_is_lowered(monkeypatch):
    schedule = _allgather_phase()
    monkeypatch.setattr("taccl_py.msccl.limits.MAX_THREADBLOCKS_PER_GPU", busiest_threadblocks(schedule) - 1)

    def no_lowering(*args, **kwargs):
        raise AssertionError("lowered a phase its threadblock count had already ruled out")

    monkeypatch.setattr(compose, "lower_schedule", no_lowering)
    assert not compose._phase_fits_msccl(schedule)
