"""The α-β simulator against hand-computed times, its bookkeeping, and the timeline plot."""

from __future__ import annotations

import math

import pytest

from taccl_py.bounds import lower_bound
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective, bus_factor
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.simulate import (
    MSCCL_LOOP,
    prepare_simulation,
    simulate,
    simulate_plan,
    simulate_sizes,
    simulation_result_to_dict,
)
from taccl_py.simulate.plot import plot_timeline
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology

from helpers import ring_algorithm

I, O = Buffer.INPUT, Buffer.OUTPUT
ALPHA_US = 1.5
BANDWIDTH_GBPS = 10.0
BYTES_PER_US = BANDWIDTH_GBPS * 1e3  # 1 GB/s = 1e3 bytes/µs


def _usage(result, resource):
    """Return the LinkUsage of ``resource`` in a simulation result, or None when unused."""
    return next((usage for usage in result.link_usage if usage.resource == resource), None)


def full_mesh(n: int, alpha_us: float = ALPHA_US, bandwidth_GBps: float = BANDWIDTH_GBPS):
    """Return n GPUs, every ordered pair joined by its own link of α and B."""
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(n)]
    links = [
        Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, alpha_us, bandwidth_GBps)
        for a in range(n)
        for b in range(n)
        if a != b
    ]
    return make_topology(f"mesh{n}", gpus, links)


def two_nodes_one_nic(nic_alpha_us: float = ALPHA_US, nic_GBps: float = BANDWIDTH_GBPS):
    """Return 2 machines of 2 GPUs; each machine's GPUs reach the other machine through one NIC link.

    The PCIe links (0 µs, 100 GB/s) never limit; the NIC-to-NIC link carries α and B.
    """
    vertices = [
        Vertex(f"n{m}.gpu{g}", VertexKind.GPU, node=m, local_index=g, rank=2 * m + g)
        for m in range(2)
        for g in range(2)
    ]
    vertices += [Vertex(f"n{m}.nic", VertexKind.NIC, node=m, local_index=0) for m in range(2)]
    links = []
    for m in range(2):
        for g in range(2):
            links += [
                Link(f"n{m}.gpu{g}", f"n{m}.nic", LinkKind.PCIE, 0.0, 100.0),
                Link(f"n{m}.nic", f"n{m}.gpu{g}", LinkKind.PCIE, 0.0, 100.0),
            ]
    links += [
        Link("n0.nic", "n1.nic", LinkKind.IB, nic_alpha_us, nic_GBps),
        Link("n1.nic", "n0.nic", LinkKind.IB, nic_alpha_us, nic_GBps),
    ]
    return make_topology("nic2x2", vertices, links, nodes=2)


def test_single_send_takes_alpha_plus_bytes_over_bandwidth():
    topology = full_mesh(2)
    algorithm = lower_plan("one", Collective.ALLGATHER, 2, 2, [Transfer(0, 1, (I, 0), (O, 0))])
    size = 2_000_000  # chunk = 1 MB
    result = simulate(algorithm, topology, size, record_timeline=True)
    expected = ALPHA_US + 1_000_000 / BYTES_PER_US
    assert result.time_us == pytest.approx(expected, rel=1e-12)
    usage = _usage(result, ("gpu0", "gpu1"))
    assert usage.size_bytes == pytest.approx(1_000_000)
    assert usage.busy_us == pytest.approx(1_000_000 / BYTES_PER_US)
    assert usage.busy_fraction == pytest.approx((1_000_000 / BYTES_PER_US) / expected)
    assert _usage(result, ("gpu1", "gpu0")) is None
    (record,) = result.timeline
    assert (record.resource, record.src_rank, record.dst_rank) == (("gpu0", "gpu1"), 0, 1)
    assert (record.ready_us, record.start_us, record.end_us) == pytest.approx((0.0, ALPHA_US, expected))


