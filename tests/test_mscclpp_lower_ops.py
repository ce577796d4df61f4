"""Gathering a lane's gates and publications (``BatchedLaneOps``): which ops fuse, which may not pass each other."""

from __future__ import annotations

import json

import pytest
from test_mscclpp_export import assert_plan_structure, run_plan, sync_faults

from taccl_py.baselines import ring_algorithm
from taccl_py.errors import VerificationError
from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.mscclpp import lift_mscclpp_plan, parse_mscclpp_plan
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import mscclpp_plan_text
from taccl_py.mscclpp.lower.ops import BatchedLaneOps, LaneOps
from taccl_py.topology import load_topology
from taccl_py.verify import check_algorithm


def _reduce(index: int) -> dict:
    slot = {"type": "o", "index": index, "size": 1}
    return {"name": "re", "src_buff": [slot, {"type": "s", "index": index, "size": 1}], "dst_buff": [slot]}


def _names(ops: LaneOps) -> list[str]:
    """Return ``ops`` as short names: ``wait[0,1]`` for a control op over channels or semaphores 0 and 1."""
    names = []
    for op in ops.ops:
        ids = op.get("semaphore_ids", op.get("channel_ids") if op["name"] in ("signal", "wait") else None)
        names.append(op["name"] + ("" if ids is None else "[" + ",".join(map(str, ids)) + "]"))
    return names


def test_gates_move_up_and_publications_down_past_data() -> None:
    ops = BatchedLaneOps()
    ops.control("wait", "memory", [0])
    ops.data(_reduce(0))
    ops.control("wait", "memory", [1])
    ops.data(_reduce(1))
    ops.control("signal", "memory", [2])
    ops.data(_reduce(2))
    ops.semaphores("sem_release", [0])
    ops.control("signal", "memory", [3])
    ops.close()
    # thread t waits (and signals) the t-th channel: a nop after the wait lets every thread see both
    assert _names(ops) == ["wait[0,1]", "nop", "re", "re", "re", "nop", "signal[2,3]", "sem_release[0]"]


def test_a_gate_never_passes_a_publication() -> None:
    ops = BatchedLaneOps()
    ops.control("wait", "memory", [0])
    ops.data(_reduce(0))
    ops.control("signal", "memory", [1])
    ops.semaphores("sem_acquire", [4])  # its release may need the signal above, on some other GPU
    ops.data(_reduce(1))
    ops.close()
    assert _names(ops) == ["wait[0]", "nop", "re", "nop", "signal[1]", "sem_acquire[4]", "nop", "re"]


def test_a_port_put_publishes_so_later_gates_stay_behind_it() -> None:
    ops = BatchedLaneOps()
    ops.control("wait", "port", [0])
    ops.put((Buffer.OUTPUT, 0), 1, "port", 0, 0, (Buffer.SCRATCH, 0))
    ops.control("wait", "port", [1])
    ops.close()
    assert [name.split("[")[0] for name in _names(ops)] == ["wait", "pwsf", "wait"]


def test_repeated_ids_take_one_op_each_and_ops_hold_at_most_eight_channels() -> None:
    ops = BatchedLaneOps()
    ops.control("signal", "memory", [0])
    ops.control("signal", "memory", [0])  # a channel's signals count: two threads may not race on one
    ops.control("signal", "memory", list(range(1, 10)))
    ops.close()
    assert _names(ops) == ["signal[0,1,2,3,4,5,6,7]", "signal[0,8,9]"]


def _band(name: str, nodes: int, collective: str, index: int):
    path = next(p for p in shipped_library_paths(name, nodes) if read_library(p).collective.value == collective)
    return read_library(path).bands[index].algorithm


def test_a_rank_just_over_the_limit_fits_by_gathering_alone(monkeypatch) -> None:
    # NDv2 x2 AllGather band 5 (c1p2-d131072000): rank 0 needs 14 threadblocks as written, 13 with its gates gathered
    topology = load_topology("ndv2", nodes=2)
    algorithm = _band("ndv2", 2, "allgather", 5)
    assert max(len(gpu["threadblocks"]) for gpu in generate_mscclpp_plan(algorithm, topology)["gpus"]) == 14
    monkeypatch.setattr("taccl_py.mscclpp.export.MAX_THREADBLOCKS_PER_GPU", 13)
    monkeypatch.setattr("test_mscclpp_export.MAX_THREADBLOCKS_PER_GPU", 13)
    plan = generate_mscclpp_plan(algorithm, topology)
    assert len(plan["gpus"][0]["threadblocks"]) == 13
    # a run of sends to one peer puts back to back and signals after the last (one signal per put)
    names = [[op["name"] for op in tb["ops"]] for tb in plan["gpus"][0]["threadblocks"]]
    assert any(["put", "put", "nop", "signal", "signal"] == ops[i : i + 5] for ops in names for i in range(len(ops)))
    assert_plan_structure(plan, algorithm)
    assert sync_faults(plan) == []
    run_plan(plan, algorithm, seed=0)
    mscclpp_plan_text(algorithm, topology, "Simple")  # replayed with MSCCL++'s semantics
    check_algorithm(lift_mscclpp_plan(parse_mscclpp_plan(json.dumps(plan), "gathered")))  # and lifted back


def test_a_ring_forced_to_gather_still_verifies(monkeypatch) -> None:
    topology = load_topology("ndv2", nodes=1)
    algorithm = ring_algorithm(topology, Collective.ALLREDUCE)
    monkeypatch.setattr("taccl_py.mscclpp.export.MAX_THREADBLOCKS_PER_GPU", 1)
    with pytest.raises(Exception, match="expected at most 1"):  # nothing fits one threadblock ...
        mscclpp_plan_text(algorithm, topology, "Simple")
    monkeypatch.setattr("taccl_py.mscclpp.export.MAX_THREADBLOCKS_PER_GPU", 6)
    mscclpp_plan_text(algorithm, topology, "Simple")  # ... six do, gathered and merged, and verify


def test_a_gate_let_past_a_publication_deadlocks_and_is_refused(monkeypatch) -> None:
    # The mutation the rule forbids: a wait hoisted above the signal its own peer is waiting for.
    topology = load_topology("ndv2", nodes=1)
    algorithm = ring_algorithm(topology, Collective.ALLREDUCE)
    monkeypatch.setattr("taccl_py.mscclpp.export.MAX_THREADBLOCKS_PER_GPU", 6)
    monkeypatch.setattr(BatchedLaneOps, "_gate", lambda self, gates: self._gates.extend(gates))
    with pytest.raises(VerificationError):
        mscclpp_plan_text(algorithm, topology, "Simple")


def test_the_sync_checker_sees_what_lane_ops_puts_nops_for() -> None:
    def signal(*channels: int) -> dict:
        return {"name": "signal", "channel_ids": list(channels), "channel_type": "memory"}

    written = [{"name": "wait", "channel_ids": [0], "channel_type": "memory"}, signal(1, 2), signal(2)]
    faults = sync_faults({"gpus": [{"id": 0, "threadblocks": [{"id": 0, "ops": written}]}]})
    assert [fault.split(": ", 1)[1] for fault in faults] == [
        "threads 1.. publish what only thread 0 was gated for",  # thread 1 never saw the wait
        "semaphore or channel 2 on another thread than its last use",  # thread 1 signalled it, now thread 0
    ]
    ops = LaneOps()
    ops.control("wait", "memory", [0])
    ops.control("signal", "memory", [1, 2])
    ops.control("signal", "memory", [2])
    assert _names(ops) == ["wait[0]", "nop", "signal[1,2]", "nop", "signal[2]"]
