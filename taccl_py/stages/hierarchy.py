"""Hierarchical routes: an intra-node design per kind of machine, composed with a network exchange.

A chunk of rank r on machine n is broadcast inside n down n's design's tree of r, crosses
to every other machine m over one network link u -> v (u any GPU of n whose link relays r's
chunks, chosen by arrival time and link load), and is broadcast inside m down m's design's
tree of v. For a reduction the same routes run on the reversed graph: gather inside the
machine, exchange across the NICs, reduce inside the destination machine.

Machines whose intra-node links are alike (same pairs, same costs) share one design, so a
cluster of N identical machines routes one machine's links (its MILP has the same size at 2
or 16 machines) and a mixed cluster one per kind; a machine that differs only in its NICs
(one down, another speed) shares its kind's design, since the design never crosses a NIC. The
exchange is a greedy choice per chunk and machine. The result is an ordinary ``Routing`` of
the whole graph, ordered and scheduled like any other, and competes with the routes found on
the whole graph (it wins where their MILP is too large to solve).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from taccl_py.solvers import SolverOptions, SolveStatus
from taccl_py.stages.logical import LogicalGraph, LogicalLink, Resource, symmetry_fault
from taccl_py.stages.routing import (
    GREEDY_LOAD_WEIGHTS,
    ChunkSymmetry,
    Routing,
    add_link_load,
    chunk_symmetry,
    expand_trees,
    route_chunks,
    routing_objective_us,
)
from taccl_py.stages.tree_packing import TreePacking, pack_trees, packed_routing

__all__ = [
    "HIERARCHICAL_STATUS",
    "STAR_STATUS",
    "local_graph",
    "machine_classes",
    "machine_packings",
    "hierarchical_routing",
    "star_inside_machines",
]

logger = logging.getLogger(__name__)

HIERARCHICAL_STATUS = "hierarchical"  # the ``Routing.status`` of these routes
STAR_STATUS = "star inside machines"  # appended to the status of ``star_inside_machines``' routes


def _same_link(a: LogicalLink, b: LogicalLink) -> bool:
    return (a.alpha_us, a.bandwidth_GBps, a.roots, a.policy) == (b.alpha_us, b.bandwidth_GBps, b.roots, b.policy)


def _machine_links(graph: LogicalGraph, node: int) -> tuple[LogicalLink, ...]:
    """Return machine ``node``'s intra-node links open to every chunk, in graph order."""
    gpn = graph.gpus_per_node
    low, high = node * gpn, (node + 1) * gpn
    return tuple(
        link
        for link in graph.links
        if not link.internode and low <= link.src < high and low <= link.dst < high and link.roots is None
    )


def _alike(graph: LogicalGraph, node: int, other: int) -> bool:
    """Return True when machine ``other`` has machine ``node``'s intra-node links at the same cost, and no more."""
    shift = (other - node) * graph.gpus_per_node
    links = _machine_links(graph, node)
    if len(links) != len(_machine_links(graph, other)):
        return False
    for link in links:
        image = graph.index.get((link.src + shift, link.dst + shift))
        if image is None or not _same_link(link, graph.links[image]):
            logger.info("machine %d differs from machine %d (link %d->%d)", other, node, link.src, link.dst)
            return False
    return True


def machine_classes(graph: LogicalGraph) -> tuple[int, ...]:
    """Return, per machine, the first machine whose intra-node links are alike (its design's owner)."""
    nodes = graph.num_ranks // graph.gpus_per_node
    owners: list[int] = []
    for node in range(nodes):
        owners.append(next((o for o in dict.fromkeys(owners) if _alike(graph, o, node)), node))
    return tuple(owners)


def _local_rotations(graph: LogicalGraph, links: tuple[LogicalLink, ...]) -> tuple[tuple[int, int], ...]:
    """Return the rotations of a machine's own links: the graph's, or where the graph keeps no machine rotation
    (its machines differ), the smallest that maps the machine's links onto themselves.
    """
    gpn = graph.gpus_per_node
    # Rotations inside blocks that divide a machine act on every machine alike, so they are each machine's too.
    rotations = tuple((offset, group) for offset, group in graph.rotations if gpn % group == 0)
    if rotations or any(group > gpn for _, group in graph.rotations):
        return rotations
    for offset in range(1, gpn):
        if gpn % offset == 0:
            candidate = LogicalGraph(graph.topology_name, gpn, gpn, links, ((offset, gpn),), graph.reversed)
            if symmetry_fault(candidate) is None:
                return ((offset, gpn),)
    return ()


def local_graph(graph: LogicalGraph, node: int = 0) -> LogicalGraph | None:
    """Return machine ``node``'s intra-node links as a graph of its own (ranks 0..gpus_per_node-1).

    None when there is one machine (there is nothing to compose).
    """
    gpn = graph.gpus_per_node
    if graph.num_ranks // gpn < 2:
        return None
    shift = node * gpn
    links = tuple(
        replace(link, src=link.src - shift, dst=link.dst - shift) if shift else link
        for link in _machine_links(graph, node)
    )
    return LogicalGraph(graph.topology_name, gpn, gpn, links, _local_rotations(graph, links), graph.reversed)


class _Composer:
    """Builds one representative chunk's tree from the machines' designs and the network links.

    ``designs[n]`` is machine n's local design (routes on ranks 0..gpus_per_node-1).
    """

    def __init__(
        self, graph: LogicalGraph, designs: tuple[Routing, ...], chunk_bytes: float, piece_bytes: float
    ) -> None:
        self.graph = graph
        self.designs = designs
        self.gpn = graph.gpus_per_node
        self.nodes = graph.num_ranks // self.gpn
        self.chunk_bytes = chunk_bytes
        self.piece_bytes = piece_bytes

    def local_tree(self, root: int, q: int) -> tuple[int, ...]:
        """Return the local tree of chunk ``q`` of ``root``, moved onto ``root``'s machine (full-graph links)."""
        design = self.designs[root // self.gpn]
        shift = (root // self.gpn) * self.gpn
        local = design.graph.links
        tree = design.trees[(root - shift) * design.chunkup + q % design.chunkup]
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


def machine_packings(graph: LogicalGraph) -> dict[int, TreePacking]:
    """Return the tree packing of each kind of machine's own links (``local_graph``), keyed by its design's owner.

    Empty for one machine. The designs of every chunking start from these packings.
    """
    if graph.num_ranks // graph.gpus_per_node < 2:
        return {}
    return {owner: pack_trees(local_graph(graph, owner)) for owner in dict.fromkeys(machine_classes(graph))}


def hierarchical_routing(
    graph: LogicalGraph,
    chunkup: int,
    chunk_bytes: float,
    piece_bytes: float,
    options: SolverOptions,
    time_limit_s: float | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    packings: Mapping[int, TreePacking] | None = None,
) -> Routing | None:
    """Return hierarchical routes over ``graph`` (bytes per chunk and per piece), or None where they do not apply.

    None for one machine, one GPU per machine (nothing to route inside one), or network links
    that leave a machine unreachable for some chunk.
    Each kind of machine's design MILP runs within ``options``' budgets and what is left of
    ``time_limit_s`` (s); the first status short of optimal is the result's ``solve_status``.
    ``progress`` gets a line before each design and the MILPs' lines (``solve_model``).
    ``packings`` are ``machine_packings(graph)`` when the caller has them.
    """
    if graph.num_ranks // graph.gpus_per_node < 2 or graph.gpus_per_node < 2:
        return None
    nodes = graph.num_ranks // graph.gpus_per_node
    owners = machine_classes(graph)
    packings = packings if packings is not None else machine_packings(graph)
    # Each local tree carries a GPU's own chunk and, on average, one landed from every other machine.
    local_bytes = chunk_bytes * nodes
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    designs: dict[int, Routing] = {}
    for owner in dict.fromkeys(owners):
        local = local_graph(graph, owner)
        if progress is not None:
            kind = "one machine's" if len(set(owners)) == 1 else f"machine {owner}'s"
            progress(f"hierarchical routes: designing {kind} {local.num_ranks} GPUs")
        start = packed_routing(packings[owner], chunkup, local_bytes, piece_bytes)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        designs[owner] = route_chunks(
            local, chunkup, local_bytes, piece_bytes, options, left, start=start, progress=progress
        )
    statuses = [design.solve_status for design in designs.values()]
    status = next((s for s in statuses if s not in (None, SolveStatus.OPTIMAL.value)), statuses[0])
    solve_s = sum(design.solve_s for design in designs.values())
    composer = _Composer(graph, tuple(designs[owner] for owner in owners), chunk_bytes, piece_bytes)
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
            best = Routing(graph, chunkup, trees, objective, HIERARCHICAL_STATUS, solve_s, status)
    logger.info(
        "%s: hierarchical routes from %d local design(s) of %d GPUs (%s), objective %.1f us",
        graph.topology_name,
        len(designs),
        graph.gpus_per_node,
        ", ".join(design.status for design in designs.values()),
        best.objective_us,
    )
    return best


def _star_tree(graph: LogicalGraph, tree: tuple[int, ...], root: int) -> tuple[int, ...] | None:
    """Return ``tree`` with each machine's part replaced by direct links from where the chunk enters it.

    None where a machine is entered twice or lacks a direct link from its entry to one of its GPUs.
    """
    gpn = graph.gpus_per_node
    crossings = [l for l in tree if graph.links[l].internode]
    entries = [root] + [graph.links[l].dst for l in crossings]
    if len({rank // gpn for rank in entries}) < len(entries):
        return None
    out: list[int] = []
    for crossing, entry in zip([None, *crossings], entries):
        if crossing is not None:
            out.append(crossing)
        machine = entry // gpn
        for gpu in range(machine * gpn, (machine + 1) * gpn):
            if gpu == entry:
                continue
            l = graph.index.get((entry, gpu))
            if l is None or not graph.links[l].allows(root):
                return None
            out.append(l)
    return tuple(out)


def star_inside_machines(routing: Routing, chunk_bytes: float, piece_bytes: float) -> Routing | None:
    """Return ``routing`` with every chunk broadcast inside each machine straight from the GPU it enters at.

    The crossings between machines stay; inside a machine the chunk goes in one hop to every GPU
    (NVSwitch), so a piece landed from a NIC is forwarded one NVSwitch transfer after it lands
    instead of down a path. None where nothing changes or a machine lacks direct links.
    """
    graph = routing.graph
    if graph.num_ranks // graph.gpus_per_node < 2:
        return None
    trees = []
    for c, tree in enumerate(routing.trees):
        star = _star_tree(graph, tree, routing.root(c))
        trees.append(tree if star is None else star)
    trees = tuple(trees)
    if trees == routing.trees:
        return None
    objective = routing_objective_us(graph, trees, routing.chunkup, chunk_bytes, piece_bytes)
    return replace(routing, trees=trees, objective_us=objective, status=f"{routing.status}, {STAR_STATUS}")
