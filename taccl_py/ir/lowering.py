"""Lower a causally ordered list of chunk transfers to an ``Algorithm``.

Baselines and the synthesizer describe a schedule as ``Transfer`` and ``LocalCopy`` items in an
order where every item's inputs were produced by earlier items. ``lower_plan`` gives each rank one
threadblock per (direction, peer, channel) plus one per channel of local copies, appends the items' steps in
order, and adds the cross-threadblock dependencies that data hazards (read-after-write,
write-after-write, write-after-read) require. Every edge then points from an earlier item to a
later one, so the result cannot deadlock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective, chunk_layout

__all__ = [
    "MAX_TRANSFERS_PER_THREADBLOCK",
    "Transfer",
    "LocalCopy",
    "ScratchAllocator",
    "lower_plan",
    "spread_long_connections",
]

Slot = tuple[Buffer, int]
# Transfers per threadblock before a (src, dst, channel) spills to another channel: MSCCL's
# limit is 64 steps per threadblock (taccl_py.msccl.limits), and dependency nops count too.
MAX_TRANSFERS_PER_THREADBLOCK = 28


@dataclass(frozen=True, slots=True)
class Transfer:
    """Move ``count`` chunks from ``src`` on ``src_rank`` to ``dst`` on ``dst_rank``.

    With ``reduce`` the receiver adds the data to what ``dst`` holds instead of overwriting it.
    """

    src_rank: int
    dst_rank: int
    src: Slot
    dst: Slot
    count: int = 1
    reduce: bool = False
    channel: int = 0


@dataclass(frozen=True, slots=True)
class LocalCopy:
    """Copy (or with ``reduce``, add) ``count`` chunks from ``src`` to ``dst`` on ``rank``.

    Copies of one ``channel`` share a threadblock of no peer (MSCCL runs at most 64 steps in one).
    """

    rank: int
    src: Slot
    dst: Slot
    count: int = 1
    reduce: bool = False
    channel: int = 0


@dataclass
class ScratchAllocator:
    """Hands out each rank's scratch chunks in order, for plans that stage data on relays."""

    next_free: dict[int, int] = field(default_factory=dict)

    def take(self, rank: int, count: int) -> int:
        """Return the first of ``count`` scratch chunks of ``rank`` no earlier call returned."""
        start = self.next_free.get(rank, 0)
        self.next_free[rank] = start + count
        return start


@dataclass
class _RankState:
    """Threadblocks under construction and the hazard bookkeeping of one rank."""

    rank: int
    tb_keys: dict[tuple, int] = field(default_factory=dict)
    tb_peers: dict[int, tuple[int | None, int | None, int]] = field(default_factory=dict)
    steps: dict[int, list[Step]] = field(default_factory=dict)
    # Keyed by (buffer's spelling, chunk) and holding tuples of ints: the garbage collector stops
    # tracking such tuples (an Enum member in a key would keep every key tracked).
    last_writer: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    readers: dict[tuple[str, int], tuple[tuple[int, int], ...]] = field(default_factory=dict)
    scratch_used: int = 0

    def threadblock(self, key: tuple, send_peer: int | None, recv_peer: int | None, channel: int) -> int:
        if key not in self.tb_keys:
            tb_id = len(self.tb_keys)
            self.tb_keys[key] = tb_id
            self.tb_peers[tb_id] = (send_peer, recv_peer, channel)
            self.steps[tb_id] = []
        return self.tb_keys[key]


# Buffer -> its spelling: an Enum's ``.value`` is a descriptor call, slow over millions of steps.
_CODES = {buffer: buffer.value for buffer in Buffer}


def _slots(slot: Slot, count: int) -> list[tuple[str, int]]:
    """Return the hazard keys of ``count`` chunks from ``slot``."""
    code = _CODES[slot[0]]
    return [(code, slot[1] + i) for i in range(count)]


def _append_step(
    state: _RankState,
    tb_id: int,
    op: OpType,
    src: Slot | None,
    dst: Slot | None,
    count: int,
    reads: list[tuple[str, int]],
    writes: list[tuple[str, int]],
) -> None:
    """Append a step to ``tb_id`` with the dependencies its reads and writes need."""
    last_writer, readers = state.last_writer, state.readers
    needed: dict[int, int] = {}
    for slot in reads + writes:
        writer = last_writer.get(slot)
        if writer is not None and needed.get(writer[0], -1) < writer[1]:
            needed[writer[0]] = writer[1]
    for slot in writes:
        for tb, index in readers.get(slot, ()):
            if needed.get(tb, -1) < index:
                needed[tb] = index
    needed.pop(tb_id, None)  # program order already covers the threadblock's own earlier steps
    steps = state.steps[tb_id]
    here = (tb_id, len(steps))
    steps.append(
        Step(
            op,
            src[0] if src else None,
            src[1] if src else 0,
            dst[0] if dst else None,
            dst[1] if dst else 0,
            count,
            tuple(sorted(needed.items())),
        )
    )
    for slot in reads:  # few readers between two writes (a tree's fan-out): a tuple is cheapest
        readers[slot] = readers.get(slot, ()) + (here,)
    for slot in writes:
        last_writer[slot] = here
        readers.pop(slot, None)  # a write orders every later access after the reads before it
    for slot in (src, dst):
        if slot is not None and slot[0] is Buffer.SCRATCH and state.scratch_used < slot[1] + count:
            state.scratch_used = slot[1] + count


