"""Find data races between threadblocks of a rank: conflicting accesses with no ordering path.

Two actions of one rank in different threadblocks race when both touch a buffer chunk, at least
one writes it, and no chain of predecessor edges of the dataflow (program order, dependencies,
send-to-receive matches, across any ranks) leads from one to the other.

The replay records accesses in a linear extension of the dataflow (round order) into an
``AccessLog``, which keeps per chunk its last writer and the readers since; checking each access
against those alone finds a race whenever one exists (FastTrack's argument: an ordered access to
a later write is ordered to the earlier ones by transitivity). Candidate pairs are then decided
in two passes. Most are ordered by one dependency edge (``lower_plan`` adds one per hazard):
a pair (a, b) is ordered when some edge leads from a or a later action of a's threadblock to b
or an earlier action of b's threadblock, which sorted edge tables answer for all pairs at once.
The rest are decided with vector clocks restricted to the threadblocks that occur in them: for
every action, the number of actions of each such threadblock that happen before it, propagated
level by level over the DAG with numpy in blocks of columns (memory O(actions × block)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from taccl_py.errors import Violation
from taccl_py.ir.dataflow import Action, Dataflow

__all__ = ["AccessLog", "find_races", "happens_before_clocks"]

# Bytes of clock matrix kept at once: bounds memory for 64 ranks x thousands of steps.
CLOCK_BLOCK_BYTES = 64 * 2**20

# A candidate pair: (first action, second action, chunk key, first writes, second writes).
_Candidate = tuple[int, int, tuple, bool, bool]


@dataclass
class AccessLog:
    """Accesses to buffer chunks in replay order, reduced to the pairs that could race.

    Keys are (rank, buffer's spelling, temp, chunk) tuples; values are action ids. ``threadblock_of`` maps
    an action id (an index) to its (rank, threadblock), so pairs inside one threadblock (ordered
    by program order) are never recorded.
    """

    threadblock_of: Sequence[tuple[int, int]]
    last_writer: dict[tuple, int] = field(default_factory=dict)
    readers: dict[tuple, tuple[int, ...]] = field(default_factory=dict)
    candidates: list[_Candidate] = field(default_factory=list)

    def read(self, key: tuple, action_id: int) -> None:
        """Record that ``action_id`` reads the chunk ``key``."""
        writer = self.last_writer.get(key)
        if writer is not None and writer != action_id:
            if self.threadblock_of[writer] != self.threadblock_of[action_id]:
                self.candidates.append((writer, action_id, key, True, False))
        # Few reads between two writes (a tree's fan-out); tuples of ints leave the GC's tracking.
        self.readers[key] = self.readers.get(key, ()) + (action_id,)

    def write(self, key: tuple, action_id: int) -> None:
        """Record that ``action_id`` writes the chunk ``key``."""
        tb_of, candidates = self.threadblock_of, self.candidates
        mine = tb_of[action_id]
        writer = self.last_writer.get(key)
        if writer is not None and writer != action_id and tb_of[writer] != mine:
            candidates.append((writer, action_id, key, True, True))
        for reader in self.readers.get(key, ()):
            if reader != action_id and tb_of[reader] != mine:
                candidates.append((reader, action_id, key, False, True))
        self.last_writer[key] = action_id
        self.readers.pop(key, None)


def _chains(actions: tuple[Action, ...]) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int], int]]:
    """Return per action its threadblock index and position in that threadblock, and the index map."""
    index: dict[tuple[int, int], int] = {}
    tb_of = np.empty(len(actions), dtype=np.int64)
    position = np.empty(len(actions), dtype=np.int64)
    seen: dict[int, int] = {}
    for action in actions:
        g = index.setdefault((action.rank, action.threadblock), len(index))
        tb_of[action.id] = g
        here = seen.get(g, 0)
        position[action.id] = here
        seen[g] = here + 1
    return tb_of, position, index


def _edges(flow: Dataflow) -> tuple[np.ndarray, np.ndarray]:
    """Return (src, dst): one entry per predecessor edge of the dataflow."""
    preds = flow.predecessors
    dst = np.repeat(np.arange(len(preds), dtype=np.int64), [len(p) for p in preds])
    src = np.fromiter((p for node_preds in preds for p in node_preds), dtype=np.int64, count=len(dst))
    return src, dst


def _directly_ordered(
    tb_of: np.ndarray, position: np.ndarray, edges: tuple[np.ndarray, np.ndarray], first: np.ndarray, second: np.ndarray
) -> np.ndarray:
    """Return per pair (first, second) whether one edge orders them through program order.

    True when an edge p -> x has p in first's threadblock at or after first, and x in second's
    threadblock at or before second: first -> ... -> p -> x -> ... -> second is a path. False
    says nothing (a longer path may exist).
    """
    src, dst = edges
    cross = tb_of[src] != tb_of[dst]
    src, dst = src[cross], dst[cross]
    tbs = np.int64(int(tb_of.max(initial=0)) + 1)
    span = np.int64(len(position) + 1)  # > any position, so group * span + position never collide
    # Per (threadblock of x, threadblock of p), edges by x's position; with the running maximum
    # of p's position, the last edge at or before ``second`` tells whether one reaches ``first``.
    group = tb_of[dst] * tbs + tb_of[src]
    order = np.lexsort((position[dst], group))
    group, x_pos, p_pos = group[order], position[dst][order], position[src][order]
    # Offsetting each group by group * span keeps the running maximum inside the group.
    reach = np.maximum.accumulate(p_pos + group * span) - group * span
    want = tb_of[second] * tbs + tb_of[first]
    at = np.searchsorted(group * span + x_pos, want * span + position[second], side="right") - 1
    found = at >= 0
    found[found] = group[at[found]] == want[found]
    ordered = np.zeros(len(first), dtype=bool)
    ordered[found] = reach[at[found]] >= position[first][found]
    return ordered


def _levels(flow: Dataflow) -> np.ndarray:
    """Return each action's depth: 1 + the largest depth of its predecessors."""
    depth = [0] * len(flow.actions)
    predecessors = flow.predecessors
    for node in flow.order:
        preds = predecessors[node]
        if preds:
            depth[node] = 1 + max([depth[p] for p in preds])
    return np.asarray(depth, dtype=np.int64)


@dataclass(frozen=True)
class _Graph:
    """Edges sorted by the depth, then id, of their head, with level and head-group bounds."""

    src: np.ndarray
    dst: np.ndarray
    bounds: np.ndarray
    heads: np.ndarray
    head_bounds: np.ndarray
    tb_of: np.ndarray
    position: np.ndarray
    index: dict[tuple[int, int], int]


def _graph(flow: Dataflow, chains: tuple | None = None, edges: tuple | None = None) -> _Graph:
    tb_of, position, index = chains if chains is not None else _chains(flow.actions)
    src, dst = edges if edges is not None else _edges(flow)
    depth = _levels(flow)
    order = np.lexsort((dst, depth[dst]))
    dst, src = dst[order], src[order]
    bounds = np.searchsorted(depth[dst], np.arange(int(depth.max(initial=0)) + 2))
    # Edges into one action are consecutive: ``heads`` are the first edge of each such run.
    new_head = np.ones(len(dst), dtype=bool)
    new_head[1:] = dst[1:] != dst[:-1]
    heads = np.flatnonzero(new_head)
    return _Graph(src, dst, bounds, heads, np.searchsorted(heads, bounds), tb_of, position, index)


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
        if lo == hi:
            continue
        # Heads of one level are distinct and deeper than every tail of that level, so one
        # maximum per head (reduceat over its run of edges) and one store update them all.
        starts = graph.heads[graph.head_bounds[level] : graph.head_bounds[level + 1]]
        reduced = np.maximum.reduceat(clocks[graph.src[lo:hi]], starts - lo, axis=0)
        targets = graph.dst[starts]
        clocks[targets] = np.maximum(clocks[targets], reduced)
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


def _clock_racing(
    flow: Dataflow, chains: tuple, edges: tuple, threadblock_of: Sequence[tuple[int, int]], pairs: np.ndarray
) -> np.ndarray:
    """Return per pair (rows of [first, second]) whether no path orders them, by vector clocks."""
    graph = _graph(flow, chains, edges)
    first, second = pairs[:, 0], pairs[:, 1]
    columns = sorted({threadblock_of[a] for a in first.tolist()})
    column_of = {tb: col for col, tb in enumerate(columns)}
    col = np.fromiter((column_of[threadblock_of[a]] for a in first.tolist()), dtype=np.int64, count=len(first))
    width = max(1, CLOCK_BLOCK_BYTES // (4 * len(flow.actions)))
    racing = np.zeros(len(first), dtype=bool)
    for start in range(0, len(columns), width):
        clocks = _block_clocks(graph, columns[start : start + width])
        here = np.nonzero((col >= start) & (col < start + width))[0]
        racing[here] = clocks[second[here], col[here] - start] <= graph.position[first[here]]
    return racing


def _describe(action: Action, writes: bool, key: tuple) -> str:
    verb = "writes" if writes else "reads"
    return f"tb {action.threadblock} step {action.step} ({action.kind.value}) {verb} {key[1]}[{key[3]}]"


def find_races(flow: Dataflow, log: AccessLog) -> list[Violation]:
    """Return a "race" violation for each pair of steps whose conflicting accesses are unordered.

    Notes
    -----
    One violation per pair of (threadblock, step) is reported, at the later step in replay
    order. Pairs one dependency edge orders are settled without clocks; clocks for the rest
    are computed for blocks of ``CLOCK_BLOCK_BYTES`` at a time.
    """
    if not log.candidates:
        return []
    chains, edges = _chains(flow.actions), _edges(flow)
    first = np.fromiter((c[0] for c in log.candidates), dtype=np.int64, count=len(log.candidates))
    second = np.fromiter((c[1] for c in log.candidates), dtype=np.int64, count=len(log.candidates))
    racing = np.zeros(len(log.candidates), dtype=bool)
    open_pairs = np.flatnonzero(~_directly_ordered(chains[0], chains[1], edges, first, second))
    if len(open_pairs):
        pairs = np.stack((first[open_pairs], second[open_pairs]), axis=1)
        racing[open_pairs] = _clock_racing(flow, chains, edges, log.threadblock_of, pairs)
    unordered = [log.candidates[i] for i in np.flatnonzero(racing)]
    unordered.sort(key=lambda c: (c[1], c[0]))
    found: list[Violation] = []
    seen: set[tuple] = set()
    for first_id, second_id, key, first_writes, second_writes in unordered:
        a, b = flow.actions[first_id], flow.actions[second_id]
        pair = (a.rank, a.threadblock, a.step, b.threadblock, b.step)
        if pair in seen:
            continue
        seen.add(pair)
        found.append(
            Violation(
                "race",
                f"{_describe(a, first_writes, key)} and {_describe(b, second_writes, key)} "
                "with no dependency path between them",
                b.rank,
                b.threadblock,
                b.step,
                key[3],
            )
        )
    return found
