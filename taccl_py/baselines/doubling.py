"""Latency-optimal hierarchical baselines: Bruck's doubling across machines on every rail, direct exchange inside.

For machines of G GPUs each (M machines, N = M·G ranks), local GPU i of every machine forms
rail i (on DGX machines it has its own NIC):

* AllGather: every GPU sends its block straight to the G - 1 others of its machine, and rail i
  runs Bruck's doubling across machines (step k: machine m sends the blocks it holds of machines
  m .. m + 2^k - 1 to machine m - 2^k; ceil(log2 M) steps, any M). Each block a GPU receives from
  the network goes on at once to the G - 1 others of its machine, so the network and NVLink phases
  overlap. A rail's blocks sit in scratch in Bruck's relative order, so each network send is one
  contiguous transfer; blocks reach the output buffer one local copy or NVLink transfer each.
* ReduceScatter: the AllGather reversed in time, every copy an addition (partial sums travel
  the AllGather's trees towards their owner); the AllGather it mirrors runs the other way round
  (to m + 2^k), so the mirror sends to m - 2^k as the AllGather does and AllReduce's two halves
  share their connections.
* AllReduce: that ReduceScatter, then the AllGather (Rabenseifner's halving-doubling).

Step k does not wait for step k - 1: its connection sends the GPU's own block at once and what
each earlier step brought as soon as it arrives, in pieces of ``piece_blocks`` blocks (fewer
pieces pay fewer α, smaller ones let NVLink forward sooner: ``doubling_pieces_by_size`` picks by
block size). Inside a machine, received blocks are forwarded in the order they should arrive,
over ``lanes`` connections per GPU pair in turn, so one forward's α overlaps another's bytes.
``channels`` cut every block in parts, each with its own connections (threadblocks); the second
sends its own block together with the first step's, so the two channels' sends start and finish
at different times and one's α falls in the other's transfers (a NIC shared fairly by equal
transfers started together finishes them all at once, then idles through the next α).

Under MSCCL's loop (``MSCCL_LOOP``) on DGX H100 × 16, AllGather: 15.2 µs at 1 MiB (NCCL's ring
345.6), 56.3 µs at 16 MiB (0.78 of the bound), 203.9 µs at 64 MiB (0.82).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from taccl_py.baselines._orders import node_ranks
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan, spread_long_connections
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = [
    "doubling_algorithm",
    "doubling_pieces_by_size",
    "default_doubling_channels",
    "equal_machines",
    "bruck_steps",
    "MAX_DOUBLING_CHANNELS",
]

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
Items = list[Transfer | LocalCopy]
Slot = tuple[Buffer, int]
# Channels × forwarding lanes: 2 keeps 64 machines of 8 GPUs within MSCCL's 64 threadblocks per GPU
# (taccl_py.msccl.limits): 2 × (6 + 6) network and 2 × 2 × 7 NVLink connections, 3 copy threadblocks (AllReduce 6).
MAX_DOUBLING_CHANNELS = 2
# Blocks (bytes each, size / GPUs) below this cross the network in one send per earlier step, the
# rest in pieces of 2 blocks. Simulated on DGX H100 × 16 under MSCCL's loop, AllGather: 1 MiB 15.2 µs
# against 16.8 in pieces of 2; 16 MiB 56.3 against 62.9 and 58.9 (one send per step, or pieces of 1);
# 64 MiB 203.9, within 3 % of pieces of 1 (197.9), which would cost one more build per run (~10 s).
_PIECE_BLOCK_BYTES = 32 * 1024


def equal_machines(topology: Topology) -> bool:
    """Return True when every machine of ``topology`` holds equally many GPUs."""
    return len({len(node_ranks(topology, node)) for node in range(topology.nodes)}) == 1


def default_doubling_channels(piece_blocks: int | None) -> int:
    """Return the channels the doubling baseline runs with sends of ``piece_blocks`` blocks: 2 from 2 blocks.

    Simulated on DGX H100 × 16 (16 MiB AllGather, pieces of 2 blocks): 56.3 µs on two staggered
    channels against 60.3 on one with two forwarding lanes (AllReduce: 112.2 against 117.7);
    1-block pieces (64 MiB) and one send per earlier step (1 MiB) run best on one channel (197.9
    against 203.7 µs, 15.2 against 16.1).
    """
    return 2 if piece_blocks is not None and piece_blocks > 1 else 1


def doubling_pieces_by_size(topology: Topology, sizes: Sequence[int]) -> dict[int | None, list[int]]:
    """Return ``sizes`` grouped by the blocks per network send the doubling baseline uses for them."""
    groups: dict[int | None, list[int]] = {}
    for size in sizes:
        pieces = None if size / topology.num_ranks < _PIECE_BLOCK_BYTES else 2
        groups.setdefault(pieces, []).append(size)
    return groups


def bruck_steps(machines: int) -> tuple[tuple[int, int], ...]:
    """Return Bruck's steps over ``machines``: (distance 2^k, blocks sent) with blocks min(2^k, M - 2^k).

    >>> bruck_steps(6)
    ((1, 1), (2, 2), (4, 2))
    """
    steps = []
    distance = 1
    while distance < machines:
        steps.append((distance, min(distance, machines - distance)))
        distance *= 2
    return tuple(steps)


def _pieces(distance: int, count: int, piece_blocks: int | None, staggered: bool) -> list[tuple[int, int]]:
    """Return the (first relative block, blocks) runs step ``distance`` sends, in the order they are ready.

    The own block first, then what each earlier step brought, in runs of at most ``piece_blocks``
    blocks (None: one run per earlier step). ``staggered`` sends the own block with the first
    step's, so this channel's sends start and end at other times than an unstaggered one's.
    """
    runs = [(0, 1)]
    start = 1
    while start < min(distance, count):
        end = min(2 * start, count)
        width = end - start if piece_blocks is None else piece_blocks
        runs += [(first, min(width, end - first)) for first in range(start, end, width)]
        start = end
    if staggered and len(runs) > 1:
        runs = [(0, 1 + runs[1][1])] + runs[2:]
    return runs


def _arrival_order(machines: int, piece_blocks: int | None, staggered: bool) -> dict[int, float]:
    """Return each relative block's arrival in sends (every send one unit after its data and its predecessor)."""
    arrival = {0: 0.0}
    for distance, count in bruck_steps(machines):
        done = 0.0
        for first, blocks in _pieces(distance, count, piece_blocks, staggered):
            done = max([done] + [arrival[p] for p in range(first, first + blocks)]) + 1.0
            arrival.update((distance + p, done) for p in range(first, first + blocks))
    return arrival


