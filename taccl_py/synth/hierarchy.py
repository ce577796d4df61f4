"""Hierarchical routes: one intra-node design, shared by identical machines, composed with a network exchange.

A chunk of rank r on machine n is broadcast inside n down the local design's tree of r, crosses
to every other machine m over one network link u -> v (u any GPU of n whose link relays r's
chunks, chosen by arrival time and link load), and is broadcast inside m down the local tree
of v. For a reduction the same routes run on the reversed graph: gather inside the machine,
exchange across the NICs, reduce inside the destination machine.

The local design is routed on one machine's links (``local_graph``), so its MILP has the same
size at 2 or 16 machines; the exchange is a greedy choice per chunk and machine. The result is
an ordinary ``Routing`` of the whole graph, ordered and scheduled like any other, and competes
with the routes found on the whole graph (it wins where their MILP is too large to solve).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from taccl_py.synth.logical import LogicalGraph, LogicalLink, Resource
from taccl_py.synth.routing import (
    GREEDY_LOAD_WEIGHTS,
    ChunkSymmetry,
    Routing,
    add_link_load,
    chunk_symmetry,
    expand_trees,
    route_chunks,
    routing_objective_us,
)
from taccl_py.synth.solver import SolverOptions
from taccl_py.synth.tree_packing import pack_trees, packed_routing

__all__ = ["HIERARCHICAL_STATUS", "local_graph", "hierarchical_routing"]

logger = logging.getLogger(__name__)

HIERARCHICAL_STATUS = "hierarchical"  # the ``Routing.status`` of these routes


def _same_link(a: LogicalLink, b: LogicalLink) -> bool:
    return (a.alpha_us, a.bandwidth_GBps, a.roots, a.policy) == (b.alpha_us, b.bandwidth_GBps, b.roots, b.policy)


def local_graph(graph: LogicalGraph) -> LogicalGraph | None:
    """Return machine 0's intra-node links as a graph of its own (ranks 0..gpus_per_node-1).

    None when there is one machine, or when another machine lacks a link of machine 0 at the
    same cost (the machines are not identical, so one design cannot serve them all).
    """
    gpn = graph.gpus_per_node
    nodes = graph.num_ranks // gpn
    if nodes < 2:
        return None
    links = tuple(
        link for link in graph.links if not link.internode and link.src < gpn and link.dst < gpn and link.roots is None
    )
    for node in range(1, nodes):
        shift = node * gpn
        for link in links:
            image = graph.index.get((link.src + shift, link.dst + shift))
            if image is None or not _same_link(link, graph.links[image]):
                logger.info(
                    "machine %d differs from machine 0 (link %d->%d): no hierarchical routes", node, link.src, link.dst
                )
                return None
    # Rotations inside blocks that divide a machine act on every machine alike, so they are machine 0's too.
    rotations = tuple((offset, group) for offset, group in graph.rotations if gpn % group == 0)
    return LogicalGraph(graph.topology_name, gpn, gpn, links, rotations, graph.reversed)


class _Composer:
    """Builds one representative chunk's tree from the local trees and the network links."""

    def __init__(self, graph: LogicalGraph, local: Routing, chunk_bytes: float, piece_bytes: float) -> None:
        self.graph = graph
        self.local = local
        self.gpn = graph.gpus_per_node
        self.nodes = graph.num_ranks // self.gpn
        self.chunk_bytes = chunk_bytes
        self.piece_bytes = piece_bytes

    def local_tree(self, root: int, q: int) -> tuple[int, ...]:
        """Return the local tree of chunk ``q`` of ``root``, moved onto ``root``'s machine (full-graph links)."""
        shift = (root // self.gpn) * self.gpn
        local = self.local.graph.links
        tree = self.local.trees[(root - shift) * self.local.chunkup + q % self.local.chunkup]
        return tuple(self.graph.index[(local[l].src + shift, local[l].dst + shift)] for l in tree)

    def exchange_links(self, root: int, node: int) -> list[int]:
        """Return the network links that may carry ``root``'s chunks from its machine to machine ``node``."""
        out = []
        home = root // self.gpn
        for u in range(home * self.gpn, (home + 1) * self.gpn):
            for l in self.graph.out_links[u]:
                link = self.graph.links[l]
                if link.internode and link.dst // self.gpn == node and link.allows(root):
                    out.append(l)
        return out

    def tree(self, root: int, q: int, load: dict[Resource, float], weight: float) -> tuple[int, ...] | None:
        """Return the chunk's whole tree (parents first), adding its load; None when a machine is unreachable."""
        graph, home = self.graph, root // self.gpn
        tree: list[int] = []
        arrival = {root: 0.0}

        def take(links: tuple[int, ...]) -> None:
            for l in links:
                link = graph.links[l]
                arrival[link.dst] = arrival[link.src] + link.time_us(self.piece_bytes)
                tree.append(l)
                add_link_load(load, link, self.chunk_bytes)

        take(self.local_tree(root, q))
        for step in range(1, self.nodes):
            node = (home + step) % self.nodes
            choices = self.exchange_links(root, node)
            if not choices:
                return None

            def key(l: int) -> tuple[float, int]:
                # The landing GPU's broadcast is part of the choice: on machines whose NIC GPUs land
                # every chunk, their NVSwitch ports would carry twice the others' load.
                link = graph.links[l]
                extra: dict[Resource, float] = {}
                for hop in (link, *(graph.links[h] for h in self.local_tree(link.dst, q))):
                    add_link_load(extra, hop, self.chunk_bytes)
                busy = max(load.get(res, 0.0) + added for res, added in extra.items())
                return arrival[link.src] + link.time_us(self.piece_bytes) + weight * busy, l

            crossing = min(choices, key=key)
            take((crossing,))
            take(self.local_tree(graph.links[crossing].dst, q))
        return tuple(tree)


def _compose(composer: _Composer, sym: ChunkSymmetry, chunkup: int, weight: float) -> dict[int, tuple[int, ...]] | None:
    graph = composer.graph
    load: dict[Resource, float] = {}
    rep_trees: dict[int, tuple[int, ...]] = {}
    for rep in sym.reps:
        tree = composer.tree(rep // chunkup, rep % chunkup, load, weight)
        if tree is None:
            return None
        rep_trees[rep] = tree
        for perm in graph.group[1:]:  # the identity's loads were added while the tree grew
            for l in tree:
                link = graph.links[l]
                add_link_load(load, graph.links[graph.index[(perm[link.src], perm[link.dst])]], composer.chunk_bytes)
    return rep_trees


def hierarchical_routing(
    graph: LogicalGraph,
    chunkup: int,
    chunk_bytes: float,
    piece_bytes: float,
    options: SolverOptions,
    time_limit_s: float | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Routing | None:
    """Return hierarchical routes over ``graph`` (bytes per chunk and per piece), or None where they do not apply.

    None for one machine, machines that differ, or network links that leave a machine
    unreachable for some chunk. The local design's MILP runs within ``options``' budgets and
    ``time_limit_s`` (s); its status is the result's ``solve_status``. ``progress`` gets a line
    before the design and the MILP's lines (``solve_model``).
    """
    local = local_graph(graph)
    if local is None:
        return None
    nodes = graph.num_ranks // graph.gpus_per_node
    # Each local tree carries a GPU's own chunk and, on average, one landed from every other machine.
    local_bytes = chunk_bytes * nodes
    if progress is not None:
        progress(f"hierarchical routes: designing one machine's {local.num_ranks} GPUs")
    start = packed_routing(pack_trees(local), chunkup, local_bytes, piece_bytes)
    design = route_chunks(
        local, chunkup, local_bytes, piece_bytes, options, time_limit_s, start=start, progress=progress
    )
    composer = _Composer(graph, design, chunk_bytes, piece_bytes)
    sym = chunk_symmetry(graph, chunkup)
    best: Routing | None = None
    for weight in GREEDY_LOAD_WEIGHTS:
        rep_trees = _compose(composer, sym, chunkup, weight)
        if rep_trees is None:
            logger.info("%s: network links miss a machine: no hierarchical routes", graph.topology_name)
            return None
        trees = expand_trees(graph, sym, rep_trees)
        objective = routing_objective_us(graph, trees, chunkup, chunk_bytes, piece_bytes)
        if best is None or objective < best.objective_us:
            best = Routing(graph, chunkup, trees, objective, HIERARCHICAL_STATUS, design.solve_s, design.solve_status)
    logger.info(
        "%s: hierarchical routes from a %d-GPU local design (%s), objective %.1f us",
        graph.topology_name,
        local.num_ranks,
        design.status,
        best.objective_us,
    )
    return best
