"""Turn a timed schedule into ``lowering`` items and an ``Algorithm``, for each collective.

Indexing: ``chunkup`` chunks per rank, each cut into ``pieces`` pieces; piece ``j`` of chunk
``c`` (which starts on rank ``c // chunkup``) is buffer chunk ``g = c * pieces + j`` of the
collective, and ``chunks_per_loop = ranks * chunkup * pieces``.

* AllGather: the root sends its piece from its input (index ``g - root * per_rank``), every
  receiver stores it at output ``g``, forwarders send from there; each root copies its input to
  its output slots locally.
* ReduceScatter: the schedule is an AllGather on the reversed logical graph; run backwards in
  time, a send u -> v of piece g becomes a reduction v -> u. Every rank first copies its whole
  input to scratch (its own column to its output); a rank adds what its children in g's tree
  send into scratch g and sends the sum on; the root (the owner of column g) accumulates in
  its output slot.
* AllReduce: that ReduceScatter, accumulating in the output buffer (output g on every rank),
  followed by the AllGather of the reduced pieces from their owners' output slots. The two
  phases may cut a rank's data differently (``chunkup * pieces`` of each): the buffer is then
  cut into the least common multiple of both, and a piece of a phase is ``width`` consecutive
  buffer chunks (rank r's pieces fill chunks ``[r * L, (r + 1) * L)`` in both phases).

A merged group (several pieces as one transfer, ``taccl_py.stages.scheduling``) whose pieces are
contiguous in both buffers is one step; otherwise it is staged: the sender copies the pieces to
consecutive scratch chunks, one transfer moves them, and the receiver copies (or, reducing,
adds) them out. Copies cost nothing in the α-β model and little beside a network transfer.

Items are emitted in time order (copies out at the arrival time, before the sends that forward
their data), which is causal. The simulator (and the hardware) share a link between
concurrently running threadblocks, while the schedule queues a rank's sends that start on one
physical link (an NVSwitch port, the uplink to a NIC) on a few channels in a chosen order
(``taccl_py.stages.ordering.send_lane``); ``lower_schedule`` keeps that order by making each such
send depend on the previous send of its queue and channel. A (src, dst, channel) with more
transfers than an MSCCL threadblock may hold spills to further channels, chained the same way.
An AllReduce lowered with ``phase_barrier`` also holds each rank's first gather send per
threadblock until every reduce step of that rank is done. These dependencies point from earlier
items to later ones, so they cannot create a deadlock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from taccl_py.ir.algorithm import Algorithm, Buffer, Step
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import MAX_TRANSFERS_PER_THREADBLOCK, LocalCopy, Transfer, lower_plan, spread_long_connections
from taccl_py.stages.scheduling import Schedule

__all__ = ["TimedItem", "lower_schedule", "busiest_threadblocks"]

Item = Transfer | LocalCopy
Slot = tuple[Buffer, int]
# Order of items at equal times: copies out of a landing area (or adds, reducing), then copies
# into a staging area, then the transfers that read what they wrote.
_UNSTAGE_ORDER, _COPY_ORDER, _TRANSFER_ORDER = 0, 1, 2


@dataclass(frozen=True, slots=True)
class TimedItem:
    """A lowering item, the time (µs) it happens in the schedule, and the queue it is chained in."""

    time_us: float
    order: int
    item: Item
    serial: tuple = ()


@dataclass
class _Scratch:
    """Next free scratch chunk per rank (staging areas are never reused)."""

    next_free: dict[int, int]

    def take(self, rank: int, count: int) -> int:
        base = self.next_free.get(rank, 0)
        self.next_free[rank] = base + count
        return base


def _per_rank(schedule: Schedule) -> int:
    return schedule.routing.chunkup * schedule.ordering.pieces


def _serial_key(schedule: Schedule, send_index: int) -> tuple:
    """Return the queue a send is chained in, or () for a link of its own."""
    lane = schedule.ordering.sends[send_index].lane
    return (lane,) if lane and lane[0] == "hop" else ()


def _contiguous(slots: Sequence[Slot], width: int) -> bool:
    return all(s[0] == slots[0][0] and s[1] == slots[0][1] + i * width for i, s in enumerate(slots))


def _runs(first: Sequence[Slot], second: Sequence[Slot], width: int) -> list[tuple[Slot, Slot, int]]:
    """Return (first slot, second slot, buffer chunks) for the maximal runs contiguous in both lists."""
    runs: list[tuple[Slot, Slot, int]] = []
    for a, b in zip(first, second):
        if runs:
            ra, rb, n = runs[-1]
            if a == (ra[0], ra[1] + n) and b == (rb[0], rb[1] + n):
                runs[-1] = (ra, rb, n + width)
                continue
        runs.append((a, b, width))
    return runs


def _group_items(
    ranks: tuple[int, int, int],
    srcs: Sequence[Slot],
    dsts: Sequence[Slot],
    reduce: bool,
    times: tuple[float, float],
    serial: tuple,
    scratch: _Scratch,
    width: int,
) -> list[TimedItem]:
    """Return the items moving ``srcs`` to ``dsts`` as one transfer over (src rank, dst rank, channel).

    Each slot is the first of ``width`` buffer chunks. A side whose slots are not contiguous goes
    through consecutive scratch chunks, copied in as few runs as possible.
    """
    src_rank, dst_rank, channel = ranks
    start, end = times
    m = len(srcs) * width
    items = []
    send_from, land_at = srcs[0], dsts[0]
    if not _contiguous(srcs, width):
        send_from = (Buffer.SCRATCH, scratch.take(src_rank, m))
        staged = [(Buffer.SCRATCH, send_from[1] + i * width) for i in range(len(srcs))]
        items.extend(
            TimedItem(start, _COPY_ORDER, LocalCopy(src_rank, a, b, n)) for a, b, n in _runs(srcs, staged, width)
        )
    if not _contiguous(dsts, width):
        land_at = (Buffer.SCRATCH, scratch.take(dst_rank, m))
        landed = [(Buffer.SCRATCH, land_at[1] + i * width) for i in range(len(dsts))]
        items.extend(
            TimedItem(end, _UNSTAGE_ORDER, LocalCopy(dst_rank, a, b, n, reduce=reduce))
            for a, b, n in _runs(landed, dsts, width)
        )
    reduce_on_arrival = reduce and land_at == dsts[0]
    items.append(
        TimedItem(
            start,
            _TRANSFER_ORDER,
            Transfer(src_rank, dst_rank, send_from, land_at, m, reduce_on_arrival, channel),
            serial,
        )
    )
    return items


def allgather_items(
    schedule: Schedule, scratch: _Scratch, *, output_only: bool = False, offset_us: float = 0.0, width: int = 1
) -> list[TimedItem]:
    """Return the AllGather items of ``schedule`` (``output_only``: roots send from their output).

    A piece is ``width`` buffer chunks.
    """
    routing, pieces, sends = schedule.routing, schedule.ordering.pieces, schedule.ordering.sends
    graph, per_rank = routing.graph, _per_rank(schedule)
    items: list[TimedItem] = []
    if not output_only:
        own = per_rank * width
        items.extend(
            TimedItem(0.0, _COPY_ORDER, LocalCopy(r, (Buffer.INPUT, 0), (Buffer.OUTPUT, r * own), own))
            for r in range(graph.num_ranks)
        )
    for group in schedule.groups:
        link = graph.links[sends[group[0]].link]
        srcs, dsts = [], []
        for i in group:
            g = sends[i].chunk * pieces + sends[i].piece
            root = routing.root(sends[i].chunk)
            from_input = link.src == root and not output_only
            srcs.append((Buffer.INPUT, (g - root * per_rank) * width) if from_input else (Buffer.OUTPUT, g * width))
            dsts.append((Buffer.OUTPUT, g * width))
        times = (offset_us + schedule.start_us[group[0]], offset_us + schedule.end_us[group[0]])
        ranks = (link.src, link.dst, 0)
        serial = _serial_key(schedule, group[0])
        items.extend(_group_items(ranks, srcs, dsts, False, times, serial, scratch, width))
    return items


def reduction_items(
    schedule: Schedule, scratch: _Scratch, accumulate: Buffer, output_at_root: bool, width: int = 1
) -> list[TimedItem]:
    """Return the reduction items: the reversed-graph AllGather ``schedule`` run backwards in time.

    Inner ranks accumulate in ``accumulate`` (scratch for ReduceScatter, output for AllReduce);
    with ``output_at_root`` a column's owner accumulates in its output slot. A piece is
    ``width`` buffer chunks.
    """
    routing, pieces, sends = schedule.routing, schedule.ordering.pieces, schedule.ordering.sends
    graph, horizon = routing.graph, schedule.makespan_us
    per_rank = _per_rank(schedule) * width  # buffer chunks per rank
    chunks = graph.num_ranks * per_rank

    def home(c: int, v: int, g: int) -> Slot:
        root = routing.root(c)
        if v == root and output_at_root:
            return (Buffer.OUTPUT, g * width - root * per_rank)
        return (accumulate, g * width)

    # Every rank starts its partial sums from its whole input (one copy; the owner's own
    # column goes to its output): leaves send it, inner ranks add their children's into it.
    items = [
        TimedItem(0.0, _COPY_ORDER, LocalCopy(v, (Buffer.INPUT, 0), (accumulate, 0), chunks))
        for v in range(graph.num_ranks)
    ]
    if output_at_root:
        items.extend(
            TimedItem(0.0, _COPY_ORDER, LocalCopy(v, (Buffer.INPUT, v * per_rank), (Buffer.OUTPUT, 0), per_rank))
            for v in range(graph.num_ranks)
        )
    for group in schedule.groups:
        link = graph.links[sends[group[0]].link]  # reversed graph: the data goes link.dst -> link.src
        srcs, dsts = [], []
        for i in group:
            c = sends[i].chunk
            g = c * pieces + sends[i].piece
            srcs.append(home(c, link.dst, g))
            dsts.append(home(c, link.src, g))
        times = (horizon - schedule.end_us[group[0]], horizon - schedule.start_us[group[0]])
        ranks = (link.dst, link.src, 0)
        serial = _serial_key(schedule, group[0])
        items.extend(_group_items(ranks, srcs, dsts, True, times, serial, scratch, width))
    return items


def _sorted(items: Iterable[TimedItem]) -> list[TimedItem]:
    return sorted(items, key=lambda t: (t.time_us, t.order))


def lower_schedule(
    name: str,
    collective: Collective,
    schedules: Sequence[Schedule],
    metadata: Iterable[tuple[str, str]] = (),
    phase_barrier: bool = False,
) -> Algorithm:
    """Return the ``Algorithm`` of ``schedules`` (one for AllGather/ReduceScatter; reduce + gather for AllReduce).

    AllReduce's two schedules may cut the data differently (see the module's indexing). With
    ``phase_barrier`` a rank starts gathering only when its reduce sends are done, so gather
    traffic does not share links with the reduction still under way, as the schedules assume.
    """
    first = schedules[0]
    num_ranks = first.routing.graph.num_ranks
    per_rank = math.lcm(*(_per_rank(s) for s in schedules))
    widths = [per_rank // _per_rank(s) for s in schedules]
    chunks = num_ranks * per_rank
    # Reduction accumulators of ReduceScatter live in scratch [0, chunks); staging areas follow.
    scratch = _Scratch({r: chunks if collective is Collective.REDUCESCATTER else 0 for r in range(num_ranks)})
    if collective is Collective.ALLGATHER:
        items = _sorted(allgather_items(first, scratch))
    elif collective is Collective.REDUCESCATTER:
        items = _sorted(reduction_items(first, scratch, Buffer.SCRATCH, output_at_root=True))
    else:
        reduce = _sorted(reduction_items(first, scratch, Buffer.OUTPUT, output_at_root=False, width=widths[0]))
        gather = allgather_items(schedules[1], scratch, output_only=True, offset_us=first.makespan_us, width=widths[1])
        items = reduce + _sorted(gather)
    barrier_at = len(reduce) if collective is Collective.ALLREDUCE and phase_barrier else None
    items = _split_long_threadblocks(items)
    algorithm = lower_plan(name, collective, num_ranks, chunks, [t.item for t in items], metadata=metadata)
    return _serialize_sends(algorithm, items, barrier_at)


def busiest_threadblocks(schedule: Schedule) -> int:
    """Return the threadblocks of the busiest GPU once ``schedule`` is lowered alone, counted without lowering it.

    ``lower_plan`` gives a GPU one threadblock for its local copies (every rank copies its input
    first) and one per peer it sends to or receives from, each merged group one transfer;
    ``spread_long_connections`` adds one per further ``MAX_TRANSFERS_PER_THREADBLOCK`` transfers.
    """
    links, sends = schedule.routing.graph.links, schedule.ordering.sends
    transfers: Counter[tuple[int, int]] = Counter()
    for group in schedule.groups:
        link = links[sends[group[0]].link]
        transfers[link.src, link.dst] += 1
    per_rank: Counter[int] = Counter()
    for (src, dst), count in transfers.items():
        threadblocks = -(-count // MAX_TRANSFERS_PER_THREADBLOCK)
        per_rank[src] += threadblocks
        per_rank[dst] += threadblocks
    return 1 + max(per_rank.values(), default=0)


def _split_long_threadblocks(items: list[TimedItem]) -> list[TimedItem]:
    """Return ``items`` with the transfers of a busy (src, dst, channel) spread over more channels.

    ``spread_long_connections`` moves the k-th block of ``MAX_TRANSFERS_PER_THREADBLOCK``
    transfers to another channel; each block's first transfer is then chained to the previous
    block's last one, so the transfers still run one after the other, as scheduled.
    """
    spread, busy = spread_long_connections([t.item for t in items], MAX_TRANSFERS_PER_THREADBLOCK)
    if not busy:
        return items
    out = []
    for timed, item in zip(items, spread, strict=True):
        key = (item.src_rank, item.dst_rank, timed.item.channel) if isinstance(item, Transfer) else None
        out.append(replace(timed, item=item, serial=timed.serial + (("tb",) + key,)) if key in busy else timed)
    return out


def _serialize_sends(algorithm: Algorithm, items: Sequence[TimedItem], barrier_at: int | None = None) -> Algorithm:
    """Return ``algorithm`` with each chained send depending on the previous send of its queue and channel.

    With ``barrier_at`` (the index of an AllReduce's first gather item), a rank's first gather
    send in each threadblock also waits for the last reduce step of every threadblock of that rank.
    """
    positions = _step_positions(algorithm, items)
    last: dict[tuple, tuple[int, int]] = {}
    extra: dict[tuple[int, int, int], set[tuple[int, int]]] = {}
    for timed, steps in zip(items, positions):
        if not isinstance(timed.item, Transfer):
            continue
        rank, tb_id, index = steps[0]
        for key in timed.serial:
            before = last.get((rank, key))  # dependencies stay on the sending rank
            if before is not None and before[0] != tb_id:
                extra.setdefault((rank, tb_id, index), set()).add(before)
            last[(rank, key)] = (tb_id, index)
    if barrier_at is not None:
        for step, waits in _phase_barrier(items, positions, barrier_at).items():
            extra.setdefault(step, set()).update(waits)
    if not extra:
        return algorithm
    by_tb: dict[tuple[int, int], dict[int, set[tuple[int, int]]]] = {}
    for (rank, tb_id, index), more in extra.items():
        by_tb.setdefault((rank, tb_id), {})[index] = more
    ranks = []
    for prog in algorithm.ranks:
        tbs = []
        for tb in prog.threadblocks:
            more = by_tb.get((prog.rank, tb.id))
            if more is not None:  # only the threadblocks that gain dependencies are rebuilt
                tb = replace(tb, steps=tuple(_with_depends(step, more.get(i)) for i, step in enumerate(tb.steps)))
            tbs.append(tb)
        ranks.append(replace(prog, threadblocks=tuple(tbs)))
    return replace(algorithm, ranks=tuple(ranks))


def _step_positions(algorithm: Algorithm, items: Sequence[TimedItem]) -> list[tuple[tuple[int, int, int], ...]]:
    """Return, per item, the (rank, threadblock, step) of its steps: a transfer's send and receive, a copy's copy.

    ``lower_plan`` gives each item one step per side in that rank's threadblock for the peer
    and channel (copies: the rank's local threadblock), in item order, so counting finds them.
    """
    tb_of = {
        (prog.rank, tb.send_peer, tb.recv_peer, tb.channel): tb.id
        for prog in algorithm.ranks
        for tb in prog.threadblocks
    }
    count: dict[tuple, int] = {}

    def next_step(key: tuple) -> tuple[int, int, int]:
        index = count.get(key, 0)
        count[key] = index + 1
        return (key[0], tb_of[key], index)

    out = []
    for timed in items:
        item = timed.item
        if isinstance(item, Transfer):
            send = next_step((item.src_rank, item.dst_rank, None, item.channel))
            out.append((send, next_step((item.dst_rank, None, item.src_rank, item.channel))))
        else:
            out.append((next_step((item.rank, None, None, 0)),))
    return out


def _phase_barrier(
    items: Sequence[TimedItem], positions: Sequence[tuple[tuple[int, int, int], ...]], barrier_at: int
) -> dict[tuple[int, int, int], set[tuple[int, int]]]:
    """Return the waits that hold a rank's first gather send per threadblock until its reduce steps are done."""
    last_reduce: dict[int, dict[int, int]] = {}  # rank -> threadblock -> its last reduce step
    for steps in positions[:barrier_at]:
        for rank, tb_id, index in steps:
            last_reduce.setdefault(rank, {})[tb_id] = index
    waits: dict[tuple[int, int, int], set[tuple[int, int]]] = {}
    started: set[tuple[int, int]] = set()
    for timed, steps in zip(items[barrier_at:], positions[barrier_at:]):
        rank, tb_id, index = steps[0]
        if not isinstance(timed.item, Transfer) or (rank, tb_id) in started:
            continue
        started.add((rank, tb_id))
        before = {(tb, last) for tb, last in last_reduce.get(rank, {}).items() if tb != tb_id}
        if before:
            waits[(rank, tb_id, index)] = before
    return waits


def _with_depends(step: Step, more: set[tuple[int, int]] | None) -> Step:
    if not more:
        return step
    merged: dict[int, int] = dict(step.depends)
    for tb, index in more:
        merged[tb] = max(merged.get(tb, -1), index)
    return replace(step, depends=tuple(sorted(merged.items())))
