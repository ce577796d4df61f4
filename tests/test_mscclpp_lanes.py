"""Fewer semaphores and fewer threadblocks for MSCCL++ plans: transitive reduction and merged lanes."""

from __future__ import annotations

from taccl_py.baselines import ring_algorithm
from taccl_py.ir.algorithm import Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.mscclpp.lower.lanes import lane_dependencies, merge_lanes, step_positions
from taccl_py.topology import load_topology


def _copy(offset: int, depends: tuple = ()) -> Step:
    return Step(OpType.COPY, Buffer.INPUT, offset, Buffer.OUTPUT, offset, depends=depends)


def _lanes(prog: RankProgram) -> list[tuple]:
    return [tuple((tb.id, i) for i in range(len(tb.steps))) for tb in prog.threadblocks]


def _chain_with_shortcut() -> RankProgram:
    """Threadblock 2 waits for 1, which waits for 0; 2 also names 0 (implied through 1)."""
    return RankProgram(
        0,
        (
            Threadblock(0, (_copy(0), _copy(1))),
            Threadblock(1, (_copy(2, ((0, 0),)),)),
            Threadblock(2, (_copy(3, ((0, 0), (1, 0))), _copy(4, ((0, 1),)))),
        ),
        input_chunks=5,
        output_chunks=5,
    )


def test_an_implied_dependency_gets_no_semaphore():
    prog = _chain_with_shortcut()
    kept = lane_dependencies(prog, _lanes(prog))
    assert kept == {(1, 0): [(0, 0)], (2, 0): [(1, 0)], (2, 1): [(0, 1)]}


def test_a_dependency_implied_through_program_order_is_dropped():
    prog = RankProgram(
        0,
        (
            Threadblock(0, (_copy(0), _copy(1))),
            Threadblock(1, (_copy(2, ((0, 1),)), _copy(3, ((0, 0),)))),
        ),
        input_chunks=4,
        output_chunks=4,
    )
    assert lane_dependencies(prog, _lanes(prog)) == {(1, 0): [(0, 1)]}


def test_dependencies_inside_a_merged_lane_need_no_semaphore():
    prog = _chain_with_shortcut()
    merged = [((0, 0), (1, 0), (0, 1)), ((2, 0), (2, 1))]
    assert lane_dependencies(prog, merged) == {(2, 0): [(1, 0)], (2, 1): [(0, 1)]}


def test_merged_lanes_follow_one_topological_order_and_keep_every_step():
    algorithm = ring_algorithm(load_topology("ndv2"), Collective.ALLREDUCE)
    positions = step_positions(algorithm)
    prog = algorithm.ranks[0]
    lanes = merge_lanes(prog, positions, lambda trial: [1] * len(trial), limit=1)
    assert len(lanes) == 1
    assert sorted(lanes[0]) == sorted(step for lane in _lanes(prog) for step in lane)
    order = [positions[(0, *step)] for step in lanes[0]]
    assert order == sorted(order)
    for tb in prog.threadblocks:  # each threadblock's steps keep their program order
        mine = [index for tb_id, index in lanes[0] if tb_id == tb.id]
        assert mine == sorted(mine)


def test_merging_stops_when_no_merge_helps():
    algorithm = ring_algorithm(load_topology("ndv2"), Collective.ALLGATHER)
    prog = algorithm.ranks[0]
    lanes = merge_lanes(prog, step_positions(algorithm), lambda trial: None if len(trial) < 2 else [1] * len(trial), 0)
    assert len(lanes) == 2  # a single lane is refused (as if over a channel limit), so two stay
