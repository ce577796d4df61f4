"""Tests of taccl_py.verify: correct schedules pass, each fault class is named and located."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taccl_py.errors import VerificationError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.msccl import read_msccl_xml
from taccl_py.verify import VerificationReport, check_algorithm, describe_value, verify_algorithm

from helpers import (
    BROKEN_MSCCL_FIXTURES,
    assert_valid_algorithm,
    msccl_fixture_paths,
    ring_algorithm,
    ring_allgather_plan,
    ring_reducescatter_plan,
)

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def _kinds(report: VerificationReport) -> set[str]:
    return {v.kind for v in report.violations}


def _algorithm(
    collective: Collective,
    programs: list[list[Threadblock]],
    chunks_per_loop: int,
    *,
    scratch: int = 0,
    inplace: bool = False,
) -> Algorithm:
    """Return a hand-written algorithm with the collective's buffer sizes (in-place aware)."""
    n = len(programs)
    probe = Algorithm("probe", collective, n, chunks_per_loop, ())
    inputs, outputs = probe.layout.input_chunks, probe.layout.output_chunks
    if inplace:
        inputs, outputs = (0, outputs) if collective is Collective.ALLGATHER else (inputs, 0)
    ranks = tuple(RankProgram(r, tuple(tbs), inputs, outputs, scratch) for r, tbs in enumerate(programs))
    return Algorithm("hand", collective, n, chunks_per_loop, ranks, inplace=inplace)


# -- correct schedules ------------------------------------------------------------------------------


@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.value)
@pytest.mark.parametrize("num_ranks", [2, 3, 5, 8])
def test_lowered_rings_verify(collective: Collective, num_ranks: int) -> None:
    report = assert_valid_algorithm(ring_algorithm(collective, num_ranks))
    assert report.ok and report.violations == () and report.first is None
    assert report.rounds >= 1


def test_inplace_allreduce_ring_verifies() -> None:
    algorithm = ring_algorithm(Collective.ALLREDUCE, 4, inplace=True)
    assert algorithm.ranks[0].output_chunks == 0
    assert verify_algorithm(algorithm).ok


@pytest.mark.parametrize("path", msccl_fixture_paths(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reference_xml_verdicts(path) -> None:
    report = verify_algorithm(read_msccl_xml(str(path)))
    expected_fault = BROKEN_MSCCL_FIXTURES.get(path.name)
    if expected_fault is None:
        assert report.ok, report.summary()
    else:
        assert not report.ok and report.first.kind == expected_fault


def test_composed_sccl_allreduce_is_rejected_for_reading_uninitialized_scratch() -> None:
    # msccl compose + ncclize declare nchunksperloop=1 (1 input chunk per GPU) for an allreduce whose
    # reduce-scatter phase moves 8 distinct chunks: 7 of them live in scratch that nothing fills.
    path = next(p for p in msccl_fixture_paths() if p.name == "sccl_allreduce_dgx1_composed.xml")
    algorithm = read_msccl_xml(str(path))
    report = verify_algorithm(algorithm)
    first = report.first
    assert (first.kind, first.rank, first.threadblock, first.step) == ("uninitialized read", 0, 5, 0)
    assert "s[1]" in first.message
    assert {"uninitialized read", "wrong result"} <= _kinds(report)
    assert "deadlock" not in _kinds(report) and "race" not in _kinds(report)
    with pytest.raises(
        VerificationError, match=r"incorrect: uninitialized read \(rank 0, tb 5, step 0, chunk 1\).*\(\+\d+ more\)"
    ):
        check_algorithm(algorithm)


def test_check_algorithm_returns_its_argument() -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 3)
    assert check_algorithm(algorithm) is algorithm


def test_report_is_frozen_and_summarises() -> None:
    report = verify_algorithm(ring_algorithm(Collective.ALLGATHER, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.ok = False  # type: ignore[misc]
    assert report.summary() == f"ring_allgather_2: ok ({report.rounds} rounds)"


# -- one test per fault class -----------------------------------------------------------------------


def test_wrong_result_names_rank_chunk_and_values() -> None:
    # a direct allgather whose rank 1 forgets to copy its own input into its output
    items = [LocalCopy(r, (I, 0), (O, r)) for r in (0, 2)]
    items += [Transfer(r, q, (I, 0), (O, r)) for r in range(3) for q in range(3) if q != r]
    report = verify_algorithm(lower_plan("nocopy", Collective.ALLGATHER, 3, 3, items))
    assert [(v.kind, v.rank, v.chunk) for v in report.violations] == [("wrong result", 1, 1)]
    assert report.first.message == "output chunk 1 (o[1]) holds nothing (never written); expected in[0] of rank 1"


def test_double_reduction_names_the_contribution() -> None:
    items = ring_reducescatter_plan(2)
    items.insert(1, items[0])  # rank 0 sends its chunk to rank 1 twice: rank 1 adds it twice
    report = verify_algorithm(lower_plan("twice", Collective.REDUCESCATTER, 2, 2, items))
    doubled = [v for v in report.violations if v.kind == "double reduction"]
    assert doubled and doubled[0].rank == 1 and "counts input 1 of rank 0 twice" in doubled[0].message
    assert "wrong result" in _kinds(report)


def test_reduction_in_allgather_is_reported() -> None:
    items = ring_allgather_plan(2)
    items[-1] = replace(items[-1], reduce=True)
    report = verify_algorithm(lower_plan("sum", Collective.ALLGATHER, 2, 2, items))
    assert "reduction in non-reducing collective" in _kinds(report)


def test_uninitialized_scratch_read() -> None:
    send = Threadblock(0, (Step(OpType.SEND, S, 0, count=1),), send_peer=1)
    recv = Threadblock(0, (Step(OpType.RECV, dst_buffer=O, dst_offset=0),), recv_peer=0)
    algorithm = _algorithm(Collective.ALLGATHER, [[send], [recv]], 2, scratch=1)
    report = verify_algorithm(algorithm)
    assert report.first.kind == "uninitialized read"
    assert (report.first.rank, report.first.threadblock, report.first.step, report.first.chunk) == (0, 0, 0, 0)
    assert "reads s[0]" in report.first.message


def test_deadlock_is_structural_and_spelled_out() -> None:
    ring = [
        [
            Threadblock(
                0,
                (Step(OpType.RECV, dst_buffer=O, dst_offset=1 - r), Step(OpType.SEND, I, 0)),
                send_peer=1 - r,
                recv_peer=1 - r,
            )
        ]
        for r in range(2)
    ]
    report = verify_algorithm(_algorithm(Collective.ALLGATHER, ring, 2))
    assert report.first.kind == "deadlock" and report.rounds == 0
    assert "circular wait" in report.first.message


def test_unmatched_send_and_size_mismatch() -> None:
    lonely = [[Threadblock(0, (Step(OpType.SEND, I, 0),), send_peer=1)], []]
    assert verify_algorithm(_algorithm(Collective.ALLGATHER, lonely, 2)).first.kind == "unmatched send"
    sizes = [
        [Threadblock(0, (Step(OpType.SEND, I, 0, count=2),), send_peer=1)],
        [Threadblock(0, (Step(OpType.RECV, dst_buffer=O, dst_offset=0, count=1),), recv_peer=0)],
    ]
    assert "size mismatch" in _kinds(verify_algorithm(_algorithm(Collective.ALLREDUCE, sizes, 2)))


def test_buffer_too_small_for_the_layout() -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 2)
    small = replace(algorithm, ranks=(replace(algorithm.ranks[0], output_chunks=1),) + algorithm.ranks[1:])
    report = verify_algorithm(small)
    assert not report.ok and report.first.rank == 0


def _copy_race(with_dependency: bool) -> Algorithm:
    """Two threadblocks of each rank copy the input to the same output chunk."""
    dep = ((0, 0),) if with_dependency else ()
    programs = []
    for r in range(2):
        programs.append(
            [
                Threadblock(0, (Step(OpType.COPY, I, 0, O, r),)),
                Threadblock(1, (Step(OpType.COPY, I, 0, O, r, depends=dep),)),
                Threadblock(2, (Step(OpType.SEND, I, 0, depends=dep),), send_peer=1 - r),
                Threadblock(3, (Step(OpType.RECV, dst_buffer=O, dst_offset=1 - r),), recv_peer=1 - r),
            ]
        )
    return _algorithm(Collective.ALLGATHER, programs, 2)


def test_write_write_race_between_threadblocks() -> None:
    report = verify_algorithm(_copy_race(with_dependency=False))
    assert _kinds(report) == {"race"}
    race = report.violations[0]
    assert (race.rank, race.chunk) == (0, 0) and {race.threadblock} <= {0, 1}
    assert "writes o[0]" in race.message and "no dependency path" in race.message
    assert verify_algorithm(_copy_race(with_dependency=True)).ok


def _without_dependencies(algorithm):
    """Return ``algorithm`` with every step's cross-threadblock dependencies removed."""
    ranks = []
    for prog in algorithm.ranks:
        tbs = tuple(replace(tb, steps=tuple(replace(s, depends=()) for s in tb.steps)) for tb in prog.threadblocks)
        ranks.append(replace(prog, threadblocks=tbs))
    return replace(algorithm, ranks=tuple(ranks))


def test_stripped_dependencies_make_races() -> None:
    stripped = _without_dependencies(ring_algorithm(Collective.ALLGATHER, 3))
    assert "race" in _kinds(verify_algorithm(stripped))


def test_ordering_through_another_rank_is_not_a_race() -> None:
    # rank 0 tb 0 writes o[0] then sends it; rank 1 bounces a message back; rank 0 tb 1 reads o[0]
    # only after receiving it: ordered through rank 1, with no dependency on rank 0 itself.
    rank0 = [
        Threadblock(0, (Step(OpType.COPY, I, 0, O, 0), Step(OpType.SEND, O, 0)), send_peer=1),
        Threadblock(1, (Step(OpType.RECV, dst_buffer=O, dst_offset=1), Step(OpType.COPY, O, 0, S, 0)), recv_peer=1),
    ]
    rank1 = [
        Threadblock(
            0,
            (Step(OpType.RECV, dst_buffer=O, dst_offset=0), Step(OpType.COPY, I, 0, O, 1), Step(OpType.SEND, O, 1)),
            send_peer=0,
            recv_peer=0,
        )
    ]
    report = verify_algorithm(_algorithm(Collective.ALLGATHER, [rank0, rank1], 2, scratch=1))
    assert report.ok, report.summary()


def _reachable(flow) -> list[set[int]]:
    """Return, per action, the actions that happen before it (brute force over predecessors)."""
    before: list[set[int]] = [set() for _ in flow.actions]
    for node in flow.order:
        for pred in flow.predecessors[node]:
            before[node] |= before[pred] | {pred}
    return before


@pytest.mark.parametrize("strip", [False, True], ids=["lowered", "stripped"])
@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.ALLREDUCE], ids=lambda c: c.value)
def test_one_edge_ordering_is_sound_and_settles_lowered_plans(collective: Collective, strip: bool) -> None:
    import numpy as np

    from taccl_py.ir.dataflow import build_dataflow
    from taccl_py.verify.races import _chains, _directly_ordered, _edges
    from taccl_py.verify.replay import _replay_actions

    algorithm = ring_algorithm(collective, 4)
    if strip:
        algorithm = _without_dependencies(algorithm)
    flow = build_dataflow(algorithm)
    before = _reachable(flow)
    pairs = [
        (a.id, b.id) for a in flow.actions for b in flow.actions if a.rank == b.rank and a.threadblock != b.threadblock
    ]
    first, second = (np.array(side, dtype=np.int64) for side in zip(*pairs))
    tb_of, position, _ = _chains(flow.actions)
    ordered = _directly_ordered(tb_of, position, _edges(flow), first, second)
    assert all(a in before[b] for (a, b), yes in zip(pairs, ordered) if yes)  # never claims a missing path
    log = _replay_actions(flow, flow.actions_in_round_order()).accesses
    found = np.array([c[:2] for c in log.candidates], dtype=np.int64).reshape(-1, 2)
    settled = _directly_ordered(tb_of, position, _edges(flow), found[:, 0], found[:, 1])
    if not strip:  # lower_plan adds one dependency per hazard: no pair needs the clocks
        assert settled.all() and len(settled)
    else:
        assert not settled.all()


def test_describe_value_marks_repeats() -> None:
    assert describe_value(((0, 1), (0, 1), (1, 1))) == "in[1] of ranks 0 x2,1"


# -- property tests: corrupted correct algorithms are rejected --------------------------------------


@lru_cache(maxsize=1)
def _correct_algorithms() -> tuple[Algorithm, ...]:
    rings = [ring_algorithm(c, n) for c in Collective for n in range(2, 9)]
    rings += [ring_algorithm(Collective.ALLREDUCE, n, inplace=True) for n in (2, 3, 4)]
    references = [read_msccl_xml(str(p)) for p in msccl_fixture_paths() if p.name not in BROKEN_MSCCL_FIXTURES]
    return tuple(rings + references)


def _steps(algorithm: Algorithm, predicate) -> list[tuple[int, int, int]]:
    return [
        (p.rank, t, s)
        for p in algorithm.ranks
        for t, tb in enumerate(p.threadblocks)
        for s, step in enumerate(tb.steps)
        if predicate(step)
    ]


def _edit_threadblock(algorithm: Algorithm, rank: int, t: int, steps: tuple[Step, ...], index_map) -> Algorithm:
    """Replace the steps of threadblock ``t`` of ``rank``; remap references to them with ``index_map``.

    ``index_map(old step index)`` gives the new index, or None to drop a dependency on it.
    """
    tb_id = algorithm.ranks[rank].threadblocks[t].id

    def remap(step: Step) -> Step:
        deps = [(d_tb, index_map(d_s) if d_tb == tb_id else d_s) for d_tb, d_s in step.depends]
        return replace(step, depends=tuple(d for d in deps if d[1] is not None))

    prog = algorithm.ranks[rank]
    tbs = tuple(
        replace(tb, steps=tuple(remap(x) for x in (steps if index == t else tb.steps)))
        for index, tb in enumerate(prog.threadblocks)
    )
    return replace(
        algorithm, ranks=tuple(replace(p, threadblocks=tbs) if p.rank == rank else p for p in algorithm.ranks)
    )


_FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(st.data())
def test_dropping_a_step_is_detected(data) -> None:
    algorithm = data.draw(st.sampled_from(_correct_algorithms()))
    rank, t, s = data.draw(st.sampled_from(_steps(algorithm, lambda step: step.op is not OpType.NOP)))
    old = algorithm.ranks[rank].threadblocks[t].steps
    dropped = old[:s] + old[s + 1 :]
    mutated = _edit_threadblock(algorithm, rank, t, dropped, lambda i: i if i < s else (None if i == s else i - 1))
    assert not verify_algorithm(mutated).ok


@_FAST
@given(st.data())
def test_moving_a_step_offset_is_detected(data) -> None:
    algorithm = data.draw(st.sampled_from(_correct_algorithms()))
    uses = lambda step: step.src_buffer is not None or step.dst_buffer is not None  # noqa: E731
    rank, t, s = data.draw(st.sampled_from(_steps(algorithm, uses)))
    prog = algorithm.ranks[rank]
    step = prog.threadblocks[t].steps[s]
    field = "src" if step.src_buffer is not None and (step.dst_buffer is None or data.draw(st.booleans())) else "dst"
    buffer, offset = getattr(step, f"{field}_buffer"), getattr(step, f"{field}_offset")
    choices = [o for o in range(prog.chunks(buffer) - step.count + 1) if o != offset]
    if not choices:
        return
    moved = replace(step, **{f"{field}_offset": data.draw(st.sampled_from(choices))})
    steps = prog.threadblocks[t].steps
    mutated = _edit_threadblock(algorithm, rank, t, steps[:s] + (moved,) + steps[s + 1 :], lambda i: i)
    assert not verify_algorithm(mutated).ok


@_FAST
@given(st.data())
def test_duplicating_a_reducing_step_is_detected(data) -> None:
    algorithm = data.draw(st.sampled_from([a for a in _correct_algorithms() if a.collective.reduces]))
    rank, t, s = data.draw(st.sampled_from(_steps(algorithm, lambda step: step.op.reduces)))
    steps = algorithm.ranks[rank].threadblocks[t].steps
    mutated = _edit_threadblock(algorithm, rank, t, steps[: s + 1] + steps[s:], lambda i: i if i <= s else i + 1)
    assert not verify_algorithm(mutated).ok


def test_race_detection_in_small_clock_blocks(monkeypatch) -> None:
    import taccl_py.verify.races as hb

    algorithm = ring_algorithm(Collective.ALLGATHER, 4)
    stripped = replace(
        algorithm,
        ranks=tuple(
            replace(
                p,
                threadblocks=tuple(
                    replace(tb, steps=tuple(replace(s, depends=()) for s in tb.steps)) for tb in p.threadblocks
                ),
            )
            for p in algorithm.ranks
        ),
    )
    expected = [v for v in verify_algorithm(stripped).violations if v.kind == "race"]
    monkeypatch.setattr(hb, "CLOCK_BLOCK_BYTES", 1)  # one threadblock column per block
    assert [v for v in verify_algorithm(stripped).violations if v.kind == "race"] == expected and expected


def test_happens_before_clocks_follow_messages_across_ranks() -> None:
    from taccl_py.ir.dataflow import ActionKind, build_dataflow
    from taccl_py.verify.races import happens_before_clocks

    flow = build_dataflow(ring_algorithm(Collective.ALLGATHER, 2))
    send = next(a for a in flow.actions if a.kind is ActionKind.SEND and a.rank == 0)
    recv = flow.actions[flow.match[send.id]]
    clocks, position = happens_before_clocks(flow, [(0, send.threadblock), (1, recv.threadblock)])
    assert clocks[recv.id, 0] > position[send.id]  # the send happens before its receive
    assert clocks[send.id, 1] <= position[recv.id]  # and not the other way round
