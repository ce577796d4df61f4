"""Hierarchical baselines: rings inside each machine and rings across machines.

* AllReduce: reduce-scatter inside every machine (local GPU l ends with the machine's sum of
  block l), allreduce of block l among the GPUs of local index l across machines (ring
  reduce-scatter then allgather), allgather inside every machine.
* AllGather: allgather among same-local-index GPUs across machines first, then inside every
  machine (each GPU forwards what it gathered from the other machines).
* ReduceScatter: the reverse, reduce-scatter inside every machine, then across machines.

Inside a machine channel c follows the c-th of that machine's ``machine_rings`` (NVLink cycles on
NDv2/DGX-1, both directions, the double-NVLink one twice; machines of another kind get their own
rings); a rank's data is split over the channels and each channel's share into ``chunks``
pieces. With one machine this is the ring algorithm.
"""

from __future__ import annotations

from dataclasses import replace

from taccl_py.baselines._orders import node_ranks
from taccl_py.baselines._plans import Piece, ring_allgather_items, ring_reducescatter_items
from taccl_py.baselines.ring import MAX_CHANNELS, machine_rings
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan, spread_long_connections
from taccl_py.topology.fingerprint import node_signatures
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = ["local_rings", "machines_local_rings", "hierarchical_algorithm"]

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
Items = list[Transfer | LocalCopy]


def local_rings(topology: Topology, channels: int | None = None, node: int = 0) -> tuple[tuple[int, ...], ...]:
    """Return one ring of local indices per channel inside machine ``node``.

    The rings are ``machine_rings`` (the machine's link-disjoint cycles, both ways, weighted by
    speed); ``channels`` defaults to their number and reuses them cyclically.
    """
    local = {rank: i for i, rank in enumerate(node_ranks(topology, node))}
    candidates = [tuple(local[r] for r in ring) for ring in machine_rings(topology, node)]
    count = len(candidates) if channels is None else channels
    if not 1 <= count <= MAX_CHANNELS:
        raise ArgumentError(topology.name, "channels", f"{count} channels", f"1..{MAX_CHANNELS}")
    return tuple(candidates[k % len(candidates)] for k in range(count))


def machines_local_rings(topology: Topology, channels: int | None = None) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Return ``local_rings`` of every machine, all with the same channel count.

    Machines of one kind (equal ``node_signature``) share their rings; machines of different
    kinds each get their own, and ``channels`` defaults to the most rings any machine has.
    """
    signatures = node_signatures(topology) if topology.nodes > 1 else ("",)
    by_kind: dict[str, tuple[tuple[int, ...], ...]] = {}
    for node, signature in enumerate(signatures):
        if signature not in by_kind:
            by_kind[signature] = local_rings(topology, channels, node)
    count = max(len(rings) for rings in by_kind.values())
    return tuple(tuple(by_kind[s][k % len(by_kind[s])] for k in range(count)) for s in signatures)


class _Grid:
    """Ranks as (machine, local index) with every machine's per-channel local rings."""

    def __init__(self, topology: Topology, rings: tuple[tuple[tuple[int, ...], ...], ...]) -> None:
        self.nodes = topology.nodes
        self.local = topology.gpus_per_node
        self.rings = rings
        self.channels = len(rings[0])

    def rank(self, node: int, local: int) -> int:
        return node * self.local + local

    def node_ring(self, node: int, channel: int) -> list[int]:
        return [self.rank(node, local) for local in self.rings[node][channel]]

    def cross_ring(self, local: int) -> list[int]:
        return [self.rank(node, local) for node in range(self.nodes)]


def _intra(grid: _Grid, owned_by_local, buffer: Buffer, reduce: bool) -> Items:
    """Run a ring step inside every machine on every channel; ``owned_by_local(node, local, channel)``."""
    make = ring_reducescatter_items if reduce else ring_allgather_items
    items: Items = []
    for channel in range(grid.channels):
        for node in range(grid.nodes):
            owned = [owned_by_local(node, local, channel) for local in grid.rings[node][channel]]
            items += make(grid.node_ring(node, channel), owned, buffer, channel)
    return items


def _cross(grid: _Grid, owned_by_node, buffer: Buffer, reduce: bool) -> Items:
    """Run a ring step across machines for every local index; ``owned_by_node(node, local)``."""
    if grid.nodes == 1:
        return []
    make = ring_reducescatter_items if reduce else ring_allgather_items
    items: Items = []
    for local in range(grid.local):
        owned = [owned_by_node(node, local) for node in range(grid.nodes)]
        items += make(grid.cross_ring(local), owned, buffer, grid.channels)
    return items


def _allreduce_items(grid: _Grid, chunks: int) -> tuple[int, Items]:
    """Chunk (local l, channel c, piece p, machine m) sits at ((l*K + c)*P + p)*nodes + m."""
    k, n = grid.channels, grid.nodes
    total = grid.local * k * chunks * n

    def block(local: int, channel: int) -> list[Piece]:  # local l's pieces on channel c, all machines
        return [(((local * k + channel) * chunks + p) * n, n) for p in range(chunks)]

    def part(node: int, local: int) -> list[Piece]:  # machine m's share of local l's block
        return [(((local * k + c) * chunks + p) * n + node, 1) for c in range(k) for p in range(chunks)]

    items: Items = [LocalCopy(r, (I, 0), (O, 0), total) for r in range(grid.nodes * grid.local)]
    items += _intra(grid, lambda node, local, c: block(local, c), O, reduce=True)
    items += _cross(grid, part, O, reduce=True)
    items += _cross(grid, part, O, reduce=False)
    items += _intra(grid, lambda node, local, c: block(local, c), O, reduce=False)
    return total, items