@dataclass(frozen=True)
class _Shape:
    """Channels (parts of a block), blocks per network send (None: one send per earlier step), forwarding lanes."""

    channels: int
    piece_blocks: int | None
    lanes: int

    def staggered(self, channel: int) -> bool:
        """Return True for the channels whose sends are staggered (every second one)."""
        return channel % 2 == 1


class _Grid:
    """Ranks as (machine, local index), channel parts and every slot the AllGather touches."""

    def __init__(
        self, topology: Topology, shape: _Shape, scratch_base: int, direction: int = 1, copy_base: int = 0
    ) -> None:
        self.machines = topology.nodes
        self.ranks = [node_ranks(topology, node) for node in range(self.machines)]
        self.local = len(self.ranks[0])
        self.channels = shape.channels
        self.shape = shape
        self.scratch_base = scratch_base
        self.direction = direction  # 1: machine m holds m + p at relative p and sends to m - 2^k; -1 mirrored
        # Local copies go on threadblocks of their own (MSCCL runs at most 64 steps in one): those of
        # forwarding lane l on copy channel copy_base + l, a GPU's own blocks on copy_base + MAX_DOUBLING_CHANNELS.
        self.copy_base = copy_base

    def lane(self, channel: int, position: int) -> int:
        """Return the channel forwarding relative block ``position`` of ``channel`` in a machine (lanes alternate)."""
        return channel + self.channels * (position % self.shape.lanes)

    def own_copies(self) -> int:
        """Return the copy channel of a GPU's own blocks."""
        return self.copy_base + MAX_DOUBLING_CHANNELS

    def block(self, rank: int, channel: int) -> int:
        """Return the chunk of ``rank``'s block that ``channel`` carries (output or input index)."""
        return rank * self.channels + channel

    def scratch(self, position: int, channel: int) -> Slot:
        """Return the scratch slot of relative block ``position`` of ``channel``'s rail copy."""
        return (S, self.scratch_base + channel * self.machines + position)


