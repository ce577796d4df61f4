"""The execution models of the simulator: MSCCL's slice loop and pipelined sends (issue 30)."""

from __future__ import annotations

import random

import pytest

from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import Transfer, lower_plan
from taccl_py.simulate import MSCCL_LOOP, MSCCL_PIPELINED, WHOLE_CHUNKS, ExecutionModel, execution_model, simulate
from taccl_py.simulate.model import MSCCL_SEND_SLOTS, MSCCL_SLICE_BYTES, slice_sizes
from taccl_py.simulate.protocol import LL, LL128, SIMPLE
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology

from helpers import ring_algorithm

MIB = 2**20
BYTES_PER_US = 10_000.0  # 10 GB/s


def _pair(alpha_us: float):
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, rank=r) for r in range(2)]
    links = [
        Link("gpu0", "gpu1", LinkKind.NVLINK, alpha_us, 10.0),
        Link("gpu1", "gpu0", LinkKind.NVLINK, alpha_us, 10.0),
    ]
    return make_topology("pair", gpus, links)


def _one_send():
    """Rank 0 sends its chunk to rank 1: 2 chunks per loop, so a chunk is half the size."""
    return lower_plan("one", Collective.ALLGATHER, 2, 2, [Transfer(0, 1, (Buffer.INPUT, 0), (Buffer.OUTPUT, 0))])


def test_slices_follow_msccl_buffer_sizes():
    assert MSCCL_SLICE_BYTES == {SIMPLE: 2 * MIB, LL: 32 * 1024, LL128: 576_000}
    assert MSCCL_SEND_SLOTS == 2
    assert slice_sizes(5 * MIB, MSCCL_LOOP, SIMPLE) == (2 * MIB, 2 * MIB, 1 * MIB)
    assert slice_sizes(5 * MIB, WHOLE_CHUNKS, SIMPLE) == (5 * MIB,)
    assert slice_sizes(100.0, MSCCL_LOOP, LL) == (100.0,)


def test_a_chunk_of_three_slices_pays_alpha_per_pass_when_serialized():
    size = 10 * MIB  # 5 MiB chunks: passes of 2, 2 and 1 MiB
    whole = simulate(_one_send(), _pair(1.0), size, model=WHOLE_CHUNKS)
    sliced = simulate(_one_send(), _pair(1.0), size, model=MSCCL_LOOP)
    assert whole.time_us == pytest.approx(1.0 + 5 * MIB / BYTES_PER_US)
    assert sliced.time_us == pytest.approx(3 * 1.0 + 5 * MIB / BYTES_PER_US)
    assert (whole.num_passes, sliced.num_passes, sliced.model) == (1, 3, "msccl")


def test_pipelined_sends_pay_alpha_once_while_slots_last():
    size = 10 * MIB
    result = simulate(_one_send(), _pair(1.0), size, model=MSCCL_PIPELINED)
    assert result.time_us == pytest.approx(1.0 + 5 * MIB / BYTES_PER_US)


def test_pipelined_sends_wait_for_a_free_slot():
    alpha = 1000.0  # far longer than a slice's 209.7 µs: the third slice waits for the first's RECV
    result = simulate(_one_send(), _pair(alpha), 10 * MIB, model=MSCCL_PIPELINED, record_timeline=True)
    slice_us = 2 * MIB / BYTES_PER_US
    assert result.time_us == pytest.approx(alpha + slice_us + alpha + slice_us / 2)
    starts = sorted(record.start_us for record in result.timeline)
    assert starts == pytest.approx([0.0, slice_us, alpha + slice_us])


def test_timeline_holds_every_pass():
    result = simulate(_one_send(), _pair(1.0), 10 * MIB, model=MSCCL_LOOP, record_timeline=True)
    assert [record.size_bytes for record in result.timeline] == [2 * MIB, 2 * MIB, 1 * MIB]
    assert [record.transfer for record in result.timeline] == [0, 1, 2]


def test_a_threadblock_runs_ahead_into_the_next_pass():
    # a 4-rank ring: per slice, every rank's threadblocks overlap passes, so the 1 GB ring is
    # within a few fills of the whole-chunk time, far from passes x whole-chunk latency
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, rank=r) for r in range(4)]
    links = [Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, 1.0, 10.0) for a in range(4) for b in range(4) if a != b]
    topology = make_topology("mesh4", gpus, links)
    ring = ring_algorithm(Collective.ALLGATHER, 4)
    whole = simulate(ring, topology, 10**9, model=WHOLE_CHUNKS).time_us
    sliced = simulate(ring, topology, 10**9, model=MSCCL_LOOP)
    assert sliced.num_passes > 100
    slice_us = 2 * MIB / BYTES_PER_US
    assert whole <= sliced.time_us <= whole + 3 * (slice_us + 1.0)


@pytest.mark.parametrize("seed", range(12))
def test_chunks_within_one_slice_simulate_as_whole_chunks(seed):
    rng = random.Random(seed)
    n, chunks = 4, 4
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, rank=r) for r in range(n)]
    links = [
        Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, rng.choice([0.0, 0.5, 2.0]), rng.choice([10.0, 25.0]))
        for a in range(n)
        for b in range(n)
        if a != b
    ]
    topology = make_topology("random", gpus, links)
    items = []
    for _ in range(rng.randint(3, 12)):
        src, dst = rng.sample(range(n), 2)
        items.append(Transfer(src, dst, (Buffer.INPUT, rng.randint(0, chunks - 1)), (Buffer.OUTPUT, rng.randint(0, 3))))
    algorithm = lower_plan(f"random{seed}", Collective.ALLREDUCE, n, chunks, items)
    size = rng.choice([4_000, 400_000, 8 * MIB])  # chunks of at most 2 MiB: one pass
    whole = simulate(algorithm, topology, size, bound_time_us=1.0, model="chunks").time_us
    assert simulate(algorithm, topology, size, bound_time_us=1.0, model="msccl").time_us == pytest.approx(whole)


def _needs_three_slots() -> Algorithm:
    """Rank 0 sends three chunks on channel 0, then one on channel 1; rank 1's first receive on
    channel 0 waits for the one on channel 1. Buffered sends run it; two slots cannot."""

    def send(offset: int, depends=()) -> Step:
        return Step(OpType.SEND, Buffer.INPUT, offset, depends=depends)

    def recv(offset: int, depends=()) -> Step:
        return Step(OpType.RECV, dst_buffer=Buffer.OUTPUT, dst_offset=offset, depends=depends)

    rank0 = RankProgram(
        0,
        (
            Threadblock(0, (send(0), send(1), send(2)), send_peer=1, channel=0),
            Threadblock(1, (send(3, ((0, 2),)),), send_peer=1, channel=1),
        ),
        input_chunks=4,
        output_chunks=4,
    )
    rank1 = RankProgram(
        1,
        (
            Threadblock(0, (recv(0, ((1, 0),)), recv(1), recv(2)), recv_peer=0, channel=0),
            Threadblock(1, (recv(3),), recv_peer=0, channel=1),
        ),
        input_chunks=4,
        output_chunks=4,
    )
    return Algorithm("three-slots", Collective.ALLGATHER, 2, 4, (rank0, rank1))


def test_a_program_that_needs_more_slots_is_refused_when_pipelined():
    algorithm = _needs_three_slots()
    simulate(algorithm, _pair(1.0), 4_000, model=MSCCL_LOOP)  # serialized sends are buffered
    simulate(algorithm, _pair(1.0), 4_000, model=ExecutionModel("wide", None, 3, "three slots"))
    with pytest.raises(VerificationError, match="never run with 2 send slots"):
        simulate(algorithm, _pair(1.0), 4_000, model=MSCCL_PIPELINED)


def test_unknown_model_is_refused():
    assert execution_model("pipelined") is MSCCL_PIPELINED
    with pytest.raises(ArgumentError, match="unknown execution model"):
        simulate(_one_send(), _pair(1.0), 1000, model="fast")


def test_chunkings_of_one_piece_come_first_where_the_slice_loop_pipelines():
    from taccl_py.bounds import lower_bound
    from taccl_py.stages.logical import build_logical_graph
    from taccl_py.stages.sketch import auto_sketch
    from taccl_py.synth.candidates import candidate_chunkings
    from taccl_py.topology import load_topology

    topology = load_topology("dgx2")
    graph = build_logical_graph(topology, auto_sketch(topology))
    large = lower_bound(topology, Collective.ALLGATHER, 10**9)  # 62.5 MB a rank: 30 slices
    sliced = candidate_chunkings(graph, Collective.ALLGATHER, large, model=MSCCL_LOOP)
    whole = candidate_chunkings(graph, Collective.ALLGATHER, large, model=WHOLE_CHUNKS)
    assert [(c.chunkup, c.pieces) for c in sliced[:3]] == [(1, 1), (2, 1), (4, 1)]
    assert all(c.pieces > 1 for c in whole) and not any(c.pipelined_sends for c in sliced)
    assert all(
        c.pipelined_sends for c in candidate_chunkings(graph, Collective.ALLGATHER, large, model=MSCCL_PIPELINED)
    )
    small = lower_bound(topology, Collective.ALLGATHER, 16 * 2**20)  # 1 MiB a rank: one slice
    assert candidate_chunkings(graph, Collective.ALLGATHER, small, model=MSCCL_LOOP) == candidate_chunkings(
        graph, Collective.ALLGATHER, small, model=WHOLE_CHUNKS
    )
