"""Lower bounds on collective time: the cut bound (max-flow) and the latency floor.

Data moves only over links that some GPU-to-GPU ``route`` holds (``route`` is the model's one
definition of which links a transfer uses; GPUs may relay). For AllGather of M bytes over N
GPUs, every vertex set S that misses at least one GPU must send the M/N bytes of each of its
GPUs out over the links leaving S at least once, so

    T_AG >= (M / N) * max_S |GPUs in S| / capacity(links leaving S).

ReduceScatter is the same on the reversed graph (each GPU of S needs M/N reduced bytes from
outside S); AllReduce >= T_RS + T_AG (docs/design.md). The maximum over S is exact: for a rate
x, every S has capacity(leaving S) >= x |GPUs in S| iff, with a super source feeding every
GPU at rate x, each GPU v has a minimum cut >= x N. Starting from x = the best of a few
candidate sets (one GPU's ingress or egress, one node), Dinkelbach's iteration lowers x to the
ratio of the most violated minimum cut until no GPU has one; the last set is the binding cut.
When the machines of a composed topology are alike, only machine 0's GPUs need a max-flow.
AlltoAll has its own cut (``alltoall_bound``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.flow import build_residual_network, preflow_push

from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.topology.alltoall_bound import alltoall_cut
from taccl_py.topology.compose import node_prefix
from taccl_py.topology.model import ROUTE_REFERENCE_BYTES, Link, LinkKind, Topology, VertexKind, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "CutBound",
    "LowerBound",
    "binding_cut",
    "latency_floor_us",
    "lower_bound",
    "lower_bounds",
    "lower_bounds_by_collective",
]

# Relative slack when comparing a min-cut value with x * N: capacities are floats and the
# preflow sums them in a different order than the ratio does.
_REL_TOL = 1e-9
# Dinkelbach converges in a handful of rounds; the cap only guards against float cycling.
_MAX_ROUNDS = 64
_SOURCE = ("super source",)  # a node key no vertex name (a str) can equal
_EDGE_ORDER = "edge order"  # key of a flow graph's attributes: each edge's place in graph.edges
_NETWORK_KINDS = frozenset({LinkKind.IB, LinkKind.ETHERNET})
# The collectives bounded by the ReduceScatter cut (data into a set) and by the AllGather cut (out of it).
_USES_RS_CUT = frozenset({Collective.REDUCESCATTER, Collective.ALLREDUCE})
_USES_AG_CUT = frozenset({Collective.ALLGATHER, Collective.ALLREDUCE})


@dataclass(frozen=True)
class CutBound:
    """The vertex set S with the most GPUs per GB/s crossing its boundary.

    ``reverse`` False: capacity of the links leaving S (AllGather); True: entering S
    (ReduceScatter). ``cut_gpus / capacity_GBps`` is the size-independent ratio.
    """

    reverse: bool
    cut: tuple[str, ...]
    cut_gpus: int
    capacity_GBps: float
    description: str

    def time_us(self, size_bytes: float, num_ranks: int) -> float:
        """Return (size / N) * |GPUs in S| / capacity in µs (0 for one GPU)."""
        if not self.cut_gpus:
            return 0.0
        return float(size_bytes / num_ranks * self.cut_gpus / (self.capacity_GBps * BYTES_PER_US_PER_GBPS))


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on one collective's time at one size, with the cut that binds it.

    ``time_us = max(bandwidth_time_us, latency_floor_us)``. For AllReduce the bandwidth
    term is the ReduceScatter one plus the AllGather one and ``cut`` is the AllGather cut.
    """

    collective: Collective
    size_bytes: int
    time_us: float
    bandwidth_time_us: float
    latency_floor_us: float
    cut: tuple[str, ...]
    cut_gpus: int
    cut_capacity_GBps: float
    description: str


def _route_links(topology: Topology) -> tuple[Link, ...]:
    """Return the links some GPU-to-GPU route holds, in topology order.

    One Dijkstra per source instead of one ``route`` call per pair: with the out-edges of
    the other GPUs hidden (GPUs do not forward), the search explores the same vertices in the
    same order as ``route``'s per-pair search, so each path is the one ``route`` returns
    (tests check this on the built-in machines).
    """
    graph = topology.graph
    gpu_names = {v.name for v in topology.gpus}
    used: set[tuple[str, str]] = set()
    for source in topology.gpus:
        weight = functools.partial(_search_weight, gpu_names, source.name)
        paths = nx.single_source_dijkstra_path(graph, source.name, weight=weight)
        for target in topology.gpus:
            if target is source:
                continue
            if topology.link(source.name, target.name) is not None:
                used.add((source.name, target.name))
            elif target.name in paths:
                path = paths[target.name]
                used.update(zip(path, path[1:]))
            else:
                route(topology, source.rank, target.rank)  # raises the model's "no path" error
    return tuple(link for link in topology.links if link.key in used)