def test_ring_allgather_on_uniform_mesh_is_three_steps():
    topology = full_mesh(4)
    size = 4_000_000
    result = simulate(ring_algorithm(Collective.ALLGATHER, 4), topology, size)
    assert result.time_us == pytest.approx(3 * (ALPHA_US + (size / 4) / BYTES_PER_US), rel=1e-12)
    assert result.algbw_GBps == pytest.approx(size / result.time_us / 1e3)
    assert result.busbw_GBps == pytest.approx(result.algbw_GBps * bus_factor(Collective.ALLGATHER, 4))
    bound = lower_bound(topology, Collective.ALLGATHER, size).time_us
    assert result.bound_time_us == pytest.approx(bound)
    assert result.fraction_of_bound == pytest.approx(bound / result.time_us)
    assert result.num_transfers == 12


def test_ring_allreduce_on_uniform_mesh_is_six_steps():
    size = 4_000_000
    result = simulate(ring_algorithm(Collective.ALLREDUCE, 4), full_mesh(4), size)
    assert result.time_us == pytest.approx(6 * (ALPHA_US + (size / 4) / BYTES_PER_US), rel=1e-12)


def test_two_transfers_sharing_a_nic_link_split_it_and_finish_together():
    topology = two_nodes_one_nic()
    plan = [Transfer(0, 2, (I, 0), (O, 0)), Transfer(1, 3, (I, 0), (O, 0))]
    algorithm = lower_plan("share", Collective.ALLREDUCE, 4, 4, plan)
    size = 4_000_000
    chunk = size / 4
    # serialized, so a send holds the link until its bytes arrive (msccl-net frees it α sooner between machines)
    result = simulate(algorithm, topology, size, record_timeline=True, model=MSCCL_LOOP)
    expected = ALPHA_US + 2 * chunk / BYTES_PER_US
    assert result.time_us == pytest.approx(expected, rel=1e-12)
    ends = {(r.src_rank, r.dst_rank): r.end_us for r in result.timeline if r.resource == ("n0.nic", "n1.nic")}
    assert ends[(0, 2)] == pytest.approx(expected) and ends[(1, 3)] == pytest.approx(expected)
    nic = _usage(result, ("n0.nic", "n1.nic"))
    assert nic.size_bytes == pytest.approx(2 * chunk)
    assert nic.busy_fraction == pytest.approx((2 * chunk / BYTES_PER_US) / expected)


def test_different_sizes_on_a_shared_link_share_then_the_larger_runs_alone():
    topology = two_nodes_one_nic()
    plan = [Transfer(0, 2, (I, 0), (O, 0), count=1), Transfer(1, 3, (I, 0), (O, 0), count=3)]
    size = 4_000_000
    b = size / 4
    algorithm = lower_plan("sizes", Collective.ALLREDUCE, 4, 4, plan)
    result = simulate(algorithm, topology, size, record_timeline=True, model=MSCCL_LOOP)  # serialized: as above
    ends = {r.src_rank: r.end_us for r in result.timeline if r.resource == ("n0.nic", "n1.nic")}
    # both at B/2 until the small one has moved b; the large one then has 2b left at B
    assert ends[0] == pytest.approx(ALPHA_US + 2 * b / BYTES_PER_US)
    assert ends[1] == pytest.approx(ALPHA_US + 4 * b / BYTES_PER_US)
    assert result.time_us == pytest.approx(ends[1])


def test_max_min_gives_the_unconstrained_flow_what_the_constrained_one_leaves():
    vertices = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(3)] + [
        Vertex("sw", VertexKind.NVSWITCH)
    ]
    links = [
        Link("gpu0", "sw", LinkKind.NVSWITCH, 0.0, 10.0),
        Link("gpu1", "sw", LinkKind.NVSWITCH, 0.0, 100.0),
        Link("sw", "gpu2", LinkKind.NVSWITCH, 0.0, 30.0),
    ]
    topology = make_topology("maxmin", vertices, links)
    plan = [Transfer(0, 2, (I, 0), (O, 0)), Transfer(1, 2, (I, 0), (O, 1))]
    size = 2_000_000
    b = size / 2
    # gpu0 and gpu1 cannot reach each other: no cut bound, so give one
    result = simulate(
        lower_plan("maxmin", Collective.ALLREDUCE, 3, 2, plan), topology, size, record_timeline=True, bound_time_us=1.0
    )
    ends = {r.src_rank: r.end_us for r in result.timeline if r.resource == ("sw", "gpu2")}
    assert ends[1] == pytest.approx(b / 20e3)  # 30 GB/s minus the 10 GB/s gpu0 can send
    assert ends[0] == pytest.approx(b / 10e3)  # limited by its own 10 GB/s link throughout
    assert _usage(result, ("sw", "gpu2")).busy_us == pytest.approx(b / 10e3)


