"""The lanes of an MSCCL++ plan: which steps share an instruction stream, and the semaphores between lanes.

A rank's steps run on *lanes*, at first one per threadblock of ours. Two passes here keep a large
schedule within the executor's limits:

* ``lane_dependencies`` keeps only the cross-lane dependencies that no other path implies (a
  transitive reduction of the rank's step graph: program order plus ``depends``). A dropped
  dependency costs no semaphore. What is left pairs in order: per ordered pair of lanes, later
  acquires meet later releases, so one counting semaphore per pair serves them all
  (``lane_semaphores``).
* ``merge_lanes`` runs the steps of several of our threadblocks on one lane, interleaved in one
  global topological order of the algorithm's steps (``step_positions``). Every program-order edge
  a merge adds then runs forward in that order, so no wait can close a cycle, and dependencies
  between merged threadblocks need no semaphore.

``ops`` turns a lane into the executor's operations and cuts it into threadblocks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, RankProgram
from taccl_py.ir.dataflow import build_dataflow

__all__ = ["Lane", "StepKey", "StepRef", "lane_dependencies", "lane_semaphores", "merge_lanes", "step_positions"]

StepRef = tuple[int, int]  # (threadblock id, step index) on one rank
StepKey = tuple[int, int, int]  # (rank, threadblock id, step index)
Lane = tuple[StepRef, ...]  # the steps one instruction stream runs, in order


def step_positions(algorithm: Algorithm) -> dict[StepKey, int]:
    """Return every step's position in one topological order of the algorithm's dataflow (all ranks).

    A step's position is that of its first action; every dependency, program-order edge and
    send-to-receive match enters a step at its first action, so positions increase along them.
    """
    dataflow = build_dataflow(algorithm)
    if dataflow.order is None:
        raise ArgumentError(algorithm.name, "algorithm", "a circular or broken dataflow", "a verified algorithm")
    positions: dict[StepKey, int] = {}
    for position, action_id in enumerate(dataflow.order):
        action = dataflow.actions[action_id]
        positions.setdefault((action.rank, action.threadblock, action.step), position)
    return positions


def _step_graph(prog: RankProgram, lanes: list[Lane]) -> tuple[list[StepRef], dict[StepRef, set[StepRef]]]:
    """Return the rank's steps in a topological order and their successors (lane order plus ``depends``)."""
    successors: dict[StepRef, set[StepRef]] = defaultdict(set)
    indegree: dict[StepRef, int] = {}
    for lane in lanes:
        for before, after in zip(lane, lane[1:]):
            successors[before].add(after)
    for tb in prog.threadblocks:
        for index, step in enumerate(tb.steps):
            for dependency in step.depends:
                if dependency != (tb.id, index):
                    successors[tuple(dependency)].add((tb.id, index))
    nodes = [step for lane in lanes for step in lane]
    for node in nodes:
        indegree.setdefault(node, 0)
        for successor in successors[node]:
            indegree[successor] = indegree.get(successor, 0) + 1
    order = [node for node in nodes if indegree[node] == 0]
    for node in order:  # Kahn's algorithm; ``order`` is its own queue
        for successor in successors[node]:
            indegree[successor] -= 1
            if indegree[successor] == 0:
                order.append(successor)
    if len(order) != len(nodes):
        raise ArgumentError(f"rank {prog.rank}", "threadblocks", "circular dependencies", "a verified algorithm")
    return order, successors


def _descendants(prog: RankProgram, lanes: list[Lane]) -> tuple[list[StepRef], dict, dict[StepRef, int], dict]:
    """Return the topological order, successors, bit of each step and the bit set of its descendants."""
    order, successors = _step_graph(prog, lanes)
    bit = {node: 1 << index for index, node in enumerate(order)}
    below: dict[StepRef, int] = {}
    for node in reversed(order):
        reach = 0
        for successor in successors[node]:
            reach |= bit[successor] | below[successor]
        below[node] = reach
    return order, successors, bit, below


def lane_dependencies(prog: RankProgram, lanes: list[Lane]) -> dict[StepRef, list[StepRef]]:
    """Return, per step, the steps of other lanes it must wait for that no other path already orders before it.

    Notes
    -----
    One pass over the steps in reverse topological order builds each step's descendants as a
    bit set; a dependency u -> v is implied when v descends from another successor of u. The
    cost is O(edges x steps / word size).
    """
    lane_of = {step: number for number, lane in enumerate(lanes) for step in lane}
    order, successors, bit, below = _descendants(prog, lanes)
    kept: dict[StepRef, list[StepRef]] = defaultdict(list)
    for node in order:
        # a step never descends from itself, so v is below some successor of u other than v iff below any
        implied = 0
        for successor in successors[node]:
            implied |= below[successor]
        for successor in successors[node]:
            if lane_of[node] != lane_of[successor] and not implied & bit[successor]:
                kept[successor].append(node)
    return {step: sorted(before) for step, before in kept.items()}


