"""Executor and plan compiler, run in one process over the thread transport (LocalHub).

The thread transport copies a message when the receiver waits, straight from the sender's tensor,
so a plan that lets a send's source change too early computes wrong results here.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
from pathlib import Path

import pytest
import torch

from taccl_py.errors import ArgumentError, TransportError, VerificationError
from taccl_py.files import read_any_algorithm
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.inplace import inplace_variant
from taccl_py.ir.lowering import Transfer, lower_plan
from taccl_py.runtime.executor import Executor, block_layout
from taccl_py.runtime.executor.rank_plan import Storage, compile_rank_plan
from taccl_py.runtime.transports.local import LocalHub
from taccl_py.verify import verify_algorithm

from helpers import ring_algorithm

FIXTURES = Path(__file__).parent / "fixtures" / "msccl"
BROKEN_XML = "sccl_allreduce_dgx1_composed.xml"
I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def msccl_algorithms() -> list[Algorithm]:
    """Return every reference XML except the one known to be wrong."""
    return [read_any_algorithm(path) for path in sorted(FIXTURES.glob("*/*.xml")) if path.name != BROKEN_XML]


def make_inputs(algorithm: Algorithm, numel: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    in_blocks, _, _ = block_layout(algorithm.collective, algorithm.num_ranks, algorithm.chunks_per_loop)
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-8, 9, (in_blocks * numel,), generator=generator).to(dtype) for _ in range(algorithm.num_ranks)
    ]


def expected(algorithm: Algorithm, inputs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    """Return what each rank's output must be, computed with torch on the gathered inputs."""
    n = algorithm.num_ranks
    stacked = torch.stack(inputs)
    if algorithm.collective is Collective.ALLGATHER:
        return [torch.cat(inputs)] * n
    if algorithm.collective is Collective.ALLTOALL:
        return [torch.cat([inputs[q].view(n, -1)[r] for q in range(n)]) for r in range(n)]
    reduced = {"sum": stacked.sum(0), "max": stacked.max(0).values, "min": stacked.min(0).values}.get(op)
    if op == "avg":
        total = stacked.sum(0).to(stacked.dtype)
        reduced = total / n if total.dtype.is_floating_point else torch.div(total, n, rounding_mode="trunc")
    reduced = reduced.to(inputs[0].dtype)
    if algorithm.collective is Collective.REDUCESCATTER:
        return list(reduced.view(n, -1))
    return [reduced] * n


def run_threads(
    algorithm: Algorithm,
    inputs: list[torch.Tensor],
    numel: int,
    op: str = "sum",
    timeout_s: float = 10.0,
    executors: list[Executor] | None = None,
    prepost: bool = False,
    segment_bytes: int | None = None,
) -> list[torch.Tensor]:
    """Run ``algorithm`` on one thread per rank; return the outputs (raise the first rank's error)."""
    n = algorithm.num_ranks
    hub = LocalHub(n)
    executors = executors or [
        Executor(algorithm, r, inputs[0].dtype, numel, prepost_receives=prepost, segment_bytes=segment_bytes)
        for r in range(n)
    ]
    outputs = [torch.full((executors[r].expected_numels()[1],), 99, dtype=inputs[0].dtype) for r in range(n)]
    errors: dict[int, BaseException] = {}

    def work(rank: int) -> None:
        try:
            executors[rank].run(outputs[rank], inputs[rank], hub.transport(rank), op, timeout_s)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors[rank] = error
            hub.fail(f"rank {rank} failed: {error}")

    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s * 4)
    if errors:
        raise errors[min(errors)]
    return outputs


def assert_runs_correctly(
    algorithm: Algorithm, numel: int, dtype: torch.dtype = torch.float32, op: str = "sum", seed: int = 0
) -> None:
    """Run plain, with receives posted ahead, and with messages cut into segments (reduced as they
    arrive); each must give torch's result and keep the inputs."""
    for prepost, segment_bytes in ((False, None), (True, None), (True, 40)):
        inputs = make_inputs(algorithm, numel, dtype, seed)
        kept = [t.clone() for t in inputs]
        outputs = run_threads(algorithm, inputs, numel, op, prepost=prepost, segment_bytes=segment_bytes)
        for rank, (got, want) in enumerate(zip(outputs, expected(algorithm, kept, op))):
            variant = f"prepost={prepost} segment_bytes={segment_bytes}"
            assert torch.equal(got, want), (
                f"{algorithm.name} {variant} rank {rank} numel {numel} {dtype} {op}: {got[:8].tolist()} != "
                f"{want[:8].tolist()}"
            )
        for rank, (now, before) in enumerate(zip(inputs, kept)):
            assert torch.equal(now, before), f"{algorithm.name}: rank {rank}'s input was modified"