def test_a_threadblocks_consecutive_sends_each_pay_latency():
    plan = [Transfer(0, 1, (I, 0), (O, 0)), Transfer(0, 1, (I, 1), (O, 1))]
    size = 4_000_000
    result = simulate(lower_plan("two", Collective.ALLREDUCE, 2, 2, plan), full_mesh(2), size)
    assert result.time_us == pytest.approx(2 * (ALPHA_US + (size / 2) / BYTES_PER_US))


def test_local_copies_take_no_time():
    algorithm = lower_plan(
        "copies", Collective.ALLGATHER, 2, 2, [LocalCopy(0, (I, 0), (O, 0)), LocalCopy(1, (I, 0), (O, 1))]
    )
    result = simulate(algorithm, full_mesh(2), 1000, bound_time_us=1.0)
    assert result.time_us == 0.0
    assert math.isinf(result.algbw_GBps)
    assert simulation_result_to_dict(result)["algbw_GBps"] is None


def test_simulate_sizes_matches_single_runs_and_plans_are_reusable():
    topology = full_mesh(4)
    algorithm = ring_algorithm(Collective.REDUCESCATTER, 4)
    sizes = (1000, 1_000_000, 1_000_000_000)
    many = simulate_sizes(algorithm, topology, sizes)
    plan = prepare_simulation(algorithm, topology)
    for size, result in zip(sizes, many):
        assert result.time_us == pytest.approx(simulate(algorithm, topology, size).time_us)
        assert simulate_plan(plan, size).time_us == pytest.approx(result.time_us)


def test_alltoall_is_measured_against_its_egress_cut():
    result = simulate(ring_algorithm(Collective.ALLTOALL, 3), full_mesh(3), 3_000_000)
    assert result.time_us == pytest.approx(ALPHA_US + 1_000_000 / BYTES_PER_US)  # one chunk per pair, all at once
    # each GPU sends 2 MB over its 2 links after one link's α: the egress cut with its α (issue 30), met exactly
    assert result.bound_time_us == pytest.approx(ALPHA_US + 1_000_000 / BYTES_PER_US)
    assert simulation_result_to_dict(result)["fraction_of_bound"] == pytest.approx(
        result.bound_time_us / result.time_us
    )


def test_wrong_rank_count_is_an_argument_error():
    with pytest.raises(ArgumentError, match="4 ranks but topology 'mesh2' has 2 GPUs"):
        simulate(ring_algorithm(Collective.ALLGATHER, 4), full_mesh(2), 1000)


@pytest.mark.parametrize("size", [0, -5, 1.5, True])
def test_bad_size_is_an_argument_error(size):
    with pytest.raises(ArgumentError, match="size_bytes"):
        simulate(ring_algorithm(Collective.ALLGATHER, 2), full_mesh(2), size)


def test_unmatched_send_is_a_verification_error():
    sender = RankProgram(0, (Threadblock(0, (Step(OpType.SEND, I, 0, None, 0, 1),), send_peer=1),), 1, 2)
    idle = RankProgram(1, (), 1, 2)
    broken = Algorithm("broken", Collective.ALLGATHER, 2, 2, (sender, idle))
    with pytest.raises(VerificationError, match="unmatched send"):
        simulate(broken, full_mesh(2), 1000)


def test_result_dict_has_links_and_timeline_on_request():
    result = simulate(ring_algorithm(Collective.ALLGATHER, 2), full_mesh(2), 2000, record_timeline=True)
    record = simulation_result_to_dict(result, timeline=True)
    assert record["collective"] == "allgather" and record["num_transfers"] == 2
    assert {u["resource"] for u in record["link_usage"]} == {"gpu0→gpu1", "gpu1→gpu0"}
    assert len(record["timeline"]) == 2
    assert "timeline" not in simulation_result_to_dict(result)


def test_plot_timeline_writes_png_and_svg(tmp_path):
    result = simulate(ring_algorithm(Collective.ALLREDUCE, 4), two_nodes_one_nic(), 4_000_000, record_timeline=True)
    png, svg = tmp_path / "run.png", tmp_path / "run.svg"
    plot_timeline(result, png)
    plot_timeline(result, svg)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text(encoding="utf-8")[:2000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.png", "run.svg"]


def test_plot_timeline_rejects_missing_timeline_and_bad_extension(tmp_path):
    result = simulate(ring_algorithm(Collective.ALLGATHER, 2), full_mesh(2), 2000)
    with pytest.raises(ArgumentError, match="record_timeline=True"):
        plot_timeline(result, tmp_path / "run.png")
    with pytest.raises(ArgumentError, match="expected '.png' or '.svg'"):
        plot_timeline(
            simulate(ring_algorithm(Collective.ALLGATHER, 2), full_mesh(2), 2000, record_timeline=True),
            tmp_path / "run.jpg",
        )
    assert list(tmp_path.iterdir()) == []


# -- cross-check against a naive reference: global max-min recomputed at every event -------------


def _reference_time_us(algorithm: Algorithm, topology, size_bytes: int) -> float:
    """Return the collective time by the model's definition, computed the slow, obvious way."""
    from taccl_py.ir.dataflow import ActionKind, build_dataflow
    from taccl_py.topology.model import route

    flow = build_dataflow(algorithm)
    chunk = size_bytes / algorithm.chunks_per_loop
    sends = {a.id: route(topology, a.rank, a.peer) for a in flow.actions if a.kind is ActionKind.SEND}
    size = {a.id: a.sources[0].count * chunk for a in flow.actions if a.kind is ActionKind.SEND}
    finished: dict[int, float] = {}
    waiting: dict[int, float] = {}  # send -> when its bytes start (after α)
    active: dict[int, float] = {}  # send -> bytes left
    now = 0.0
    while len(finished) < len(flow.actions):
        changed = True
        while changed:
            changed = False
            for a in flow.actions:
                if (
                    a.id in finished
                    or a.id in waiting
                    or a.id in active
                    or any(p not in finished for p in flow.predecessors[a.id])
                ):
                    continue
                if a.kind is ActionKind.SEND:
                    waiting[a.id] = now + sends[a.id].alpha_us
                else:
                    finished[a.id] = now
                changed = True
            for a, start in list(waiting.items()):
                if start <= now:
                    del waiting[a]
                    active[a] = size[a]
        if not active and not waiting:
            break
        rates = _reference_max_min(
            {a: sends[a].resources for a in active}, {l.key: l.bandwidth_GBps * 1e3 for l in topology.links}
        )
        step = min([left / rates[a] for a, left in active.items()] + [start - now for start in waiting.values()])
        now += step
        for a in list(active):
            active[a] -= rates[a] * step
            if active[a] <= 1e-9 * size[a]:
                del active[a]
                finished[a] = now
    return max(finished.values(), default=0.0)


def _reference_max_min(links_of: dict[int, tuple], capacity: dict) -> dict[int, float]:
    rates: dict[int, float] = {}
    spare = dict(capacity)
    while len(rates) < len(links_of):
        shares = {}
        for link in spare:
            users = [f for f, links in links_of.items() if link in links and f not in rates]
            if users:
                shares[link] = spare[link] / len(users)
        bottleneck = min(shares, key=shares.get)
        for f, links in links_of.items():
            if bottleneck in links and f not in rates:
                rates[f] = shares[bottleneck]
                for link in links:
                    spare[link] -= shares[bottleneck]
    return rates


def _random_topology(rng):
    kind = rng.choice(["mesh", "nic", "switch"])
    if kind == "nic":
        return two_nodes_one_nic(rng.choice([0.0, rng.uniform(0.1, 3.0)]), rng.uniform(2.0, 20.0))
    n = 4
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(n)]
    if kind == "mesh":
        links = [
            Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, rng.choice([0.0, 0.5, 1.0]), rng.choice([5.0, 10.0, 25.0]))
            for a in range(n)
            for b in range(n)
            if a != b
        ]
        return make_topology("rmesh", gpus, links)
    links = []
    for r in range(n):
        links += [
            Link(f"gpu{r}", "sw", LinkKind.NVSWITCH, rng.choice([0.0, 0.3]), rng.choice([10.0, 20.0])),
            Link("sw", f"gpu{r}", LinkKind.NVSWITCH, 0.0, rng.choice([10.0, 30.0])),
        ]
    return make_topology("rswitch", gpus + [Vertex("sw", VertexKind.NVSWITCH)], links)


@pytest.mark.parametrize("seed", range(40))
def test_engine_matches_naive_reference_on_random_plans(seed):
    import random

    rng = random.Random(seed)
    topology = _random_topology(rng)
    n, chunks = 4, 4
    items = []
    for _ in range(rng.randint(3, 14)):
        src, dst = rng.sample(range(n), 2)
        count = rng.randint(1, 2)
        items.append(
            Transfer(
                src,
                dst,
                (I, rng.randint(0, chunks - count)),
                (O, rng.randint(0, chunks - count)),
                count,
                reduce=rng.random() < 0.3,
                channel=rng.randint(0, 1),
            )
        )
        if rng.random() < 0.2:
            items.append(LocalCopy(dst, (O, 0), (O, chunks - 1)))
    algorithm = lower_plan(f"random{seed}", Collective.ALLREDUCE, n, chunks, items)
    size = rng.choice([4_000, 4_000_000, 400_000_000])
    got = simulate(algorithm, topology, size, bound_time_us=1.0, model="chunks").time_us
    assert got == pytest.approx(_reference_time_us(algorithm, topology, size), rel=1e-9)


# -- max-min fair sharing against a plain progressive filling -------------------------------------


def _plain_max_min(links, link_routes, route_links, counts, capacity):
    """Return route -> rate by progressive filling with a full scan for the bottleneck (no heap)."""
    from taccl_py.simulate.fairshare import MIN_RATE_FRACTION

    spare = {link: capacity[link] for link in links}
    unfixed = {link: sum(counts[r] for r in link_routes[link]) for link in links}
    rates = {}
    while any(unfixed.values()):
        share, link = min((spare[l] / unfixed[l], l) for l in links if unfixed[l])
        share = max(share, capacity[link] * MIN_RATE_FRACTION)
        for route in link_routes[link]:  # the link's routes in the order its set lists them
            if route in rates:
                continue
            rates[route] = share
            for other in route_links[route]:
                spare[other] -= share * counts[route]
                unfixed[other] -= counts[route]
    return rates


@pytest.mark.parametrize("seed", range(30))
def test_max_min_sharing_matches_a_plain_progressive_filling_bit_for_bit(seed):
    import random

    from taccl_py.simulate.fairshare import MaxMinSharing

    rng = random.Random(seed)
    num_links = rng.randint(2, 14)
    capacity = [rng.choice([10.0, 25.0, 125.0, 9523.809523809523]) for _ in range(num_links)]
    route_links = [tuple(rng.sample(range(num_links), rng.randint(1, min(4, num_links)))) for _ in range(24)]
    route_flows = [set(range(100 * r, 100 * r + rng.choice([0, 1, 1, 2, 3]))) for r in range(len(route_links))]
    link_routes = [set() for _ in range(num_links)]
    for r in rng.sample(range(len(route_links)), len(route_links)):  # sets filled in a random order
        for link in route_links[r] if route_flows[r] else ():
            link_routes[link].add(r)
    link_count = [sum(len(route_flows[r]) for r in link_routes[link]) for link in range(num_links)]
    active = [r for r in range(len(route_links)) if route_flows[r]]
    if not active:
        return
    sharing = MaxMinSharing(route_links, capacity)
    for _ in range(3):  # the scratch tables are reused between calls
        seeds = set(rng.sample(active, rng.randint(1, len(active))))
        members, links = sharing.component(seeds, link_routes)
        reachable, frontier = set(seeds), list(seeds)
        while frontier:
            for link in route_links[frontier.pop()]:
                for other in link_routes[link] - reachable:
                    reachable.add(other)
                    frontier.append(other)
        assert members == reachable
        assert sorted(links) == sorted({link for r in members for link in route_links[r]})
        table = sharing.rates(links, link_routes, route_flows, link_count)
        counts = [len(flows) for flows in route_flows]
        expected = _plain_max_min(links, link_routes, route_links, counts, capacity)
        assert {r: table[r] for r in members} == expected
