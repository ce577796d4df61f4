"""NCCL-like ring baselines: AllGather, ReduceScatter and AllReduce (ReduceScatter + AllGather).

Each channel is a ring over all ranks; a rank's data is split evenly over the channels, and
each channel's share into ``chunks`` pieces that follow each other around its ring.

Ring orders follow what NCCL builds on the machine:

* One machine: Hamiltonian cycles over the fastest GPU pairs, each further cycle on links the
  earlier ones leave free (on NDv2/DGX-1 the double-NVLink cycle 0-1-3-2-6-7-5-4 and the
  single-NVLink one), each run in both directions (the two directions of a link are separate
  resources). A cycle whose bottleneck is k times the slowest chosen one gets k channels per
  direction, so every channel carries about the same time's worth of data.
* Several machines: channel c crosses between machines through rail c (``rail_nics``: one
  working NIC per machine, as many rails as the machine with the fewest working NICs has, the
  same NIC index on every machine where it is up): in every machine the ring leaves at the GPU
  nearest that NIC and enters at another GPU next to a working NIC, with a Hamiltonian path
  over the fastest pairs in between, so different channels use different NICs and no hop
  between machines starts or ends at a GPU whose NIC is down. With one rail a second channel
  runs the same ring in the opposite direction.
"""

from __future__ import annotations

from taccl_py.baselines._orders import best_path, disjoint_cycles, nic_rank_orders, nic_ranks, node_ranks, rail_nics
from taccl_py.baselines._plans import ring_allgather_items, ring_reducescatter_items
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan, spread_long_connections
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = ["machine_rings", "ring_orders", "ring_algorithm", "ring_steps_per_threadblock", "MAX_CHANNELS", "MAX_WEIGHT"]

MAX_CHANNELS = 32  # MSCCL/NCCL limit on channels (MAXCHANNELS 32)
MAX_WEIGHT = 4  # at most this many channels per cycle direction when link speeds differ

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def machine_rings(topology: Topology, node: int = 0) -> tuple[tuple[int, ...], ...]:
    """Return the rings over machine ``node``'s ranks: its link-disjoint cycles, both ways, weighted.

    A cycle whose bottleneck is k times the slowest chosen one appears k times per direction
    (at most ``MAX_WEIGHT``); the first copies of every ring come first.
    """
    ranks = node_ranks(topology, node)
    if len(ranks) < 3:
        return (ranks,)
    cycles = disjoint_cycles(topology, ranks)
    slowest = min(bandwidth for _, bandwidth in cycles)
    weights = [min(MAX_WEIGHT, max(1, round(bandwidth / slowest))) for _, bandwidth in cycles]
    rings: list[tuple[int, ...]] = []
    for copy in range(max(weights)):
        for (order, _), weight in zip(cycles, weights):
            if copy < weight:
                rings += [order, (order[0],) + tuple(reversed(order[1:]))]
    return tuple(rings)


def _multi_node_rings(topology: Topology) -> list[tuple[int, ...]]:
    rails = rail_nics(topology)
    orders = [nic_rank_orders(topology, node) for node in range(topology.nodes)]
    endpoints = [nic_ranks(topology, node) for node in range(topology.nodes)]
    rings: list[tuple[int, ...]] = []
    entries: list[set[int]] = [set() for _ in range(topology.nodes)]
    for rail in range(len(rails[0])):
        ring: list[int] = []
        for node in range(topology.nodes):
            near = orders[node][rails[node][rail]]
            exit_rank = near[0]
            entry_rank = _entry_rank(near, entries[node], endpoints[node])
            entries[node].add(entry_rank)
            ring += best_path(topology, node_ranks(topology, node), entry_rank, exit_rank)[0]
        rings.append(tuple(ring))
    if len(rings) == 1:
        rings.append((rings[0][0],) + tuple(reversed(rings[0][1:])))
    return rings


def _entry_rank(near: tuple[int, ...], taken: set[int], endpoints: frozenset[int]) -> int:
    """Return the GPU a ring enters a machine by, given its exit ``near[0]`` (nearest the rail's NIC).

    The nearest other GPU next to a working NIC that no earlier channel enters by: with one NIC
    per GPU this spreads the entries (and the NICs their inbound routes use) over all GPUs, and
    a GPU whose NIC is down is never an entry (its route would detour over the host).
    """
    usable = [rank for rank in near[1:] if rank in endpoints]
    fresh = [rank for rank in usable if rank not in taken]
    return (fresh or usable or list(near[1:]) or [near[0]])[0]


def ring_steps_per_threadblock(collective: Collective | str, num_ranks: int, chunks: int) -> int:
    """Return the fewest MSCCL steps a ring's threadblock runs: (N−1)·chunks, twice that for AllReduce.

    Each of a channel's ``chunks`` pieces passes N−1 hops around a ring of N ranks, one step per
    hop on the threadblock that sends to the next rank (AllReduce: a reduce-scatter and an
    all-gather lap). Export adds a few more (local copies, dependency nops), so this is a floor
    that lets a caller refuse a ring beyond a runtime's step limit before building it.

    >>> ring_steps_per_threadblock("allreduce", 64, 1), ring_steps_per_threadblock("allgather", 8, 4)
    (126, 28)
    """
    laps = 2 if Collective(collective) is Collective.ALLREDUCE else 1
    return laps * (num_ranks - 1) * chunks


