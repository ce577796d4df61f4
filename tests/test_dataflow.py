"""Send/receive matching, deadlock detection and rounds."""

from __future__ import annotations

from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import ActionKind, build_dataflow


def _two_rank(steps0, steps1, peers=True) -> Algorithm:
    """Return a 2-rank allgather whose single threadblocks run ``steps0`` and ``steps1``."""
    tb0 = Threadblock(0, tuple(steps0), send_peer=1 if peers else None, recv_peer=1 if peers else None)
    tb1 = Threadblock(0, tuple(steps1), send_peer=0 if peers else None, recv_peer=0 if peers else None)
    return Algorithm("t", Collective.ALLGATHER, 2, 2, (RankProgram(0, (tb0,), 1, 2), RankProgram(1, (tb1,), 1, 2)))


SEND = Step(OpType.SEND, Buffer.INPUT, 0, None, 0, 1)


def RECV(offset):
    return Step(OpType.RECV, None, 0, Buffer.OUTPUT, offset, 1)


def test_exchange_send_then_receive_is_not_a_deadlock():
    flow = build_dataflow(_two_rank([SEND, RECV(1)], [SEND, RECV(0)]))
    assert flow.violations == ()
    assert flow.num_rounds == 1  # sends and the receives they meet share round 0


def test_receive_first_on_both_sides_deadlocks_with_the_cycle_named():
    flow = build_dataflow(_two_rank([RECV(1), SEND], [RECV(0), SEND]))
    kinds = [v.kind for v in flow.violations]
    assert kinds == ["deadlock"]
    message = flow.violations[0].message
    assert "rank 0" in message and "rank 1" in message and "waits on" in message
    assert flow.rounds is None


def test_unmatched_send_and_receive_are_reported():
    flow = build_dataflow(_two_rank([SEND, SEND], [RECV(0)]))
    assert [v.kind for v in flow.violations] == ["unmatched send"]
    flow = build_dataflow(_two_rank([SEND], [RECV(0), RECV(1)]))
    assert [v.kind for v in flow.violations] == ["unmatched receive"]


def test_receive_of_the_wrong_size():
    big_send = Step(OpType.SEND, Buffer.OUTPUT, 0, None, 0, 2)
    flow = build_dataflow(_two_rank([big_send], [RECV(0)]))
    assert "size mismatch" in [v.kind for v in flow.violations]


def test_out_of_bounds_and_missing_peer_and_bad_dependency():
    oob = Step(OpType.SEND, Buffer.INPUT, 3, None, 0, 1)
    assert "out of bounds" in [v.kind for v in build_dataflow(_two_rank([oob], [RECV(0)])).violations]
    no_peer = build_dataflow(_two_rank([SEND], [RECV(0)], peers=False))
    assert {v.kind for v in no_peer.violations} == {"structure"}
    dangling = Step(OpType.NOP, depends=((7, 0),))
    assert "bad dependency" in [v.kind for v in build_dataflow(_two_rank([dangling], [])).violations]


def test_forwarding_step_splits_into_receive_then_send_a_round_later():
    # rank 0 sends to 1; rank 1 receives and forwards back (rcs); rank 0 receives.
    rcs = Step(OpType.RECV_COPY_SEND, None, 0, Buffer.OUTPUT, 0, 1)
    flow = build_dataflow(_two_rank([SEND, RECV(1)], [rcs]))
    assert flow.violations == ()
    kinds = {(a.rank, a.kind): flow.rounds[a.id] for a in flow.actions}
    assert kinds[(1, ActionKind.RECV)] == 0
    assert kinds[(1, ActionKind.SEND)] == 1
    assert kinds[(0, ActionKind.RECV)] == 1


def test_reduce_steps_use_a_temporary_then_compute():
    rrc = Step(OpType.RECV_REDUCE_COPY, Buffer.OUTPUT, 0, Buffer.OUTPUT, 0, 1)
    flow = build_dataflow(_two_rank([SEND], [rrc]))
    compute = next(a for a in flow.actions if a.kind is ActionKind.COMPUTE)
    assert compute.sources[0].buffer is Buffer.OUTPUT
    assert compute.sources[1].temp == (0, 0)
    order = flow.actions_in_round_order()
    assert [a.kind for a in order] == [ActionKind.SEND, ActionKind.RECV, ActionKind.COMPUTE]
