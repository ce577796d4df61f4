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

Pieces of one block go in half blocks. NVLink forwarding is the tight side: a GPU's NIC takes in
15 blocks (16 machines) and its NVLink must pass each on 7 times, 0.91 of the NIC's time; it can
only start once network data lands; whole-block pieces left it idle until 9.5 µs and then often
on one channel's connections alone, each forward's α in the open. In halves, step 1 sends the own
block in two sends, so the first half lands early while the other steps' own blocks still share
the NIC; the second channel sends its own block with the first half of step 1's block, half a
block out of step with the first, so the two channels' forwards interleave; and each half goes
on as it lands (in whole blocks where that would pass MSCCL's 64 steps a threadblock: ~60 machines).

Under MSCCL's loop (``MSCCL_LOOP``) on DGX H100 × 16, AllGather: 15.2 µs at 1 MiB (NCCL's ring
345.6), 53.0 µs at 16 MiB (0.82 of the bound; 56.3 in whole blocks), 194.2 µs at 64 MiB (0.86).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from taccl_py.baselines._orders import node_ranks
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan, spread_long_connections
from taccl_py.msccl.limits import MAX_STEPS_PER_THREADBLOCK
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
# Blocks (bytes each, size / GPUs) below _PIECE_BLOCK_BYTES cross the network in one send per earlier
# step, those below _HALF_BLOCK_BYTES in pieces of 2 blocks, the rest in pieces of 1 (in half blocks).
# Simulated on DGX H100 × 16 under MSCCL's loop, AllGather: 1 MiB 15.2 µs against 16.8 in pieces of 2;
# 4 MiB (32 KiB blocks) 23.6 in pieces of 2 against 31.5 in halves; 16 MiB 53.0 in halves against
# 56.3 in pieces of 2 and 62.9 in one send per step; 64 MiB 194.2 against 203.9; 1 GiB 3073.6 against
# 3264.7; × 32 at 64 KiB blocks (16 MiB) 67.8 in pieces of 2 against 71.7, at 128 KiB (32 MiB) 101.0
# in halves against 106.5. The reductions run the gather backwards, where halves pay from 512 KiB
# blocks (ReduceScatter × 16: 16 MiB 62.8 µs against 56.0 in pieces of 2, 64 MiB 187.2 against
# 194.6; AllReduce 115.8 against 112.2, 381.5 against 398.4).
_PIECE_BLOCK_BYTES = 32 * 1024
_HALF_BLOCK_BYTES = 128 * 1024
_HALF_BLOCK_BYTES_REDUCING = 512 * 1024


def equal_machines(topology: Topology) -> bool:
    """Return True when every machine of ``topology`` holds equally many GPUs."""
    return len({len(node_ranks(topology, node)) for node in range(topology.nodes)}) == 1


def default_doubling_channels(piece_blocks: int | None) -> int:
    """Return the channels the doubling baseline runs with sends of ``piece_blocks`` blocks: 2 for any pieces.

    Simulated on DGX H100 × 16 (16 MiB AllGather, pieces of 2 blocks): 56.3 µs on two staggered
    channels against 60.3 on one with two forwarding lanes (AllReduce: 112.2 against 117.7);
    one send per earlier step (1 MiB) runs best on one channel (15.2 against 16.1 µs). Pieces of
    one block (half blocks) stagger the channels by half a block.
    """
    return 1 if piece_blocks is None else 2


def doubling_pieces_by_size(
    topology: Topology, sizes: Sequence[int], collective: Collective | str = Collective.ALLGATHER
) -> dict[int | None, list[int]]:
    """Return ``sizes`` grouped by the blocks per network send the doubling baseline of ``collective`` uses."""
    gathers = Collective(collective) is Collective.ALLGATHER
    halves = _HALF_BLOCK_BYTES if gathers else _HALF_BLOCK_BYTES_REDUCING
    groups: dict[int | None, list[int]] = {}
    for size in sizes:
        block = size / topology.num_ranks
        pieces = None if block < _PIECE_BLOCK_BYTES else 2 if block < halves else 1
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
    """Return the (first relative part, parts) runs step ``distance`` sends, in the order they are ready.

    In whole blocks: the own block first, then what each earlier step brought in runs of at most
    ``piece_blocks`` blocks (None: one run per earlier step); ``staggered`` sends the own block
    with the first step's, so this channel's sends start and end at other times than an
    unstaggered one's. Pieces of one block go in half blocks (``_parts``): the own block in two
    halves when it is all the step sends (the first half arrives early), and ``staggered`` sends
    the own block with the first half of the first step's block, half a block out of step.
    """
    runs = [(0, 1)]
    start = 1
    while start < min(distance, count):
        end = min(2 * start, count)
        width = end - start if piece_blocks is None else piece_blocks
        runs += [(first, min(width, end - first)) for first in range(start, end, width)]
        start = end
    if piece_blocks != 1:
        return [(0, 1 + runs[1][1])] + runs[2:] if staggered and len(runs) > 1 else runs
    halves = [(2 * first, 2 * blocks) for first, blocks in runs]
    if len(halves) == 1:
        return [(0, 1), (1, 1)]
    return [(0, 3), (3, 1)] + halves[2:] if staggered else halves