def _allgather_items(grid: _Grid, own: Callable[[int, int], Slot]) -> Items:
    """Return the AllGather's items; ``own(rank, channel)`` is where rank's part for channel starts out."""
    m_count, g_count, shape = grid.machines, grid.local, grid.shape
    items: Items = []
    for m in range(m_count):
        for rank in grid.ranks[m]:
            for c in range(grid.channels):
                out = (O, grid.block(rank, c))
                if own(rank, c) != out:
                    items.append(LocalCopy(rank, own(rank, c), out, channel=grid.own_copies()))
                if shape.staggered(c):  # its first sends start at the own block: copy it beside the rest
                    items.append(LocalCopy(rank, own(rank, c), grid.scratch(0, c), channel=grid.own_copies()))
                items += [Transfer(rank, peer, own(rank, c), out, channel=c) for peer in grid.ranks[m] if peer != rank]
    for distance, count in bruck_steps(m_count):
        for m in range(m_count):
            target = (m - grid.direction * distance) % m_count
            for i in range(g_count):
                for c in range(grid.channels):
                    rank = grid.ranks[m][i]
                    for first, blocks in _pieces(distance, count, shape.piece_blocks, shape.staggered(c)):
                        src = grid.scratch(first, c) if first or shape.staggered(c) else own(rank, c)
                        dst = grid.scratch(distance + first, c)
                        items.append(Transfer(rank, grid.ranks[target][i], src, dst, blocks, channel=c))
    # Forward blocks inside the machine in the order they should arrive (each connection runs in order).
    arrivals = [_arrival_order(m_count, shape.piece_blocks, shape.staggered(c)) for c in range(grid.channels)]
    order = sorted((arrivals[c][p], p, c) for c in range(grid.channels) for p in range(1, m_count))
    for _, position, c in order:
        for m in range(m_count):
            origin = (m + grid.direction * position) % m_count
            for i in range(g_count):
                rank = grid.ranks[m][i]
                held, out = grid.scratch(position, c), (O, grid.block(grid.ranks[origin][i], c))
                lane = grid.lane(c, position)
                items.append(LocalCopy(rank, held, out, channel=grid.copy_base + lane))
                items += [Transfer(rank, peer, held, out, channel=lane) for peer in grid.ranks[m] if peer != rank]
    return items


def _reversed_items(items: Sequence[Transfer | LocalCopy], swap: Callable[[int, Slot], Slot]) -> Items:
    """Return ``items`` run backwards with every copy an addition: the mirror collective's items.

    A copy from x to y becomes y's partial sum added into x; ``swap(rank, slot)`` maps each slot to
    the mirror's (the gather's output is the reduction's input). The first write into a slot
    overwrites it (nothing was there), the later ones add.
    """
    written: set[tuple[int, Buffer, int]] = set()
    out: Items = []
    for item in reversed(items):
        if isinstance(item, LocalCopy):
            src, dst, count = swap(item.rank, item.dst), swap(item.rank, item.src), item.count
            for start, run, seen in _runs(written, item.rank, dst, count):
                shifted = (src[0], src[1] + start)
                out.append(LocalCopy(item.rank, shifted, (dst[0], dst[1] + start), run, seen, item.channel))
            continue
        src, dst = swap(item.dst_rank, item.dst), swap(item.src_rank, item.src)
        for start, run, seen in _runs(written, item.src_rank, dst, item.count):
            out.append(
                Transfer(
                    item.dst_rank,
                    item.src_rank,
                    (src[0], src[1] + start),
                    (dst[0], dst[1] + start),
                    run,
                    reduce=seen,
                    channel=item.channel,
                )
            )
    return out


def _runs(written: set[tuple[int, Buffer, int]], rank: int, dst: Slot, count: int) -> list[tuple[int, int, bool]]:
    """Return (offset, chunks, already written) runs of ``dst`` on ``rank``, and mark them all written."""
    flags = [(rank, dst[0], dst[1] + k) in written for k in range(count)]
    written.update((rank, dst[0], dst[1] + k) for k in range(count))
    runs: list[tuple[int, int, bool]] = []
    for k, flag in enumerate(flags):
        if runs and runs[-1][2] == flag:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, flag)
        else:
            runs.append((k, 1, flag))
    return runs


