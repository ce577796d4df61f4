"""Unchained NIC queues and one-hop forwarding on machines that differ (issue 47).

On DGX-A100 x2 + DGX-H100 x2 the A100 machines' NICs bind AllGather (the cut bound). Chained
queues (``send_lane``) send a rank's pieces to other machines one at a time, so every A100 NIC
idles for each send's α; unchained, several senders share it and one's α overlaps another's
bytes. Once the NICs keep up, what is left is forwarding inside the A100 machines, which a
star from where a piece lands shortens (``star_inside_machines``). Timed with the simulator on
the tree packing's routes at 64 MB (c1p4 and c1p8, as synthesis tries).
"""

from __future__ import annotations

import pytest

from taccl_py.bounds import lower_bound
from taccl_py.ir.collectives import Collective
from taccl_py.simulate import simulate
from taccl_py.solvers import SolverOptions
from taccl_py.stages.hierarchy import star_inside_machines
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.lower_schedule import lower_schedule
from taccl_py.stages.ordering import lacks_machine_rotation, order_sends
from taccl_py.stages.scheduling import schedule_sends
from taccl_py.stages.sketch import auto_sketch
from taccl_py.stages.tree_packing import pack_trees, packed_routing
from taccl_py.topology.cluster import load_cluster
from taccl_py.verify import check_algorithm

SIZE = 64_000_000


@pytest.fixture(scope="module")
def mixed():
    """Return the mixed cluster, its logical graph and the tree packing's c1p4 routing at 64 MB."""
    topology = load_cluster(cluster="dgx-a100:2,dgx-h100:2")
    graph = build_logical_graph(topology, auto_sketch(topology))
    piece = SIZE / graph.num_ranks / 4
    return topology, graph, packed_routing(pack_trees(graph), 1, SIZE / graph.num_ranks, piece), piece


def _run(topology, routing, piece, chain_hops, pieces=4):
    ordering = order_sends(routing, pieces, piece, chain_hops=chain_hops)
    algorithm = lower_schedule("ag", Collective.ALLGATHER, [schedule_sends(ordering, SolverOptions(), milp=False)])
    check_algorithm(algorithm)
    # msccl: the ordering here times every send serialized (order_sends' default), and so does the replay
    return ordering, simulate(algorithm, topology, SIZE, record_timeline=True, model="msccl")


def test_unchained_queues_hide_alpha_on_the_mixed_cluster(mixed):
    topology, graph, routing, piece = mixed
    assert lacks_machine_rotation(graph), "synthesis tries unchained queues only where machines differ"
    chained_order, chained = _run(topology, routing, piece, True)
    unchained_order, unchained = _run(topology, routing, piece, False)
    assert any(send.lane[0] == "hop" for send in chained_order.sends)
    assert all(send.lane[0] == "link" for send in unchained_order.sends)
    # Measured 2026-11-28: 324.9 µs (0.778 of the bound) chained, 299.5 µs (0.844) unchained.
    assert unchained.time_us < 0.95 * chained.time_us
    assert unchained.fraction_of_bound > 0.83


def test_inter_machine_bytes_arrive_by_the_bound(mixed):
    """The cut bound's bandwidth term is reached: what is left is the tail inside the machines.

    Every byte from another machine is in by the bound (252.7 µs), so no valid bound on the
    inter-machine traffic can be tighter; the run's last 47 µs forward the last pieces over NVSwitch.
    """
    topology, graph, routing, piece = mixed
    _, result = _run(topology, routing, piece, False)
    bound = lower_bound(topology, Collective.ALLGATHER, SIZE).time_us
    gpn = graph.gpus_per_node
    crossing = [r.end_us for r in result.timeline if r.src_rank // gpn != r.dst_rank // gpn]
    assert max(crossing) == pytest.approx(bound, rel=1e-6)
    assert result.time_us > bound + 30.0


def test_a_piece_landed_from_a_nic_is_forwarded_in_one_hop(mixed):
    topology, graph, _, _ = mixed
    shard = SIZE / graph.num_ranks
    piece = shard / 8
    paths = packed_routing(pack_trees(graph), 1, shard, piece)
    stars = star_inside_machines(paths, shard, piece)
    gpn = graph.gpus_per_node
    for c, (path, star) in enumerate(zip(paths.trees, stars.trees)):
        crossings = [l for l in path if graph.links[l].internode]
        assert [l for l in star if graph.links[l].internode] == crossings
        landed = [paths.root(c)] + [graph.links[l].dst for l in crossings]
        entries = {rank // gpn: rank for rank in landed}
        inside = [graph.links[l] for l in star if not graph.links[l].internode]
        assert all(link.src == entries[link.src // gpn] for link in inside)
        assert sorted(link.dst for link in inside) == sorted(
            r for r in range(graph.num_ranks) if r // gpn in entries and r != entries[r // gpn]
        )
    _, along_paths = _run(topology, paths, piece, False, pieces=8)
    _, one_hop = _run(topology, stars, piece, False, pieces=8)
    # Measured 2026-11-29: 301.0 µs (0.839 of the bound) down the packing's paths, 287.4 µs (0.879) in one hop.
    assert one_hop.time_us < 0.97 * along_paths.time_us
    assert one_hop.fraction_of_bound > 0.87
    assert star_inside_machines(stars, shard, piece) is None, "a star is its own star"