def _forwards(machines: int, piece_blocks: int | None, staggered: bool) -> list[tuple[float, int, int, int]]:
    """Return the (arrival in sends, relative block, first part, parts) a channel forwards inside a machine.

    Each send arrives one unit after its data and its predecessor. What a send brings goes on as it
    lands, one forward per block it touches; in whole blocks when halves would take a forwarding
    connection past MSCCL's steps per threadblock (beside the own block's forward).
    """
    parts = _parts(piece_blocks)
    arrival = dict.fromkeys(range(parts), 0.0)
    forwards = []
    for distance, count in bruck_steps(machines):
        done = 0.0
        for first, run in _pieces(distance, count, piece_blocks, staggered):
            done = max([done] + [arrival[p] for p in range(first, first + run)]) + 1.0
            start, end = distance * parts + first, distance * parts + first + run
            arrival.update((p, done) for p in range(start, end))
            for position in range(start // parts, (end - 1) // parts + 1):
                low, high = max(start, position * parts), min(end, (position + 1) * parts)
                forwards.append((done, position, low - position * parts, high - low))
    if 1 + len(forwards) > MAX_STEPS_PER_THREADBLOCK:
        whole: dict[int, float] = {}
        for done, position, _, _ in forwards:
            whole[position] = max(whole.get(position, 0.0), done)
        forwards = [(done, position, 0, parts) for position, done in whole.items()]
    return forwards


def _parts(piece_blocks: int | None) -> int:
    """Return the chunks a channel cuts each block in: halves for pieces of one block, else whole blocks."""
    return 2 if piece_blocks == 1 else 1


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
        self.parts = _parts(shape.piece_blocks)
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
        """Return the first chunk of ``rank``'s block that ``channel`` carries (output index)."""
        return (rank * self.channels + channel) * self.parts

    def scratch(self, part: int, channel: int) -> Slot:
        """Return the scratch slot of relative part ``part`` (block ``part // parts``) of ``channel``'s rail copy."""
        return (S, self.scratch_base + channel * self.machines * self.parts + part)


def _allgather_items(grid: _Grid, own: Callable[[int, int], Slot]) -> Items:
    """Return the AllGather's items; ``own(rank, channel)`` is where rank's parts for channel start out."""
    m_count, g_count, shape, parts = grid.machines, grid.local, grid.shape, grid.parts
    items: Items = []
    for m in range(m_count):
        for rank in grid.ranks[m]:
            for c in range(grid.channels):
                held, out = own(rank, c), (O, grid.block(rank, c))
                if held != out:
                    items.append(LocalCopy(rank, held, out, parts, channel=grid.own_copies()))
                if shape.staggered(c):  # its first sends start at the own block: copy it beside the rest
                    items.append(LocalCopy(rank, held, grid.scratch(0, c), parts, channel=grid.own_copies()))
                items += [Transfer(rank, peer, held, out, parts, channel=c) for peer in grid.ranks[m] if peer != rank]
    for distance, count in bruck_steps(m_count):
        for m in range(m_count):
            target = (m - grid.direction * distance) % m_count
            for i in range(g_count):
                for c in range(grid.channels):
                    rank = grid.ranks[m][i]
                    for first, run in _pieces(distance, count, shape.piece_blocks, shape.staggered(c)):
                        held = own(rank, c)
                        src = (
                            grid.scratch(first, c)
                            if first >= parts or shape.staggered(c)
                            else (held[0], held[1] + first)
                        )
                        dst = grid.scratch(distance * parts + first, c)
                        items.append(Transfer(rank, grid.ranks[target][i], src, dst, run, channel=c))
    # Forward blocks inside the machine in the order they should arrive (each connection runs in order).
    order = sorted(
        (done, position, c, first, run)
        for c in range(grid.channels)
        for done, position, first, run in _forwards(m_count, shape.piece_blocks, shape.staggered(c))
    )
    for _, position, c, first, run in order:
        for m in range(m_count):
            origin = (m + grid.direction * position) % m_count
            for i in range(g_count):
                rank = grid.ranks[m][i]
                held = grid.scratch(position * parts + first, c)
                out = (O, grid.block(grid.ranks[origin][i], c) + first)
                lane = grid.lane(c, position)
                items.append(LocalCopy(rank, held, out, run, channel=grid.copy_base + lane))
                items += [Transfer(rank, peer, held, out, run, channel=lane) for peer in grid.ranks[m] if peer != rank]
    return items


def _reversed_items(
    items: Sequence[Transfer | LocalCopy],
    swap: Callable[[int, Slot], Slot],
    written: dict[tuple[int, Buffer], set[int]] | None = None,
) -> Items:
    """Return ``items`` run backwards with every copy an addition: the mirror collective's items.

    A copy from x to y becomes y's partial sum added into x; ``swap(rank, slot)`` maps each slot to
    the mirror's (the gather's output is the reduction's input). The first write into a slot
    overwrites it (nothing was there), the later ones add; ``written`` marks (rank, buffer) chunk
    offsets that already hold data, so every write there adds.
    """
    written = {} if written is None else written
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


def _runs(written: dict[tuple[int, Buffer], set[int]], rank: int, dst: Slot, count: int) -> list[tuple[int, int, bool]]:
    """Return (offset, chunks, already written) runs of ``dst`` on ``rank``, and mark them all written."""
    # Chunk offsets per (rank, buffer): a million items make no per-chunk key tuples.
    seen = written.setdefault((rank, dst[0]), set())
    first = dst[1]
    flags = [first + k in seen for k in range(count)]
    seen.update(range(first, first + count))
    runs: list[tuple[int, int, bool]] = []
    for k, flag in enumerate(flags):
        if runs and runs[-1][2] == flag:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, flag)
        else:
            runs.append((k, 1, flag))
    return runs


def _plan(topology: Topology, collective: Collective, shape: _Shape) -> Items:
    """Return the items of ``collective``: the AllGather, its mirror, or the mirror then the AllGather."""
    parts = _parts(shape.piece_blocks)
    if collective is Collective.ALLGATHER:
        return _allgather_items(_Grid(topology, shape, 0), lambda rank, c: (I, c * parts))
    # The mirror of a gather that sends the other way round sends where the gather does: one set of connections.
    gather = _allgather_items(_Grid(topology, shape, 0, direction=-1), lambda rank, c: (I, c * parts))
    if collective is Collective.REDUCESCATTER:
        swap = {I: O, O: I, S: S}
        return _mirrored(gather, lambda rank, slot: (swap[slot[0]], slot[1]))
    # AllReduce: the reduce-scatter leaves rank r's sums in its output at r's block, read back by the gather.
    # Its copies take channels of their own beside the reduce-scatter's.
    grid = _Grid(topology, shape, shape.channels * topology.nodes * parts, copy_base=MAX_DOUBLING_CHANNELS + 1)

    def swap_allreduce(rank: int, slot: Slot) -> Slot:
        if slot[0] is I:
            return (O, grid.block(rank, 0) + slot[1])
        return (I, slot[1]) if slot[0] is O else slot

    items = _mirrored(gather, swap_allreduce)
    return items + _allgather_items(grid, lambda rank, c: (O, grid.block(rank, c)))


def _mirrored(gather: Items, swap: Callable[[int, Slot], Slot]) -> Items:
    """Return the mirror of ``gather`` (``_reversed_items``) that stays right in place.

    Mirrored as is, the first receive where a rank's sums gather would overwrite, and its own input
    be added last; in place (PyTorch's all_reduce) that receive overwrites the very input. So the
    own input is copied there first (in place a copy onto itself, dropped), every receive adds,
    and the closing addition goes.
    """
    own = [item for item in gather if isinstance(item, LocalCopy) and item.src[0] is I and item.dst[0] is O]
    seeds = [
        LocalCopy(item.rank, swap(item.rank, item.dst), swap(item.rank, item.src), item.count, False, item.channel)
        for item in own
    ]
    ready: dict[tuple[int, Buffer], set[int]] = {}
    for seed in seeds:
        ready.setdefault((seed.rank, seed.dst[0]), set()).update(range(seed.dst[1], seed.dst[1] + seed.count))
    copied = {id(item) for item in own}
    return seeds + _reversed_items([item for item in gather if id(item) not in copied], swap, ready)


def doubling_algorithm(
    topology: Topology,
    collective: Collective,
    *,
    channels: int | None = None,
    piece_blocks: int | None = None,
    lanes: int | None = None,
    max_transfers_per_threadblock: int | None = None,
    verify: bool = True,
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
        many as soon as it arrives; None (default): in one send per earlier step; 1: in half
        blocks, the channels half a block apart (module docstring).
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
    chunks = topology.num_ranks * count * _parts(piece_blocks)
    algorithm = lower_plan(name, collective, topology.num_ranks, chunks, items)
    algorithm = replace(algorithm, metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm
