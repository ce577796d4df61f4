"""The automatic parts of a sketch: NIC relays from NIC affinity, and the topology's rotations."""

from __future__ import annotations

import networkx as nx

from taccl_py.errors import TopologyError
from taccl_py.topology.model import ROUTE_REFERENCE_BYTES, Topology, VertexKind, route

__all__ = ["find_symmetry", "nic_relays"]


def _nic_cost_us(topology: Topology, gpu: str, nic: str) -> float | None:
    """Return the path cost (α plus 1 MB, µs) from ``gpu`` to ``nic`` through non-GPU vertices."""
    allowed = {v.name for v in topology.vertices if v.kind is not VertexKind.GPU} | {gpu}
    view = topology.graph.subgraph(allowed)
    try:
        return nx.dijkstra_path_length(view, gpu, nic, weight=lambda a, b, d: d["link"].time_us(ROUTE_REFERENCE_BYTES))
    except nx.NetworkXNoPath:
        return None


def _relay_groups(topology: Topology) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Return (NIC name, the local GPUs nearest to it) for each NIC of node 0 some GPU reaches."""
    nics = topology.nics(0)
    gpus = [g for g in topology.gpus if g.node == 0]
    costs = {(g.local_index, n.name): _nic_cost_us(topology, g.name, n.name) for g in gpus for n in nics}
    groups = []
    for nic in nics:
        reachable = {g: c for (g, n), c in costs.items() if n == nic.name and c is not None}
        if not reachable:
            continue
        best = min(reachable.values())
        nearest = [g for g, c in reachable.items() if c <= best * (1 + 1e-6)]
        # A GPU relays through the NIC it is nearest to; drop GPUs closer to another NIC.
        own = [g for g in nearest if all((costs[(g, m.name)] or float("inf")) >= best * (1 - 1e-6) for m in nics)]
        groups.append((nic.name, tuple(sorted(own or nearest))))
    return tuple(groups)


def _shares_first_hop(topology: Topology, local: int, nic: str) -> bool:
    """Return True when GPU ``local``'s way to ``nic`` starts on the link its best GPU route uses.

    On a PCIe-only machine a GPU reaches its peers and its NIC through the same uplink, so
    relaying other GPUs' chunks through one sender would cross that uplink twice.
    """
    gpu = topology.gpus[local]
    allowed = {v.name for v in topology.vertices if v.kind is not VertexKind.GPU} | {gpu.name}
    path = nx.dijkstra_path(
        topology.graph.subgraph(allowed), gpu.name, nic, weight=lambda a, b, d: d["link"].time_us(ROUTE_REFERENCE_BYTES)
    )
    peers = [r for r in range(topology.gpus_per_node) if r != local]
    if not peers:
        return False
    best = max((route(topology, local, r) for r in peers), key=lambda r: r.bandwidth_GBps)
    return best.links[0].key == (path[0], path[1])


def nic_relays(topology: Topology) -> tuple[tuple[int, int], ...]:
    """Return the automatic (local sender, local receiver) pairs across machines, from NIC affinity.

    Per NIC, the first GPU nearest to it sends, to the first two GPUs nearest the same NIC on
    the other machine (TACCL's shipped sketches relay the same way). One sender per NIC keeps
    its transfers in the schedule's order (the plan chains a rank's sends through one NIC)
    instead of several senders sharing it; two receivers let both GPUs of a NIC's pair take
    network data over their own PCIe link, which on NVSwitch machines relieves their switch
    ports, the busiest resource of a two-machine AllGather. Where GPUs reach each other over
    the same uplink as the NIC (PCIe-only machines), every GPU near the NIC sends and receives.
    """
    pairs = set()
    for nic, group in _relay_groups(topology):
        if _shares_first_hop(topology, group[0], nic):
            pairs.update((a, b) for a in group for b in group)
        else:
            pairs.update((group[0], group[i]) for i in range(min(2, len(group))))
    return tuple(sorted(pairs))


def _pair_signature(topology: Topology, src: int, dst: int) -> tuple[float, float, int] | None:
    try:
        r = route(topology, src, dst)
    except TopologyError:  # no path that avoids relaying through a GPU
        return None
    return (round(r.alpha_us, 9), round(r.bandwidth_GBps, 9), len(r.links))


def _is_node_rotation(topology: Topology, offset: int, signatures: dict, relays: tuple[tuple[int, ...], ...]) -> bool:
    gpn = topology.gpus_per_node
    for (a, b), sig in signatures.items():
        if signatures[((a + offset) % gpn, (b + offset) % gpn)] != sig:
            return False
    groups = {frozenset(g) for g in relays}
    return all(frozenset((g + offset) % gpn for g in group) in groups for group in groups)


def find_symmetry(topology: Topology) -> tuple[tuple[int, int], ...]:
    """Return rotations ``(offset, group)`` that map the topology onto itself.

    Within a machine: the smallest offset whose rotation of the local GPUs keeps every
    GPU-to-GPU route's α, bandwidth and hop count and the NIC relay groups. Across machines: the
    rotation by one machine (composed machines are identical copies).

    >>> from taccl_py.topology import load_topology
    >>> find_symmetry(load_topology("dgx2", nodes=2))
    ((2, 16), (16, 32))
    """
    gpn, n = topology.gpus_per_node, topology.num_ranks
    signatures = {(a, b): _pair_signature(topology, a, b) for a in range(gpn) for b in range(gpn) if a != b}
    relays = tuple(group for _, group in _relay_groups(topology)) if topology.nodes > 1 else ()
    rotations = []
    for offset in range(1, gpn):
        if gpn % offset == 0 and _is_node_rotation(topology, offset, signatures, relays):
            rotations.append((offset, gpn))
            break
    if topology.nodes > 1:
        rotations.append((gpn, n))
    return tuple(rotations)
