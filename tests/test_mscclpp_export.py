"""MSCCL++ execution plans from our schedules: structure, limits, and a symbolic run of the plan."""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections import Counter, defaultdict
from dataclasses import replace

import pytest

from taccl_py.baselines import ring_algorithm, tree_algorithm
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm, input_slot, output_slot
from taccl_py.ir.collectives import Collective, expected_output, initial_value
from taccl_py.mscclpp.export import (
    MAX_CHANNELS_PER_THREADBLOCK,
    MAX_OPERATIONS_PER_THREADBLOCK,
    MAX_THREADBLOCKS_PER_GPU,
    generate_mscclpp_plan,
)
from taccl_py.mscclpp.files import write_mscclpp_plan
from taccl_py.mscclpp.sizes import addressable_size
from taccl_py.topology import load_topology

from helpers import run_calls_interleaved
from shipped_bands import outer_bands, shipped_band, shipped_bands

MACHINES = (("ndv2", 1), ("dgx-a100", 2))
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
SEEDS = (0, 1)


@functools.cache
def _topology(name: str, nodes: int):
    return load_topology(name, nodes=nodes)


def _baseline(name: str, nodes: int, family: str, collective: Collective) -> Algorithm:
    topology = _topology(name, nodes)
    if family == "ring":
        return ring_algorithm(topology, collective)
    return tree_algorithm(topology, channels=2)


# The default run makes plans of the first and the last band of each library (its smallest sizes and
# its largest, there the largest schedule); the bands between run with --runslow.
def _shipped_bands() -> list:
    cases = []
    for name, nodes in MACHINES:
        bands = [band for band in shipped_bands(name, nodes) if band[0] in {c.value for c in COLLECTIVES}]
        kept = outer_bands(bands)
        for collective, index in bands:
            marks = [] if (collective, index) in kept else [pytest.mark.slow]
            cases.append(pytest.param((name, nodes, collective, index), marks=marks))
    return cases


@functools.cache
def _baseline_plan(name: str, nodes: int, family: str, collective: Collective) -> dict:
    """The plan of a baseline on the machine; shared by the tests, which only read it."""
    return generate_mscclpp_plan(_baseline(name, nodes, family, collective), _topology(name, nodes))


def _channel_peers(gpu: dict) -> dict[str, list[int]]:
    return {channel["channel_type"]: channel["connected_to"] for channel in gpu["channels"]}


def _paired_channel(plan: dict, rank: int, kind: str, channel: int) -> tuple[int, int]:
    """Return the (peer, channel) ``rank``'s ``channel`` meets: its k-th to a peer meets the peer's k-th back."""
    peers = _channel_peers(plan["gpus"][rank])[kind]
    peer = peers[channel]
    k = peers[:channel].count(peer)
    back = [i for i, p in enumerate(_channel_peers(plan["gpus"][peer])[kind]) if p == rank]
    return peer, back[k]


def _resolve(gpu: dict, tb: dict, op: dict) -> dict:
    """Return the op's GPU-level channel ids and remote buffers (rank, type)."""
    kind = op.get("channel_type")
    tb_channels = {c["channel_type"]: c["channel_ids"] for c in tb["channels"]}
    tb_remote = {r["access_channel_type"]: r["remote_buffer_ids"] for r in tb["remote_buffer_refs"]}
    remote = [
        gpu["remote_buffers"][tb_remote[kind][b["buffer_id"]]] for b in op.get("dst_buff", ()) if "buffer_id" in b
    ]
    return {"channels": [tb_channels[kind][i] for i in op.get("channel_ids", ())], "remote": remote}