def _gather_items(grid: _Grid, chunks: int, reduce: bool) -> tuple[int, Items]:
    """AllGather (reduce False) or ReduceScatter (True); rank r's chunks are r*U .. r*U+U-1, U = K*P."""
    units = grid.channels * chunks
    ranks = grid.nodes * grid.local

    def own(node: int, local: int) -> list[Piece]:
        return [(grid.rank(node, local) * units + u, 1) for u in range(units)]

    def gathered(node: int, local: int, channel: int) -> list[Piece]:  # local l's column of machines, channel c
        return [
            (grid.rank(m, local) * units + channel * chunks + p, 1) for m in range(grid.nodes) for p in range(chunks)
        ]

    if not reduce:
        items: Items = [LocalCopy(r, (I, 0), (O, r * units), units) for r in range(ranks)]
        items += _cross(grid, own, O, reduce=False)
        items += _intra(grid, gathered, O, reduce=False)
        return ranks * units, items
    items = [LocalCopy(r, (I, 0), (S, 0), ranks * units) for r in range(ranks)]
    items += _intra(grid, gathered, S, reduce=True)
    items += _cross(grid, own, S, reduce=True)
    items += [LocalCopy(r, (S, r * units), (O, 0), units) for r in range(ranks)]
    return ranks * units, items


def hierarchical_algorithm(
    topology: Topology,
    collective: Collective,
    *,
    channels: int | None = None,
    chunks: int | None = None,
    max_transfers_per_threadblock: int | None = None,
    verify: bool = True,
) -> Algorithm:
    """Return a verified hierarchical (intra-machine rings + cross-machine rings) algorithm.

    Parameters
    ----------
    topology : Topology
        The machine(s); each machine kind has its own local rings (``machines_local_rings``).
    collective : Collective
        allgather, reducescatter or allreduce.
    channels : int, optional
        Local rings run in parallel (default: as many as ``local_rings`` finds).
    chunks : int, optional
        Pieces per channel (default 1); more pieces let the phases overlap.
    max_transfers_per_threadblock : int, optional
        Spread longer runs of sends over more channels (``spread_long_connections``) so that
        MSCCL loads the rings; the name then ends in ``-tb<N>`` and still counts the rings' channels.

    Raises
    ------
    ArgumentError
        For alltoall, fewer than 2 GPUs, or counts out of range.
    """
    collective = Collective(collective)
    if collective is Collective.ALLTOALL:
        raise ArgumentError(
            topology.name,
            "collective",
            "no hierarchical baseline for alltoall",
            "allgather, reducescatter or allreduce",
        )
    if topology.num_ranks < 2:
        raise ArgumentError(topology.name, "num_ranks", f"{topology.num_ranks} GPU", "at least 2 GPUs")
    pieces = 1 if chunks is None else chunks
    if pieces < 1:
        raise ArgumentError(topology.name, "chunks", f"{pieces} chunks", "at least 1 chunk per channel")
    rings = machines_local_rings(topology, channels)
    if len(rings[0]) + 1 > MAX_CHANNELS and topology.nodes > 1:
        raise ArgumentError(
            topology.name, "channels", f"{len(rings[0])} channels", f"1..{MAX_CHANNELS - 1} (one more crosses machines)"
        )
    grid = _Grid(topology, rings)
    if collective is Collective.ALLREDUCE:
        total, items = _allreduce_items(grid, pieces)
    else:
        total, items = _gather_items(grid, pieces, reduce=collective is Collective.REDUCESCATTER)
    # the name and metadata count every ring's channel, the cross-machine ring's included
    channels = 1 + max(item.channel for item in items if isinstance(item, Transfer))
    name = f"hierarchical-{channels}ch-{pieces}p"
    metadata = (
        ("baseline", "hierarchical"),
        ("topology", topology.name),
        ("channels", str(channels)),
        ("chunks", str(pieces)),
        ("local_rings", _rings_text(rings)),
    )
    if max_transfers_per_threadblock is not None:
        items, spread = spread_long_connections(items, max_transfers_per_threadblock)
        if spread:
            name += f"-tb{max_transfers_per_threadblock}"
            metadata += (("transfers_per_threadblock", str(max_transfers_per_threadblock)),)
    algorithm = lower_plan(name, collective, topology.num_ranks, total, items)
    algorithm = replace(algorithm, metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm


def _rings_text(rings: tuple[tuple[tuple[int, ...], ...], ...]) -> str:
    """Return ``"0 1 2; 0 2 1"``, or per machine ``"n0: ...| n1: ..."`` when the machines' rings differ."""
    texts = ["; ".join(" ".join(map(str, ring)) for ring in node_rings) for node_rings in rings]
    if all(text == texts[0] for text in texts):
        return texts[0]
    return " | ".join(f"n{node}: {text}" for node, text in enumerate(texts))
