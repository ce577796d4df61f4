"""The automatic parts of a sketch: NIC relays from each machine's NIC affinity, and the rotations that remain.

Machines of a cluster may differ (two kinds of machine, a NIC down, a NIC at another speed), so
relays are found per machine and paired per machine pair, and a rotation is kept only where it
maps every machine (and the network between them) onto itself. On N identical machines this
gives what one machine's pattern applied everywhere gives.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import networkx as nx

from taccl_py.errors import TopologyError
from taccl_py.topology.compose import NETWORK_SWITCH, local_name, node_prefix
from taccl_py.topology.fingerprint import node_signatures
from taccl_py.topology.model import ROUTE_REFERENCE_BYTES, Topology, VertexKind, route

__all__ = ["RelayGroup", "cluster_relays", "find_symmetry", "nic_relays", "pair_relays", "relay_groups"]

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RelayGroup:
    """The local GPUs of one machine nearest one of its NICs (``nic``: the name inside the machine).

    ``shares_uplink``: the GPUs reach their peers over the same first hop as the NIC (PCIe-only
    machines), so every one of them sends and receives rather than one relaying for the others.
    """

    nic: str
    gpus: tuple[int, ...]
    shares_uplink: bool

    @property
    def senders(self) -> tuple[int, ...]:
        """Return the local GPUs that send across the network through this NIC.

        One sender per NIC keeps its transfers in the schedule's order (the plan chains a rank's
        sends through one NIC) instead of several senders sharing it.
        """
        return self.gpus if self.shares_uplink else self.gpus[:1]

    @property
    def receivers(self) -> tuple[int, ...]:
        """Return the local GPUs that take network data from this NIC.

        Two receivers let both GPUs of a NIC's pair take network data over their own PCIe link,
        which on NVSwitch machines relieves their switch ports, the busiest resource of a
        two-machine AllGather.
        """
        return self.gpus if self.shares_uplink else self.gpus[:2]


def _weight(a: str, b: str, data: dict) -> float:
    return data["link"].time_us(ROUTE_REFERENCE_BYTES)


def _local_view(topology: Topology, node: int, gpu: str) -> nx.DiGraph:
    """Return machine ``node``'s switches, CPUs and NICs plus ``gpu``: the ways a GPU reaches its NICs.

    The network switch is left out: a path out through one NIC and back in through another is
    no way to reach a NIC.
    """
    allowed = {
        v.name
        for v in topology.vertices
        if v.node == node and v.kind is not VertexKind.GPU and v.kind is not VertexKind.NET_SWITCH
    }
    return topology.graph.subgraph(allowed | {gpu})


def _nic_costs_us(topology: Topology, node: int) -> dict[tuple[int, str], float]:
    """Return the path cost (α plus 1 MB, µs) from each local GPU of ``node`` to each NIC it reaches."""
    gpn = topology.gpus_per_node
    nics = [n.name for n in topology.nics(node)]
    costs = {}
    for local in range(gpn):
        gpu = topology.gpu(node * gpn + local).name
        reach = nx.single_source_dijkstra_path_length(_local_view(topology, node, gpu), gpu, weight=_weight)
        for nic in nics:
            if nic in reach:
                costs[(local, nic)] = reach[nic]
    return costs


def _shares_first_hop(topology: Topology, node: int, local: int, nic: str) -> bool:
    """Return True when GPU ``local``'s way to ``nic`` starts on the link its best GPU route uses.

    On a PCIe-only machine a GPU reaches its peers and its NIC through the same uplink, so
    relaying other GPUs' chunks through one sender would cross that uplink twice.
    """
    gpn = topology.gpus_per_node
    gpu = topology.gpu(node * gpn + local)
    path = nx.dijkstra_path(_local_view(topology, node, gpu.name), gpu.name, nic, weight=_weight)
    peers = [node * gpn + r for r in range(gpn) if r != local]
    if not peers:
        return False
    best = max((route(topology, gpu.rank, r) for r in peers), key=lambda r: r.bandwidth_GBps)
    return best.links[0].key == (path[0], path[1])


def relay_groups(topology: Topology, node: int = 0) -> tuple[RelayGroup, ...]:
    """Return, per NIC of machine ``node`` that some GPU reaches, the local GPUs nearest to it.

    A GPU belongs to the NIC it is nearest to; a GPU whose own NIC is down belongs to none
    (its chunks reach a NIC over NVLink through a GPU that has one, not over PCIe or the host
    link to a NIC further away).
    """
    costs = _nic_costs_us(topology, node)
    nics = topology.nics(node)
    groups = []
    for nic in nics:
        reachable = {g: c for (g, n), c in costs.items() if n == nic.name}
        if not reachable:
            continue
        best = min(reachable.values())
        nearest = [g for g, c in reachable.items() if c <= best * (1 + 1e-6)]
        # A GPU relays through the NIC it is nearest to; drop GPUs closer to another NIC.
        own = [g for g in nearest if all(costs.get((g, m.name), float("inf")) >= best * (1 - 1e-6) for m in nics)]
        gpus = tuple(sorted(own or nearest))
        shares = _shares_first_hop(topology, node, gpus[0], nic.name)
        groups.append(RelayGroup(local_name(topology, nic.name, node), gpus, shares))
    return tuple(groups)


def pair_relays(topology: Topology, src_node: int, dst_node: int) -> Pairs:
    """Return the (local sender, local receiver) pairs from machine ``src_node`` to machine ``dst_node``.

    A NIC's senders send to the receivers of the NIC of the same name on the other machine; a
    NIC without a counterpart there (down, or a machine of another kind) is paired with every
    NIC of the other machine, so that its traffic can spread over them.
    """
    return _pairs_between(relay_groups(topology, src_node), relay_groups(topology, dst_node))


def _pairs_between(send: tuple[RelayGroup, ...], receive: tuple[RelayGroup, ...]) -> Pairs:
    by_nic = {group.nic: group for group in receive}
    sent = {group.nic for group in send}
    pairs: set[tuple[int, int]] = set()
    for group in send:
        for target in (by_nic[group.nic],) if group.nic in by_nic else receive:
            pairs.update((s, r) for s in group.senders for r in target.receivers)
    for target in receive:
        if target.nic not in sent:
            pairs.update((s, r) for group in send for s in group.senders for r in target.receivers)
    return tuple(sorted(pairs))


def _groups_by_node(topology: Topology) -> tuple[tuple[RelayGroup, ...], ...]:
    """Return every machine's relay groups, found once per distinct machine (identical ones share).

    Where some machines lack a NIC the others have (one down) and leaving that NIC out on every
    machine costs the weakest machine nothing (its NIC bandwidth bounds every machine's
    exchange), the groups keep only the NICs every machine has: the machines' relays are alike
    again, and so is their symmetry.
    """
    signatures = node_signatures(topology)
    found: dict[str, tuple[RelayGroup, ...]] = {}
    for node, signature in enumerate(signatures):
        if signature not in found:
            found[signature] = relay_groups(topology, node)
    groups = tuple(found[signature] for signature in signatures)
    common = set.intersection(*({group.nic for group in node_groups} for node_groups in groups))
    if all(len(node_groups) == len(common) for node_groups in groups) or not common:
        return groups
    railed = tuple(tuple(group for group in node_groups if group.nic in common) for node_groups in groups)
    if _weakest_nic_GBps(topology, railed) < _weakest_nic_GBps(topology, groups) * (1 - 1e-9):
        return groups
    return railed


def _weakest_nic_GBps(topology: Topology, groups: tuple[tuple[RelayGroup, ...], ...]) -> float:
    """Return the least total network bandwidth (GB/s) of a machine's relay NICs."""
    return min(
        sum(topology.vertex(_nic_name(topology, node, group.nic)).net_bandwidth_GBps or 0.0 for group in node_groups)
        for node, node_groups in enumerate(groups)
    )


def _nic_name(topology: Topology, node: int, nic: str) -> str:
    return node_prefix(node) + nic if topology.nodes > 1 else nic


def _pair_patterns(topology: Topology, groups: tuple[tuple[RelayGroup, ...], ...]) -> dict[tuple[int, int], Pairs]:
    """Return the relay pairs of every ordered machine pair, from every machine's relay groups.

    A pair whose route leaves or enters through another NIC than its GPUs' own is dropped (a
    slow NIC makes the route detour over PCIe to a faster one, which would then carry the
    relays of two NICs), unless that leaves the machine pair no relay at all.
    """
    nic_of = [{gpu: group.nic for group in node_groups for gpu in group.gpus} for node_groups in groups]
    gpn = topology.gpus_per_node
    patterns = {}
    for a in range(topology.nodes):
        for b in range(topology.nodes):
            if a == b:
                continue
            pairs = _pairs_between(groups[a], groups[b])
            direct = tuple(
                (s, r)
                for s, r in pairs
                if {
                    (_nic_name(topology, a, nic_of[a][s]), NETWORK_SWITCH),
                    (NETWORK_SWITCH, _nic_name(topology, b, nic_of[b][r])),
                }
                <= set(route(topology, a * gpn + s, b * gpn + r).resources)
            )
            patterns[(a, b)] = direct or pairs
    return patterns


def cluster_relays(topology: Topology) -> tuple[Pairs, tuple[tuple[int, int, Pairs], ...]]:
    """Return the relay pairs most machine pairs use, and (src, dst, pairs) for the machine pairs that differ.

    On identical machines every pair uses the same relays and the second part is empty.
    """
    if topology.nodes < 2:
        return (), ()
    patterns = _pair_patterns(topology, _groups_by_node(topology))
    counts = Counter(patterns.values())
    first = {}
    for pattern in patterns.values():
        first.setdefault(pattern, len(first))
    common = max(counts, key=lambda pattern: (counts[pattern], -first[pattern]))
    overrides = tuple((a, b, pattern) for (a, b), pattern in patterns.items() if pattern != common)
    return common, overrides


def nic_relays(topology: Topology) -> Pairs:
    """Return the automatic (local sender, local receiver) pairs most machine pairs use, from NIC affinity.

    Per NIC, the first GPU nearest to it sends, to the first two GPUs nearest the same NIC on
    the other machine (TACCL's shipped sketches relay the same way); where GPUs reach each other
    over the same uplink as the NIC (PCIe-only machines), every GPU near the NIC sends and
    receives (``RelayGroup``). ``cluster_relays`` also gives the machine pairs that differ.
    """
    return cluster_relays(topology)[0]


def _pair_signature(topology: Topology, src: int, dst: int) -> tuple[float, float, int] | None:
    try:
        r = route(topology, src, dst)
    except TopologyError:  # no path that avoids relaying through a GPU
        return None
    return (round(r.alpha_us, 9), round(r.bandwidth_GBps, 9), len(r.links))


def _rotates_machine(topology: Topology, node: int, offset: int, groups: tuple[RelayGroup, ...]) -> bool:
    """Return True when rotating machine ``node``'s GPUs by ``offset`` keeps its routes and relay groups."""
    gpn = topology.gpus_per_node
    base = node * gpn
    for a in range(gpn):
        for b in range(gpn):
            if a != b:
                image = ((a + offset) % gpn, (b + offset) % gpn)
                if _pair_signature(topology, base + a, base + b) != _pair_signature(
                    topology, base + image[0], base + image[1]
                ):
                    return False
    sets = {frozenset(group.gpus) for group in groups}
    return all(frozenset((g + offset) % gpn for g in group) in sets for group in sets)


def _rotates_pairs(topology: Topology, patterns: dict[tuple[int, int], Pairs], offset: int) -> bool:
    """Return True when rotating every machine's GPUs by ``offset`` maps each relay route onto one of equal cost."""
    gpn = topology.gpus_per_node
    for pattern in set(patterns.values()):
        if {((s + offset) % gpn, (r + offset) % gpn) for s, r in pattern} != set(pattern):
            return False
    for (a, b), pattern in patterns.items():
        for s, r in pattern:
            image = (a * gpn + (s + offset) % gpn, b * gpn + (r + offset) % gpn)
            if _route_cost(topology, a * gpn + s, b * gpn + r) != _route_cost(topology, *image):
                return False
    return True


def _machine_rotation(
    topology: Topology, groups: tuple[tuple[RelayGroup, ...], ...], patterns: dict[tuple[int, int], Pairs]
) -> int | None:
    """Return the smallest offset that rotates every machine's GPUs onto themselves, or None."""
    gpn = topology.gpus_per_node
    signatures = node_signatures(topology)
    distinct = [node for node in range(topology.nodes) if signatures.index(signatures[node]) == node]
    for offset in range(1, gpn):
        if gpn % offset:
            continue
        if all(_rotates_machine(topology, node, offset, groups[node]) for node in distinct) and _rotates_pairs(
            topology, patterns, offset
        ):
            return offset
    return None


def _network_maps(topology: Topology, shift: int) -> bool:
    """Return True when moving every machine ``shift`` places on maps the links between machines onto themselves."""
    nodes = topology.nodes

    def moved(name: str) -> str | None:
        vertex = topology.vertex(name)
        if vertex.kind is VertexKind.NET_SWITCH:
            return name
        prefix = node_prefix(vertex.node)
        if not name.startswith(prefix):
            return None
        return node_prefix((vertex.node + shift) % nodes) + name[len(prefix) :]

    for link in topology.links:
        ends = (topology.vertex(link.src), topology.vertex(link.dst))
        if ends[0].node == ends[1].node and VertexKind.NET_SWITCH not in (ends[0].kind, ends[1].kind):
            continue
        src, dst = moved(link.src), moved(link.dst)
        image = None if src is None or dst is None else topology.link(src, dst)
        if image is None or (image.kind, image.alpha_us, image.bandwidth_GBps, image.count) != (
            link.kind,
            link.alpha_us,
            link.bandwidth_GBps,
            link.count,
        ):
            return False
    return True


def _route_cost(topology: Topology, src: int, dst: int) -> tuple | None:
    """Return a route's α and each of its links' bandwidth in path order (None: no route)."""
    try:
        r = route(topology, src, dst)
    except TopologyError:
        return None
    return (round(r.alpha_us, 9), tuple(round(link.bandwidth_GBps, 9) for link in r.links))


def _machines_match(topology: Topology, node: int, other: int) -> bool:
    """Return True when every GPU-to-GPU route inside ``node`` costs what its image inside ``other`` does."""
    gpn = topology.gpus_per_node
    return all(
        _route_cost(topology, node * gpn + a, node * gpn + b) == _route_cost(topology, other * gpn + a, other * gpn + b)
        for a in range(gpn)
        for b in range(gpn)
        if a != b
    )


def _relays_match(topology: Topology, patterns: dict[tuple[int, int], Pairs], k: int) -> bool:
    """Return True when moving every machine k places on maps every relay route onto one of equal cost."""
    gpn, nodes = topology.gpus_per_node, topology.nodes
    for (a, b), pattern in patterns.items():
        c, d = (a + k) % nodes, (b + k) % nodes
        if patterns[(c, d)] != pattern:
            return False
        for s, r in pattern:
            if _route_cost(topology, a * gpn + s, b * gpn + r) != _route_cost(topology, c * gpn + s, d * gpn + r):
                return False
    return True


def _node_rotation(topology: Topology, patterns: dict[tuple[int, int], Pairs]) -> int | None:
    """Return the smallest k such that machine i maps onto machine i + k for every i, or None.

    Machines map when their signatures are equal and so is the network, or, for machines that
    differ only in what the relays leave unused (a NIC down that every machine's relays skip),
    when every route inside a machine and every relay route costs what its image does.
    """
    nodes = topology.nodes
    signatures = node_signatures(topology)
    for k in range(1, nodes):
        if nodes % k:
            continue
        moved = all(patterns[(a, b)] == patterns[((a + k) % nodes, (b + k) % nodes)] for a, b in patterns)
        if not moved:
            continue
        if all(signatures[i] == signatures[(i + k) % nodes] for i in range(nodes)) and _network_maps(topology, k):
            return k
        if all(_machines_match(topology, i, (i + k) % nodes) for i in range(nodes)) and _relays_match(
            topology, patterns, k
        ):
            return k
    return None


def find_symmetry(topology: Topology) -> tuple[tuple[int, int], ...]:
    """Return rotations ``(offset, group)`` that map the topology onto itself.

    Within machines: the smallest offset whose rotation of the local GPUs keeps, on every
    machine, every GPU-to-GPU route's α, bandwidth and hop count and the NIC relay groups.
    Across machines: the rotation by the fewest machines k that maps machine i onto machine
    i + k for every i (equal node signatures) and the network onto itself; none where the
    machines admit no such k (two machines that differ).

    >>> from taccl_py.topology import load_topology
    >>> find_symmetry(load_topology("dgx2", nodes=2))
    ((2, 16), (16, 32))
    """
    gpn, n = topology.gpus_per_node, topology.num_ranks
    # One machine has no relays: its rotations need not keep any NIC affinity.
    groups = _groups_by_node(topology) if topology.nodes > 1 else ((),)
    patterns = _pair_patterns(topology, groups) if topology.nodes > 1 else {}
    rotations = []
    offset = _machine_rotation(topology, groups, patterns)
    if offset is not None:
        rotations.append((offset, gpn))
    if topology.nodes > 1:
        k = _node_rotation(topology, patterns)
        if k is not None:
            rotations.append((k * gpn, n))
    return tuple(rotations)
