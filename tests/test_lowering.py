"""Lowering causally ordered transfers to threadblocks with hazard dependencies."""

from __future__ import annotations

import pytest

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Buffer, OpType
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import build_dataflow
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan

O, I, S = Buffer.OUTPUT, Buffer.INPUT, Buffer.SCRATCH


def test_reductions_into_one_slot_are_chained_and_the_forward_waits_for_both():
    plan = [
        Transfer(1, 0, (I, 0), (O, 0), reduce=True),
        Transfer(2, 0, (I, 0), (O, 0), reduce=True),
        Transfer(0, 3, (O, 0), (S, 2)),
    ]
    algorithm = lower_plan("chain", Collective.ALLREDUCE, 4, 1, plan)
    rank0 = algorithm.ranks[0]
    recv_from_2 = next(tb for tb in rank0.threadblocks if tb.recv_peer == 2)
    recv_from_1 = next(tb for tb in rank0.threadblocks if tb.recv_peer == 1)
    assert recv_from_2.steps[0].op is OpType.RECV_REDUCE_COPY
    assert recv_from_2.steps[0].depends == ((recv_from_1.id, 0),)  # write after write
    send_to_3 = next(tb for tb in rank0.threadblocks if tb.send_peer == 3)
    assert send_to_3.steps[0].depends == ((recv_from_2.id, 0),)  # read after the last write
    assert algorithm.ranks[3].scratch_chunks == 3
    assert build_dataflow(algorithm).violations == ()


def test_write_after_read_waits_for_the_reader():
    plan = [Transfer(0, 1, (O, 0), (O, 0)), Transfer(2, 0, (I, 0), (O, 0))]
    algorithm = lower_plan("war", Collective.ALLREDUCE, 3, 1, plan)
    recv = next(tb for tb in algorithm.ranks[0].threadblocks if tb.recv_peer == 2)
    send = next(tb for tb in algorithm.ranks[0].threadblocks if tb.send_peer == 1)
    assert recv.steps[0].depends == ((send.id, 0),)


def test_one_threadblock_per_direction_peer_and_channel():
    plan = [Transfer(0, 1, (I, 0), (O, 0), channel=c) for c in (0, 1, 0)]
    algorithm = lower_plan("ch", Collective.ALLGATHER, 2, 2, plan)
    senders = [tb for tb in algorithm.ranks[0].threadblocks if tb.send_peer == 1]
    assert sorted((tb.channel, len(tb.steps)) for tb in senders) == [(0, 2), (1, 1)]


def test_bad_plans_are_rejected():
    with pytest.raises(ArgumentError, match="to itself"):
        lower_plan("x", Collective.ALLGATHER, 2, 2, [Transfer(1, 1, (I, 0), (O, 0))])
    with pytest.raises(ArgumentError, match="outside 0..1"):
        lower_plan("x", Collective.ALLGATHER, 2, 2, [LocalCopy(5, (I, 0), (O, 0))])