def assert_plan_structure(plan: dict, algorithm: Algorithm) -> None:
    """Assert every reference resolves, limits hold, puts equal our sends and signals meet waits."""
    assert json.loads(json.dumps(plan)) == plan
    assert plan["protocol"] == "Simple" and plan["collective"] == algorithm.collective.value
    assert [gpu["id"] for gpu in plan["gpus"]] == list(range(algorithm.num_ranks))
    signals, waits, releases, acquires = Counter(), Counter(), Counter(), Counter()
    puts = 0
    for gpu in plan["gpus"]:
        rank, peers = gpu["id"], _channel_peers(gpu)
        assert len(gpu["threadblocks"]) <= MAX_THREADBLOCKS_PER_GPU
        assert [tb["id"] for tb in gpu["threadblocks"]] == list(range(len(gpu["threadblocks"])))
        for tb in gpu["threadblocks"]:
            assert len(tb["ops"]) <= MAX_OPERATIONS_PER_THREADBLOCK
            for channel in tb["channels"]:
                assert len(channel["channel_ids"]) <= MAX_CHANNELS_PER_THREADBLOCK
                assert all(0 <= i < len(peers[channel["channel_type"]]) for i in channel["channel_ids"])
            for ref in tb["remote_buffer_refs"]:
                assert all(0 <= i < len(gpu["remote_buffers"]) for i in ref["remote_buffer_ids"])
            for index, op in enumerate(tb["ops"]):
                refs = _resolve(gpu, tb, op)
                for semaphore in op.get("semaphore_ids", ()):
                    assert 0 <= semaphore < len(gpu["semaphores"])
                    (releases if op["name"] == "sem_release" else acquires)[(rank, semaphore)] += 1
                if op["name"] in ("put", "pwsf"):
                    puts += 1
                    target = refs["remote"][0]
                    assert op["channel_type"] in target["access_channel_types"]
                    # a signal publishes a memory put before the threadblock's next gate (or its end)
                    following = list(itertools.takewhile(lambda o: o["name"] not in _GATES, tb["ops"][index + 1 :]))
                    # pwsf (put with signal and flush) exists for port channels only (execution_kernel.hpp handlePut)
                    assert (op["name"] == "pwsf") == (op["channel_type"] == "port")
                    assert op["name"] == "pwsf" or any(
                        o["name"] == "signal" and o["channel_type"] == op["channel_type"] for o in following
                    )
                for channel in refs["channels"] if op["name"] in ("signal", "wait", "pwsf") else ():
                    peer, back = _paired_channel(plan, rank, op["channel_type"], channel)
                    if op["name"] in ("signal", "pwsf"):
                        signals[(peer, op["channel_type"], back)] += 1
                    else:
                        waits[(rank, op["channel_type"], channel)] += 1
    assert puts == sum(step.op.sends for prog in algorithm.ranks for tb in prog.threadblocks for step in tb.steps)
    assert signals == waits
    assert releases == acquires


def run_plan(plan: dict, algorithm: Algorithm, seed: int, calls: int = 2) -> None:
    """Run ``calls`` back-to-back calls of the plan symbolically in a seeded random interleaving.

    A GPU starts call c + 1 once its own call c is done (stream order), while its peers may lag;
    values carry the call's number, so a put of one call landing in a slot another call still
    reads shows up as a wrong output.
    """
    rng = random.Random(seed)
    memory: dict[tuple[int, str, int], tuple] = {}
    tokens: Counter = Counter()  # (rank, kind, channel): signals arrived less waits done; kept across calls
    semaphores: Counter = Counter()

    def start(call: int, rank: int) -> None:
        for index in range(algorithm.layout.input_chunks):
            buffer, offset = input_slot(algorithm, rank, index)
            memory[(rank, buffer.value, offset)] = tuple(pair + (call,) for pair in initial_value(rank, index))

    def finish(call: int, rank: int) -> None:
        for index in range(algorithm.layout.output_chunks):
            buffer, offset = output_slot(algorithm, rank, index)
            expected = tuple(sorted(pair + (call,) for pair in expected_output(algorithm.layout, rank, index)))
            assert memory.get((rank, buffer.value, offset)) == expected, (call, rank, index)

    def step(call: int, gpu: dict, tb: dict, op: dict) -> bool:
        rank = gpu["id"]
        refs = _resolve(gpu, tb, op)
        if op["name"] == "wait":  # the op's threads wait one channel each; done when all are
            keys = [(rank, op["channel_type"], channel) for channel in refs["channels"]]
            if any(tokens[key] == 0 for key in keys):
                return False
            for key in keys:
                tokens[key] -= 1
        elif op["name"] == "sem_acquire":
            if any(semaphores[(rank, s)] == 0 for s in op["semaphore_ids"]):
                return False
            for s in op["semaphore_ids"]:
                semaphores[(rank, s)] -= 1
        elif op["name"] == "sem_release":
            for s in op["semaphore_ids"]:
                semaphores[(rank, s)] += 1
        for channel in refs["channels"] if op["name"] in ("signal", "pwsf") else ():
            # this step is atomic: the peer sees pwsf's data with its signal
            peer, back = _paired_channel(plan, rank, op["channel_type"], channel)
            tokens[(peer, op["channel_type"], back)] += 1
        if op["name"] in ("put", "pwsf", "copy", "re"):
            sources = [
                [memory.get((rank, c["type"], c["index"] + i), ()) for i in range(c["size"])] for c in op["src_buff"]
            ]
            target = (
                refs["remote"][0]
                if op["name"] in ("put", "pwsf")
                else {"rank": rank, "type": op["dst_buff"][0]["type"]}
            )
            for i, parts in enumerate(zip(*sources)):
                memory[(target["rank"], target["type"], op["dst_buff"][0]["index"] + i)] = tuple(sorted(sum(parts, ())))
        return True

    run_calls_interleaved(plan, calls, rng, start, step, finish)
    assert not +tokens and not +semaphores, "signals or releases left unconsumed"


