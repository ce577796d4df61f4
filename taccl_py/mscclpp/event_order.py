"""Orders over a graph of events given as predecessor sets: a topological one, and the one forced on a few events."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["in_forced_order", "topological_order"]


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
    predecessors: Sequence[set[int]], groups: Sequence[object], events: list[int], position: dict[int, int]
) -> list[int] | None:
    """Return ``events`` in the order the edges force on them, or None where two of them may run either way.

    Events of one group (a threadblock, listed in program order) are returned as given. Otherwise each
    must reach the next along the edges; ``position`` (a topological order's places) prunes the search
    from the later one back at events placed before the earlier one, which cannot lie between them.
    """
    if len({groups[event] for event in events}) <= 1:
        return events
    if any(event not in position for event in events):
        return None
    ordered = sorted(events, key=position.__getitem__)
    for earlier, later in zip(ordered, ordered[1:]):
        floor, stack, seen = position[earlier], [later], {later}
        while stack and earlier not in seen:
            for pred in predecessors[stack.pop()]:
                if pred not in seen and position.get(pred, -1) >= floor:
                    seen.add(pred)
                    stack.append(pred)
        if earlier not in seen:
            return None
    return ordered