# -- the plan ---------------------------------------------------------------------------------------


def test_ring_allgather_plan_posts_one_message_each_way_per_round() -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 4)
    plan = compile_rank_plan(algorithm, 2)
    transfer_rounds = [r for r in plan.rounds if r.sends or r.recvs]
    assert len(transfer_rounds) == 3
    assert all(len(r.sends) == 1 and len(r.recvs) == 1 for r in transfer_rounds)
    assert {m.peer for r in transfer_rounds for m in r.sends} == {3}
    assert {m.peer for r in transfer_rounds for m in r.recvs} == {1}
    assert plan.snapshot_chunks == 0
    waited = set(plan.final_send_waits) | {i for r in plan.rounds for i in r.send_waits}
    assert waited == set(range(plan.num_sends))


def swap_through_scratch() -> Algorithm:
    """Return a 2-rank allgather whose ranks send scratch chunk 0 while receiving into it."""
    programs = []
    for rank in range(2):
        other = 1 - rank
        local = Threadblock(
            0,
            (
                Step(OpType.COPY, I, 0, S, 0),
                Step(OpType.COPY, S, 0, O, other, depends=((1, 1),)),
                Step(OpType.COPY, I, 0, O, rank),
            ),
        )
        wire = Threadblock(
            1,
            (Step(OpType.SEND, S, 0, depends=((0, 0),)), Step(OpType.RECV, None, 0, S, 0)),
            send_peer=other,
            recv_peer=other,
        )
        programs.append(RankProgram(rank, (local, wire), 1, 2, 1))
    return Algorithm("swap", Collective.ALLGATHER, 2, 2, tuple(programs))


def test_receives_are_posted_a_round_early_only_where_nothing_touches_their_target() -> None:
    ring = compile_rank_plan(ring_algorithm(Collective.ALLREDUCE, 4, inplace=True), 1, prepost_receives=True)
    assert sum(len(r.early_recvs) for r in ring.rounds) >= 4
    assert ring.rounds[-1].early_recvs == ()
    swap = compile_rank_plan(swap_through_scratch(), 0, prepost_receives=True)
    # the scratch chunk is written by a copy the round before its receive: that receive must wait
    assert all(m.span.storage is not Storage.SCRATCH for r in swap.rounds for m in r.early_recvs)
    assert sum(len(r.recvs) for r in swap.rounds) == 1


def test_segments_are_reduced_and_forwarded_as_they_arrive() -> None:
    algorithm = ring_algorithm(Collective.ALLREDUCE, 4, inplace=True)
    executor = Executor(algorithm, 1, torch.float32, 4000, prepost_receives=True, segment_bytes=1000)
    tensor = torch.zeros(4000)
    rounds = executor._binding(tensor, tensor).rounds
    first = next(r for r in rounds if r.computes)
    assert len(first.computes) == 4 and [c[4] for c in first.computes] == [0, 1, 2, 3]  # 4 segments of 250 floats
    assert first.eager == [(0, -1), (1, -1), (2, -1), (3, -1)]  # each forwarded once reduced
    plain = Executor(algorithm, 1, torch.float32, 4000)._binding(tensor, tensor).rounds
    assert all(r.eager is None for r in plain) and max(len(r.computes) for r in plain) == 1


def test_send_source_received_into_in_the_same_round_is_snapshotted() -> None:
    algorithm = swap_through_scratch()
    assert verify_algorithm(algorithm).ok
    plan = compile_rank_plan(algorithm, 0)
    assert plan.snapshot_chunks == 1
    assert any(r.snapshots and r.recvs for r in plan.rounds)
    assert_runs_correctly(algorithm, 5)


def test_without_the_snapshot_the_thread_transport_exposes_the_race() -> None:
    algorithm = swap_through_scratch()
    executors = []
    for rank in range(2):
        executor = Executor(algorithm, rank, torch.float32, 3)
        source_of = {copy: source for r in executor.plan.rounds for copy, source in r.snapshots}
        assert source_of and all(copy.storage is Storage.SNAP for copy in source_of)
        rounds = tuple(
            dataclasses.replace(
                r,
                snapshots=(),
                sends=tuple(dataclasses.replace(m, span=source_of.get(m.span, m.span)) for m in r.sends),
            )
            for r in executor.plan.rounds
        )
        executor.plan = dataclasses.replace(executor.plan, rounds=rounds)  # send straight from the scratch chunk
        executors.append(executor)
    inputs = [torch.full((3,), 1.0), torch.full((3,), 2.0)]
    outputs = run_threads(algorithm, inputs, 3, executors=executors)
    # whichever rank's receive copies second reads a scratch chunk its peer already overwrote
    assert not all(torch.equal(out, torch.cat(inputs)) for out in outputs), "the broken plan should have lost a chunk"


