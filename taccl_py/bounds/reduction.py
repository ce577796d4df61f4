"""The AllReduce bound that holds for in-network reduction too (NVLink SHARP), and which machines have it.

A switch that reduces (``Vertex.reduces_in_network``: NVSwitch 3 with NVLink SHARP, DGX-H100) lets
an AllReduce send each GPU's buffer up once and receive the result once (NCCL's NVLS), so the
ReduceScatter+AllGather class bound of ``bounds`` (2(N-1)/N M per GPU) does not hold for it. What
still holds for any AllReduce of M bytes, in the network or not: every output element depends on
every GPU's input, so a vertex set S holding some but not all GPUs must send at least M bytes out
(one per byte of the buffer, however reduced inside S) and take M bytes in. With the α argument
of ``bounds`` (a byte leaving S's GPUs is sent by a transfer from a GPU in S to one outside it,
which spends its route's α),

    T_AR >= max over S of (α_S + M / capacity(S)),  and >= the latency floor,

taken over S = each GPU alone (its egress and its ingress: the per-GPU link rate) and, across
machines, each machine (its NIC cut). This is the bound ``baselines.nvls`` measures NCCL's NVLS
against; it is below the class bound wherever N > 2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from taccl_py.bounds import LowerBound, checked_sizes, lower_bounds, make_lower_bound, route_latency_floor_us
from taccl_py.bounds.cut import CutBound, crossing_alpha_us, route_links
from taccl_py.ir.collectives import Collective
from taccl_py.topology.fingerprint import node_signature
from taccl_py.topology.model import Link, Topology, Vertex, VertexKind
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["in_network_reduction_bounds", "reducing_switches", "schedule_bounds"]


@dataclass(frozen=True)
class _Side:
    """A candidate set S: its vertex names, GPUs, capacity out of it (or into it) in GB/s, and α (µs)."""

    names: tuple[str, ...]
    gpus: int
    capacity_GBps: float
    alpha_us: float
    description: str

    def time_us(self, size_bytes: int) -> float:
        return self.alpha_us + size_bytes / (self.capacity_GBps * BYTES_PER_US_PER_GBPS)


def reducing_switches(topology: Topology) -> tuple[Vertex, ...]:
    """Return each machine's reducing switch in node order, or () unless every machine has one.

    A machine has one when some switch of it reduces in the network and every GPU of the machine
    has a link to it and one back.

    >>> from taccl_py.topology import load_topology
    >>> [v.name for v in reducing_switches(load_topology("dgx-h100", nodes=2))]
    ['n0.nvswitch', 'n1.nvswitch']
    >>> reducing_switches(load_topology("dgx2"))
    ()
    """
    found = []
    for node in range(topology.nodes):
        gpus = [v.name for v in topology.gpus if v.node == node]
        switch = next(
            (
                v
                for v in topology.vertices
                if v.node == node
                and v.kind is VertexKind.NVSWITCH
                and v.reduces_in_network
                and all(topology.link(g, v.name) and topology.link(v.name, g) for g in gpus)
            ),
            None,
        )
        if switch is None:
            return ()
        found.append(switch)
    return tuple(found)


def in_network_reduction_bounds(
    topology: Topology, sizes_bytes: Iterable[int], *, links: tuple[Link, ...] | None = None
) -> tuple[LowerBound, ...]:
    """Return, per size, a lower bound (µs) on any AllReduce of that many bytes, in-network reduction included.

    Parameters
    ----------
    topology : Topology
        Any topology; only links some GPU-to-GPU route holds count.
    sizes_bytes : iterable of int
        AllReduce buffer sizes M (bytes).
    links : tuple of Link, optional
        ``route_links(topology)`` when the caller has it already (computed here otherwise).

    Returns
    -------
    tuple of LowerBound
        ``time_us = max over S of (α_S + M / capacity(S)), or the latency floor``; ``cut`` is the
        binding set at that size (one GPU, or one machine), ``cut_only_time_us`` the same without α.

    Raises
    ------
    ArgumentError
        For a size below 1 byte.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> (bound,) = in_network_reduction_bounds(load_topology("dgx-h100"), [370_800_000])
    >>> round(bound.time_us, 3), bound.cut_gpus  # 0.6 µs + 370.8 MB at 370.8 GB/s per GPU
    (1000.6, 1)
    """
    sizes = checked_sizes(topology, sizes_bytes)
    if topology.num_ranks < 2:
        nothing = CutBound(False, (), 0, 0.0, "one GPU: nothing to move", 0.0)
        return tuple(
            make_lower_bound(Collective.ALLREDUCE, s, 0.0, 0.0, 0.0, nothing, nothing.description) for s in sizes
        )
    links = route_links(topology) if links is None else links
    floor = route_latency_floor_us(topology, links)
    sides = _sides(topology, links)
    bounds = []
    for size in sizes:
        side = max(sides, key=lambda s: s.time_us(size))
        cut = CutBound(False, side.names, side.gpus, side.capacity_GBps, side.description, side.alpha_us)
        bandwidth_us = size / (side.capacity_GBps * BYTES_PER_US_PER_GBPS)
        description = f"in-network reduction bound: {side.description}"
        bounds.append(
            make_lower_bound(Collective.ALLREDUCE, size, bandwidth_us, side.alpha_us, floor, cut, description)
        )
    return tuple(bounds)


def schedule_bounds(
    topology: Topology, collective: Collective, sizes_bytes: Iterable[int], *, reduces_in_switch: bool = False
) -> tuple[LowerBound, ...]:
    """Return, per size, the lower bound (µs) that holds for a schedule of ``collective`` on ``topology``.

    A schedule that sums in a switch (``Algorithm.reduces_in_switch``) is held to the bounds that
    hold for in-network reduction: AllReduce's here, and for ReduceScatter the same argument with
    each GPU's output block of M/N bytes (a set holding some GPUs sends M/N out, for a block
    outside that depends on its inputs, and takes M/N in). Every other schedule is held to
    ``lower_bounds`` (for AllReduce, the ReduceScatter + AllGather class bound).
    """
    sizes = checked_sizes(topology, sizes_bytes)
    if reduces_in_switch and collective is Collective.ALLREDUCE:
        return in_network_reduction_bounds(topology, sizes)
    if reduces_in_switch and collective is Collective.REDUCESCATTER:
        blocks = in_network_reduction_bounds(topology, [max(1, size // topology.num_ranks) for size in sizes])
        return tuple(
            replace(bound, collective=Collective.REDUCESCATTER, size_bytes=size) for bound, size in zip(blocks, sizes)
        )
    return lower_bounds(topology, collective, sizes)


def _sides(topology: Topology, links: tuple[Link, ...]) -> list[_Side]:
    """Return the candidate sets both ways: each GPU, and each machine when there are several.

    Machines with the same ``node_signature`` (same links, NICs and speeds) have the same cuts,
    so only the first of each kind is cut.
    """
    kinds: dict[str, int] = {}
    for node in range(topology.nodes):
        kinds.setdefault(node_signature(topology, node), node)
    representatives = set(kinds.values())
    sets: list[tuple[frozenset[str], str]] = []
    for gpu in topology.gpus:
        if gpu.node in representatives:
            sets.append((frozenset({gpu.name}), f"{gpu.name} alone"))
    if topology.nodes > 1:
        for node in sorted(representatives):
            members = frozenset(
                v.name for v in topology.vertices if v.node == node and v.kind is not VertexKind.NET_SWITCH
            )
            sets.append((members, f"node {node} ({topology.gpus_per_node} GPUs)"))
    sides = []
    for inside, what in sets:
        gpus = tuple(v for v in topology.gpus if v.name in inside)
        others = tuple(v for v in topology.gpus if v.name not in inside)
        names = tuple(v.name for v in topology.vertices if v.name in inside)
        leaving = sum(link.bandwidth_GBps for link in links if link.src in inside and link.dst not in inside)
        entering = sum(link.bandwidth_GBps for link in links if link.dst in inside and link.src not in inside)
        sides.append(
            _Side(
                names, len(gpus), leaving, crossing_alpha_us(topology, gpus, others), f"{what}: {leaving:.4g} GB/s out"
            )
        )
        sides.append(
            _Side(
                names, len(gpus), entering, crossing_alpha_us(topology, others, gpus), f"{what}: {entering:.4g} GB/s in"
            )
        )
    return sides
