"""Hierarchical routes: each kind of machine's design moved onto its machines, joined by one network hop per machine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taccl_py.ir.collectives import Collective
from taccl_py.solvers import SolverOptions
from taccl_py.stages.hierarchy import HIERARCHICAL_STATUS, hierarchical_routing, local_graph, machine_classes
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.routing import routing_objective_us
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth.compose import Chunking, synthesize_chunking
from taccl_py.topology import load_topology

from helpers import assert_arborescence

SIZE = 64_000_000
OPTIONS = SolverOptions()


def _graph(name: str, nodes: int):
    topology = load_topology(name, nodes=nodes)
    return build_logical_graph(topology, auto_sketch(topology))


def _route(graph, chunkup: int = 1, pieces: int = 4):
    chunk = SIZE / (graph.num_ranks * chunkup)
    return hierarchical_routing(graph, chunkup, chunk, chunk / pieces, OPTIONS)


def test_the_local_graph_is_machine_zero_alone():
    graph = _graph("dgx1", 2)
    local = local_graph(graph)
    assert local.num_ranks == local.gpus_per_node == 8
    assert local.links and all(not link.internode and link.src < 8 and link.dst < 8 for link in local.links)
    assert len(local.links) == sum(1 for link in graph.links if not link.internode) // 2
    assert local_graph(_graph("dgx1", 1)) is None


def test_machines_that_differ_get_designs_of_their_own():
    graph = _graph("dgx1", 2)
    assert machine_classes(graph) == (0, 0)
    inside_second = next(l for l, link in enumerate(graph.links) if not link.internode and link.src >= 8)
    missing = graph.links[inside_second]
    links = graph.links[:inside_second] + graph.links[inside_second + 1 :]
    differing = replace(graph, links=links, rotations=())
    assert machine_classes(differing) == (0, 1)
    second = local_graph(differing, 1)
    pairs = {(link.src, link.dst) for link in second.links}
    assert (missing.src - 8, missing.dst - 8) not in pairs and len(pairs) == len(local_graph(differing, 0).links) - 1
    routing = _route(differing)
    assert routing.status == HIERARCHICAL_STATUS
    for chunk, tree in enumerate(routing.trees):
        assert_arborescence(differing, routing.root(chunk), tree)


@pytest.mark.parametrize(("name", "nodes", "chunkup"), [("dgx1", 2, 1), ("dgx2", 2, 1), ("ndv2", 4, 2)])
def test_every_tree_is_the_local_design_joined_by_one_crossing_per_machine(name, nodes, chunkup):
    graph = _graph(name, nodes)
    routing = _route(graph, chunkup)
    gpn = graph.gpus_per_node
    assert routing.status == HIERARCHICAL_STATUS
    assert len(routing.trees) == graph.num_ranks * chunkup
    for chunk, tree in enumerate(routing.trees):
        root = routing.root(chunk)
        assert_arborescence(graph, root, tree)
        crossings = [graph.links[l] for l in tree if graph.links[l].internode]
        assert sorted(link.dst // gpn for link in crossings) == sorted(set(range(nodes)) - {root // gpn})
        assert all(link.src // gpn == root // gpn for link in crossings), "a chunk relayed through a third machine"
    chunk_bytes = SIZE / (graph.num_ranks * chunkup)
    expected = routing_objective_us(graph, routing.trees, chunkup, chunk_bytes, chunk_bytes / 4)
    assert routing.objective_us == pytest.approx(expected)


def test_landing_machines_reuse_the_design_of_the_landing_gpu():
    graph = _graph("dgx1", 2)
    routing = _route(graph)
    gpn = graph.gpus_per_node
    inside = {}
    for chunk, tree in enumerate(routing.trees):
        for l in tree:
            link = graph.links[l]
            if link.internode:
                landing = link.dst
        links_there = tuple(
            (graph.links[l].src % gpn, graph.links[l].dst % gpn)
            for l in tree
            if not graph.links[l].internode and graph.links[l].src // gpn == landing // gpn
        )
        home = tuple(
            (graph.links[l].src % gpn, graph.links[l].dst % gpn)
            for l in tree
            if not graph.links[l].internode and graph.links[l].src // gpn == routing.root(chunk) // gpn
        )
        inside.setdefault(routing.root(chunk) % gpn, set()).add(home)
        inside.setdefault(landing % gpn, set()).add(links_there)
    # One design per local GPU, whichever machine it runs on and whether the chunk started there.
    assert all(len(designs) == 1 for designs in inside.values())


def test_reduction_routes_run_on_the_reversed_graph():
    graph = _graph("dgx2", 2).reverse()
    routing = _route(graph)
    for chunk, tree in enumerate(routing.trees):
        assert_arborescence(graph, routing.root(chunk), tree)


def test_no_routes_when_a_machine_cannot_be_reached_directly():
    graph = _graph("dgx1", 2)
    # Chunks of rank 0 may no longer cross: no network link relays them.
    links = tuple(
        replace(link, roots=frozenset(range(1, 8))) if link.internode and link.src < 8 else link for link in graph.links
    )
    assert hierarchical_routing(replace(graph, links=links, rotations=()), 1, 1e6, 1e6, OPTIONS) is None


def test_hierarchical_routes_make_a_faster_schedule_where_the_machines_are_nic_poor(monkeypatch):
    """DGX-1 x2 at 64 MB (one NIC per GPU pair, NVLink cube mesh): 757 µs with them, 800 µs without."""
    import taccl_py.synth.compose as compose

    graph = _graph("dgx1", 2)

    def makespan_us() -> float:
        candidate = synthesize_chunking(graph, Collective.ALLGATHER, Chunking(1, 4, SIZE), OPTIONS, name="ag")
        return sum(schedule.makespan_us for schedule in candidate.schedules)

    with_them = makespan_us()
    monkeypatch.setattr(compose, "hierarchical_routing", lambda *args, **kwargs: None)
    assert with_them < 0.97 * makespan_us()
