"""Rank orders the baselines share: NVLink cycles and paths inside a node, GPUs next to each NIC.

Pairs of GPUs are rated by the route between them (``route(topology, a, b)``): its bottleneck
bandwidth first, its α second. A cycle or path "over the best links" is a Hamiltonian one that
uses only pairs at or above a bandwidth threshold, with the threshold as high as possible; it
is found by depth-first search with a bounded number of expansions per threshold, so a node
whose good links form no such cycle falls back to the next threshold (and finally to every pair,
which always works since every pair has a route).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx

from taccl_py.topology.builtins import nic_affinity
from taccl_py.topology.compose import local_name, node_prefix
from taccl_py.topology.model import ROUTE_REFERENCE_BYTES, SWITCHING_KINDS, Topology, VertexKind, route

__all__ = ["node_ranks", "best_path", "disjoint_cycles", "nic_orders", "nic_rank_orders", "rail_nics", "nic_ranks"]

# Depth-first expansions tried per bandwidth threshold before giving up on it: enough for an
# exhaustive search over 8 GPUs (7! orders) and for the dense graphs of larger nodes.
_SEARCH_BUDGET = 20_000
# A further cycle joins the ring candidates when its bottleneck is at least this share of the
# best one's: NDv2's single NVLinks (half the double ones) qualify, PCIe detours do not.
_CYCLE_SHARE = 0.45
_MAX_CYCLES = 4
_REL_TOL = 1e-9
# Vertices a GPU-to-NIC path may cross inside one machine (not the network switch, not a GPU).
_IN_MACHINE_RELAYS = SWITCHING_KINDS - {VertexKind.NET_SWITCH}


def node_ranks(topology: Topology, node: int) -> tuple[int, ...]:
    """Return the global ranks of machine ``node`` by local index."""
    return tuple(gpu.rank for gpu in topology.gpus if gpu.node == node)


def _pair_bandwidth(topology: Topology, a: int, b: int) -> float:
    """Return the slower direction's bottleneck bandwidth (GB/s) between ranks a and b."""
    return min(route(topology, a, b).bandwidth_GBps, route(topology, b, a).bandwidth_GBps)


def _search(
    adjacent: dict[int, list[int]], start: int, end: int | None, cycle: bool, size: int, budget: list[int]
) -> list[int] | None:
    """Return a Hamiltonian path from ``start`` (to ``end`` if given; linking back if ``cycle``)."""
    path = [start]
    seen = {start}
    stack = [iter(adjacent[start])]
    while stack:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            seen.discard(path.pop())
            continue
        if nxt in seen or (nxt == end and len(path) < size - 1):
            continue
        path.append(nxt)
        seen.add(nxt)
        if len(path) == size:
            if (not cycle or start in adjacent[nxt]) and (end is None or nxt == end):
                return path
            seen.discard(path.pop())
            continue
        stack.append(iter(adjacent[nxt]))
    return None


def best_path(
    topology: Topology,
    ranks: Sequence[int],
    start: int,
    end: int | None = None,
    *,
    cycle: bool = False,
    allowed: set[frozenset[int]] | None = None,
) -> tuple[tuple[int, ...], float] | None:
    """Return a Hamiltonian path over ``ranks`` from ``start`` and its bottleneck (GB/s).

    With ``end`` the path ends there; with ``cycle`` its last rank also links back to
    ``start``; otherwise it ends anywhere. ``allowed`` restricts the pairs that may be used.
    Returns None when no order exists within the allowed pairs.
    """
    ranks = list(ranks)
    if len(ranks) == 1:
        return (start,), float("inf")
    pairs = {
        frozenset((a, b)): _pair_bandwidth(topology, a, b)
        for i, a in enumerate(ranks)
        for b in ranks[i + 1 :]
        if allowed is None or frozenset((a, b)) in allowed
    }
    for threshold in sorted(set(pairs.values()), reverse=True):
        usable = {pair for pair, pair_GBps in pairs.items() if pair_GBps >= threshold * (1 - _REL_TOL)}
        adjacent = {r: [] for r in ranks}
        for pair in usable:
            a, b = tuple(pair)
            adjacent[a].append(b)
            adjacent[b].append(a)
        for r in ranks:  # try strong pairs first, then the neighbour with fewest options (Warnsdorff)
            adjacent[r].sort(key=lambda q, r=r: (-pairs[frozenset((r, q))], len(adjacent[q]), q))
        found = _search(adjacent, start, None if cycle else end, cycle, len(ranks), [_SEARCH_BUDGET])
        if found is not None:
            hops = list(zip(found, found[1:])) + ([(found[-1], found[0])] if cycle else [])
            return tuple(found), min(pairs[frozenset(h)] for h in hops)
    return None


def _resources(topology: Topology, order: Sequence[int]) -> set[tuple[str, str]]:
    """Return the link keys a cycle over ``order`` holds in both directions."""
    used: set[tuple[str, str]] = set()
    for a, b in zip(order, list(order[1:]) + [order[0]]):
        used.update(route(topology, a, b).resources)
        used.update(route(topology, b, a).resources)
    return used


def disjoint_cycles(topology: Topology, ranks: Sequence[int]) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Return Hamiltonian cycles over ``ranks`` on link-disjoint routes, best bottleneck first.

    The first is the cycle over the fastest pairs; each further one avoids every link the
    earlier ones hold (both directions) and must reach ``_CYCLE_SHARE`` of the first one's
    bottleneck (GB/s). On NDv2 this yields the double-NVLink and the single-NVLink cycles; on a
    switch every cycle shares the switch ports, so there is one.
    """
    ranks = list(ranks)
    first = best_path(topology, ranks, ranks[0], cycle=True)
    if first is None or len(ranks) < 3:
        return (first,) if first is not None else ()
    cycles = [first]
    used = _resources(topology, first[0])
    while len(cycles) < _MAX_CYCLES:
        allowed = {
            frozenset((a, b))
            for i, a in enumerate(ranks)
            for b in ranks[i + 1 :]
            if not used & (set(route(topology, a, b).resources) | set(route(topology, b, a).resources))
        }
        found = best_path(topology, ranks, ranks[0], cycle=True, allowed=allowed)
        if found is None or found[1] < _CYCLE_SHARE * first[1]:
            break
        cycles.append(found)
        used |= _resources(topology, found[0])
    return tuple(cycles)


def _relay_weight(graph: nx.DiGraph) -> Callable[[str, str, dict], float | None]:
    """Return a Dijkstra weight that lets only in-machine switches, CPUs and NICs relay."""

    def weight(u: str, v: str, data: dict) -> float | None:
        if graph.nodes[u]["vertex"].kind not in _IN_MACHINE_RELAYS:
            return None
        return data["link"].time_us(ROUTE_REFERENCE_BYTES)

    return weight


def nic_orders(topology: Topology, node: int) -> tuple[tuple[int, ...], ...]:
    """Return, per NIC of machine ``node`` (file order), the node's ranks nearest that NIC first.

    Nearness is the cheapest GPU-to-NIC path (α plus 1 MB at each link's bandwidth) through
    switches and CPUs; ties go to the lower local index. A machine without NICs gets one order
    by local index.
    """
    ranks = node_ranks(topology, node)
    nics = topology.nics(node)
    if not nics:
        return (ranks,)
    reverse = topology.graph.reverse(copy=False)
    orders = []
    for nic in nics:
        # paths GPU -> NIC are paths NIC -> GPU in the reversed graph; relays must be switches
        lengths = nx.single_source_dijkstra_path_length(reverse, nic.name, weight=_relay_weight(reverse))
        cost = {r: lengths.get(topology.gpu(r).name, float("inf")) for r in ranks}
        orders.append(tuple(sorted(ranks, key=lambda r: (cost[r], r))))
    return tuple(orders)


def nic_rank_orders(topology: Topology, node: int) -> dict[str, tuple[int, ...]]:
    """Return ``nic_orders`` of machine ``node`` keyed by NIC vertex name (empty without NICs)."""
    names = [nic.name for nic in topology.nics(node)]
    return dict(zip(names, nic_orders(topology, node))) if names else {}


def nic_ranks(topology: Topology, node: int) -> frozenset[int]:
    """Return the ranks of machine ``node`` next to a NIC that is up (``nic_affinity``'s nearest GPUs).

    A GPU outside this set reaches the network only over a host or PCIe detour to another GPU's
    NIC (its own NIC is down, or it never had one close), so rings and trees do not cross
    machines there.
    """
    affinity = nic_affinity(topology)
    return frozenset(rank for nic in topology.nics(node) for rank in affinity[nic.name])


def rail_nics(topology: Topology) -> tuple[tuple[str, ...], ...]:
    """Return per machine the NICs (vertex names) that channel c of a cross-machine ring or tree uses.

    Every machine gives as many rails as the machine with the fewest NICs up has, so each NIC
    carries at most one channel per direction. NICs up on every machine come first, in machine
    0's order, so a channel keeps one NIC index (one rail) wherever it can and a NIC that is
    down on one machine is left out on every machine; each machine's other NICs fill up in
    file order.
    """
    names = [[local_name(topology, nic.name, node) for nic in topology.nics(node)] for node in range(topology.nodes)]
    width = min(len(local) for local in names)
    common = [name for name in names[0] if all(name in local for local in names)]
    rails = []
    for node, local in enumerate(names):
        chosen = common + [name for name in local if name not in common]
        prefix = node_prefix(node) if topology.nodes > 1 else ""
        rails.append(tuple(prefix + name for name in chosen[:width]))
    return tuple(rails)