# -- correctness on every algorithm kind ------------------------------------------------------------


@pytest.mark.parametrize(
    "collective",
    [Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE, Collective.ALLTOALL],
    ids=lambda c: c.value,
)
@pytest.mark.parametrize("num_ranks", [2, 3, 4])
def test_lowered_rings_on_odd_sizes(collective: Collective, num_ranks: int) -> None:
    algorithm = ring_algorithm(collective, num_ranks)
    for numel in (1, 2, 7, 64, 1001):
        assert_runs_correctly(algorithm, numel, seed=numel)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64], ids=str
)
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_every_dtype_and_op(dtype: torch.dtype, op: str) -> None:
    for algorithm in (
        ring_algorithm(Collective.ALLREDUCE, 4, inplace=True),
        ring_algorithm(Collective.REDUCESCATTER, 3),
    ):
        assert_runs_correctly(algorithm, 13, dtype, op, seed=3)


@pytest.mark.parametrize("algorithm", msccl_algorithms(), ids=lambda a: f"{a.name}-{a.num_ranks}")
def test_msccl_reference_xmls(algorithm: Algorithm) -> None:
    ops = ("sum", "max") if algorithm.collective.reduces else ("sum",)
    for numel, op in [(numel, op) for numel in (1, 37) for op in ops]:
        assert_runs_correctly(algorithm, numel, torch.int64, op, seed=numel)


def test_the_known_broken_xml_gives_wrong_results() -> None:
    algorithm = read_any_algorithm(FIXTURES / "microsoft" / BROKEN_XML)
    inputs = make_inputs(algorithm, 8, torch.float32, 1)
    outputs = run_threads(algorithm, [t.clone() for t in inputs], 8)
    assert any(not torch.equal(got, want) for got, want in zip(outputs, expected(algorithm, inputs, "sum")))


def test_inplace_allreduce_reduces_the_callers_tensor() -> None:
    algorithm = ring_algorithm(Collective.ALLREDUCE, 2, inplace=True)
    hub = LocalHub(2)
    tensors = [torch.arange(6, dtype=torch.float64) + 10 * r for r in range(2)]
    threads = [
        threading.Thread(
            target=Executor(algorithm, r, torch.float64, 6).run, args=(tensors[r], tensors[r], hub.transport(r))
        )
        for r in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert tensors[0].tolist() == tensors[1].tolist() == [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]


def test_bindings_are_reused_while_the_callers_tensors_live_and_dropped_with_them() -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 2)
    executors = [Executor(algorithm, r, torch.float32, 4) for r in range(2)]
    held = []
    for seed in range(3):
        inputs = make_inputs(algorithm, 4, torch.float32, seed)
        outputs = run_threads(algorithm, inputs, 4, executors=executors)
        assert torch.equal(outputs[0], torch.cat(inputs))
        held.append((inputs, outputs))
    assert all(len(e._bindings) == 2 for e in executors)  # the last two of three live pairs
    del held, inputs, outputs
    gc.collect()
    assert all(len(e._bindings) == 0 for e in executors)


def aliased_pair(collective: Collective, data: torch.Tensor, rank: int, num_ranks: int) -> tuple[torch.Tensor, ...]:
    """Return (output, input) of MSCCL's in-place call on rank ``rank`` holding ``data`` as its input."""
    if collective is Collective.ALLGATHER:
        buffer = torch.full((num_ranks * data.numel(),), 99, dtype=data.dtype)
        buffer.chunk(num_ranks)[rank].copy_(data)
        return buffer, buffer.chunk(num_ranks)[rank]
    buffer = data.clone()
    return (buffer.chunk(num_ranks)[rank] if collective is Collective.REDUCESCATTER else buffer), buffer