def _lower_item(states: Sequence[_RankState], item: Transfer | LocalCopy) -> None:
    if isinstance(item, LocalCopy):
        state = states[item.rank]
        tb_id = state.threadblock(("local", item.channel), None, None, item.channel)
        reads, writes = _slots(item.src, item.count), _slots(item.dst, item.count)
        op = OpType.REDUCE if item.reduce else OpType.COPY
        _append_step(state, tb_id, op, item.src, item.dst, item.count, reads + (writes if item.reduce else []), writes)
        return
    sender, receiver = states[item.src_rank], states[item.dst_rank]
    send_tb = sender.threadblock(("send", item.dst_rank, item.channel), item.dst_rank, None, item.channel)
    _append_step(sender, send_tb, OpType.SEND, item.src, None, item.count, _slots(item.src, item.count), [])
    recv_tb = receiver.threadblock(("recv", item.src_rank, item.channel), None, item.src_rank, item.channel)
    dst_slots = _slots(item.dst, item.count)
    if item.reduce:
        _append_step(receiver, recv_tb, OpType.RECV_REDUCE_COPY, item.dst, item.dst, item.count, dst_slots, dst_slots)
    else:
        _append_step(receiver, recv_tb, OpType.RECV, None, item.dst, item.count, [], dst_slots)


def spread_long_connections(
    items: Sequence[Transfer | LocalCopy], max_transfers: int = MAX_TRANSFERS_PER_THREADBLOCK
) -> tuple[list[Transfer | LocalCopy], frozenset[tuple[int, int, int]]]:
    """Return ``items`` with at most ``max_transfers`` transfers per (src rank, dst rank, channel), and the busier ones.

    Each such connection is a threadblock at both ends, and MSCCL runs at most 64 steps in one.
    The k-th run of ``max_transfers`` transfers of a busier connection moves to channel
    ``channel + k * stride``, ``stride`` one more than the highest channel of ``items``, so a
    moved transfer shares its threadblocks with no other connection; both ends move together and
    the items keep their order.
    """
    transfers = [item for item in items if isinstance(item, Transfer)]
    counts = Counter((item.src_rank, item.dst_rank, item.channel) for item in transfers)
    busy = frozenset(key for key, count in counts.items() if count > max_transfers)
    if not busy:
        return list(items), busy
    stride = 1 + max(item.channel for item in transfers)
    seen: Counter[tuple[int, int, int]] = Counter()
    out: list[Transfer | LocalCopy] = []
    for item in items:
        key = (item.src_rank, item.dst_rank, item.channel) if isinstance(item, Transfer) else None
        if key not in busy:
            out.append(item)
            continue
        block = seen[key] // max_transfers
        seen[key] += 1
        out.append(replace(item, channel=item.channel + block * stride) if block else item)
    return out, busy


def lower_plan(
    name: str,
    collective: Collective,
    num_ranks: int,
    chunks_per_loop: int,
    items: Iterable[Transfer | LocalCopy],
    *,
    inplace: bool = False,
    metadata: Iterable[tuple[str, str]] = (),
) -> Algorithm:
    """Return the ``Algorithm`` that performs ``items`` in order, with hazard dependencies.

    Scratch buffers are sized to the highest scratch chunk the items touch. Raises
    ``ArgumentError`` for a rank outside ``0..num_ranks-1`` or a transfer from a rank to itself.

    Examples
    --------
    >>> plan = [Transfer(0, 1, (Buffer.INPUT, 0), (Buffer.OUTPUT, 0)),
    ...         Transfer(1, 0, (Buffer.INPUT, 0), (Buffer.OUTPUT, 1)),
    ...         LocalCopy(0, (Buffer.INPUT, 0), (Buffer.OUTPUT, 0)),
    ...         LocalCopy(1, (Buffer.INPUT, 0), (Buffer.OUTPUT, 1))]
    >>> algo = lower_plan("ag2", Collective.ALLGATHER, 2, 2, plan)
    >>> [len(p.threadblocks) for p in algo.ranks]
    [3, 3]
    """
    layout = chunk_layout(collective, num_ranks, chunks_per_loop)
    states = [_RankState(rank) for rank in range(num_ranks)]
    for item in items:
        ranks = (item.rank,) if isinstance(item, LocalCopy) else (item.src_rank, item.dst_rank)
        if any(not 0 <= r < num_ranks for r in ranks):
            raise ArgumentError(name, "plan", f"rank in {item} outside 0..{num_ranks - 1}", "ranks of the collective")
        if isinstance(item, Transfer) and item.src_rank == item.dst_rank:
            raise ArgumentError(name, "plan", f"transfer from rank {item.src_rank} to itself", "a LocalCopy")
        _lower_item(states, item)
    in_chunks = 0 if inplace and collective is Collective.ALLGATHER else layout.input_chunks
    out_chunks = 0 if inplace and collective is not Collective.ALLGATHER else layout.output_chunks
    programs = tuple(
        RankProgram(
            state.rank,
            tuple(
                Threadblock(tb_id, tuple(state.steps[tb_id]), *state.tb_peers[tb_id]) for tb_id in sorted(state.steps)
            ),
            in_chunks,
            out_chunks,
            state.scratch_used,
        )
        for state in states
    )
    return Algorithm(
        name, collective, num_ranks, chunks_per_loop, programs, inplace=inplace, metadata=tuple(sorted(metadata))
    )