BASELINE_CASES = [(n, k, "ring", c) for n, k in MACHINES for c in COLLECTIVES]
BASELINE_CASES += [(n, k, "tree", Collective.ALLREDUCE) for n, k in MACHINES]  # the tree baseline is an AllReduce


# With --runslow: a second random interleaving of the rings across two DGX-A100 (16 ranks, 5 s),
# and their AllReduce ring (9 s); the default run keeps AllReduce across machines in the tree and in
# the shipped dgx-a100 x2 bands (test_shipped_band_plans_are_whole_and_correct).
SEEDED_BASELINE_CASES = [
    pytest.param(
        *case,
        seed,
        marks=[pytest.mark.slow]
        * (case[1] > 1 and case[2] == "ring" and (seed > 0 or case[3] is Collective.ALLREDUCE)),
    )
    for case in BASELINE_CASES
    for seed in SEEDS
]


@pytest.mark.parametrize(
    "name,nodes,family,collective,seed",
    SEEDED_BASELINE_CASES,
    ids=[f"{n}-n{k}-{f}-{c.value}-{s}" for n, k, f, c in BASELINE_CASES for s in SEEDS],
)
def test_baseline_plans_are_whole_and_correct(name, nodes, family, collective, seed):
    algorithm = _baseline(name, nodes, family, collective)
    plan = _baseline_plan(name, nodes, family, collective)
    assert_plan_structure(plan, algorithm)
    run_plan(plan, algorithm, seed)


@pytest.mark.parametrize("case", _shipped_bands(), ids=lambda c: f"{c[0]}-n{c[1]}-{c[2]}-{c[3]}")
def test_shipped_band_plans_are_whole_and_correct(case):
    name, nodes, collective, index = case
    algorithm = shipped_band(name, nodes, collective, index)
    plan = generate_mscclpp_plan(algorithm, _topology(name, nodes))
    assert_plan_structure(plan, algorithm)
    assert sync_faults(plan) == []  # 2-node bands put over port channels right after multi-semaphore acquires
    run_plan(plan, algorithm, seed=index)
    assert plan["min_message_size"] == algorithm.min_bytes
    chunks = [(gpu["input_chunks"], gpu["output_chunks"], gpu["scratch_chunks"]) for gpu in plan["gpus"]]
    largest = addressable_size(plan["collective"], algorithm.num_ranks, chunks)  # no buffer reaches 2^32 bytes
    assert largest < 2**32 and plan["max_message_size"] == min(
        largest, 2**64 - 1 if algorithm.max_bytes is None else algorithm.max_bytes - 1
    )


