"""Orders over a graph of events given as predecessor sets: a topological one, the one forced on a few events, and
which of some pairs of events are ordered."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence

__all__ = ["in_forced_order", "reached_neighbours", "reaching_pairs", "topological_order"]


def topological_order(predecessors: Sequence[set[int]], runs: Callable[[int], bool] = lambda _node: True) -> list[int]:
    """Return the events in an order that respects every edge (Kahn's algorithm).

    Events on a cycle, or behind one, are left out, and so are events ``runs`` rejects and those behind them.
    """
    successors: list[list[int]] = [[] for _ in predecessors]
    missing = [len(preds) for preds in predecessors]
    for node, preds in enumerate(predecessors):
        for pred in preds:
            successors[pred].append(node)
    ready = [node for node, count in enumerate(missing) if count == 0 and runs(node)]
    order = []
    while ready:
        node = ready.pop()
        order.append(node)
        for succ in successors[node]:
            missing[succ] -= 1
            if missing[succ] == 0 and runs(succ):
                ready.append(succ)
    return order


def in_forced_order(
    predecessors: Sequence[set[int]],
    groups: Sequence[object],
    events: list[int],
    position: dict[int, int],
    known: Collection[tuple[int, int]] = frozenset(),
) -> list[int] | None:
    """Return ``events`` in the order the edges force on them, or None where two of them may run either way.

    Events of one group (a threadblock, listed in program order) are returned as given. Otherwise each
    must reach the next along the edges; ``position`` (a topological order's places) prunes the search
    from the later one back at events placed before the earlier one, which cannot lie between them.
    ``known`` holds (earlier, later) pairs already shown to be joined by a path whose events all lie in
    ``position`` at or after the earlier one (as every path of a graph that ``position`` orders does);
    such a pair skips the search, which would find that path.
    """
    if len({groups[event] for event in events}) <= 1:
        return events
    if any(event not in position for event in events):
        return None
    ordered = sorted(events, key=position.__getitem__)
    for earlier, later in zip(ordered, ordered[1:]):
        if (earlier, later) in known:
            continue
        floor, stack, seen = position[earlier], [later], {later}
        while stack and earlier not in seen:
            for pred in predecessors[stack.pop()]:
                if pred not in seen and position.get(pred, -1) >= floor:
                    seen.add(pred)
                    stack.append(pred)
        if earlier not in seen:
            return None
    return ordered


def reaching_pairs(
    predecessors: Sequence[Iterable[int]], order: Sequence[int], pairs: Iterable[tuple[int, int]]
) -> set[tuple[int, int]]:
    """Return the (early, late) of ``pairs`` where ``early`` reaches ``late`` along ``predecessors`` (or is ``late``).

    ``order`` is a topological order holding every event asked about (and so their ancestors). It is
    the transitive closure's answer, computed as the closure is, by one sweep of ancestor bit sets in
    ``order``, but each set holds only the events asked about as ``early`` and is dropped once the last
    successor has taken it in. Time is O((events + edges) x asked / 64) word operations; memory is the
    sets still live, not a set per event.
    """
    asked: dict[int, list[int]] = defaultdict(list)
    for early, late in pairs:
        asked[late].append(early)
    sources = {early for earlies in asked.values() for early in earlies}
    bit = {node: 1 << i for i, node in enumerate(node for node in order if node in sources)}
    waiting = [0] * len(predecessors)  # successors yet to take the event's set in
    for preds in predecessors:
        for pred in preds:
            waiting[pred] += 1
    live: dict[int, int] = {}
    reached = set()
    for node in order:
        bits = bit.get(node, 0)
        for pred in predecessors[node]:
            bits |= live[pred]
            waiting[pred] -= 1
            if not waiting[pred]:
                del live[pred]
        if waiting[node]:
            live[node] = bits
        for early in asked.get(node, ()):
            if early in bit and bits & bit[early]:
                reached.add((early, node))
    return reached


def reached_neighbours(
    predecessors: Sequence[Iterable[int]],
    order: Sequence[int],
    groups: Sequence[object],
    sequences: Iterable[list[int]],
) -> set[tuple[int, int]]:
    """Return the neighbours in ``order`` of each sequence spanning several groups that a path already joins.

    These are the pairs ``in_forced_order`` searches with ``position`` taken from ``order``, a
    topological order of the graph as it stands: its paths only climb in ``order``, so each pair
    found may skip the search (edges added since only add paths).
    """
    position = {event: place for place, event in enumerate(order)}
    pairs = []
    for events in sequences:
        if len({groups[event] for event in events}) > 1 and all(event in position for event in events):
            ordered = sorted(events, key=position.__getitem__)
            pairs += zip(ordered, ordered[1:])
    return reaching_pairs(predecessors, order, pairs) if pairs else set()