def _search_weight(gpu_names: set[str], source: str, src: str, dst: str, data: dict) -> float | None:
    if src != source and src in gpu_names:
        return None
    return data["link"].time_us(ROUTE_REFERENCE_BYTES)


def _flow_graph(links: Iterable[Link], reverse: bool) -> nx.DiGraph:
    graph = nx.DiGraph()
    for link in links:
        src, dst = (link.dst, link.src) if reverse else (link.src, link.dst)
        graph.add_edge(src, dst, capacity=link.bandwidth_GBps)
    graph.graph[_EDGE_ORDER] = {edge: index for index, edge in enumerate(graph.edges)}
    return graph


def _boundary(graph: nx.DiGraph, inside: frozenset) -> tuple[tuple[str, str], ...]:
    """Return the edges leaving ``inside``, in ``graph.edges`` order.

    Found from the smaller side (the edges out of ``inside``, or into the rest), so the 2N one-GPU
    and all-but-one-GPU candidates cost their GPUs' links, not the whole graph each; the order
    keeps every capacity summed over them the same float.
    """
    if 2 * len(inside) <= len(graph):
        found = [(u, w) for u in inside if u in graph for w in graph.succ[u] if w not in inside]
    else:
        found = [(u, w) for w in graph if w not in inside for u in graph.pred[w] if u in inside]
    return tuple(sorted(found, key=graph.graph[_EDGE_ORDER].__getitem__))


def _ratio(graph: nx.DiGraph, inside: frozenset, gpus: frozenset) -> float:
    """Return capacity leaving ``inside`` per GPU in it (GB/s per GPU)."""
    capacity = sum(graph.edges[edge]["capacity"] for edge in _boundary(graph, inside))
    return capacity / len(inside & gpus)


def _candidates(topology: Topology, graph: nx.DiGraph, gpus: frozenset) -> list[frozenset]:
    everything = frozenset(graph.nodes)
    sets = []
    for node in range(topology.nodes):
        machine = frozenset(v.name for v in topology.vertices if v.node == node and v.kind is not VertexKind.NET_SWITCH)
        sets += [machine & everything, everything - machine]
    sets += [everything - {v.name} for v in topology.gpus] + [frozenset({v.name}) for v in topology.gpus]
    return [s for s in sets if s & gpus and gpus - s]


def _sinks(topology: Topology, graph: nx.DiGraph) -> list[str]:
    """Return the GPUs whose min cuts must be checked: those of the first machine of each kind.

    Swapping machine r and machine k (vertex ``n{k}.x`` <-> ``n{r}.x``, the network switch
    fixed) maps the flow network onto itself when every link keeps its capacity; then GPU
    ``n{k}.x`` has the same min cut as ``n{r}.x`` and need not be checked. Machine k joins the
    first earlier representative it swaps with, else becomes one: N copies of one machine check
    machine 0 only, a cluster of two kinds (or one NIC down) one machine of each.
    """
    if topology.nodes == 1:
        return [v.name for v in topology.gpus]
    representatives = [0]
    for node in range(1, topology.nodes):
        if not any(_alike(topology, graph, kept, node) for kept in representatives):
            representatives.append(node)
    kept_nodes = frozenset(representatives)
    return [v.name for v in topology.gpus if v.node in kept_nodes]


def _alike(topology: Topology, graph: nx.DiGraph, node: int, other: int) -> bool:
    """Return True when exchanging machines ``node`` and ``other`` maps the flow network onto itself.

    Only the links into or out of the two machines move, so only those are compared: the check
    costs the two machines' links, not the whole network's.
    """
    swap = _node_swap(topology, node, other)
    if swap is None:
        return False
    for name in swap:
        if name not in graph:
            continue
        touching = [(name, w, c) for w, c in graph.succ[name].items()]
        touching += [(u, name, c) for u, c in graph.pred[name].items() if u not in swap]
        for u, w, data in touching:
            twin = (swap.get(u, u), swap.get(w, w))
            if not graph.has_edge(*twin) or graph.edges[twin]["capacity"] != data["capacity"]:
                return False
    return True