def _plan(topology: Topology, collective: Collective, shape: _Shape) -> Items:
    """Return the items of ``collective``: the AllGather, its mirror, or the mirror then the AllGather."""
    if collective is Collective.ALLGATHER:
        return _allgather_items(_Grid(topology, shape, 0), lambda rank, c: (I, c))
    # The mirror of a gather that sends the other way round sends where the gather does: one set of connections.
    gather = _allgather_items(_Grid(topology, shape, 0, direction=-1), lambda rank, c: (I, c))
    if collective is Collective.REDUCESCATTER:
        swap = {I: O, O: I, S: S}
        return _reversed_items(gather, lambda rank, slot: (swap[slot[0]], slot[1]))
    # AllReduce: the reduce-scatter leaves rank r's sums in its output at r's block, read back by the gather.
    # Its copies take channels of their own beside the reduce-scatter's.
    grid = _Grid(topology, shape, shape.channels * topology.nodes, copy_base=MAX_DOUBLING_CHANNELS + 1)

    def swap_allreduce(rank: int, slot: Slot) -> Slot:
        if slot[0] is I:
            return (O, grid.block(rank, slot[1]))
        return (I, slot[1]) if slot[0] is O else slot

    items = _reversed_items(gather, swap_allreduce)
    return items + _allgather_items(grid, lambda rank, c: (O, grid.block(rank, c)))


def doubling_algorithm(
    topology: Topology,
    collective: Collective,
    *,
    channels: int | None = None,
    piece_blocks: int | None = None,
    lanes: int | None = None,
    max_transfers_per_threadblock: int | None = None,
) -> Algorithm:
    """Return a verified doubling baseline: Bruck's doubling per rail across machines, direct exchange inside.

    Parameters
    ----------
    topology : Topology
        Two or more machines of equally many GPUs (one each is fine).
    collective : Collective
        allgather, reducescatter or allreduce.
    channels : int, optional
        Parts every block is cut in, each on its own connections, the second one's network sends
        staggered (at most 2; default ``default_doubling_channels``).
    piece_blocks : int or None
        Blocks per network send: what each earlier step brought goes on in runs of at most this
        many as soon as it arrives; None (default): in one send per earlier step.
    lanes : int, optional
        Connections per GPU pair and channel inside a machine that forward received blocks in turn
        (default 2 // channels; channels × lanes at most 2, which keeps 64 machines within 64
        threadblocks per GPU).
    max_transfers_per_threadblock : int, optional
        Spread longer runs of sends over more channels (``spread_long_connections``).

    Raises
    ------
    ArgumentError
        For alltoall, one machine, machines of different sizes, or counts out of range.
    """
    collective = Collective(collective)
    if collective is Collective.ALLTOALL:
        fault = "no doubling baseline for alltoall"
        raise ArgumentError(topology.name, "collective", fault, "allgather, reducescatter or allreduce")
    if topology.nodes < 2:
        raise ArgumentError(topology.name, "nodes", f"{topology.nodes} machine", "two or more machines")
    if not equal_machines(topology):
        sizes = sorted({len(node_ranks(topology, node)) for node in range(topology.nodes)})
        fault = f"machines of {sizes} GPUs"
        raise ArgumentError(topology.name, "nodes", fault, "machines of equally many GPUs")
    if piece_blocks is not None and piece_blocks < 1:
        raise ArgumentError(topology.name, "piece_blocks", f"{piece_blocks} blocks", "at least 1, or None")
    count = default_doubling_channels(piece_blocks) if channels is None else channels
    if not 1 <= count <= MAX_DOUBLING_CHANNELS:
        raise ArgumentError(topology.name, "channels", f"{count} channels", f"1..{MAX_DOUBLING_CHANNELS}")
    lanes = MAX_DOUBLING_CHANNELS // count if lanes is None else lanes
    if lanes < 1 or count * lanes > MAX_DOUBLING_CHANNELS:
        fault = f"{lanes} lanes on {count} channels"
        raise ArgumentError(topology.name, "lanes", fault, f"channels x lanes within 1..{MAX_DOUBLING_CHANNELS}")
    shape = _Shape(count, piece_blocks, lanes)
    items = _plan(topology, collective, shape)
    pieces = "steps" if piece_blocks is None else f"{piece_blocks}b"
    name = f"doubling-{count}ch-{pieces}-{lanes}l"
    metadata = (
        ("baseline", "doubling"),
        ("topology", topology.name),
        ("channels", str(count)),
        ("piece_blocks", "steps" if piece_blocks is None else str(piece_blocks)),
        ("lanes", str(lanes)),
    )
    if max_transfers_per_threadblock is not None:
        items, spread = spread_long_connections(items, max_transfers_per_threadblock)
        if spread:
            name += f"-tb{max_transfers_per_threadblock}"
            metadata += (("transfers_per_threadblock", str(max_transfers_per_threadblock)),)
    algorithm = lower_plan(name, collective, topology.num_ranks, topology.num_ranks * count, items)
    return check_algorithm(replace(algorithm, metadata=metadata))
