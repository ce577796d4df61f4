"""AllReduce whose reduce and gather phases cut the data differently (``mixed_allreduce``)."""

from __future__ import annotations

import pytest
from test_executor import assert_runs_correctly

from taccl_py.ir.collectives import Collective
from taccl_py.simulate import simulate
from taccl_py.solvers import SolverOptions
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth import synthesize
from taccl_py.synth.compose import Chunking, gather_after_reduce, mixed_allreduce, synthesize_chunking
from taccl_py.topology import load_topology

from helpers import assert_valid_algorithm

MB = 1_000_000
SIZE = 64 * MB


@pytest.fixture(scope="module")
def ndv2_candidates():
    """Two AllReduce candidates on one NDv2: 2 and 6 buffer chunks per rank."""
    topology = load_topology("ndv2")
    graph = build_logical_graph(topology, auto_sketch(topology))
    options = SolverOptions(time_limit_s=20)
    made = [
        synthesize_chunking(graph, Collective.ALLREDUCE, Chunking(k, p, SIZE), options, name=f"c{k}p{p}")
        for k, p in ((1, 2), (2, 3))
    ]
    return topology, made


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["coarse-reduce", "fine-reduce"])
def test_phases_of_different_chunkings_make_one_allreduce(ndv2_candidates, order):
    topology, made = ndv2_candidates
    reduce, gather = (made[i] for i in order)
    mixed = mixed_allreduce(reduce, gather, "mixed")
    assert mixed.label == f"{reduce.label}+{gather.label}"
    # The buffer is cut into the finer of the two: lcm(1 * 2, 2 * 3) chunks per rank.
    assert mixed.algorithm.chunks_per_loop == 8 * 6
    assert_valid_algorithm(mixed.algorithm)
    predicted = reduce.schedules[0].makespan_us + gather.schedules[1].makespan_us
    simulated = simulate(mixed.algorithm, topology, SIZE).time_us
    assert simulated == pytest.approx(predicted, rel=1e-6)
    assert_runs_correctly(mixed.algorithm, numel=3)


def test_synthesis_pairs_the_fastest_phases_of_different_chunkings():
    # Two PCIe machines at 1.024 MB (on the libraries' 1KB x4 ladder): reducing is fastest with two
    # chunks per rank, gathering with one chunk in two pieces; the pair is a candidate beside the others.
    # Under msccl (every send serialized): with the network's sends pipelined one chunking wins both phases.
    result = synthesize(load_topology("pcie-8gpu", nodes=2), "allreduce", size_bytes=1_024_000, model="msccl")
    mixed = [label for label in result.candidates if "+" in label.split("@")[0]]
    assert mixed == ["c2p1+c1p2@1024000:optimal", "c2p1+c1p2-barrier@1024000:optimal"]
    assert_valid_algorithm(result.algorithm)


def test_a_barrier_holds_each_ranks_gather_until_its_reduction_is_done(ndv2_candidates):
    topology, made = ndv2_candidates
    plain = made[1]
    barrier = gather_after_reduce(plain, "barrier")
    assert barrier.phase_barrier and barrier.label == f"{plain.label}-barrier"
    assert dict(barrier.algorithm.metadata)["phase_barrier"] == "rank"
    assert_valid_algorithm(barrier.algorithm)
    assert_runs_correctly(barrier.algorithm, numel=2)
    # Same steps, more dependencies: never earlier than the plain lowering's gather.
    plain_steps = [len(tb.steps) for prog in plain.algorithm.ranks for tb in prog.threadblocks]
    assert [len(tb.steps) for prog in barrier.algorithm.ranks for tb in prog.threadblocks] == plain_steps
    added = sum(len(step.depends) for prog in barrier.algorithm.ranks for tb in prog.threadblocks for step in tb.steps)
    assert added > sum(
        len(step.depends) for prog in plain.algorithm.ranks for tb in prog.threadblocks for step in tb.steps
    )
    assert (
        simulate(barrier.algorithm, topology, SIZE).time_us >= simulate(plain.algorithm, topology, SIZE).time_us - 1e-6
    )


@pytest.mark.slow  # a minute: one DGX-2 x2 synthesis simulated at 1 GB; the barrier's lowering is checked on ndv2 above
def test_the_barrier_wins_where_gather_traffic_would_slow_the_reduction():
    # DGX-2 x2 at 1 GB, two chunks per rank in four pieces, whole chunks: 16.6 ms without, 15.9 ms with.
    topology = load_topology("dgx2", nodes=2)
    graph = build_logical_graph(topology, auto_sketch(topology))
    chunking = Chunking(2, 4, 1000 * MB)
    plain = synthesize_chunking(graph, Collective.ALLREDUCE, chunking, SolverOptions(), name="plain")
    barrier = gather_after_reduce(plain, "barrier")
    times = [simulate(c.algorithm, topology, 1000 * MB, model="chunks").time_us for c in (plain, barrier)]
    assert times[1] < 0.97 * times[0]
    # MSCCL's slice loop runs each pass's reduction and gather closer together: the barrier still wins
    sliced = [simulate(c.algorithm, topology, 1000 * MB).time_us for c in (plain, barrier)]
    assert sliced[1] < 0.99 * sliced[0]
