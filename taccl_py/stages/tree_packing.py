"""Spanning-tree packing: the bandwidth-optimal broadcast trees of every rank, as a routing.

An AllGather moves every rank's data to every other rank; data that travels down a spanning
arborescence rooted at its rank reaches everyone once. Spreading each rank's data over a
weighted set of arborescences (Blink; Zhao & Krishnamurthy 2023; ForestColl) reaches the
cut bound on the links the trees may use, where one tree per rank cannot. Here:

* **Fractional packing** (``pack_trees``), by column generation. Master LP: minimise U such
  that each representative root's tree weights sum to 1 and, for every physical resource ρ,
  ``sum_T w_T load_ρ(T) <= U`` (load: µs per byte of one rank's data, counting the tree's
  images on every rank of the root's orbit under the sketch's rotations). Pricing: with the
  load rows' duals μ as link costs, the cheapest arborescence rooted at the root (Edmonds'
  algorithm) enters when its cost is below the root's convexity dual. Duals also give a lower
  bound ``sum_r min_T μ·load(T)``, so the gap is known when the iteration budget stops early.
* **Integral packing** (``packed_routing``): ``chunkup`` chunks per rank, each on one tree, is
  a packing with weights in multiples of 1/chunkup. Counts are rounded from the fractional
  weights (largest remainder) and improved by moving single trees off the busiest resource.

The trees become an ordinary ``Routing``: the orderer pipelines them into pieces, the
scheduler and lowering follow, and ReduceScatter runs them on the reversed graph.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from taccl_py.progress import ProgressTicker
from taccl_py.solvers.highs import new_highs
from taccl_py.stages.logical import LogicalGraph, Resource
from taccl_py.stages.routing import ChunkSymmetry, Routing, chunk_symmetry, routing_objective_us
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["TreePacking", "pack_trees", "packed_routing", "integral_loads"]

logger = logging.getLogger(__name__)

# Column-generation budget: LP solves (each adds at most one tree per representative root).
# Work, not seconds, so that the same graph always gives the same trees.
MAX_PACKING_ROUNDS = 400
# Relative reduced cost below which a tree is not worth adding (the LP optimum is reached).
_PRICING_TOLERANCE = 1e-7
# Link latency (µs) is added to a link's price at this weight: among trees of equal load the
# shallower one wins (the LP itself is blind to latency).
_LATENCY_TIE_BREAK = 1e-9
# Branch-and-bound nodes for choosing integer tree counts (a work budget: same input, same trees).
MIP_NODE_LIMIT = 2000


@dataclass(frozen=True)
class TreePacking:
    """The trees column generation found and their optimal weights, with the busiest resource's load.

    ``columns`` holds (index into ``roots``, tree links parents-first) for every tree generated;
    ``weights`` their LP weights (per root they sum to 1). ``load_us_per_byte`` is the busiest
    resource's busy time per byte of each rank's data (the LP optimum when ``converged``);
    ``lower_bound_us_per_byte`` is the duals' bound on it. ``column_loads[j]`` is the load column
    j and its orbit images put on every resource (µs per byte of each rank's data).
    """

    graph: LogicalGraph
    roots: tuple[int, ...]
    columns: tuple[tuple[int, tuple[int, ...]], ...]
    weights: tuple[float, ...]
    load_us_per_byte: float
    lower_bound_us_per_byte: float
    rounds: int
    converged: bool
    column_loads: np.ndarray = field(compare=False, repr=False)


@dataclass(frozen=True)
class _Orbits:
    """Per representative root, the (resource, µs per byte) each link's images load, as CSR rows."""

    symmetry: ChunkSymmetry
    resources: tuple[Resource, ...]
    indptr: tuple[np.ndarray, ...]
    indices: tuple[np.ndarray, ...]
    coefs: tuple[np.ndarray, ...]


def _orbit_loads(graph: LogicalGraph) -> _Orbits:
    """Return, per representative root, each link's load summed over the root's orbit images."""
    symmetry = chunk_symmetry(graph, 1)
    resource_index: dict[Resource, int] = {}
    for link in graph.links:
        for res in link.resources:
            resource_index.setdefault(res, len(resource_index))
    members: dict[int, list[int]] = {rep: [] for rep in symmetry.reps}
    for root, (rep, p_index) in enumerate(symmetry.rep_of):
        members[rep].append(p_index)
    group = graph.group
    indptrs, indices, coefs = [], [], []
    for rep in symmetry.reps:
        rows: list[dict[int, float]] = []
        for link in graph.links:
            row: dict[int, float] = {}
            for p_index in members[rep]:
                perm = group[p_index]
                image = graph.links[graph.index[(perm[link.src], perm[link.dst])]]
                for res, bw in zip(image.resources, image.resource_bandwidths_GBps):
                    key = resource_index[res]
                    row[key] = row.get(key, 0.0) + 1.0 / (bw * BYTES_PER_US_PER_GBPS)
            rows.append(row)
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        indptrs.append(np.concatenate(([0], np.cumsum(lengths))))
        indices.append(np.array([k for row in rows for k in sorted(row)], dtype=np.int64))
        coefs.append(np.array([row[k] for row in rows for k in sorted(row)], dtype=np.float64))
    return _Orbits(symmetry, tuple(resource_index), tuple(indptrs), tuple(indices), tuple(coefs))


def _link_prices(orbits: _Orbits, rep_index: int, mu: np.ndarray) -> np.ndarray:
    """Return every link's price for a representative root: its orbit loads weighted by ``mu``."""
    indptr, indices, coefs = orbits.indptr[rep_index], orbits.indices[rep_index], orbits.coefs[rep_index]
    weighted = np.concatenate(([0.0], np.cumsum(coefs * mu[indices])))
    return weighted[indptr[1:]] - weighted[indptr[:-1]]


def _tree_load(orbits: _Orbits, rep_index: int, tree: tuple[int, ...]) -> np.ndarray:
    """Return the load (µs per byte of each rank's data) a tree and its orbit images put on every resource."""
    load = np.zeros(len(orbits.resources))
    indptr, indices, coefs = orbits.indptr[rep_index], orbits.indices[rep_index], orbits.coefs[rep_index]
    for l in tree:
        np.add.at(load, indices[indptr[l] : indptr[l + 1]], coefs[indptr[l] : indptr[l + 1]])
    return load


def _cheapest_arborescence(graph: LogicalGraph, root: int, prices: np.ndarray) -> tuple[int, ...]:
    """Return the arborescence rooted at ``root`` of least total price (links parents-first)."""
    digraph = nx.DiGraph()
    digraph.add_nodes_from(range(graph.num_ranks))
    for l, link in enumerate(graph.links):
        if link.dst != root and link.allows(root):
            price = float(prices[l]) + _LATENCY_TIE_BREAK * link.alpha_us
            digraph.add_edge(link.src, link.dst, weight=price, link=l)
    # With no edge into the root, a spanning arborescence can only be rooted there.
    arborescence = nx.minimum_spanning_arborescence(digraph, attr="weight", preserve_attrs=True)
    children: dict[int, list[int]] = {}
    for u, v, data in arborescence.edges(data=True):
        children.setdefault(u, []).append(data["link"])
    return _parents_first(graph, root, children)


def _parents_first(graph: LogicalGraph, root: int, children: dict[int, list[int]]) -> tuple[int, ...]:
    order, queue = [], deque([root])
    while queue:
        for l in sorted(children.get(queue.popleft(), ())):
            order.append(l)
            queue.append(graph.links[l].dst)
    return tuple(order)


class _MasterLP:
    """The packing LP in HiGHS, grown one column (tree) at a time; columns 1.. are trees, 0 is U."""

    def __init__(self, num_roots: int, num_resources: int) -> None:
        import highspy

        self.highs = new_highs()
        # No "threads": HiGHS sizes one process-wide scheduler at its first run, and a later
        # solve asking for another count (the synthesizer's MILPs) would then fail.
        self.highs.setOptionValue("random_seed", 0)
        self.inf = highspy.kHighsInf
        self.num_roots = num_roots
        empty_i, empty_v = np.array([], dtype=np.int32), np.array([], dtype=np.float64)
        self.highs.addCol(1.0, 0.0, self.inf, 0, empty_i, empty_v)
        for _ in range(num_roots):
            self.highs.addRow(1.0, 1.0, 0, empty_i, empty_v)
        for _ in range(num_resources):
            self.highs.addRow(-self.inf, 0.0, 1, np.array([0], dtype=np.int32), np.array([-1.0]))

    def add_tree(self, rep_index: int, load: np.ndarray) -> None:
        rows = np.flatnonzero(load)
        index = np.concatenate(([rep_index], rows + self.num_roots)).astype(np.int32)
        value = np.concatenate(([1.0], load[rows]))
        self.highs.addCol(0.0, 0.0, self.inf, len(index), index, value)

    def solve(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Return U, the tree weights, the roots' convexity duals and the resources' prices μ >= 0."""
        self.highs.run()
        solution = self.highs.getSolution()
        duals = np.array(solution.row_dual)
        values = np.array(solution.col_value)
        return float(values[0]), values[1:], duals[: self.num_roots], np.maximum(-duals[self.num_roots :], 0.0)


def pack_trees(
    graph: LogicalGraph, max_rounds: int = MAX_PACKING_ROUNDS, *, progress: Callable[[str], None] | None = None
) -> TreePacking:
    """Return the fractional tree packing of least busiest-resource load on ``graph`` (see module doc).

    ``max_rounds`` bounds the LP solves; the result then carries the duals' lower bound.
    ``progress`` gets a line every few seconds with the rounds and trees so far.
    """
    orbits = _orbit_loads(graph)
    reps = orbits.symmetry.reps
    master = _MasterLP(len(reps), len(orbits.resources))
    columns: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    seen: set[tuple[int, tuple[int, ...]]] = set()
    uniform = np.ones(len(orbits.resources))
    for i, rep in enumerate(reps):  # a first tree per root: the cheapest under equal prices
        tree = _cheapest_arborescence(graph, rep, _link_prices(orbits, i, uniform))
        columns.append((i, tree, _tree_load(orbits, i, tree)))
        seen.add((i, tree))
        master.add_tree(i, columns[-1][2])
    lower, converged, rounds = 0.0, False, 0
    ticker = ProgressTicker(progress)
    while rounds < max_rounds:
        ticker.tick(lambda: f"tree packing: {rounds} of at most {max_rounds} rounds, {len(columns)} trees")
        rounds += 1
        load, weights, convexity, mu = master.solve()
        added, bound = 0, 0.0
        for i, rep in enumerate(reps):
            prices = _link_prices(orbits, i, mu)
            tree = _cheapest_arborescence(graph, rep, prices)
            cost = float(sum(prices[l] for l in tree))
            bound += cost
            if cost < convexity[i] - _PRICING_TOLERANCE * max(load, 1e-30) and (i, tree) not in seen:
                seen.add((i, tree))
                columns.append((i, tree, _tree_load(orbits, i, tree)))
                master.add_tree(i, columns[-1][2])
                added += 1
        lower = max(lower, bound)
        if not added:
            converged = True
            break
    if not converged:
        load, weights, _, _ = master.solve()
    logger.info(
        "tree packing on %s: %d trees over %d roots, load %.6g us/B (bound %.6g), %d rounds%s",
        graph.topology_name,
        int(np.count_nonzero(weights > 1e-12)),
        len(reps),
        load,
        lower,
        rounds,
        "" if converged else " (round budget reached)",
    )
    return TreePacking(
        graph,
        reps,
        tuple((i, tree) for i, tree, _ in columns),
        tuple(float(w) for w in weights),
        load,
        min(lower, load),
        rounds,
        converged,
        np.array([column_load for _, _, column_load in columns]),
    )


def _round_counts(weights: list[float], k: int) -> list[int]:
    """Return integer counts summing to ``k`` nearest to ``k * weights`` (largest remainder, ties by index)."""
    scaled = [w * k for w in weights]
    counts = [int(np.floor(s + 1e-9)) for s in scaled]
    order = sorted(range(len(weights)), key=lambda j: (-(scaled[j] - counts[j]), j))
    for j in order[: max(0, k - sum(counts))]:
        counts[j] += 1
    return counts


def _integral_counts(packing: TreePacking, chunkup: int, node_limit: int) -> tuple[list[int], str]:
    """Return how many of each column's tree every root takes (``chunkup`` per root), by a small MIP.

    Minimises the busiest resource's load over integer counts of the generated trees, from
    the rounded LP weights; returns the counts and the MIP's status.
    """
    import highspy

    loads = packing.column_loads
    num_roots, num_columns = len(packing.roots), len(packing.columns)
    start = np.zeros(num_columns)
    for i in range(num_roots):
        members = [j for j, (root, _) in enumerate(packing.columns) if root == i]
        for j, count in zip(members, _round_counts([packing.weights[j] for j in members], chunkup)):
            start[j] = count
    highs = new_highs()
    for option, value in (("random_seed", 0), ("mip_rel_gap", 1e-4)):
        highs.setOptionValue(option, value)
    highs.setOptionValue("mip_max_nodes", node_limit)
    inf = highspy.kHighsInf
    empty_i, empty_v = np.array([], dtype=np.int32), np.array([], dtype=np.float64)
    highs.addCol(1.0, 0.0, inf, 0, empty_i, empty_v)  # U
    for _ in range(num_roots):
        highs.addRow(chunkup, chunkup, 0, empty_i, empty_v)
    for _ in range(loads.shape[1]):
        highs.addRow(-inf, 0.0, 1, np.array([0], dtype=np.int32), np.array([-1.0]))
    for j, (root, _) in enumerate(packing.columns):
        rows = np.flatnonzero(loads[j])
        index = np.concatenate(([root], rows + num_roots)).astype(np.int32)
        highs.addCol(0.0, 0.0, chunkup, len(index), index, np.concatenate(([1.0], loads[j][rows] / chunkup)))
    highs.changeColsIntegrality(
        num_columns,
        np.arange(1, num_columns + 1, dtype=np.int32),
        np.array([highspy.HighsVarType.kInteger] * num_columns),
    )
    peak = float((start @ loads).max()) / chunkup
    highs.setSolution(num_columns + 1, np.arange(num_columns + 1, dtype=np.int32), np.concatenate(([peak], start)))
    highs.run()
    values = np.array(highs.getSolution().col_value[1:])
    status = "optimal" if highs.getModelStatus() == highspy.HighsModelStatus.kOptimal else "node limit"
    counts = [int(round(v)) for v in values]
    if (np.array(counts) @ loads).max() > (start @ loads).max() or any(
        sum(c for c, (root, _) in zip(counts, packing.columns) if root == i) != chunkup for i in range(num_roots)
    ):
        return [int(v) for v in start], "rounded"
    return counts, status


def integral_loads(
    packing: TreePacking, chunkup: int, node_limit: int = MIP_NODE_LIMIT
) -> tuple[tuple[tuple[tuple[int, ...], ...], ...], float, str]:
    """Return ``chunkup`` trees per representative root, their busiest load (µs per byte of each rank's data)
    and how the counts were found (``optimal``, ``node limit`` or ``rounded``).
    """
    loads = packing.column_loads
    counts, status = _integral_counts(packing, chunkup, node_limit)
    chosen = tuple(
        tuple(tree for (root, tree), count in zip(packing.columns, counts) if root == i for _ in range(count))
        for i in range(len(packing.roots))
    )
    return chosen, float((np.array(counts) @ loads).max()) / chunkup, status


def packed_routing(packing: TreePacking, chunkup: int, chunk_bytes: float, piece_bytes: float) -> Routing:
    """Return the routing that sends each rank's ``chunkup`` chunks down its integral share of ``packing``'s trees."""
    graph = packing.graph
    chosen, _, status = integral_loads(packing, chunkup)
    symmetry = chunk_symmetry(graph, 1)
    rep_position = {rep: i for i, rep in enumerate(packing.roots)}
    trees = []
    for root, (rep, p_index) in enumerate(symmetry.rep_of):
        perm = graph.group[p_index]
        for tree in chosen[rep_position[rep]]:
            trees.append(tuple(graph.index[(perm[graph.links[l].src], perm[graph.links[l].dst])] for l in tree))
    trees = tuple(trees)
    objective = routing_objective_us(graph, trees, chunkup, chunk_bytes, piece_bytes)
    return Routing(graph, chunkup, trees, objective, f"tree packing ({status})")
