"""The AlltoAll cut bound: per-GPU egress/ingress and whole-machine (bisection) cuts.

In an AlltoAll of M bytes per rank over N ranks, each rank sends M/N bytes to every other
rank. A vertex set S holding k GPUs must therefore send k (N - k) M / N bytes over the links
leaving S, and receive as much over the links entering it:

    T_A2A >= (M / N) * k (N - k) / capacity(S)       (either direction)

Unlike AllGather's, this ratio is not a ratio of linear functions of S, so no max-flow finds
the best S. The bound takes the best of the sets that bind on real machines: one GPU
(its egress or ingress), the GPUs of some of one machine's NUMA domains (a host link between
sockets), one machine, and the union of the j machines with the least capacity for
j = 1 .. machines - 1 (the bisection on a non-blocking network). Each set's
capacity is the minimum cut between its GPUs and the other GPUs over the links some route
holds (``cut.route_links``), so a NIC's PCIe link binds where it is slower than the NIC.
A union's capacity is the sum of its machines' cuts, which is at least its own minimum cut:
the bound stays valid and is exact when the network is non-blocking.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import networkx as nx

from taccl_py.bounds.symmetry import gpu_classes
from taccl_py.topology.fingerprint import node_signature
from taccl_py.topology.model import Link, LinkKind, Topology
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["AlltoallCut", "alltoall_cut"]

_SOURCE, _SINK = ("alltoall source",), ("alltoall sink",)  # keys no vertex name (a str) can equal
_NETWORK_KINDS = frozenset({LinkKind.IB.value, LinkKind.ETHERNET.value})
_MAX_NUMA_DOMAINS = 8  # NUMA domains of one machine whose unions are tried as cuts (2^8 - 2 sets)


@dataclass(frozen=True)
class AlltoallCut:
    """A set of ``cut_gpus`` GPUs and the capacity (GB/s, one direction) between it and the rest."""

    cut: tuple[str, ...]
    cut_gpus: int
    capacity_GBps: float
    description: str

    def time_us(self, size_bytes: float, num_ranks: int) -> float:
        """Return (size / N) * k (N - k) / capacity in µs, with k the GPUs in the set."""
        if not self.cut_gpus or self.cut_gpus >= num_ranks:
            return 0.0
        crossing = size_bytes / num_ranks * self.cut_gpus * (num_ranks - self.cut_gpus)
        return float(crossing / (self.capacity_GBps * BYTES_PER_US_PER_GBPS))


def _graph(links: Iterable[Link]) -> nx.DiGraph:
    """Return the links as a flow network with integer capacities, in units of 1 / ``graph.graph["scale"]`` GB/s.

    Every finite float is an integer over a power of two, so scaling by the largest denominator
    makes each capacity an exact integer and every sum over them exact, whatever order a max-flow
    adds them in. networkx's preflow-push, used before ``_max_flow``, took the next vertex to
    discharge from a set whose order follows string hashing (PYTHONHASHSEED): float capacities
    gave a different last digit, and so a different one of two equal cuts, from run to run.
    """
    links = tuple(links)
    rates = {link.key: Fraction(link.bandwidth_GBps) for link in links if math.isfinite(link.bandwidth_GBps)}
    scale = math.lcm(*(rate.denominator for rate in rates.values()))
    graph = nx.DiGraph(scale=scale)
    for link in links:
        graph.add_edge(link.src, link.dst, kind=link.kind.value)
        if link.key in rates:  # an edge without a capacity is infinite to _max_flow
            graph.edges[link.key]["capacity"] = int(rates[link.key] * scale)
    return graph


def _min_cut(graph: nx.DiGraph, inside: Iterable[str], outside: Iterable[str]) -> tuple[Fraction, Counter[str]]:
    """Return the least capacity (GB/s, exact) of links that separate ``inside`` from ``outside``, and their kinds.

    The capacities are exact integers, so the vertices with a residual path to ``outside`` (the
    sink side) form the smallest sink side of any minimum cut, whichever maximum flow was found:
    the kinds do not depend on the algorithm or the order it worked in. ``_max_flow`` finds it by
    shortest augmenting paths, which from one GPU take a few searches where networkx's
    preflow-push on a copy of the whole network took a tenth of a second (144 GPUs of GB200 NVL72 x2).
    """
    inside, outside = list(inside), list(outside)
    value, far = _max_flow(graph, inside, outside)
    kinds = Counter(graph.edges[u, w]["kind"] for u in graph if u not in far for w in graph.succ[u] if w in far)
    return Fraction(value, graph.graph["scale"]), kinds


def _max_flow(graph: nx.DiGraph, inside: list[str], outside: list[str]) -> tuple[int, frozenset]:
    """Return the maximum flow (in the graph's integer units) from ``inside`` to ``outside`` and the sink side.

    Edmonds-Karp on the residual capacities: an edge without a capacity, and the edges from the
    super source and into the super sink, get one more than all finite capacities together,
    which no flow can saturate. The sink side is every vertex of ``graph`` with a residual path to
    ``outside``. Raises ``networkx.NetworkXUnbounded`` when a path of such edges joins the two sides.
    """
    infinite = 1 + sum(c for _, _, c in graph.edges(data="capacity") if c is not None)
    residual: dict[object, dict[object, int]] = {u: {} for u in graph}
    residual[_SOURCE], residual[_SINK] = {}, {}
    for u, w, capacity in graph.edges(data="capacity"):
        residual[u][w] = residual[u].get(w, 0) + (infinite if capacity is None else capacity)
        residual[w].setdefault(u, 0)
    for name in inside:
        residual[_SOURCE][name] = infinite
        residual[name].setdefault(_SOURCE, 0)
    for name in outside:
        residual[name][_SINK] = infinite
        residual[_SINK].setdefault(name, 0)
    value = 0
    while True:
        parent = {_SOURCE: None}
        frontier = deque([_SOURCE])
        while frontier and _SINK not in parent:
            u = frontier.popleft()
            for w, spare in residual[u].items():
                if spare > 0 and w not in parent:
                    parent[w] = u
                    frontier.append(w)
        if _SINK not in parent:
            break
        path = []
        w = _SINK
        while parent[w] is not None:
            path.append((parent[w], w))
            w = parent[w]
        pushed = min(residual[u][w] for u, w in path)
        if pushed >= infinite:
            raise nx.NetworkXUnbounded("Infinite capacity path, flow unbounded above.")
        for u, w in path:
            residual[u][w] -= pushed
            residual[w][u] += pushed
        value += pushed
    far = {_SINK}
    frontier = deque([_SINK])
    while frontier:
        w = frontier.popleft()
        for u in residual[w]:
            if u not in far and residual[u][w] > 0:
                far.add(u)
                frontier.append(u)
    return value, frozenset(far - {_SINK})


def _over(kinds: Counter[str]) -> str:
    """Return ``over 1 ib link`` / ``over 8 pcie links`` for the crossing links' kinds."""
    links = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"over {links} link{'s' if sum(kinds.values()) > 1 else ''}"


def _representatives(topology: Topology) -> list[int]:
    """Return the first machine of each kind and state (``node_signature``)."""
    seen: dict[str, int] = {}
    for node in range(topology.nodes):
        seen.setdefault(node_signature(topology, node), node)
    return sorted(seen.values())


def alltoall_cut(topology: Topology, links: tuple[Link, ...]) -> AlltoallCut:
    """Return the candidate set with the largest k (N - k) / capacity over ``links``, both directions.

    ``links`` are the links some GPU-to-GPU route holds. Identical machines are cut once, and
    inside a machine one GPU of each class of GPUs with identical surroundings (``gpu_classes``:
    a checked automorphism of the network maps one onto the other) is cut for the whole class.
    """
    names = [gpu.name for gpu in topology.gpus]
    if len(names) < 2:
        return AlltoallCut((), 0, 0.0, "one GPU: nothing to move")
    forward = _graph(links)
    graphs = {"leaving": forward, "entering": forward.reverse(copy=True)}
    candidates: list[AlltoallCut] = []
    representatives = _representatives(topology)
    cut_gpus = [gpu for gpu in topology.gpus if gpu.node in representatives]
    classes = gpu_classes(topology, forward, [gpu.name for gpu in cut_gpus])
    for direction, graph in graphs.items():
        per_class: dict[str, tuple[Fraction, Counter[str]]] = {}
        for gpu in cut_gpus:
            first = classes[gpu.name][0]  # an automorphism maps it onto gpu: the same cut, the same kinds
            if first not in per_class:
                per_class[first] = _min_cut(graph, [first], [name for name in names if name != first])
            exact, kinds = per_class[first]
            capacity = float(exact)
            label = "per-GPU egress cut" if direction == "leaving" else "per-GPU ingress cut"
            description = f"{label}: {gpu.name} alone: {capacity:.4g} GB/s {direction} {_over(kinds)}"
            candidates.append(AlltoallCut((gpu.name,), 1, capacity, description))
        candidates += _numa_cuts(topology, graph, names, representatives, direction)
        if topology.nodes > 1:
            candidates += _machine_cuts(topology, graph, names, representatives, direction)
    # max keeps the first of equal keys, and the candidates come in a fixed order (leaving before
    # entering, GPUs and NUMA domains in topology order): ndv2's two equal NUMA cuts give gpu0-3
    return max(candidates, key=lambda c: c.time_us(1.0, len(names)))


def _numa_cuts(
    topology: Topology, graph: nx.DiGraph, names: list[str], representatives: list[int], direction: str
) -> list[AlltoallCut]:
    """Return the cuts around each union of one machine's NUMA domains (all but the whole machine).

    Inside a machine the host link between sockets is what binds (DGX-1, PCIe boxes), and the GPUs
    of a socket are the set that has to cross it.
    """
    cuts = []
    for node in representatives:
        domains: dict[int, list[str]] = {}
        for gpu in topology.gpus:
            if gpu.node == node and gpu.numa is not None:
                domains.setdefault(gpu.numa, []).append(gpu.name)
        groups = [domains[numa] for numa in sorted(domains)]
        if len(groups) > _MAX_NUMA_DOMAINS:
            groups = []  # 2^domains unions: past a handful, the per-GPU and machine cuts stand alone
        for mask in range(1, 2 ** len(groups) - 1):
            inside = [name for bit, group in enumerate(groups) if mask >> bit & 1 for name in group]
            if len(inside) < 2:
                continue  # one GPU: the per-GPU cut
            exact, kinds = _min_cut(graph, inside, [n for n in names if n not in inside])
            capacity = float(exact)
            label = "NUMA cut"
            description = (
                f"{label}: {', '.join(inside)} ({len(inside)} GPUs): {capacity:.4g} GB/s {direction} {_over(kinds)}"
            )
            cuts.append(AlltoallCut(tuple(inside), len(inside), capacity, description))
    return cuts


def _machine_cuts(
    topology: Topology, graph: nx.DiGraph, names: list[str], representatives: list[int], direction: str
) -> list[AlltoallCut]:
    """Return the cuts around the j machines with the least capacity, for j = 1 .. machines - 1."""
    members = {node: [g.name for g in topology.gpus if g.node == node] for node in range(topology.nodes)}
    by_signature = {
        node_signature(topology, node): _min_cut(graph, members[node], [n for n in names if n not in members[node]])
        for node in representatives
    }
    cut = {node: by_signature[node_signature(topology, node)] for node in range(topology.nodes)}
    weakest = sorted(range(topology.nodes), key=lambda node: (cut[node][0], node))
    cuts = []
    for count in range(1, topology.nodes):
        chosen = sorted(weakest[:count])
        inside = tuple(name for node in chosen for name in members[node])
        total = float(sum(cut[node][0] for node in chosen))
        kinds = sum((cut[node][1] for node in chosen), Counter())
        label = "NIC cut" if set(kinds) <= _NETWORK_KINDS else "node cut"
        what = f"node {chosen[0]}" if count == 1 else "nodes " + ",".join(map(str, chosen))
        description = f"{label}: {what} ({len(inside)} GPUs): {total:.4g} GB/s {direction} {_over(kinds)}"
        cuts.append(AlltoallCut(inside, len(inside), total, description))
    return cuts
