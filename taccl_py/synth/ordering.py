"""Ordering, TACCL's second stage: the order of chunk transfers on every link, by a greedy heuristic.

Every routed chunk is cut into ``pieces`` pieces that follow the chunk's tree (pipelining); a
*send* is one piece crossing one logical link. The heuristic is list scheduling under the model
the simulator uses (``taccl_py.simulate.engine``): a logical link is one threadblock, which runs
its sends one after the other, each paying the link's α and then moving its bytes; the bytes
hold every physical resource of the route (NVSwitch ports, PCIe links, NIC), which we serialise
per resource (port serialisation on switches) at the resource's own bandwidth.

Whenever a link can start its next send, it takes, among the pieces already at its source, the
one with the longest remaining path below the link's far end (TACCL's rule), earlier pieces
first on ties. Links are served in order of their earliest possible start, so no resource idles
while a send could use it.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

from taccl_py.synth.logical import LogicalGraph, Resource
from taccl_py.synth.routing import Routing

__all__ = ["Send", "Ordering", "order_sends", "remaining_path_us"]

logger = logging.getLogger(__name__)

_BYTES_PER_US_PER_GBPS = 1e3
_EPS_US = 1e-9


@dataclass(frozen=True)
class Send:
    """Piece ``piece`` of chunk ``chunk`` crossing logical link ``link`` from ``start_us`` to ``end_us``.

    ``parent`` is the index of the send that brought the piece to the link's source (None at
    the chunk's root).
    """

    chunk: int
    piece: int
    link: int
    start_us: float
    end_us: float
    parent: int | None


@dataclass(frozen=True)
class Ordering:
    """Sends in start order, with the piece size (bytes) they were timed for."""

    routing: Routing
    pieces: int
    piece_bytes: float
    sends: tuple[Send, ...]

    @property
    def makespan_us(self) -> float:
        """Return when the last piece arrives (µs)."""
        return max((s.end_us for s in self.sends), default=0.0)


def remaining_path_us(graph: LogicalGraph, tree: tuple[int, ...], piece_bytes: float) -> dict[int, float]:
    """Return, per rank, the longest path (µs) below it in ``tree`` for one piece."""
    below: dict[int, float] = {}
    for l in reversed(tree):
        link = graph.links[l]
        below[link.src] = max(below.get(link.src, 0.0), link.time_us(piece_bytes) + below.get(link.dst, 0.0))
    return below


@dataclass
class _State:
    """Mutable bookkeeping of the list scheduler (local to one ``order_sends`` call)."""

    tb_free: list[float]
    res_free: dict[Resource, float]
    pending: list[list[tuple[float, float, int, int, int]]]
    sends: list[Send]


def _pick(state: _State, l: int, start: float) -> tuple[float, float, int, int, int]:
    """Pop the send link ``l`` runs next: highest priority among those ready at ``start``."""
    queue = state.pending[l]
    ready = [item for item in queue if item[0] <= start + _EPS_US]
    best = min(ready, key=lambda item: (item[1], item[2], item[3]))
    queue.remove(best)
    return best


def _earliest(state: _State, graph: LogicalGraph, l: int) -> float | None:
    queue = state.pending[l]
    if not queue:
        return None
    link = graph.links[l]
    start = max(state.tb_free[l], min(item[0] for item in queue))
    return max(start, max(state.res_free.get(res, 0.0) for res in link.resources) - link.alpha_us)


def _commit(state: _State, graph: LogicalGraph, l: int, item: tuple[float, float, int, int, int], piece_bytes: float) -> Send:
    ready, _, piece, chunk, parent = item
    link = graph.links[l]
    start = max(ready, state.tb_free[l], max(state.res_free.get(res, 0.0) for res in link.resources) - link.alpha_us)
    bytes_start = start + link.alpha_us
    end = bytes_start + piece_bytes / (link.bandwidth_GBps * _BYTES_PER_US_PER_GBPS)
    for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
        state.res_free[res] = bytes_start + piece_bytes / (bw * _BYTES_PER_US_PER_GBPS)
    state.tb_free[l] = end
    send = Send(chunk, piece, l, start, end, None if parent < 0 else parent)
    state.sends.append(send)
    return send


def order_sends(routing: Routing, pieces: int, piece_bytes: float) -> Ordering:
    """Return the sends of every piece over its chunk's tree, ordered and timed greedily.

    Notes
    -----
    O(S log L + S * q) for S sends, L links and q sends queued on a link at once.
    """
    graph = routing.graph
    children: list[dict[int, list[int]]] = []
    priority: list[dict[int, float]] = []
    for tree in routing.trees:
        kids: dict[int, list[int]] = {}
        for l in tree:
            kids.setdefault(graph.links[l].src, []).append(l)
        children.append(kids)
        below = remaining_path_us(graph, tree, piece_bytes)
        priority.append({l: graph.links[l].time_us(piece_bytes) + below.get(graph.links[l].dst, 0.0) for l in tree})
    state = _State([0.0] * len(graph.links), {}, [[] for _ in graph.links], [])
    heap: list[tuple[float, int]] = []
    touched: set[int] = set()
    for c in range(len(routing.trees)):
        for l in children[c].get(routing.root(c), []):
            for j in range(pieces):
                state.pending[l].append((0.0, -priority[c][l], j, c, -1))
                touched.add(l)
    for l in touched:
        heapq.heappush(heap, (0.0, l))
    while heap:
        key, l = heapq.heappop(heap)
        earliest = _earliest(state, graph, l)
        if earliest is None:
            continue
        if earliest > key + _EPS_US:
            heapq.heappush(heap, (earliest, l))
            continue
        item = _pick(state, l, earliest)
        send = _commit(state, graph, l, item, piece_bytes)
        index = len(state.sends) - 1
        for nxt in children[send.chunk].get(graph.links[l].dst, []):
            state.pending[nxt].append((send.end_us, -priority[send.chunk][nxt], send.piece, send.chunk, index))
            heapq.heappush(heap, (_earliest(state, graph, nxt), nxt))
        follow = _earliest(state, graph, l)
        if follow is not None:
            heapq.heappush(heap, (follow, l))
    return Ordering(routing, pieces, piece_bytes, tuple(state.sends))
