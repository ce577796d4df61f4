"""The cut search behind the lower bounds: the vertex set whose boundary binds AllGather or ReduceScatter.

Data moves only over links that some GPU-to-GPU ``route`` holds (``route`` is the model's one
definition of which links a transfer uses; GPUs may relay). For AllGather of M bytes over N
GPUs, every vertex set S that misses at least one GPU must send the M/N bytes of each of its
GPUs out over the links leaving S at least once, so

    T_AG >= (M / N) * max_S |GPUs in S| / capacity(links leaving S).

ReduceScatter is the same on the reversed graph (each GPU of S needs M/N reduced bytes from
outside S). The maximum over S is exact: for a rate x, every S has capacity(leaving S) >=
x |GPUs in S| iff, with a super source feeding every GPU at rate x, each GPU v has a minimum cut
>= x N. Starting from x = the best of a few candidate sets (one GPU's ingress or egress, one
node), Dinkelbach's iteration lowers x to the ratio of the most violated minimum cut until no GPU
has one; the last set is the binding cut. When the machines of a composed topology are alike,
only machine 0's GPUs need a max-flow, and of those only one per class of GPUs that an
automorphism of the network maps onto each other (``bounds.symmetry``: 1 of GB200 NVL72 x2's 72).
``taccl_py.bounds`` turns the cut into a bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.flow import build_residual_network, preflow_push

from taccl_py.bounds.symmetry import GpuClass, gpu_classes
from taccl_py.topology.compose import node_prefix
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, route, routed_links
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["CutBound", "binding_cut", "crossing_alpha_us", "cut_bound", "route_links"]

# Relative slack when comparing a min-cut value with x * N: capacities are floats and the
# preflow sums them in a different order than the ratio does.
_REL_TOL = 1e-9
# Dinkelbach converges in a handful of rounds; the cap only guards against float cycling.
_MAX_ROUNDS = 64
_SOURCE = ("super source",)  # a node key no vertex name (a str) can equal
_EDGE_ORDER = "edge order"  # key of a flow graph's attributes: each edge's place in graph.edges
_NETWORK_KINDS = frozenset({LinkKind.IB, LinkKind.ETHERNET})


@dataclass(frozen=True)
class CutBound:
    """The vertex set S with the most GPUs per GB/s crossing its boundary.

    ``reverse`` False: capacity of the links leaving S (AllGather); True: entering S
    (ReduceScatter). ``cut_gpus / capacity_GBps`` is the size-independent ratio. ``alpha_us``
    is the least α (µs) of a route from a GPU in S to a GPU outside it (``reverse``: from
    outside into S), which every byte that must cross pays first (``crossing_alpha_us``).
    """

    reverse: bool
    cut: tuple[str, ...]
    cut_gpus: int
    capacity_GBps: float
    description: str
    alpha_us: float

    def time_us(self, size_bytes: float, num_ranks: int) -> float:
        """Return (size / N) * |GPUs in S| / capacity in µs (0 for one GPU)."""
        if not self.cut_gpus:
            return 0.0
        return float(size_bytes / num_ranks * self.cut_gpus / (self.capacity_GBps * BYTES_PER_US_PER_GBPS))


def route_links(topology: Topology) -> tuple[Link, ...]:
    """Return the links some GPU-to-GPU route holds, in topology order: the only ones that carry data."""
    used = routed_links(topology)
    return tuple(link for link in topology.links if link.key in used)


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


def _violated_cuts(
    graph: nx.DiGraph,
    gpus: Sequence[str],
    sinks: Sequence[str],
    rate_GBps: float,
    classes: Mapping[str, GpuClass] | None = None,
) -> list[frozenset]:
    """Return, per sink GPU v whose min cut from the source is below rate_GBps * N, its source side.

    With ``classes`` (``gpu_classes`` of the sinks), a sink's max-flow is its class representative's
    (earlier in ``sinks``), and its source side the representative's mapped by the automorphism.
    """
    network = graph.copy()
    network.add_edges_from((_SOURCE, g, {"capacity": rate_GBps}) for g in gpus)
    residual = build_residual_network(network, "capacity")
    threshold = rate_GBps * len(gpus) * (1 - _REL_TOL)
    found = []
    by_sink: dict[str, frozenset | None] = {}
    for sink in sinks:
        first, mapping = classes[sink] if classes is not None and classes[sink][0] in by_sink else (sink, {})
        if first not in by_sink:
            preflow_push(network, _SOURCE, sink, residual=residual, value_only=True)
            violated = residual.graph["flow_value"] < threshold
            by_sink[first] = frozenset(network.nodes) - _reaching(residual, sink) - {_SOURCE} if violated else None
        if by_sink[first] is not None:
            found.append(frozenset(mapping.get(name, name) for name in by_sink[first]))
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
    classes = gpu_classes(topology, graph, sinks)
    best = min(_candidates(topology, graph, gpus), key=lambda s: _ratio(graph, s, gpus))
    rate = _ratio(graph, best, gpus)
    for _ in range(_MAX_ROUNDS):
        violated = _violated_cuts(graph, order, sinks, rate, classes)
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
        The set S (vertex names), its GPU count, boundary capacity (GB/s per direction) and the
        least α (µs) of a route across it in the direction data must cross.

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
    return cut_bound(topology, route_links(topology), reverse)


def cut_bound(topology: Topology, links: tuple[Link, ...], reverse: bool) -> CutBound:
    """Return ``binding_cut`` over ``links`` (``route_links(topology)``, computed once by the caller)."""
    if topology.num_ranks < 2:
        return CutBound(reverse, (), 0, 0.0, "one GPU: nothing to move", 0.0)
    graph = _flow_graph(links, reverse)
    inside = _binding_set(topology, graph)
    boundary = _boundary(graph, inside)
    capacity = float(sum(graph.edges[edge]["capacity"] for edge in boundary))
    crossing = tuple(topology.link(w, u) if reverse else topology.link(u, w) for u, w in boundary)
    names = tuple(v.name for v in topology.vertices if v.name in inside)
    gpus = tuple(v for v in topology.gpus if v.name in inside)
    outside = tuple(v for v in topology.gpus if v.name not in inside)
    alpha_us = crossing_alpha_us(topology, outside, gpus) if reverse else crossing_alpha_us(topology, gpus, outside)
    description = _describe(topology, gpus, crossing, capacity, reverse)
    return CutBound(reverse, names, len(gpus), capacity, description, alpha_us)


def crossing_alpha_us(topology: Topology, sources: Iterable[Vertex], targets: Iterable[Vertex]) -> float:
    """Return the least α (µs) of the route from a GPU of ``sources`` to a GPU of ``targets`` (0 if none).

    Why it bounds: a byte that must get from the source GPUs to the target GPUs is, at some hop,
    sent by a transfer from a source GPU to a target GPU (GPUs may relay, but the first hop that
    leaves the source side is such a transfer), and every transfer spends its route's whole α
    (``route``; the simulator uses no other path) before its bytes move or before they arrive.
    So the links between the sides carry none of those bytes before this α, or deliver the last
    of them no sooner than this α after it crossed.
    """
    targets = tuple(targets)
    alphas = [route(topology, a.rank, b.rank).alpha_us for a in sources for b in targets if a.rank != b.rank]
    return float(min(alphas, default=0.0))


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