def test_internode_puts_use_port_channels_and_flush():
    topology = _topology("dgx-a100", 2)
    algorithm = ring_algorithm(topology, Collective.ALLGATHER)
    plan = generate_mscclpp_plan(algorithm, topology)
    kinds = set()
    for gpu in plan["gpus"]:
        for tb in gpu["threadblocks"]:
            for op in tb["ops"]:
                if op["name"] in ("put", "pwsf"):
                    target = _resolve(gpu, tb, op)["remote"][0]["rank"]
                    across = topology.node_of(target) != topology.node_of(gpu["id"])
                    assert op["channel_type"] == ("port" if across else "memory")
                    # across machines one pwsf puts, signals and flushes (the proxy has read the source)
                    assert (op["name"] == "pwsf") == across and ("channel_ids" in op) == across
                    kinds.add(op["channel_type"])
    assert kinds == {"memory", "port"}


_THREAD_ZERO = {"signal", "wait", "flush", "sem_acquire", "sem_release", "pwsf"}
_GATES = {"wait", "sem_acquire"}
_ALL_THREADS = {"copy", "re", "put"}  # memory puts; a port put would be thread 0's


def sync_faults(plan: dict) -> list[str]:
    """Return where an op may run before what it needs, by the executor's __syncthreads rules (``LaneOps``)."""
    faults = []
    for gpu in plan["gpus"]:
        for tb in gpu["threadblocks"]:
            # thread 0 passed a gate / some thread may still be in a data op / acquiring one of several semaphores
            gated = busy = split = False
            thread_of = {}  # (op name, semaphore or channel) -> the thread that ran it since the last nop
            for index, op in enumerate(tb["ops"]):
                where = f"gpu {gpu['id']} tb {tb['id']} op {index} ({op['name']})"
                if op["name"] == "nop":
                    gated = busy = split = False
                    thread_of = {}
                    continue
                ids = op.get("semaphore_ids", op.get("channel_ids") if op["name"] in ("signal", "wait") else ())
                for thread, number in enumerate(ids):
                    if thread_of.setdefault((op["name"], op.get("channel_type"), number), thread) != thread:
                        faults.append(f"{where}: semaphore or channel {number} on another thread than its last use")
                if op["name"] in _ALL_THREADS and gated:
                    faults.append(f"{where}: after a gate without a nop")
                if op["name"] in ("signal", "sem_release", "pwsf") and busy:
                    faults.append(f"{where}: publishes unfinished data")
                if op["name"] not in _GATES and split:
                    faults.append(f"{where}: before every thread has passed its gate")
                if op["name"] in ("sem_release", "signal") and len(ids) > 1 and gated:
                    faults.append(f"{where}: threads 1.. publish what only thread 0 was gated for")
                gated = gated or op["name"] in ("wait", "sem_acquire", "flush", "pwsf")
                busy = busy or op["name"] in _ALL_THREADS
                split = split or op["name"] in _GATES and len(ids) > 1
    return faults


def _needless_nops(plan: dict) -> int:
    """Return how many nops sit between two thread-0 ops (or open or close a threadblock beside one).

    A nop after an acquire of several semaphores (one per thread) before an op that uses data is needed.
    """
    count = 0
    for gpu in plan["gpus"]:
        for tb in gpu["threadblocks"]:
            ops = [{"name": "sem_acquire"}, *tb["ops"], {"name": "sem_release"}]
            split = False
            for before, op, after in zip(ops, ops[1:], ops[2:]):
                split = split or before["name"] == "sem_acquire" and len(before.get("semaphore_ids", ())) > 1
                if op["name"] == "nop":
                    needed = split and after["name"] not in ("wait", "sem_acquire")
                    count += before["name"] in _THREAD_ZERO and after["name"] in _THREAD_ZERO and not needed
                    split = False
    return count


@pytest.mark.parametrize("case", BASELINE_CASES, ids=[f"{n}-n{k}-{f}-{c.value}" for n, k, f, c in BASELINE_CASES])
def test_nops_go_exactly_where_threads_must_meet(case):
    plan = _baseline_plan(*case)
    assert sync_faults(plan) == []
    assert _needless_nops(plan) == 0