def _node_swap(topology: Topology, node: int, other: int) -> dict[str, str] | None:
    """Return the renaming that exchanges machine ``node`` and machine ``other``, or None if they differ."""
    here, there = node_prefix(node), node_prefix(other)
    swap = {}
    for vertex in topology.vertices:
        if vertex.node not in (node, other) or vertex.kind is VertexKind.NET_SWITCH:
            continue
        mine, theirs = (here, there) if vertex.node == node else (there, here)
        if not vertex.name.startswith(mine):
            return None
        swap[vertex.name] = theirs + vertex.name[len(mine) :]
    return swap if set(swap.values()) == set(swap) else None


def _violated_cuts(graph: nx.DiGraph, gpus: Sequence[str], sinks: Sequence[str], rate_GBps: float) -> list[frozenset]:
    """Return, per sink GPU v whose min cut from the source is below rate_GBps * N, its source side."""
    network = graph.copy()
    network.add_edges_from((_SOURCE, g, {"capacity": rate_GBps}) for g in gpus)
    residual = build_residual_network(network, "capacity")
    threshold = rate_GBps * len(gpus) * (1 - _REL_TOL)
    found = []
    for sink in sinks:
        preflow_push(network, _SOURCE, sink, residual=residual, value_only=True)
        if residual.graph["flow_value"] < threshold:
            found.append(frozenset(network.nodes) - _reaching(residual, sink) - {_SOURCE})
    return found


def _reaching(residual: nx.DiGraph, sink: object) -> frozenset:
    """Return the vertices with a residual path to ``sink`` (the sink side of a min cut)."""
    seen = {sink}
    frontier = [sink]
    while frontier:
        node = frontier.pop()
        for pred, attr in residual.pred[node].items():
            if pred not in seen and attr["capacity"] - attr["flow"] > _REL_TOL * attr["capacity"]:
                seen.add(pred)
                frontier.append(pred)
    return frozenset(seen)


def _binding_set(topology: Topology, graph: nx.DiGraph) -> frozenset:
    gpus = frozenset(v.name for v in topology.gpus)
    order = [v.name for v in topology.gpus]
    sinks = _sinks(topology, graph)
    best = min(_candidates(topology, graph, gpus), key=lambda s: _ratio(graph, s, gpus))
    rate = _ratio(graph, best, gpus)
    for _ in range(_MAX_ROUNDS):
        violated = _violated_cuts(graph, order, sinks, rate)
        if not violated:
            break
        candidate = min(violated, key=lambda s: _ratio(graph, s, gpus))
        if _ratio(graph, candidate, gpus) >= rate:
            break
        best, rate = candidate, _ratio(graph, candidate, gpus)
    return best


def binding_cut(topology: Topology, reverse: bool = False) -> CutBound:
    """Return the vertex set that bounds AllGather (``reverse`` False) or ReduceScatter time.

    Parameters
    ----------
    topology : Topology
        Any topology; only links that some GPU-to-GPU route holds count.
    reverse : bool
        False: capacity leaving the set (AllGather); True: entering it (ReduceScatter).

    Returns
    -------
    CutBound
        The set S (vertex names), its GPU count and boundary capacity (GB/s per direction).

    Notes
    -----
    Exact up to a relative 1e-9: a few rounds of one max-flow per GPU (networkx preflow-push)
    plus the all-pairs routes. The ratio does not depend on the size, so compute it once
    and call ``CutBound.time_us`` per size (``lower_bounds`` does).

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> cut = binding_cut(load_topology("ndv2", nodes=2))
    >>> cut.cut_gpus, round(cut.capacity_GBps, 4)
    (8, 9.5238)
    """
    return _cut_bound(topology, _route_links(topology), reverse)


def _cut_bound(topology: Topology, links: tuple[Link, ...], reverse: bool) -> CutBound:
    if topology.num_ranks < 2:
        return CutBound(reverse, (), 0, 0.0, "one GPU: nothing to move")
    graph = _flow_graph(links, reverse)
    inside = _binding_set(topology, graph)
    boundary = _boundary(graph, inside)
    capacity = float(sum(graph.edges[edge]["capacity"] for edge in boundary))
    crossing = tuple(topology.link(w, u) if reverse else topology.link(u, w) for u, w in boundary)
    names = tuple(v.name for v in topology.vertices if v.name in inside)
    gpus = tuple(v for v in topology.gpus if v.name in inside)
    return CutBound(reverse, names, len(gpus), capacity, _describe(topology, gpus, crossing, capacity, reverse))


def _describe(topology: Topology, inside_gpus: tuple, links: tuple[Link, ...], capacity: float, reverse: bool) -> str:
    """Return e.g. ``NIC cut: node 0 (8 GPUs): 9.524 GB/s leaving over 1 ib link``.

    A set of whole nodes that misses exactly one node is named by that node, with the direction
    turned (``node 1 (8 GPUs): 168 GB/s entering over 7 pcie links``): the same links, read from
    the node whose NICs or PCIe bind.
    """
    outside = [v for v in topology.gpus if v not in inside_gpus]
    nodes = sorted({v.node for v in inside_gpus})
    outside_nodes = sorted({v.node for v in outside})
    crossing = "entering" if reverse else "leaving"
    network = all(link.kind in _NETWORK_KINDS for link in links)
    whole_nodes = len(inside_gpus) == len(nodes) * topology.gpus_per_node
    if topology.nodes > 1 and whole_nodes and len(nodes) > 1 and len(outside_nodes) == 1:
        label = "NIC cut" if network else "node cut"
        what = f"node {outside_nodes[0]} ({len(outside)} GPUs)"
        crossing = "leaving" if reverse else "entering"
    elif topology.nodes > 1 and whole_nodes:
        label = "NIC cut" if network else "node cut"
        what = (
            f"node {nodes[0]}" if len(nodes) == 1 else "nodes " + ",".join(map(str, nodes))
        ) + f" ({len(inside_gpus)} GPUs)"
    elif len(outside) == 1:
        label = "per-GPU egress cut" if reverse else "per-GPU ingress cut"
        what = f"every GPU but {outside[0].name} ({len(inside_gpus)} GPUs)"
        crossing = f"out of {outside[0].name}" if reverse else f"into {outside[0].name}"
    elif len(inside_gpus) == 1:
        label = "per-GPU ingress cut" if reverse else "per-GPU egress cut"
        what = f"{inside_gpus[0].name} alone"
    else:
        label = "NIC cut" if network else "cut"
        what = f"{len(inside_gpus)} GPUs ({', '.join(v.name for v in inside_gpus)})"
    kinds: dict[str, int] = {}
    for link in links:
        kinds[link.kind.value] = kinds.get(link.kind.value, 0) + 1
    over = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"{label}: {what}: {capacity:.4g} GB/s {crossing} over {over} link{'s' if len(links) > 1 else ''}"


def latency_floor_us(topology: Topology) -> float:
    """Return the largest, over ordered GPU pairs, of the least total α of a path between them (µs).

    Paths run over links some route holds and may relay through GPUs; every collective here
    moves data between every pair, so some chunk pays at least this much.
    """
    return _latency_floor_us(topology, _route_links(topology))


def _latency_floor_us(topology: Topology, links: tuple[Link, ...]) -> float:
    graph = nx.DiGraph()
    graph.add_weighted_edges_from(((link.src, link.dst, link.alpha_us) for link in links), weight="alpha_us")
    names = [v.name for v in topology.gpus]
    floor = 0.0
    for src in names:
        lengths = nx.single_source_dijkstra_path_length(graph, src, weight="alpha_us") if src in graph else {}
        floor = max([floor] + [lengths[dst] for dst in names if dst != src and dst in lengths])
    return float(floor)


def lower_bounds(
    topology: Topology, collective: Collective | str, sizes_bytes: Iterable[int]
) -> tuple[LowerBound, ...]:
    """Return ``lower_bound`` at each size, computing the cuts and the floor once.

    Raises ``ArgumentError`` for an unknown collective or a size below 1 byte.
    """
    collective = _collective(collective)
    return lower_bounds_by_collective(topology, (collective,), sizes_bytes)[collective]


def lower_bounds_by_collective(
    topology: Topology, collectives: Iterable[Collective | str], sizes_bytes: Iterable[int]
) -> dict[Collective, tuple[LowerBound, ...]]:
    """Return ``lower_bounds`` of each collective (in the order given), sharing the work between them.

    The routes and the latency floor serve every collective, and AllReduce takes the AllGather and
    ReduceScatter cuts, so each is computed once here where one ``lower_bounds`` call per
    collective computes the routes four times and each cut twice (``taccl topo show``).

    Raises ``ArgumentError`` for an unknown collective or a size below 1 byte.
    """
    chosen = tuple(dict.fromkeys(_collective(collective) for collective in collectives))
    sizes = tuple(sizes_bytes)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ArgumentError(topology.name, "size_bytes", f"size {size!r}", "an integer number of bytes >= 1")
    links = _route_links(topology)
    floor = _latency_floor_us(topology, links)
    cuts: dict[bool, CutBound] = {}  # by direction: reverse True for ReduceScatter, False for AllGather
    bounds = {}
    for collective in chosen:
        if collective is Collective.ALLTOALL:
            bounds[collective] = _alltoall_bounds(topology, links, sizes, floor)
            continue
        directions = [reverse for reverse, uses in ((True, _USES_RS_CUT), (False, _USES_AG_CUT)) if collective in uses]
        for reverse in directions:
            if reverse not in cuts:
                cuts[reverse] = _cut_bound(topology, links, reverse)
        bounds[collective] = _cut_bounds(collective, sizes, [cuts[r] for r in directions], floor, topology.num_ranks)
    return bounds


def _cut_bounds(
    collective: Collective, sizes: tuple[int, ...], cuts: Sequence[CutBound], floor: float, num_ranks: int
) -> tuple[LowerBound, ...]:
    """Return the bound at each size from ``cuts`` (ReduceScatter's first, AllGather's last) and the floor."""
    main = cuts[-1]
    if len(cuts) == 2 and cuts[0].cut == cuts[1].cut:
        description = f"reducescatter + allgather, {main.description}"
    elif len(cuts) == 2:
        description = f"reducescatter {cuts[0].description}; allgather {cuts[1].description}"
    else:
        description = main.description
    bounds = []
    for size in sizes:
        bandwidth = sum(cut.time_us(size, num_ranks) for cut in cuts)
        bounds.append(
            LowerBound(
                collective,
                size,
                max(bandwidth, floor),
                bandwidth,
                floor,
                main.cut,
                main.cut_gpus,
                main.capacity_GBps,
                description,
            )
        )
    return tuple(bounds)


def _alltoall_bounds(
    topology: Topology, links: tuple[Link, ...], sizes: tuple[int, ...], floor: float
) -> tuple[LowerBound, ...]:
    """Return the AlltoAll bound at each size (``alltoall_bound``): its cut or the latency floor."""
    cut = alltoall_cut(topology, links)
    bounds = []
    for size in sizes:
        bandwidth = cut.time_us(size, topology.num_ranks)
        bounds.append(
            LowerBound(
                Collective.ALLTOALL,
                size,
                max(bandwidth, floor),
                bandwidth,
                floor,
                cut.cut,
                cut.cut_gpus,
                cut.capacity_GBps,
                cut.description,
            )
        )
    return tuple(bounds)


def _collective(collective: Collective | str) -> Collective:
    try:
        return Collective(collective)
    except ValueError:
        raise ArgumentError(
            None, "collective", f"unknown collective {collective!r}", "allgather, reducescatter, allreduce or alltoall"
        ) from None


def lower_bound(topology: Topology, collective: Collective | str, size_bytes: int) -> LowerBound:
    """Return a lower bound on the time (µs) of ``collective`` over ``size_bytes`` on ``topology``.

    Parameters
    ----------
    topology : Topology
        The machine(s); links no GPU-to-GPU route holds carry nothing.
    collective : Collective or str
        allgather, reducescatter, allreduce or alltoall.
    size_bytes : int
        The nccl-tests size M: AllGather's total output, ReduceScatter's total input,
        AllReduce's buffer; AlltoAll's buffer on one rank.

    Returns
    -------
    LowerBound
        ``time_us = max(bandwidth term, latency floor)``; the bandwidth term is the cut bound
        (M/N) * |GPUs in S| / capacity(S) (AllReduce: ReduceScatter's plus AllGather's).

    Raises
    ------
    ArgumentError
        For an unknown collective or a size below 1 byte.
    TopologyError
        When some GPU cannot reach another.

    Notes
    -----
    Each call recomputes the cut (one max-flow per GPU per round); for several sizes use
    ``lower_bounds``.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> bound = lower_bound(load_topology("dgx2"), "allgather", 10**9)
    >>> round(bound.time_us), bound.cut_gpus
    (7500, 15)
    """
    return lower_bounds(topology, collective, (size_bytes,))[0]
