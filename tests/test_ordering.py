"""Ordering: greedy list scheduling of piece sends over the routed trees."""

from __future__ import annotations

from collections import defaultdict

import pytest
from test_routing import ring_topology

from taccl_py.stages.logical import LogicalLink, build_logical_graph
from taccl_py.stages.ordering import is_slow_link, occupy_resources, order_sends, remaining_path_us, send_lane
from taccl_py.stages.routing import greedy_routing
from taccl_py.stages.sketch.model import Sketch
from taccl_py.topology import load_topology

MB = 1_000_000


def ordered(topology, chunkup: int, pieces: int, size: float):
    graph = build_logical_graph(topology, Sketch())
    chunk = size / (graph.num_ranks * chunkup)
    return order_sends(greedy_routing(graph, chunkup, chunk, chunk / pieces), pieces, chunk / pieces)


def test_every_piece_reaches_every_rank_once():
    ordering = ordered(ring_topology(), 1, 3, 12 * MB)
    got = defaultdict(set)
    for send in ordering.sends:
        got[(send.chunk, send.piece)].add(ordering.routing.graph.links[send.link].dst)
    assert len(got) == 4 * 3
    assert all(len(ranks) == 3 for ranks in got.values())


def test_sends_follow_their_data_and_their_queue():
    ordering = ordered(load_topology("ndv2", nodes=2), 1, 2, 16 * MB)
    last_end: dict[tuple, float] = {}
    starts = [s.start_us for s in ordering.sends]
    assert starts == sorted(starts), "sends are listed in start order"
    for send in ordering.sends:
        if send.parent is not None:
            parent = ordering.sends[send.parent]
            assert (parent.chunk, parent.piece) == (send.chunk, send.piece)
            assert send.start_us >= parent.end_us - 1e-9
        assert send.start_us >= last_end.get(send.lane, 0.0) - 1e-9, "a queue runs one send at a time"
        last_end[send.lane] = send.end_us


def test_network_sends_of_a_rank_share_one_queue():
    graph = build_logical_graph(load_topology("ndv2", nodes=2), Sketch())
    lanes = {send_lane(graph, l) for l, link in enumerate(graph.links) if link.internode and link.src == 0}
    assert len(lanes) == 1
    intra = [send_lane(graph, l) for l, link in enumerate(graph.links) if not link.internode]
    assert len(set(intra)) == len(intra)


def test_longest_remaining_path_goes_first():
    graph = build_logical_graph(ring_topology(), Sketch())
    routing = greedy_routing(graph, 1, MB, MB)
    below = remaining_path_us(graph, routing.trees[0], MB)
    assert below[0] == pytest.approx(max(below.values()))


def test_resource_queues():
    link = LogicalLink(0, 1, 1.0, 10.0, (("a", "b"), ("b", "c")), (10.0, 20.0))
    free: dict = {}
    assert occupy_resources(link, 0.0, 10_000, free) == pytest.approx(2.0)  # 1 µs + 10 kB at 10 GB/s
    assert free[("b", "c")] == pytest.approx(1.5)
    # a second send queues behind the first on the slower resource
    assert occupy_resources(link, 0.0, 10_000, free) == pytest.approx(3.0)


def test_pipelined_sends_pay_alpha_after_their_bytes():
    link = LogicalLink(0, 1, 1.0, 10.0, (("a", "b"),), (10.0,))
    free: dict = {}
    # bytes from 0 to 1 µs, delivered α later; the next send's bytes follow at once
    assert occupy_resources(link, 0.0, 10_000, free, pipelined=True) == pytest.approx(2.0)
    assert free[("a", "b")] == pytest.approx(1.0)
    assert occupy_resources(link, 1.0, 10_000, free, pipelined=True) == pytest.approx(3.0)


def test_a_pipelined_lane_starts_its_next_send_when_the_bytes_have_left():
    topology = load_topology("ndv2", nodes=2)
    graph = build_logical_graph(topology, Sketch())
    chunk = 16 * MB / graph.num_ranks
    routing = greedy_routing(graph, 1, chunk, chunk / 4)
    serial = order_sends(routing, 4, chunk / 4)
    piped = order_sends(routing, 4, chunk / 4, pipelined=True)
    assert piped.pipelined and not serial.pipelined
    assert piped.makespan_us < serial.makespan_us
    last_end: dict[tuple, float] = {}
    for send in piped.sends:
        alpha = graph.links[send.link].alpha_us
        assert send.start_us >= last_end.get(send.lane, 0.0) - 1e-9
        last_end[send.lane] = send.end_us - alpha  # free once the bytes have left


def test_latency_bound_links_batch_waiting_pieces():
    ordering = ordered(load_topology("ndv2", nodes=2), 1, 1, 1000)
    graph = ordering.routing.graph
    assert is_slow_link(graph.links[0], 1000 / 16)
    batched = [s for i, s in enumerate(ordering.sends) if s.batch is not None and s.batch != i]
    assert batched, "pieces waiting for one latency-bound link leave together"
    for send in batched:
        head = ordering.sends[send.batch]
        assert (head.link, head.start_us, head.end_us) == (send.link, send.start_us, send.end_us)


def test_bandwidth_bound_links_do_not_batch():
    ordering = ordered(load_topology("dgx2"), 1, 2, 64 * MB)
    assert all(s.batch == i for i, s in enumerate(ordering.sends))
