"""Routing, TACCL's first stage: which logical links every chunk takes (a MILP, with a greedy start).

Chunks: each rank's input is cut into ``chunkup`` chunks; chunk ``c`` starts on rank
``c // chunkup``. An AllGather chunk must reach every rank exactly once, so its route is a
spanning arborescence of the logical graph rooted at its rank.

The model (bandwidth-relaxed, as TACCL's routing; our variable names):

* ``x[c, l]`` binary: chunk c crosses logical link l = (u, v); ``t[c, v]`` its arrival (µs).
* one incoming copy: ``sum_{l into v} x[c, l] = 1`` for every rank v but the root.
* causality: ``t[c, v] >= t[c, u] + lat_l`` when ``x[c, l] = 1``, written with big-M:
  ``t[c, v] >= t[c, u] + (lat_l + H) x[c, l] - H``. Every ``t`` lies in [0, H] with H the
  horizon (the greedy solution's objective, an upper bound on any optimum), so with x = 0 the
  row reads ``t_v >= t_u - H``, always true: M = H is the smallest safe big-M.
* load: for every physical resource ρ, ``sum x[c, l] * chunk_bytes / bw_ρ <= L`` over the links
  holding ρ (NIC, PCIe link, NVSwitch port, NVLink).
* objective: ``L + P`` with ``P >= t[c, v]``. ``lat_l`` is α plus one *pipelined piece* at the
  link's bandwidth: the schedule later cuts chunks into pieces, so a pipelined run costs the
  busiest resource's load plus one piece's trip down the deepest path (TACCL minimises the
  maximum of the two; with pipelining their sum is the better estimate).

Symmetry: variables of a chunk's image under a rotation are those of the chunk, mapped
(``x[π c, π l] = x[c, l]``), so only one chunk per orbit has variables; loads are still summed
over every chunk, so a symmetry the resources do not share costs optimality, never correctness.

A greedy router (load-aware Prim trees, several latency/load weights) gives the horizon, the
warm start, and the answer when the MILP finds nothing in time.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pulp

from taccl_py.solvers import SolverOptions, SolveStatus, solve_model
from taccl_py.solvers.matrix import linear_sum
from taccl_py.stages.logical import LogicalGraph, LogicalLink, Resource
from taccl_py.stages.sketch.model import SwitchPolicy
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "Routing",
    "ChunkSymmetry",
    "chunk_symmetry",
    "expand_trees",
    "add_link_load",
    "route_chunks",
    "route_candidates",
    "greedy_routing",
    "greedy_routings",
    "routing_objective_us",
]

logger = logging.getLogger(__name__)

# Latency/load trade-offs the greedy router tries (µs of path latency per µs of resource load).
GREEDY_LOAD_WEIGHTS = (0.0, 0.25, 1.0, 4.0)
# Greedy routings ordered beside the MILP's (each costs an ordering pass).
MAX_ALTERNATIVE_ROUTINGS = 2
# Status of a greedy routing ordered beside the MILP's, so that plain "heuristic" keeps one
# meaning: the MILP found nothing better than its greedy start within its budget.
ALTERNATIVE_STATUS = "greedy alternative"
# Routing MILPs of clusters with no rotation left (machines that differ) beyond this many columns
# are not solved: on dgx-a100 x4 with a NIC down (32 GPUs, ~8,000 columns per chunk) the root LP
# alone took 7 s a solve and never beat its start (the hierarchical or packed routes). A work
# budget of zero, so the same every run; the 16 GPUs of NDv2 x2 (~1,100 columns) are still solved.
MAX_ASYMMETRIC_COLUMNS = 4_000
# Weight of one distinct switch connection in the objective under uc-min / uc-max, relative to
# the horizon: small enough never to trade against time, large enough to break ties.
_POLICY_WEIGHT = 1e-4


@dataclass(frozen=True)
class ChunkSymmetry:
    """For every chunk, its orbit representative and the permutation (index into the group) mapping it."""

    reps: tuple[int, ...]
    rep_of: tuple[tuple[int, int], ...]


def chunk_symmetry(graph: LogicalGraph, chunkup: int) -> ChunkSymmetry:
    """Return the chunk orbits under the graph's rotation group."""
    group = graph.group
    rep_of: dict[int, tuple[int, int]] = {}
    reps = []
    for q in range(chunkup):
        for root in range(graph.num_ranks):
            c = root * chunkup + q
            if c in rep_of:
                continue
            reps.append(c)
            for p_index, perm in enumerate(group):
                rep_of.setdefault(perm[root] * chunkup + q, (c, p_index))
    return ChunkSymmetry(tuple(reps), tuple(rep_of[c] for c in range(graph.num_ranks * chunkup)))


@dataclass(frozen=True)
class Routing:
    """Every chunk's arborescence (link indices, parents before children) and how it was found.

    ``status`` names where the routes came from (``optimal``, ``node limit``, ``heuristic``,
    ``ALTERNATIVE_STATUS``, a packing's status); ``solve_status`` is how the routing MILP ended
    (a ``SolveStatus`` value; None: not run), also when its routes were not kept, so a budget
    that bound is never hidden.
    """

    graph: LogicalGraph
    chunkup: int
    trees: tuple[tuple[int, ...], ...]
    objective_us: float
    status: str
    solve_s: float = 0.0
    solve_status: str | None = None

    def root(self, chunk: int) -> int:
        """Return the rank chunk ``chunk`` starts on."""
        return chunk // self.chunkup


def _image(graph: LogicalGraph, perm: tuple[int, ...], link: int) -> int:
    src, dst = graph.links[link].src, graph.links[link].dst
    return graph.index[(perm[src], perm[dst])]


def expand_trees(
    graph: LogicalGraph, sym: ChunkSymmetry, rep_trees: dict[int, tuple[int, ...]]
) -> tuple[tuple[int, ...], ...]:
    """Return every chunk's tree from its orbit representative's (``rep_trees``), mapped by the symmetry."""
    group = graph.group
    return tuple(tuple(_image(graph, group[p], l) for l in rep_trees[rep]) for rep, p in sym.rep_of)


def _load_coefficients(
    graph: LogicalGraph, sym: ChunkSymmetry, chunkup: int, chunk_bytes: float
) -> dict[Resource, dict[tuple[int, int], float]]:
    """Return, per resource, the load (µs) each representative variable (rep, link) puts on it."""
    loads: dict[Resource, dict[tuple[int, int], float]] = {}
    group = graph.group
    inverse = [tuple(sorted(range(len(p)), key=p.__getitem__)) for p in group]
    for c, (rep, p_index) in enumerate(sym.rep_of):
        root = c // chunkup
        inv = inverse[p_index]
        for l_index, link in enumerate(graph.links):
            if link.dst == root or not link.allows(root):
                continue
            key = (rep, graph.index[(inv[link.src], inv[link.dst])])
            for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
                row = loads.setdefault(res, {})
                row[key] = row.get(key, 0.0) + chunk_bytes / (bw * BYTES_PER_US_PER_GBPS)
    return loads


def routing_objective_us(
    graph: LogicalGraph, trees: tuple[tuple[int, ...], ...], chunkup: int, chunk_bytes: float, piece_bytes: float
) -> float:
    """Return the relaxed objective of ``trees``: the busiest resource's load plus the deepest path (µs)."""
    load: dict[Resource, float] = {}
    deepest = 0.0
    for c, tree in enumerate(trees):
        arrival = {c // chunkup: 0.0}
        for l in tree:
            link = graph.links[l]
            arrival[link.dst] = arrival[link.src] + link.time_us(piece_bytes)
            for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
                load[res] = load.get(res, 0.0) + chunk_bytes / (bw * BYTES_PER_US_PER_GBPS)
        deepest = max(deepest, max(arrival.values()))
    return max(load.values(), default=0.0) + deepest


# -- greedy -------------------------------------------------------------------------------------


def _greedy_key(
    link: LogicalLink,
    start_us: float,
    load: dict[Resource, float],
    weight: float,
    chunk_bytes: float,
    piece_bytes: float,
) -> float:
    """Return the Prim key of ``link``: arrival over it plus ``weight`` times its busiest resource's load."""
    busy = max(
        load.get(res, 0.0) + chunk_bytes / (bw * BYTES_PER_US_PER_GBPS)
        for res, bw in zip(link.resources, link.resource_bandwidths_GBps)
    )
    return start_us + link.time_us(piece_bytes) + weight * busy


def _greedy_tree(
    graph: LogicalGraph, root: int, load: dict[Resource, float], weight: float, chunk_bytes: float, piece_bytes: float
) -> tuple[int, ...]:
    """Return a Prim-style arborescence for a chunk of ``root`` under current loads.

    Keys are rechecked when popped: the tree's own edges add load as it grows, so a second
    edge through a NIC the tree already crosses costs more than when it was pushed.
    """
    arrival = {root: 0.0}
    tree: list[int] = []
    heap: list[tuple[float, int]] = []

    def push(u: int) -> None:
        for l in graph.out_links[u]:
            link = graph.links[l]
            if link.dst not in arrival and link.allows(root):
                heapq.heappush(heap, (_greedy_key(link, arrival[u], load, weight, chunk_bytes, piece_bytes), l))

    push(root)
    while heap and len(arrival) < graph.num_ranks:
        key, l = heapq.heappop(heap)
        link = graph.links[l]
        if link.dst in arrival:
            continue
        current = _greedy_key(link, arrival[link.src], load, weight, chunk_bytes, piece_bytes)
        if current > key * (1 + 1e-9) + 1e-12:
            heapq.heappush(heap, (current, l))
            continue
        arrival[link.dst] = arrival[link.src] + link.time_us(piece_bytes)
        tree.append(l)
        add_link_load(load, link, chunk_bytes)
        push(link.dst)
    return tuple(tree)


def add_link_load(load: dict[Resource, float], link: LogicalLink, chunk_bytes: float) -> None:
    """Add one chunk's crossing of ``link`` (µs of busy time) to every resource it holds in ``load``."""
    for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
        load[res] = load.get(res, 0.0) + chunk_bytes / (bw * BYTES_PER_US_PER_GBPS)


def _greedy_trees(
    graph: LogicalGraph, sym: ChunkSymmetry, chunkup: int, weight: float, chunk_bytes: float, piece_bytes: float
) -> dict[int, tuple[int, ...]]:
    load: dict[Resource, float] = {}
    rep_trees: dict[int, tuple[int, ...]] = {}
    for rep in sym.reps:
        tree = _greedy_tree(graph, rep // chunkup, load, weight, chunk_bytes, piece_bytes)
        rep_trees[rep] = tree
        for perm in graph.group[1:]:  # the identity's loads were added while building the tree
            for l in tree:
                add_link_load(load, graph.links[_image(graph, perm, l)], chunk_bytes)
    return rep_trees


def greedy_routings(graph: LogicalGraph, chunkup: int, chunk_bytes: float, piece_bytes: float) -> tuple[Routing, ...]:
    """Return the greedy routings over ``GREEDY_LOAD_WEIGHTS``, best objective first (symmetric by construction)."""
    sym = chunk_symmetry(graph, chunkup)
    candidates = {}
    for weight in GREEDY_LOAD_WEIGHTS:
        trees = expand_trees(graph, sym, _greedy_trees(graph, sym, chunkup, weight, chunk_bytes, piece_bytes))
        candidates.setdefault(
            trees,
            Routing(
                graph,
                chunkup,
                trees,
                routing_objective_us(graph, trees, chunkup, chunk_bytes, piece_bytes),
                "heuristic",
            ),
        )
    return tuple(sorted(candidates.values(), key=lambda r: r.objective_us))


def greedy_routing(graph: LogicalGraph, chunkup: int, chunk_bytes: float, piece_bytes: float) -> Routing:
    """Return the best of the greedy routings (``greedy_routings``)."""
    return greedy_routings(graph, chunkup, chunk_bytes, piece_bytes)[0]


# -- MILP ---------------------------------------------------------------------------------------


@dataclass
class _Model:
    prob: pulp.LpProblem
    x: dict[tuple[int, int], pulp.LpVariable]
    t: dict[tuple[int, int], pulp.LpVariable]


def _shortest_latency(graph: LogicalGraph, root: int, piece_bytes: float) -> list[float]:
    dist = [math.inf] * graph.num_ranks
    dist[root] = 0.0
    heap = [(0.0, root)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for l in graph.out_links[u]:
            link = graph.links[l]
            if link.allows(root) and d + link.time_us(piece_bytes) < dist[link.dst]:
                dist[link.dst] = d + link.time_us(piece_bytes)
                heapq.heappush(heap, (dist[link.dst], link.dst))
    return dist


def _build_model(
    graph: LogicalGraph, sym: ChunkSymmetry, chunkup: int, chunk_bytes: float, piece_bytes: float, horizon: float
) -> _Model:
    prob = pulp.LpProblem("routing", pulp.LpMinimize)
    keys = [
        (rep, l)
        for rep in sym.reps
        for l, link in enumerate(graph.links)
        if link.dst != rep // chunkup and link.allows(rep // chunkup)
    ]
    x = prob.add_variable_dicts("x", keys, cat=pulp.LpBinary)
    t_keys = [(rep, v) for rep in sym.reps for v in range(graph.num_ranks) if v != rep // chunkup]
    t = prob.add_variable_dicts("t", t_keys, lowBound=0, upBound=horizon)
    load_max = prob.add_variable("load_us", lowBound=0, upBound=horizon)
    path_max = prob.add_variable("path_us", lowBound=0, upBound=horizon)
    prob += load_max + path_max + _policy_terms(prob, graph, x)
    incoming: dict[tuple[int, int], list[int]] = {}
    for rep, l in keys:
        incoming.setdefault((rep, graph.links[l].dst), []).append(l)
    for rep in sym.reps:
        root = rep // chunkup
        dist = _shortest_latency(graph, root, piece_bytes)
        for v in range(graph.num_ranks):
            if v == root:
                continue
            ins = incoming[(rep, v)]
            prob += pulp.lpSum(x[(rep, l)] for l in ins) == 1, f"one_copy_{rep}_{v}"
            prob += (
                t[(rep, v)]
                >= pulp.lpSum(
                    (dist[graph.links[l].src] + graph.links[l].time_us(piece_bytes)) * x[(rep, l)] for l in ins
                ),
                f"earliest_{rep}_{v}",
            )
            prob += path_max >= t[(rep, v)], f"path_{rep}_{v}"
    for rep, l in keys:
        link = graph.links[l]
        t_src = 0 if link.src == rep // chunkup else t[(rep, link.src)]
        prob += (
            t[(rep, link.dst)] >= t_src + (link.time_us(piece_bytes) + horizon) * x[(rep, l)] - horizon,
            f"causal_{rep}_{l}",
        )
    for r_index, (res, row) in enumerate(sorted(_load_coefficients(graph, sym, chunkup, chunk_bytes).items())):
        prob += linear_sum([(x[key], coef) for key, coef in row.items()]) <= load_max, f"load_{r_index}"
    return _Model(prob, x, t)


def _policy_terms(
    prob: pulp.LpProblem, graph: LogicalGraph, x: dict[tuple[int, int], pulp.LpVariable]
) -> pulp.LpAffineExpression:
    """Return the objective terms of the sketch's switch policies (uc-min: few peers, uc-max: many)."""
    links = [l for l, link in enumerate(graph.links) if link.policy is not None]
    if not links:
        return linear_sum(())
    used = prob.add_variable_dicts("used", links, cat=pulp.LpBinary)
    by_link: dict[int, list[pulp.LpVariable]] = {}
    for (rep, l), var in x.items():
        by_link.setdefault(l, []).append(var)
    terms = []
    for l in links:
        for var in by_link.get(l, []):
            prob += used[l] >= var, f"used_{l}_{var.name}"
        sign = 1.0 if graph.links[l].policy is SwitchPolicy.UC_MIN else -1.0
        terms.append((used[l], sign * _POLICY_WEIGHT))
    return linear_sum(terms)


def _start_values(
    model: _Model, graph: LogicalGraph, sym: ChunkSymmetry, start: Routing, chunkup: int, piece_bytes: float
) -> dict[str, float]:
    values: dict[str, float] = {var.name: 0.0 for var in model.x.values()}
    for rep in sym.reps:
        arrival = {rep // chunkup: 0.0}
        for l in start.trees[rep]:
            link = graph.links[l]
            values[model.x[(rep, l)].name] = 1.0
            arrival[link.dst] = arrival[link.src] + link.time_us(piece_bytes)
            values[model.t[(rep, link.dst)].name] = arrival[link.dst]
    return values


def _extract_trees(
    model: _Model, graph: LogicalGraph, sym: ChunkSymmetry, chunkup: int
) -> dict[int, tuple[int, ...]] | None:
    rep_trees = {}
    for rep in sym.reps:
        chosen = [l for (r, l), var in model.x.items() if r == rep and (var.value() or 0.0) > 0.5]
        root = rep // chunkup
        order = sorted(
            chosen,
            key=lambda l: 0.0 if graph.links[l].src == root else (model.t[(rep, graph.links[l].src)].value() or 0.0),
        )
        reached, tree = {root}, []
        pending = list(order)
        while pending:
            progress = [l for l in pending if graph.links[l].src in reached]
            if not progress:
                return None
            for l in progress:
                if graph.links[l].dst not in reached:
                    reached.add(graph.links[l].dst)
                    tree.append(l)
            pending = [l for l in pending if l not in progress]
        if len(reached) != graph.num_ranks:
            return None
        rep_trees[rep] = tuple(tree)
    return rep_trees


def route_candidates(
    graph: LogicalGraph,
    chunkup: int,
    chunk_bytes: float,
    piece_bytes: float,
    options: SolverOptions,
    time_limit_s: float | None = None,
    start: Routing | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[Routing, ...]:
    """Return the MILP's routing followed by ``start`` (when it differs) and the distinct greedy ones.

    Routings of equal relaxed objective can order very differently, so the caller orders each
    and keeps the fastest schedule; the greedy ones carry ``ALTERNATIVE_STATUS``. ``start`` (e.g.
    packed trees) also warm-starts the MILP when it beats the greedy routes. ``progress`` gets
    the MILP's lines (``solve_model``).
    """
    best = route_chunks(graph, chunkup, chunk_bytes, piece_bytes, options, time_limit_s, start=start, progress=progress)
    others = tuple(
        replace(r, status=ALTERNATIVE_STATUS)
        for r in greedy_routings(graph, chunkup, chunk_bytes, piece_bytes)
        if r.trees != best.trees
    )
    given = (start,) if start is not None and start.trees != best.trees else ()
    return (best,) + given + others[:MAX_ALTERNATIVE_ROUTINGS]


def route_chunks(
    graph: LogicalGraph,
    chunkup: int,
    chunk_bytes: float,
    piece_bytes: float,
    options: SolverOptions,
    time_limit_s: float | None = None,
    start: Routing | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Routing:
    """Return every chunk's route: the MILP's best within its budgets, else the greedy one.

    ``chunk_bytes`` sizes the loads, ``piece_bytes`` (<= chunk) the path latencies. ``start`` is
    another routing to warm-start from when its objective beats the greedy one's. The result's
    ``status`` says ``optimal``, ``node limit``, ``wall-clock cap`` or ``heuristic`` (the MILP
    found nothing better within its budgets, or was not needed: a single-rank problem), or the
    start's status when the MILP found nothing better than it; ``solve_status`` says how the MILP
    ended either way. ``time_limit_s`` (s) is what is left of the wall-clock safety cap.
    ``progress`` gets the MILP's lines (``solve_model``).
    """
    incumbent = greedy_routing(graph, chunkup, chunk_bytes, piece_bytes)
    if start is not None and start.objective_us < incumbent.objective_us:
        incumbent = start
    if graph.num_ranks < 2:
        return incumbent
    sym = chunk_symmetry(graph, chunkup)
    if len(graph.group) == 1 and graph.num_ranks > graph.gpus_per_node:
        columns = sum(1 for rep in sym.reps for link in graph.links if link.allows(rep // chunkup))
        if columns > MAX_ASYMMETRIC_COLUMNS:
            logger.info("routing MILP: %d columns, no symmetry: not solved; keeping its start", columns)
            return replace(incumbent, solve_status=SolveStatus.TOO_LARGE.value)
    horizon = incumbent.objective_us * (1 + 1e-6) + 1e-6
    model = _build_model(graph, sym, chunkup, chunk_bytes, piece_bytes, horizon)
    values = _start_values(model, graph, sym, incumbent, chunkup, piece_bytes)
    outcome = solve_model(model.prob, options, time_limit_s, values, progress=progress)
    ended = outcome.status.value
    kept = Routing(graph, chunkup, incumbent.trees, incumbent.objective_us, incumbent.status, outcome.wall_s, ended)
    if not outcome.has_solution:
        logger.info("routing MILP: %s; keeping the %s routes", outcome.status.value, incumbent.status)
        return kept
    rep_trees = _extract_trees(model, graph, sym, chunkup)
    if rep_trees is None:
        logger.warning("routing MILP returned a solution that is not a tree; keeping the %s routes", incumbent.status)
        return kept
    trees = expand_trees(graph, sym, rep_trees)
    objective = routing_objective_us(graph, trees, chunkup, chunk_bytes, piece_bytes)
    if objective > incumbent.objective_us:
        return kept
    status = "optimal" if outcome.status is SolveStatus.OPTIMAL else outcome.status.value
    return Routing(graph, chunkup, trees, objective, status, outcome.wall_s, ended)
