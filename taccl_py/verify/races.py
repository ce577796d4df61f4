"""Find data races between threadblocks of a rank: conflicting accesses with no ordering path.

Two actions of one rank in different threadblocks race when both touch a buffer chunk, at least
one writes it, and no chain of predecessor edges of the dataflow (program order, dependencies,
send-to-receive matches, across any ranks) leads from one to the other.

The replay records accesses in a linear extension of the dataflow (round order) into an
``AccessLog``, which keeps per chunk its last writer and the readers since; checking each access
against those alone finds a race whenever one exists (FastTrack's argument: an ordered access to
a later write is ordered to the earlier ones by transitivity). Candidate pairs are then decided
with vector clocks restricted to the threadblocks that occur in them: for every action, the
number of actions of each such threadblock that happen before it, propagated level by level
over the DAG with numpy in blocks of columns (memory O(actions × block)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from taccl_py.errors import Violation
from taccl_py.ir.dataflow import Action, Dataflow

__all__ = ["AccessLog", "find_races", "happens_before_clocks"]

# Bytes of clock matrix kept at once: bounds memory for 64 ranks x thousands of steps.
CLOCK_BLOCK_BYTES = 64 * 2**20


@dataclass
class _Candidate:
    first: int
    second: int
    key: tuple
    first_writes: bool
    second_writes: bool


@dataclass
class AccessLog:
    """Accesses to buffer chunks in replay order, reduced to the pairs that could race.

    Keys are (rank, buffer, temp, chunk) tuples; values are action ids. ``threadblock_of`` maps
    an action id to its (rank, threadblock), so pairs inside one threadblock (ordered by program
    order) are never recorded.
    """

    threadblock_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    last_writer: dict[tuple, int] = field(default_factory=dict)
    readers: dict[tuple, list[int]] = field(default_factory=dict)
    candidates: list[_Candidate] = field(default_factory=list)

    def _pair(self, first: int, second: int, key: tuple, first_writes: bool, second_writes: bool) -> None:
        if first != second and self.threadblock_of.get(first) != self.threadblock_of.get(second):
            self.candidates.append(_Candidate(first, second, key, first_writes, second_writes))

    def read(self, key: tuple, action_id: int) -> None:
        """Record that ``action_id`` reads the chunk ``key``."""
        writer = self.last_writer.get(key)
        if writer is not None:
            self._pair(writer, action_id, key, True, False)
        self.readers.setdefault(key, []).append(action_id)

    def write(self, key: tuple, action_id: int) -> None:
        """Record that ``action_id`` writes the chunk ``key``."""
        writer = self.last_writer.get(key)
        if writer is not None:
            self._pair(writer, action_id, key, True, True)
        for reader in self.readers.get(key, ()):
            self._pair(reader, action_id, key, False, True)
        self.last_writer[key] = action_id
        self.readers[key] = []


def _chains(actions: tuple[Action, ...]) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int], int]]:
    """Return per action its threadblock index and position in that threadblock, and the index map."""
    index: dict[tuple[int, int], int] = {}
    tb_of = np.empty(len(actions), dtype=np.int64)
    position = np.empty(len(actions), dtype=np.int64)
    seen: dict[int, int] = {}
    for action in actions:
        g = index.setdefault((action.rank, action.threadblock), len(index))
        tb_of[action.id] = g
        position[action.id] = seen.get(g, 0)
        seen[g] = position[action.id] + 1
    return tb_of, position, index


def _levels(flow: Dataflow) -> np.ndarray:
    """Return each action's depth: 1 + the largest depth of its predecessors."""
    depth = [0] * len(flow.actions)
    for node in flow.order:
        preds = flow.predecessors[node]
        if preds:
            depth[node] = 1 + max(depth[p] for p in preds)
    return np.asarray(depth, dtype=np.int64)


@dataclass(frozen=True)
class _Graph:
    """Edges sorted by the depth of their head, with level bounds, and per-action chain data."""

    src: np.ndarray
    dst: np.ndarray
    bounds: np.ndarray
    tb_of: np.ndarray
    position: np.ndarray
    index: dict[tuple[int, int], int]