def ring_orders(topology: Topology, channels: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Return one ring (ranks in sending order) per channel, built as NCCL would on ``topology``.

    ``channels`` defaults to the number of distinct rings found (see the module notes), at most
    ``MAX_CHANNELS`` as NCCL caps them (72 NICs per machine on GB200 NVL72 racks give 72 rings);
    more channels reuse them cyclically. Raises ``ArgumentError`` for a channel count outside
    1..``MAX_CHANNELS`` or a topology with fewer than 2 GPUs.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> ring_orders(load_topology("ndv2"))[:2]
    ((0, 1, 3, 2, 6, 7, 5, 4), (0, 4, 5, 7, 6, 2, 3, 1))
    """
    if topology.num_ranks < 2:
        raise ArgumentError(topology.name, "num_ranks", f"{topology.num_ranks} GPU", "at least 2 GPUs for a ring")
    candidates = list(machine_rings(topology)) if topology.nodes == 1 else _multi_node_rings(topology)
    count = min(len(candidates), MAX_CHANNELS) if channels is None else channels
    if not 1 <= count <= MAX_CHANNELS:
        raise ArgumentError(topology.name, "channels", f"{count} channels", f"1..{MAX_CHANNELS}")
    return tuple(candidates[k % len(candidates)] for k in range(count))


def _owned(ring: tuple[int, ...], units: int, channel: int, chunks: int) -> list[list[tuple[int, int]]]:
    """Return per ring position the chunks of its rank this channel carries (one piece each)."""
    return [[(rank * units + channel * chunks + piece, 1) for piece in range(chunks)] for rank in ring]


def _ring_items(
    collective: Collective, rings: tuple[tuple[int, ...], ...], n: int, chunks: int
) -> list[Transfer | LocalCopy]:
    units = len(rings) * chunks
    total = n * units
    if collective is Collective.ALLGATHER:
        items: list[Transfer | LocalCopy] = [LocalCopy(r, (I, 0), (O, r * units), units) for r in range(n)]
        for channel, ring in enumerate(rings):
            items += ring_allgather_items(ring, _owned(ring, units, channel, chunks), O, channel)
        return items
    if collective is Collective.REDUCESCATTER:
        items = [LocalCopy(r, (I, 0), (S, 0), total) for r in range(n)]
        for channel, ring in enumerate(rings):
            items += ring_reducescatter_items(ring, _owned(ring, units, channel, chunks), S, channel)
        return items + [LocalCopy(r, (S, r * units), (O, 0), units) for r in range(n)]
    items = [LocalCopy(r, (I, 0), (O, 0), total) for r in range(n)]
    for channel, ring in enumerate(rings):
        owned = _owned(ring, units, channel, chunks)
        items += ring_reducescatter_items(ring, owned, O, channel)
        items += ring_allgather_items(ring, owned, O, channel)
    return items


def ring_algorithm(
    topology: Topology,
    collective: Collective,
    *,
    channels: int | None = None,
    chunks: int | None = None,
    max_transfers_per_threadblock: int | None = None,
    verify: bool = True,
) -> Algorithm:
    """Return a verified NCCL-like ring algorithm for ``collective`` on ``topology``.

    Parameters
    ----------
    topology : Topology
        The machine(s); ring orders come from ``ring_orders``.
    collective : Collective
        allgather, reducescatter or allreduce (reduce-scatter then allgather on each ring).
    channels : int, optional
        Rings run in parallel (default: as many as ``ring_orders`` finds).
    chunks : int, optional
        Pieces each channel's share is cut into (pipeline depth; default 1). In the α-β model a
        ring's links are busy on every step, so deeper pipelines only add latency.
    max_transfers_per_threadblock : int, optional
        Spread a ring's longer runs of sends over more channels (``spread_long_connections``),
        the same ring in threadblocks MSCCL loads; the name then ends in ``-tb<N>``. Default:
        one threadblock per ring and direction, as NCCL runs it.

    Returns
    -------
    Algorithm
        With ``chunks_per_loop = ranks * channels * chunks``; checked by ``check_algorithm``.

    Raises
    ------
    ArgumentError
        For alltoall, fewer than 2 GPUs, or channel or chunk counts out of range.
    """
    collective = Collective(collective)
    if collective is Collective.ALLTOALL:
        raise ArgumentError(
            topology.name, "collective", "no ring baseline for alltoall", "allgather, reducescatter or allreduce"
        )
    pieces = 1 if chunks is None else chunks
    if pieces < 1:
        raise ArgumentError(topology.name, "chunks", f"{pieces} chunks", "at least 1 chunk per channel")
    rings = ring_orders(topology, channels)
    n = topology.num_ranks
    metadata = (
        ("baseline", "ring"),
        ("topology", topology.name),
        ("channels", str(len(rings))),
        ("chunks", str(pieces)),
        ("rings", "; ".join(" ".join(map(str, ring)) for ring in rings)),
    )
    items, spread = _ring_items(collective, rings, n, pieces), frozenset()
    name = f"ring-{len(rings)}ch-{pieces}p"
    if max_transfers_per_threadblock is not None:
        items, spread = spread_long_connections(items, max_transfers_per_threadblock)
    if spread:
        name += f"-tb{max_transfers_per_threadblock}"
        metadata += (("transfers_per_threadblock", str(max_transfers_per_threadblock)),)
    algorithm = lower_plan(name, collective, n, n * len(rings) * pieces, items, metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm
