"""Switch steps (NVLink SHARP multimem) in the IR: replay, races, barriers and the simulator's cost."""

from __future__ import annotations

import pytest

from taccl_py.baselines.nvls import nvls_allreduce_times
from taccl_py.bounds.reduction import in_network_reduction_bounds
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import ActionKind, build_dataflow
from taccl_py.simulate import simulate, simulate_sizes
from taccl_py.topology import load_topology
from taccl_py.verify import verify_algorithm

GROUP = tuple(range(8))


def _switch_allreduce(*, channels: int = 1, inplace: bool = False, slice_of=lambda r, c, ch: r * ch + c) -> Algorithm:
    """An NVLS AllReduce: rank r reduce-stores its slices over the whole machine."""
    chunks = 8 * channels
    dst = Buffer.INPUT if inplace else Buffer.OUTPUT
    ranks = []
    for r in GROUP:
        tbs = tuple(
            Threadblock(
                c,
                (
                    Step(
                        OpType.SWITCH_REDUCE_STORE,
                        Buffer.INPUT,
                        slice_of(r, c, channels),
                        dst,
                        slice_of(r, c, channels),
                    ),
                ),
                channel=c,
                switch_group=GROUP,
            )
            for c in range(channels)
        )
        ranks.append(RankProgram(r, tbs, chunks, chunks))
    return Algorithm("switch-ar", Collective.ALLREDUCE, 8, chunks, tuple(ranks), inplace=inplace)


def _multicast_allgather() -> Algorithm:
    ranks = tuple(
        RankProgram(
            r,
            (Threadblock(0, (Step(OpType.SWITCH_STORE, Buffer.INPUT, 0, Buffer.OUTPUT, r),), switch_group=GROUP),),
            1,
            8,
        )
        for r in GROUP
    )
    return Algorithm("switch-ag", Collective.ALLGATHER, 8, 8, ranks)


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_a_reduce_store_per_rank_slice_is_an_allreduce(inplace):
    assert verify_algorithm(_switch_allreduce(channels=2, inplace=inplace)).ok


def test_a_multicast_store_of_each_block_is_an_allgather():
    assert verify_algorithm(_multicast_allgather()).ok


def test_two_members_storing_one_chunk_in_one_group_step_race():
    report = verify_algorithm(_switch_allreduce(slice_of=lambda r, c, ch: r // 2 * 2))
    kinds = {v.kind for v in report.violations}
    assert not report.ok and "race" in kinds


def test_a_switch_step_without_a_group_or_a_member_missing_is_refused():
    algorithm = _switch_allreduce()
    lonely = Threadblock(0, algorithm.ranks[0].threadblocks[0].steps)  # no switch_group
    broken = Algorithm(
        "x", Collective.ALLREDUCE, 8, 8, (RankProgram(0, (lonely,), 8, 8), *algorithm.ranks[1:]), inplace=False
    )
    assert "on a threadblock with no switch group" in build_dataflow(broken).violations[0].message
    short = RankProgram(3, (Threadblock(0, (), switch_group=GROUP),), 8, 8)
    missing = Algorithm("x", Collective.ALLREDUCE, 8, 8, (*algorithm.ranks[:3], short, *algorithm.ranks[4:]))
    assert any(v.kind == "unmatched switch step" for v in build_dataflow(missing).violations)


def test_barriers_join_every_members_group_step():
    flow = build_dataflow(_switch_allreduce(channels=1))
    switch = [a for a in flow.actions if a.kind is ActionKind.SWITCH_REDUCE]
    assert len(switch) == 8 and all(a.group == GROUP for a in switch)
    # a reduce-store reading every member's input waits for nothing else on one machine: no preds
    assert all(flow.predecessors[a.id] == () for a in switch)


def test_a_switch_step_reading_before_a_member_wrote_its_operand_is_caught():
    """Rank 0 copies into scratch, then every member reduces scratch: the barrier orders the copy first."""
    ranks = []
    for r in GROUP:
        steps = (Step(OpType.COPY, Buffer.INPUT, 0, Buffer.SCRATCH, 0, 8),)
        copy = Threadblock(0, steps)
        reduce = Threadblock(
            1,
            (Step(OpType.SWITCH_REDUCE_STORE, Buffer.SCRATCH, r, Buffer.OUTPUT, r, depends=((0, 0),)),),
            switch_group=GROUP,
        )
        ranks.append(RankProgram(r, (copy, reduce), 8, 8, 8))
    good = Algorithm("staged", Collective.ALLREDUCE, 8, 8, tuple(ranks))
    assert verify_algorithm(good).ok
    # without rank 5's dependency its copy races with the other members' reads of its scratch
    bad_reduce = Threadblock(
        1, (Step(OpType.SWITCH_REDUCE_STORE, Buffer.SCRATCH, 5, Buffer.OUTPUT, 5),), switch_group=GROUP
    )
    bad_ranks = list(ranks)
    bad_ranks[5] = RankProgram(5, (ranks[5].threadblocks[0], bad_reduce), 8, 8, 8)
    report = verify_algorithm(Algorithm("staged", Collective.ALLREDUCE, 8, 8, tuple(bad_ranks)))
    assert "race" in {v.kind for v in report.violations}


def test_a_switch_allreduce_times_as_nccls_nvls_model_on_whole_chunks():
    """One reduce-store per rank slice moves M(1 + 1/8) per port at the NVLS rate: NCCL's NVLS time."""
    topology = load_topology("dgx-h100")
    sizes = [2**16, 2**24, 2**30]
    results = simulate_sizes(_switch_allreduce(channels=2), topology, sizes, model="chunks")
    for result, nvls, bound in zip(
        results, nvls_allreduce_times(topology, sizes), in_network_reduction_bounds(topology, sizes)
    ):
        assert result.time_us == pytest.approx(nvls.time_us, rel=1e-9)
        assert result.bound_time_us == pytest.approx(bound.time_us)  # the in-network bound, not RS + AG
        assert result.time_us >= bound.time_us


def test_switch_traffic_shares_the_port_with_point_to_point_traffic():
    """A multicast AllGather runs at the NVLS rate; the port's other traffic gets what the twin leaves."""
    topology = load_topology("dgx-h100")
    size = 2**30
    alone = simulate(_multicast_allgather(), topology, size, model="chunks")
    rate = 308.6e3  # bytes/µs: the switch's reduce_bandwidth_GBps, capped by the 370.8 GB/s port
    # every member, the storer included, takes all 8 blocks through its port: M at the NVLS rate
    assert alone.time_us == pytest.approx(0.6 + size / rate, rel=1e-9)
    assert alone.time_us >= alone.bound_time_us


def test_a_switch_group_without_a_reducing_switch_is_refused():
    with pytest.raises(ArgumentError, match="switch_group"):
        simulate(_switch_allreduce(), load_topology("dgx-a100"), 2**20)


def _mixed_allgather() -> Algorithm:
    """Each rank multicasts the first half of its block and sends the second half to every peer."""
    ranks = []
    for r in GROUP:
        tbs = [Threadblock(0, (Step(OpType.SWITCH_STORE, Buffer.INPUT, 0, Buffer.OUTPUT, 2 * r),), switch_group=GROUP)]
        tbs.append(Threadblock(1, (Step(OpType.COPY, Buffer.INPUT, 1, Buffer.OUTPUT, 2 * r + 1),)))
        for peer in (p for p in GROUP if p != r):
            steps = (
                Step(OpType.SEND, Buffer.INPUT, 1),
                Step(OpType.RECV, dst_buffer=Buffer.OUTPUT, dst_offset=2 * peer + 1),
            )
            tbs.append(Threadblock(len(tbs), steps, send_peer=peer, recv_peer=peer))
        ranks.append(RankProgram(r, tuple(tbs), 2, 16))
    return Algorithm("mixed-ag", Collective.ALLGATHER, 8, 16, tuple(ranks))


def test_switch_and_point_to_point_flows_share_a_port_max_min_fairly():
    """15 flows into each port (8 multicast, 7 peer sends) split its 370.8 GB/s; the NVLS twin never binds."""
    algorithm = _mixed_allgather()
    assert verify_algorithm(algorithm).ok
    size = 2**30
    result = simulate(algorithm, load_topology("dgx-h100"), size, model="chunks")
    assert result.time_us == pytest.approx(0.6 + size / 16 / (370.8e3 / 15), rel=1e-9)


def test_switch_groups_survive_the_json_round_trip_and_msccl_xml_refuses_them(tmp_path):
    from taccl_py.ir.algorithm_json import generate_algorithm_json, parse_algorithm_json
    from taccl_py.msccl.export import generate_msccl_xml

    algorithm = _switch_allreduce(channels=2)
    again = parse_algorithm_json(generate_algorithm_json(algorithm), "a.json")
    assert again.ranks == algorithm.ranks and again.uses_switch and again.reduces_in_switch
    with pytest.raises(ArgumentError, match="no MSCCL-IR form"):
        generate_msccl_xml(algorithm)