def _merged(first: Lane, second: Lane, position: Callable[[StepRef], int]) -> Lane:
    return tuple(sorted(first + second, key=position))


def merge_lanes(
    prog: RankProgram,
    positions: dict[StepKey, int],
    threadblocks_of: Callable[[list[Lane]], list[int] | None],
    limit: int,
) -> list[Lane]:
    """Return the rank's lanes: one per threadblock, merged greedily until they need at most ``limit`` threadblocks.

    ``threadblocks_of(lanes)`` gives the hardware threadblocks each lane needs once cut into
    pieces of at most 64 ops, or None when a lane breaks another limit (channels per threadblock).
    Each round merges the first pair of ``_candidate_pairs`` whose merged lane stays under a length
    cap (twice the longest threadblock at first, doubled when nothing fits: a lane runs its steps
    one after another, so long lanes lose parallelism) and needs no more threadblocks than the two
    did. When no merge is left to try, the lanes reached come back as they are.

    Notes
    -----
    Every trial lowers the whole rank again, O(lanes x steps) per round; ranks within the limit
    never get here.
    """

    def position(step: StepRef) -> int:
        return positions[(prog.rank, *step)]

    lanes = [tuple((tb.id, i) for i in range(len(tb.steps))) for tb in sorted(prog.threadblocks, key=lambda t: t.id)]
    counts = threadblocks_of(lanes)
    refused: set[tuple[Lane, Lane]] = set()
    # A lane runs its steps one after another: cap its length, doubling the cap only when no merge fits under it.
    cap = 2 * max((len(lane) for lane in lanes), default=1)
    while counts is not None and sum(counts) > limit:
        longest = max(len(lane) for lane in lanes)
        for a, b in _candidate_pairs(prog, lanes, counts):
            if (lanes[a], lanes[b]) in refused or len(lanes[a]) + len(lanes[b]) > cap:
                continue
            trial = [lane for number, lane in enumerate(lanes) if number not in (a, b)]
            trial.append(_merged(lanes[a], lanes[b], position))
            trial_counts = threadblocks_of(trial)
            if trial_counts is not None and sum(trial_counts) <= sum(counts):
                lanes, counts = trial, trial_counts
                break
            refused.add((lanes[a], lanes[b]))
        else:
            if cap >= sum(len(lane) for lane in lanes) and cap > longest:
                break
            cap *= 2
    return lanes


def _candidate_pairs(prog: RankProgram, lanes: list[Lane], counts: list[int]) -> list[tuple[int, int]]:
    """Return pairs of lanes worth merging, best first.

    First pairs joined by kept dependencies, most per step first (a merge drops their semaphores
    and keeps lanes short, which cut into fewer partial pieces); then pairs of one-piece lanes,
    smallest first (two short threadblocks may fit one).
    """
    dependencies = lane_dependencies(prog, lanes)
    lane_of = {step: number for number, lane in enumerate(lanes) for step in lane}
    weight: dict[tuple[int, int], int] = defaultdict(int)
    for step, before in dependencies.items():
        for other in before:
            weight[tuple(sorted((lane_of[other], lane_of[step])))] += 1
    joined = sorted(weight, key=lambda pair: (-weight[pair] / (len(lanes[pair[0]]) + len(lanes[pair[1]])), pair))
    single = sorted((n for n, count in enumerate(counts) if count == 1), key=lambda n: (len(lanes[n]), n))
    small = [(a, b) for i, a in enumerate(single) for b in single[i + 1 :] if (min(a, b), max(a, b)) not in weight]
    small.sort(key=lambda pair: (len(lanes[pair[0]]) + len(lanes[pair[1]]), pair))
    return [tuple(sorted(pair)) for pair in joined + small]


def lane_semaphores(prog: RankProgram, lanes: list[Lane]) -> tuple[dict, dict, int]:
    """Return the semaphores each (threadblock, step) acquires before it and releases after it, and their count.

    One semaphore per ordered pair of lanes; ``lane_dependencies`` leaves per pair only
    dependencies whose releases and acquires come in the same order, so the k-th acquire meets the k-th release.
    """
    lane_of = {step: number for number, lane in enumerate(lanes) for step in lane}
    semaphore_of: dict[tuple[int, int], int] = {}
    acquires: dict[tuple[int, int], list[int]] = defaultdict(list)
    releases: dict[tuple[int, int], list[int]] = defaultdict(list)
    dependencies = lane_dependencies(prog, lanes)
    for lane in lanes:
        for step in lane:
            for other in dependencies.get(step, ()):
                semaphore = semaphore_of.setdefault((lane_of[other], lane_of[step]), len(semaphore_of))
                acquires[step].append(semaphore)
                releases[other].append(semaphore)
    return acquires, releases, len(semaphore_of)
