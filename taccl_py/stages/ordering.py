"""Ordering, TACCL's second stage: the order of chunk transfers on every link, by a greedy heuristic.

Every routed chunk is cut into ``pieces`` pieces that follow the chunk's tree (pipelining); a
*send* is one piece crossing one logical link. The heuristic is list scheduling under the model
the simulator uses (``taccl_py.simulate.engine``): a logical link is one threadblock, which runs
its sends one after the other, each paying the link's α and then moving its bytes; the bytes
load every physical resource of the route (NVSwitch ports, PCIe links, NIC), each of which
serves its work in order at its own bandwidth (port serialisation on switches;
``occupy_resources``).

Sends of one rank whose routes start on the same physical link wait in one queue
(``send_lane``) served one send at a time, so the NIC carries them in the schedule's order.
Whenever a queue can start its next send, it takes, among the pieces already at its source, the
one with the longest remaining path below the link's far end (TACCL's rule), earlier pieces
first on ties. On a latency-bound link (α above a piece's transfer time) the other pieces
already waiting for the same link travel with it as one transfer. Queues are served in order
of their earliest possible start, so no resource idles while a send could use it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from taccl_py.progress import ProgressTicker
from taccl_py.stages.logical import LogicalGraph, LogicalLink, Resource
from taccl_py.stages.routing import Routing, chunk_symmetry
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "Send",
    "Ordering",
    "order_sends",
    "remaining_path_us",
    "occupy_resources",
    "lane_free_us",
    "is_slow_link",
    "lacks_machine_rotation",
    "send_lane",
]

logger = logging.getLogger(__name__)

_EPS_US = 1e-9
# Most pieces one transfer of a latency-bound link carries (MSCCL allows at most 71 per step).
MAX_BATCH = 64


@dataclass(frozen=True, slots=True)
class Send:
    """Piece ``piece`` of chunk ``chunk`` crossing logical link ``link`` from ``start_us`` to ``end_us``.

    ``parent`` is the index of the send that brought the piece to the link's source (None at
    the chunk's root); ``lane`` the queue it waited in (``send_lane``); ``batch``
    the index of the first send of the transfer it travels in (several ready pieces of a
    latency-bound link leave together).
    """

    chunk: int
    piece: int
    link: int
    start_us: float
    end_us: float
    parent: int | None
    lane: tuple = ()
    batch: int | None = None


@dataclass(frozen=True)
class Ordering:
    """Sends in start order, with the piece size (bytes) they were timed for and the send model.

    ``pipelined``: timed with pipelined sends (a lane's next send starts when the bytes of the
    previous have left, not when they have arrived; ``taccl_py.simulate.model``);
    ``pipelined_internode``: only the sends between machines were (the ``msccl-net`` model).
    """

    routing: Routing
    pieces: int
    piece_bytes: float
    sends: tuple[Send, ...]
    pipelined: bool = False
    pipelined_internode: bool = False

    def pipelines(self, link: LogicalLink) -> bool:
        """Return True when sends on ``link`` were timed as pipelined."""
        return times_pipelined(link, self.pipelined, self.pipelined_internode)

    @property
    def makespan_us(self) -> float:
        """Return when the last piece arrives (µs)."""
        return max((s.end_us for s in self.sends), default=0.0)


def lacks_machine_rotation(graph: LogicalGraph) -> bool:
    """Return True for a graph of several machines whose rotations do not move each machine onto the next."""
    return graph.num_ranks > graph.gpus_per_node and (graph.gpus_per_node, graph.num_ranks) not in graph.rotations


def is_slow_link(link: LogicalLink, piece_bytes: float) -> bool:
    """Return True for a link across machines, or one whose α exceeds a piece's transfer time."""
    return link.internode or link.alpha_us >= piece_bytes / (link.bandwidth_GBps * BYTES_PER_US_PER_GBPS)


def send_lane(graph: LogicalGraph, link: int) -> tuple:
    """Return the key of the queue a link's sends wait in.

    A rank's links to other machines whose routes start on the same physical link (the uplink
    toward its NIC) share one queue: the plan chains their sends (``taccl_py.stages.lower_schedule``) so
    that the NIC carries them one at a time in the schedule's order instead
    of all at once at a fraction of its bandwidth each. Every other link is its own queue, one
    threadblock: chaining a switch port's sends to different peers would let one congested
    peer block the port.
    """
    return _lanes(graph)[link]


def _lanes(graph: LogicalGraph, chain_hops: bool = True) -> tuple[tuple, ...]:
    # On a reversed graph (a reduction run backwards) the physical sender is the link's far end;
    # its resources keep the physical order, so resources[0] is that sender's uplink.
    return tuple(
        ("hop", link.dst if graph.reversed else link.src, link.resources[0])
        if chain_hops and link.internode
        else ("link", l)
        for l, link in enumerate(graph.links)
    )


def remaining_path_us(graph: LogicalGraph, tree: tuple[int, ...], piece_bytes: float) -> dict[int, float]:
    """Return, per rank, the longest path (µs) below it in ``tree`` for one piece."""
    below: dict[int, float] = {}
    for l in reversed(tree):
        link = graph.links[l]
        below[link.src] = max(below.get(link.src, 0.0), link.time_us(piece_bytes) + below.get(link.dst, 0.0))
    return below


_Item = tuple[float, tuple, int, int, int, int]  # (ready, priority key, piece, chunk, link, parent send or -1)


@dataclass
class _Queue:
    """Sends waiting for one lane: not yet ready (heap by ready time) and ready (heap by priority)."""

    free: float
    future: list[_Item] = field(default_factory=list)
    ready: list[tuple[float, int, int, int, int, float]] = field(default_factory=list)

    def push(self, item: _Item) -> None:
        heapq.heappush(self.future, item)

    def earliest(self) -> float | None:
        """Return when the lane can start its next send (µs), None when nothing waits."""
        if self.ready:  # moved there when they were ready at a start no later than now
            return self.free
        if self.future:
            return max(self.free, self.future[0][0])
        return None

    def pop(self, start: float) -> _Item:
        """Return the highest-priority send ready at ``start``."""
        while self.future and self.future[0][0] <= start + _EPS_US:
            ready, *rest = heapq.heappop(self.future)
            heapq.heappush(self.ready, (*rest, ready))
        *rest, ready = heapq.heappop(self.ready)
        return (ready, *rest)

    def pop_busiest(self, start: float, work_left: Callable[[int], float]) -> _Item:
        """Return the ready send whose link's busiest resource has the most work left (``work_left``, µs).

        Ties go by priority; a linear scan, as the work left changes with every send placed.
        """
        while self.future and self.future[0][0] <= start + _EPS_US:
            ready, *rest = heapq.heappop(self.future)
            heapq.heappush(self.ready, (*rest, ready))
        best = min(range(len(self.ready)), key=lambda i: (-work_left(self.ready[i][3]), self.ready[i]))
        self.ready[best], self.ready[-1] = self.ready[-1], self.ready[best]
        *rest, ready = self.ready.pop()
        heapq.heapify(self.ready)
        return (ready, *rest)

    def pop_same_link(self, link: int, limit: int) -> list[_Item]:
        """Return up to ``limit`` more ready sends of ``link``, by priority (they join a batch)."""
        taken, kept = [], []
        while self.ready and len(taken) < limit:
            entry = heapq.heappop(self.ready)
            (taken if entry[3] == link else kept).append(entry)
        for entry in kept:
            heapq.heappush(self.ready, entry)
        return [(entry[-1], *entry[:-1]) for entry in taken]


@dataclass
class _State:
    """Mutable bookkeeping of the list scheduler (local to one ``order_sends`` call)."""

    queues: dict[tuple, _Queue]
    res_free: dict[Resource, float]
    sends: list[Send]
    pipelined: bool = False
    pipelined_internode: bool = False


def times_pipelined(link: LogicalLink, pipelined: bool, pipelined_internode: bool) -> bool:
    """Return True when a send on ``link`` is timed as pipelined: every send, or (internode) those between machines."""
    return pipelined or (pipelined_internode and link.internode)


def occupy_resources(
    link: LogicalLink, start_us: float, size_bytes: float, res_free: dict[Resource, float], pipelined: bool = False
) -> float:
    """Return when a send of ``size_bytes`` started at ``start_us`` on ``link`` is delivered (µs).

    Each resource is a queue of work at its own bandwidth: the send's bytes join every queue of
    its route after α and are delivered when the last queue has served them (never sooner than
    α plus the bytes at the bottleneck). ``res_free`` (resource -> µs its queue drains) is
    updated. Unlike a strict reservation of all resources at once, this keeps every resource
    busy while it has work, as the simulator's fluid sharing does. ``pipelined``: the bytes
    join the queues at once and arrive α after the last queue served them (the simulator's
    pipelined sends), so the sender's lane is free α before the delivery.
    """
    alpha_us = link.alpha_us
    bytes_start = start_us if pipelined else start_us + alpha_us
    end = bytes_start + size_bytes / (link.bandwidth_GBps * BYTES_PER_US_PER_GBPS)
    for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
        free = res_free.get(res, 0.0)
        done = (bytes_start if bytes_start > free else free) + size_bytes / (bw * BYTES_PER_US_PER_GBPS)
        res_free[res] = done
        if done > end:
            end = done
    return end + alpha_us if pipelined else end


def lane_free_us(link: LogicalLink, delivered_us: float, pipelined: bool) -> float:
    """Return when a lane may start its next send (µs) after one on ``link`` delivered at ``delivered_us``.

    Serialized, when the bytes arrive; pipelined, when they have left: α before the delivery.
    """
    return delivered_us - link.alpha_us if pipelined else delivered_us


def _commit(state: _State, graph: LogicalGraph, lane: tuple, items: list[_Item], piece_bytes: float) -> list[Send]:
    """Time ``items`` (all on one link) as one transfer in ``lane`` and record their sends."""
    l = items[0][4]
    queue = state.queues[lane]
    start = max(max(item[0] for item in items), queue.free)
    link = graph.links[l]
    pipelined = times_pipelined(link, state.pipelined, state.pipelined_internode)
    end = occupy_resources(link, start, piece_bytes * len(items), state.res_free, pipelined)
    queue.free = lane_free_us(link, end, pipelined)
    first = len(state.sends)
    sends = [
        Send(chunk, piece, l, start, end, None if parent < 0 else parent, lane, first)
        for _, _, piece, chunk, _, parent in items
    ]
    state.sends.extend(sends)
    return sends


def _trees(routing: Routing, piece_bytes: float) -> tuple[list[dict[int, list[int]]], list[dict[int, tuple]]]:
    """Return per chunk its links by source rank, and each link's priority key (smaller goes first).

    The key is the longest path below the link (µs, longest first), then the chunk's orbit
    representative and the link's preimage under the symmetry that maps the representative to
    the chunk: ties break the same way in every image, so symmetric routes get symmetric orders
    (at any moment every machine sends to the machine the same offset away, and no NIC or
    switch port receives from two senders at once).

    Where no rotation moves each machine onto the next (machines that differ: a NIC down,
    another kind), ties no longer break alike on every machine, and paths of unequal length
    would send every machine's chunks to the same machine first while others idle. Sends
    across machines then go by machine offset from the chunk's root first (its own machine's
    sends to the next machine, then the one after), the order the rotation gives otherwise.
    """
    graph = routing.graph
    sym = chunk_symmetry(graph, routing.chunkup)
    inverse = [tuple(sorted(range(len(p)), key=p.__getitem__)) for p in graph.group]
    gpn = graph.gpus_per_node
    nodes = graph.num_ranks // gpn
    by_offset = lacks_machine_rotation(graph)
    children: list[dict[int, list[int]]] = []
    priority: list[dict[int, tuple]] = []
    for c, tree in enumerate(routing.trees):
        kids: dict[int, list[int]] = {}
        for l in tree:
            kids.setdefault(graph.links[l].src, []).append(l)
        children.append(kids)
        below = remaining_path_us(graph, tree, piece_bytes)
        rep, p_index = sym.rep_of[c]
        inv = inverse[p_index]
        keys = {}
        for l in tree:
            link = graph.links[l]
            canonical = graph.index.get((inv[link.src], inv[link.dst]), l)
            key = (-(link.time_us(piece_bytes) + below.get(link.dst, 0.0)), rep, canonical)
            if by_offset and link.internode:
                home = routing.root(c) // gpn
                key = ((link.src // gpn - home) % nodes, (link.dst // gpn - home) % nodes, *key)
            keys[l] = key
        priority.append(keys)
    return children, priority


def _add_work(work: dict[Resource, float], link: LogicalLink, size_bytes: float) -> None:
    for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
        work[res] = work.get(res, 0.0) + size_bytes / (bw * BYTES_PER_US_PER_GBPS)


def _relist(heap: list[tuple[float, tuple]], listed: dict[tuple, float], lane: tuple, queue: _Queue) -> None:
    """List ``lane`` in ``heap`` under its earliest start, unless it is listed no later already."""
    earliest = queue.earliest()
    if earliest is None or listed.get(lane, float("inf")) <= earliest:
        return
    listed[lane] = earliest
    heapq.heappush(heap, (earliest, lane))


def order_sends(
    routing: Routing,
    pieces: int,
    piece_bytes: float,
    *,
    progress: Callable[[str], None] | None = None,
    busiest_first: bool = False,
    pipelined: bool = False,
    pipelined_internode: bool = False,
    chain_hops: bool = True,
) -> Ordering:
    """Return the sends of every piece over its chunk's tree, ordered and timed greedily.

    ``progress`` gets a line every few seconds with the sends placed so far (``ProgressTicker``).
    ``busiest_first``: a queue toward other machines takes, among its ready pieces, the one whose
    route holds the resource with the most work left (priority breaks ties): on machines that
    differ, the NICs with the most to receive are then served first rather than by path length.
    ``pipelined``: time sends as the simulator's pipelined model runs them (``occupy_resources``);
    ``pipelined_internode``: only the sends between machines (the ``msccl-net`` model).
    ``chain_hops`` False: every link is its own queue, so a rank's sends to several machines share
    its NIC at once and one's α overlaps another's bytes (machines that differ, where the chained
    queues leave the slower machines' NICs idle for every α; ``send_lane``).

    Notes
    -----
    O(S log Q + S * q) for S sends, Q queues and q sends waiting in a queue at once.
    """
    graph = routing.graph
    children, priority = _trees(routing, piece_bytes)
    lane_of = list(_lanes(graph, chain_hops))
    latency_bound = [
        link.alpha_us >= piece_bytes / (link.bandwidth_GBps * BYTES_PER_US_PER_GBPS) for link in graph.links
    ]
    state = _State({lane: _Queue(0.0) for lane in lane_of}, {}, [], pipelined, pipelined_internode)
    work_left: dict[Resource, float] = {}
    if busiest_first:
        for tree in routing.trees:
            for l in tree:
                _add_work(work_left, graph.links[l], pieces * piece_bytes)

    def busiest(l: int) -> float:
        return max(work_left[res] for res in graph.links[l].resources)

    for c in range(len(routing.trees)):
        for l in children[c].get(routing.root(c), []):
            for j in range(pieces):
                state.queues[lane_of[l]].push((0.0, priority[c][l], j, c, l, -1))
    heap: list[tuple[float, tuple]] = []
    listed: dict[tuple, float] = {}  # the key each lane is listed under in ``heap`` (older entries are stale)
    for lane, queue in state.queues.items():
        _relist(heap, listed, lane, queue)
    ticker = ProgressTicker(progress)
    total = pieces * sum(len(tree) for tree in routing.trees)
    while heap:
        ticker.tick(lambda: f"ordering: {len(state.sends)} of {total} sends placed")
        key, lane = heapq.heappop(heap)
        if listed.get(lane) != key:
            continue
        del listed[lane]
        queue = state.queues[lane]
        earliest = queue.earliest()
        if earliest is None:
            continue
        if earliest > key + _EPS_US:
            _relist(heap, listed, lane, queue)
            continue
        hop = busiest_first and lane[0] == "hop"
        first = queue.pop_busiest(earliest, busiest) if hop else queue.pop(earliest)
        batch = [first]
        if latency_bound[first[4]]:
            batch += queue.pop_same_link(first[4], MAX_BATCH - 1)
        if busiest_first:
            _add_work(work_left, graph.links[first[4]], -len(batch) * piece_bytes)
        base = len(state.sends)
        for offset, send in enumerate(_commit(state, graph, lane, batch, piece_bytes)):
            for nxt in children[send.chunk].get(graph.links[send.link].dst, []):
                target = state.queues[lane_of[nxt]]
                target.push((send.end_us, priority[send.chunk][nxt], send.piece, send.chunk, nxt, base + offset))
                _relist(heap, listed, lane_of[nxt], target)
        _relist(heap, listed, lane, queue)
    return Ordering(routing, pieces, piece_bytes, tuple(state.sends), pipelined, pipelined_internode)