def run_aliased(collective: Collective, seed: int) -> tuple[Algorithm, list, list, list]:
    """Run the in-place variant of a 4-rank ring on aliased tensors; return ring, inputs, tensor pairs, executors."""
    n, numel = 4, 12  # 12 divides into the allreduce's 4 chunks: no padding, so no copy at all
    ring = ring_algorithm(collective, n)
    variant = inplace_variant(ring)
    assert variant.inplace and verify_algorithm(variant).ok
    inputs = make_inputs(ring, numel, torch.float32, seed=seed)
    pairs = [aliased_pair(collective, inputs[r], r, n) for r in range(n)]
    executors = [Executor(variant, r, torch.float32, numel) for r in range(n)]
    hub = LocalHub(n)
    threads = [
        threading.Thread(target=executors[r].run, args=(*pairs[r], hub.transport(r), "sum", 10.0)) for r in range(n)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    return ring, inputs, pairs, executors


@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.ALLREDUCE], ids=lambda c: c.value)
def test_an_inplace_variant_on_aliased_tensors_copies_nothing(collective: Collective) -> None:
    ring, inputs, pairs, executors = run_aliased(collective, seed=11)
    for rank, ((output, input), want) in enumerate(zip(pairs, expected(ring, inputs, "sum"))):
        binding = executors[rank]._binding(output, input)
        assert (binding.copy_in, binding.copy_out) == ([], []), f"rank {rank} copied the rank's block"
        assert torch.equal(output, want), f"rank {rank}: {output[:8].tolist()} != {want[:8].tolist()}"
    # calls that do not alias still run the variant correctly, through copies
    outputs = run_threads(inplace_variant(ring), [t.clone() for t in inputs], 12)
    assert all(torch.equal(got, want) for got, want in zip(outputs, expected(ring, inputs, "sum")))


def test_an_inplace_reducescatter_on_aliased_tensors_leaves_the_other_blocks() -> None:
    ring, inputs, pairs, _executors = run_aliased(Collective.REDUCESCATTER, seed=12)
    for rank, ((output, buffer), want) in enumerate(zip(pairs, expected(ring, inputs, "sum"))):
        assert torch.equal(output, want)
        others = [block for b, block in enumerate(buffer.chunk(4)) if b != rank]
        assert all(
            torch.equal(got, block)
            for got, block in zip(others, [b for i, b in enumerate(inputs[rank].chunk(4)) if i != rank])
        ), "torch's backends leave the other blocks of an in-place reduce_scatter's input as they were"


# -- errors -----------------------------------------------------------------------------------------


def test_unsupported_dtype_is_refused() -> None:
    with pytest.raises(ArgumentError, match="dtype: torch.complex64 is not supported"):
        Executor(ring_algorithm(Collective.ALLGATHER, 2), 0, torch.complex64, 4)


def test_wrong_shape_is_refused_before_anything_is_sent() -> None:
    executor = Executor(ring_algorithm(Collective.ALLGATHER, 2), 0, torch.float32, 4)
    hub = LocalHub(2)
    with pytest.raises(ArgumentError, match="output: 7 elements; expected 8 elements"):
        executor.run(torch.zeros(7), torch.zeros(4), hub.transport(0))
    with pytest.raises(ArgumentError, match="input: not contiguous"):
        executor.run(torch.zeros(8), torch.zeros(4, 2)[:, 0], hub.transport(0))
    with pytest.raises(ArgumentError, match="op: 'prod'"):
        executor.run(torch.zeros(8), torch.zeros(4), hub.transport(0), op="prod")
    with pytest.raises(ArgumentError, match="transport: rank 1 of 2; expected rank 0 of 2"):
        executor.run(torch.zeros(8), torch.zeros(4), hub.transport(1))


def test_structurally_broken_algorithm_is_refused() -> None:
    lonely = lower_plan("lonely", Collective.ALLGATHER, 2, 2, [Transfer(0, 1, (I, 0), (O, 0))])
    programs = (lonely.ranks[0], dataclasses.replace(lonely.ranks[1], threadblocks=()))
    with pytest.raises(VerificationError, match="unmatched send"):
        Executor(dataclasses.replace(lonely, ranks=programs), 0, torch.float32, 4)


def test_a_silent_peer_times_out_with_a_transport_error_naming_it() -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 2)
    hub = LocalHub(2)
    executor = Executor(algorithm, 0, torch.float32, 2)
    with pytest.raises(
        TransportError, match=r"rank 0: receive from rank 1 failed in round \d+ \(threadblock \d+, step \d+\)"
    ):
        executor.run(torch.zeros(4), torch.ones(2), hub.transport(0), timeout_s=0.2)


def test_scratch_used_on_another_cuda_stream_is_recorded_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caching allocator must not hand the scratch out again while another stream still uses it."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: streams and the caching allocator need a GPU")
    from taccl_py.runtime.executor import Executor
    from taccl_py.runtime.measure.bench import _NullTransport

    algorithm = ring_algorithm(Collective.ALLREDUCE, 4, inplace=True)
    executor = Executor(algorithm, 0, torch.float32, 8, "cuda")
    tensor = torch.ones(executor.expected_numels()[0], device="cuda")
    recorded = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: recorded.append(stream))
    executor.run(tensor, tensor, _NullTransport(0, 4))
    assert recorded == []  # the stream it was built on
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        executor.run(tensor, tensor, _NullTransport(0, 4))
    assert recorded and set(recorded) == {side}