def _graph(flow: Dataflow) -> _Graph:
    tb_of, position, index = _chains(flow.actions)
    depth = _levels(flow)
    dst = np.fromiter((node for node, preds in enumerate(flow.predecessors) for _ in preds), dtype=np.int64)
    src = np.fromiter((p for preds in flow.predecessors for p in preds), dtype=np.int64)
    order = np.argsort(depth[dst], kind="stable")
    dst, src = dst[order], src[order]
    bounds = np.searchsorted(depth[dst], np.arange(int(depth.max(initial=0)) + 2))
    return _Graph(src, dst, bounds, tb_of, position, index)


def _block_clocks(graph: _Graph, columns: list[tuple[int, int]]) -> np.ndarray:
    """Return clocks[action, k]: how many actions of threadblock ``columns[k]`` happen before or are it."""
    clocks = np.zeros((len(graph.tb_of), len(columns)), dtype=np.int32)
    col_of_tb = np.full(len(graph.index), -1, dtype=np.int64)
    for col, tb in enumerate(columns):
        col_of_tb[graph.index[tb]] = col
    own = col_of_tb[graph.tb_of]
    mine = own >= 0
    clocks[np.nonzero(mine)[0], own[mine]] = graph.position[mine] + 1
    for level in range(1, len(graph.bounds) - 1):
        lo, hi = graph.bounds[level], graph.bounds[level + 1]
        if lo < hi:
            np.maximum.at(clocks, graph.dst[lo:hi], clocks[graph.src[lo:hi]])
    return clocks


def happens_before_clocks(flow: Dataflow, columns: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Return (clocks, position) for the (rank, threadblock) ``columns``.

    ``clocks[b, k]`` counts the actions of threadblock ``columns[k]`` that happen before action b
    or are b; action a of that threadblock happens before b exactly when
    ``clocks[b, k] > position[a]``. Memory is O(actions x columns): callers with many columns
    should ask in blocks, as ``find_races`` does.
    """
    graph = _graph(flow)
    return _block_clocks(graph, columns), graph.position


def _describe(action: Action, writes: bool, key: tuple) -> str:
    verb = "writes" if writes else "reads"
    return f"tb {action.threadblock} step {action.step} ({action.kind.value}) {verb} {key[1].value}[{key[3]}]"


def find_races(flow: Dataflow, log: AccessLog) -> list[Violation]:
    """Return a "race" violation for each pair of steps whose conflicting accesses are unordered.

    Notes
    -----
    One violation per pair of (threadblock, step) is reported, at the later step in replay
    order. Clocks are computed for blocks of ``CLOCK_BLOCK_BYTES`` at a time.
    """
    if not log.candidates:
        return []
    graph = _graph(flow)
    columns = sorted({log.threadblock_of[c.first] for c in log.candidates})
    column_of = {tb: col for col, tb in enumerate(columns)}
    first = np.fromiter((c.first for c in log.candidates), dtype=np.int64)
    second = np.fromiter((c.second for c in log.candidates), dtype=np.int64)
    col = np.fromiter((column_of[log.threadblock_of[c.first]] for c in log.candidates), dtype=np.int64)
    width = max(1, CLOCK_BLOCK_BYTES // (4 * len(flow.actions)))
    racing = np.zeros(len(log.candidates), dtype=bool)
    for start in range(0, len(columns), width):
        clocks = _block_clocks(graph, columns[start : start + width])
        here = np.nonzero((col >= start) & (col < start + width))[0]
        racing[here] = clocks[second[here], col[here] - start] <= graph.position[first[here]]
    unordered = [log.candidates[i] for i in np.nonzero(racing)[0]]
    unordered.sort(key=lambda c: (c.second, c.first))
    found: list[Violation] = []
    seen: set[tuple] = set()
    for cand in unordered:
        first, second = flow.actions[cand.first], flow.actions[cand.second]
        pair = (first.rank, first.threadblock, first.step, second.threadblock, second.step)
        if pair in seen:
            continue
        seen.add(pair)
        found.append(
            Violation(
                "race",
                f"{_describe(first, cand.first_writes, cand.key)} and "
                f"{_describe(second, cand.second_writes, cand.key)} "
                "with no dependency path between them",
                second.rank,
                second.threadblock,
                second.step,
                cand.key[3],
            )
        )
    return found