def test_sync_checker_sees_a_missing_nop():
    plan = generate_mscclpp_plan(ring_algorithm(_topology("ndv2", 1), Collective.ALLREDUCE))
    ops = next(tb["ops"] for tb in plan["gpus"][0]["threadblocks"] if any(o["name"] == "re" for o in tb["ops"]))
    ops.pop(next(i for i, o in enumerate(ops) if o["name"] == "re") - 1)  # the nop between a wait and its reduce
    assert any("after a gate without a nop" in fault for fault in sync_faults(plan))


def test_without_topology_every_channel_is_memory():
    algorithm = ring_algorithm(_topology("dgx-a100", 2), Collective.ALLGATHER)
    plan = generate_mscclpp_plan(algorithm)
    assert {c["channel_type"] for gpu in plan["gpus"] for c in gpu["channels"]} == {"memory"}
    assert plan["num_threads_per_block"] == 1024 and plan["buffer_alignment"] == 16
    assert plan["inplace"] is algorithm.inplace and plan["reuse_resources"] is False


def test_long_threadblocks_are_cut_and_chained():
    algorithm = ring_algorithm(_topology("ndv2", 1), Collective.ALLREDUCE)
    plan = generate_mscclpp_plan(algorithm)
    ours = max(len(prog.threadblocks) for prog in algorithm.ranks)
    assert max(len(gpu["threadblocks"]) for gpu in plan["gpus"]) > ours
    first = plan["gpus"][0]["threadblocks"]
    assert any(tb["ops"][0]["name"] == "sem_acquire" for tb in first)


def test_topology_of_another_size_is_refused():
    algorithm = ring_algorithm(_topology("ndv2", 1), Collective.ALLGATHER)
    with pytest.raises(ArgumentError, match="topology: 16 GPUs; expected 8 ranks"):
        generate_mscclpp_plan(algorithm, _topology("dgx-a100", 2))


def test_too_many_threadblocks_are_refused(monkeypatch):
    # Merging lanes fits even a 16-channel tree into 64 threadblocks; no plan fits in none.
    monkeypatch.setattr("taccl_py.mscclpp.export.MAX_THREADBLOCKS_PER_GPU", 0)
    with pytest.raises(ArgumentError, match=r"rank 0: \d+ threadblocks; expected at most 0"):
        generate_mscclpp_plan(ring_algorithm(_topology("ndv2", 1), Collective.ALLGATHER))


def test_a_16_channel_tree_fits_by_merging_lanes():
    topology = _topology("dgx-a100", 2)
    algorithm = tree_algorithm(topology, channels=16)
    plan = generate_mscclpp_plan(algorithm, topology)
    assert_plan_structure(plan, algorithm)
    run_plan(plan, algorithm, seed=0)
    assert max(len(prog.threadblocks) for prog in algorithm.ranks) > MAX_THREADBLOCKS_PER_GPU


def test_write_round_trips_and_refuses_unverified(tmp_path):
    topology = _topology("ndv2", 1)
    algorithm = ring_algorithm(topology, Collective.REDUCESCATTER)
    path = tmp_path / "rs.json"
    write_mscclpp_plan(algorithm, path, topology)
    assert json.loads(path.read_text()) == generate_mscclpp_plan(algorithm, topology)
    broken = replace(
        algorithm, ranks=algorithm.ranks[:1] + tuple(replace(p, threadblocks=()) for p in algorithm.ranks[1:])
    )
    with pytest.raises(VerificationError):
        write_mscclpp_plan(broken, tmp_path / "broken.json", topology)
    assert not (tmp_path / "broken.json").exists()


def test_landing_slots_are_scratch_only_where_needed():
    algorithm = ring_algorithm(_topology("ndv2", 1), Collective.ALLGATHER)
    plan = generate_mscclpp_plan(algorithm)
    targets = defaultdict(set)
    for gpu in plan["gpus"]:
        for tb in gpu["threadblocks"]:
            for op in tb["ops"]:
                if op["name"] == "put":
                    targets[_resolve(gpu, tb, op)["remote"][0]["type"]].add(op["dst_buff"][0]["index"])
    assert "o" in targets  # an AllGather ring's receives land straight in the output
