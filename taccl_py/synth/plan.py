"""Turn a timed schedule into ``lowering`` items and an ``Algorithm``, for each collective.

Indexing: ``chunkup`` chunks per rank, each cut into ``pieces`` pieces; piece ``j`` of chunk
``c`` (which starts on rank ``c // chunkup``) is buffer chunk ``g = c * pieces + j`` of the
collective, and ``chunks_per_loop = ranks * chunkup * pieces``.

* AllGather: the root sends its piece from its input (index ``g - root * per_rank``), every
  receiver stores it at output ``g``, forwarders send from there; each root copies its input to
  its output slots locally.
* ReduceScatter: the schedule is an AllGather on the reversed logical graph; run backwards in
  time, a send u -> v of piece g becomes a reduction v -> u. A leaf of g's tree sends its input
  chunk g; an inner rank first copies input g to scratch g, adds what its children send, and
  sends the sum on; the root (the owner of column g) accumulates in its output slot.
* AllReduce: that ReduceScatter, accumulating in the output buffer (output g on every rank),
  followed by the AllGather of the reduced pieces from their owners' output slots.

Items are emitted in start order, which is causal (a piece leaves a rank only after it arrived).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from taccl_py.algorithm import Algorithm, Buffer
from taccl_py.collectives import Collective
from taccl_py.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.synth.scheduling import Schedule

__all__ = ["allgather_items", "reducescatter_items", "allreduce_items", "lower_schedule"]

Item = Transfer | LocalCopy


def _per_rank(schedule: Schedule) -> int:
    return schedule.routing.chunkup * schedule.ordering.pieces


def _groups_by_start(schedule: Schedule) -> list[tuple[int, ...]]:
    """Return the send groups in the order they start (ties: the one that ends first)."""
    return sorted(schedule.groups, key=lambda g: (schedule.start_us[g[0]], schedule.end_us[g[0]], g[0]))


def allgather_items(schedule: Schedule, *, output_only: bool = False) -> list[Item]:
    """Return the AllGather items of ``schedule`` (``output_only``: roots send from their output)."""
    routing, pieces = schedule.routing, schedule.ordering.pieces
    graph, per_rank = routing.graph, _per_rank(schedule)
    items: list[Item] = []
    if not output_only:
        items.extend(LocalCopy(r, (Buffer.INPUT, 0), (Buffer.OUTPUT, r * per_rank), per_rank) for r in range(graph.num_ranks))
    for group in _groups_by_start(schedule):
        first = schedule.ordering.sends[group[0]]
        link = graph.links[first.link]
        g = first.chunk * pieces + first.piece
        root = routing.root(first.chunk)
        src = (Buffer.INPUT, g - root * per_rank) if link.src == root and not output_only else (Buffer.OUTPUT, g)
        items.append(Transfer(link.src, link.dst, src, (Buffer.OUTPUT, g), len(group)))
    return items


def _reduction_items(schedule: Schedule, accumulate: Buffer, output_at_root: bool) -> list[Item]:
    """Return the reduction items: the reversed-graph AllGather schedule run backwards in time."""
    routing, pieces = schedule.routing, schedule.ordering.pieces
    graph, per_rank = routing.graph, _per_rank(schedule)
    inner = {(c, graph.links[l].src) for c, tree in enumerate(routing.trees) for l in tree}
    copies: list[Item] = []
    for c, tree in enumerate(routing.trees):
        root = routing.root(c)
        for v in {root} | {graph.links[l].src for l in tree}:
            dst = (Buffer.OUTPUT, c * pieces - root * per_rank) if v == root and output_at_root else (accumulate, c * pieces)
            copies.append(LocalCopy(v, (Buffer.INPUT, c * pieces), dst, pieces))
    transfers: list[Item] = []
    for group in sorted(schedule.groups, key=lambda g: (-schedule.end_us[g[0]], -schedule.start_us[g[0]], g[0])):
        first = schedule.ordering.sends[group[0]]
        link = graph.links[first.link]  # reversed graph: the reduction goes link.dst -> link.src
        g = first.chunk * pieces + first.piece
        root = routing.root(first.chunk)
        src = (accumulate, g) if (first.chunk, link.dst) in inner else (Buffer.INPUT, g)
        dst = (Buffer.OUTPUT, g - root * per_rank) if link.src == root and output_at_root else (accumulate, g)
        transfers.append(Transfer(link.dst, link.src, src, dst, len(group), reduce=True))
    return copies + transfers


def reducescatter_items(schedule: Schedule) -> list[Item]:
    """Return the ReduceScatter items of a reversed-graph AllGather ``schedule``."""
    return _reduction_items(schedule, Buffer.SCRATCH, output_at_root=True)


def allreduce_items(reduce_schedule: Schedule, gather_schedule: Schedule) -> list[Item]:
    """Return AllReduce items: the reduction (in the output buffer), then the AllGather."""
    return _reduction_items(reduce_schedule, Buffer.OUTPUT, output_at_root=False) + allgather_items(gather_schedule, output_only=True)


def lower_schedule(
    name: str,
    collective: Collective,
    schedules: Sequence[Schedule],
    metadata: Iterable[tuple[str, str]] = (),
) -> Algorithm:
    """Return the ``Algorithm`` of ``schedules`` (one for AllGather/ReduceScatter; reduce + gather for AllReduce)."""
    first = schedules[0]
    num_ranks = first.routing.graph.num_ranks
    chunks = num_ranks * _per_rank(first)
    if collective is Collective.ALLGATHER:
        items = allgather_items(first)
    elif collective is Collective.REDUCESCATTER:
        items = reducescatter_items(first)
    else:
        items = allreduce_items(first, schedules[1])
    return lower_plan(name, collective, num_ranks, chunks, items, metadata=metadata)
