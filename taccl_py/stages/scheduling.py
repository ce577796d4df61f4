"""Contiguity and exact scheduling, TACCL's third stage, over fixed routes and link orders.

On a slow link (across machines, or any link whose α outweighs a piece's transfer) consecutive
sends can travel as one transfer (the plan stages pieces that are not contiguous in the
buffers through scratch): the threadblock then pays α once instead
of once per piece, but the first piece arrives only with the last. Which neighbours to merge is
decided by a MILP over the fixed orders (TACCL's contiguity stage), with the model the ordering
stage uses (``taccl_py.stages.ordering``):

* ``s_i`` start, ``f_i`` finish of its bytes, ``e_i`` delivery of send i (µs); ``m_ab`` binary
  merges consecutive sends a, b of one slow link.
* data: ``s_i >= e_parent``; bytes: ``f_i >= s_i + α + b/B``; delivery ``e_i >= f_i``.
* one threadblock per link: ``s_b >= f_a - H m_ab``; merged: ``s_a = s_b`` (the group leaves when
  all its pieces are there), ``f_b >= f_a + b/B`` and ``e_a >= e_b`` (delivered together).
* resources (ports, PCIe, NIC) keep the ordering stage's order: ``s_b + α_b >= s_a + α_a + b/bw``.
* minimise ``T >= e_i``. H is the unmerged schedule's makespan: with T <= H every time lies in
  [0, H], so H is a safe big-M for every disjunction above.

The MILP's choice of merges is then replayed exactly (``replay_groups``: a longest-path pass in
the original start order, which is topological for data, link and resource precedence) and kept
only if it beats the unmerged schedule. Large instances, or no solution in time, fall back to a
greedy rule: merge a send into its predecessor when its piece was already waiting when the
predecessor started (no piece is delayed, α is saved).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import pulp

from taccl_py.solvers import SolverOptions, solve_model
from taccl_py.stages.ordering import Ordering, is_slow_link, lane_free_us, occupy_resources
from taccl_py.stages.routing import Routing
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["Schedule", "schedule_sends", "replay_groups", "MAX_MILP_SENDS"]

logger = logging.getLogger(__name__)

# The contiguity MILP has ~(2 + resources per link) rows per send; beyond this many sends pulp's
# model building alone would take seconds, and the greedy rule is used instead.
MAX_MILP_SENDS = 600


@dataclass(frozen=True)
class Schedule:
    """Sends merged into groups (send indices, in link order) with exact start/end times (µs).

    ``solve_status`` is how the contiguity MILP ended (a ``SolveStatus`` value; None: not run),
    whether or not its merges were kept.
    """

    ordering: Ordering
    groups: tuple[tuple[int, ...], ...]
    start_us: tuple[float, ...]
    end_us: tuple[float, ...]
    status: str
    solve_status: str | None = None

    @property
    def routing(self) -> Routing:
        """Return the routing the schedule is built on."""
        return self.ordering.routing

    @property
    def makespan_us(self) -> float:
        """Return when the last piece arrives (µs)."""
        return max(self.end_us, default=0.0)


def _candidate_pairs(ordering: Ordering, *, adjacent: bool) -> list[tuple[int, int]]:
    """Return pairs (a, b) of sends of one slow link in one queue, b the link's next send after a.

    With ``adjacent`` only pairs with no other send of the queue between them (the MILP's
    model keeps the queue's order); otherwise a merge may move b ahead of sends of the queue's
    other links (the plan stages non-contiguous pieces through scratch).
    """
    graph = ordering.routing.graph
    last_in_lane: dict[tuple, int] = {}
    last_on_link: dict[tuple, int] = {}
    pairs = []
    for i, send in enumerate(ordering.sends):
        key = (send.lane, send.link)
        a = last_in_lane.get(send.lane) if adjacent else last_on_link.get(key)
        last_in_lane[send.lane] = i
        last_on_link[key] = i
        if (
            a is not None
            and ordering.sends[a].link == send.link
            and is_slow_link(graph.links[send.link], ordering.piece_bytes)
        ):
            pairs.append((a, i))
    return pairs


def _groups_from_merges(ordering: Ordering, merged: set[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    follower = {a: b for a, b in merged}
    led = {b for _, b in merged}
    groups = []
    for i in range(len(ordering.sends)):
        if i in led:
            continue
        group = [i]
        while group[-1] in follower:
            group.append(follower[group[-1]])
        groups.append(tuple(group))
    return tuple(groups)


def _group_order(ordering: Ordering, groups: tuple[tuple[int, ...], ...]) -> list[int] | None:
    """Return group indices in a topological order of data, link and resource precedence (None: cyclic)."""
    graph, sends = ordering.routing.graph, ordering.sends
    group_of = {i: k for k, group in enumerate(groups) for i in group}
    preds: list[set[int]] = [set() for _ in groups]
    last: dict[object, int] = {}
    for i, send in enumerate(sends):
        k = group_of[i]
        if send.parent is not None:
            if group_of[send.parent] == k:  # a transfer cannot carry the piece it forwards
                return None
            preds[k].add(group_of[send.parent])
        for key in (send.lane,) + graph.links[send.link].resources:
            if key in last:
                preds[k].add(last[key])
            last[key] = k
    for k in range(len(groups)):
        preds[k].discard(k)
    succs: list[list[int]] = [[] for _ in groups]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    waiting = [len(ps) for ps in preds]
    heap = [(groups[k][0], k) for k in range(len(groups)) if not waiting[k]]
    heapq.heapify(heap)
    order = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(k)
        for nxt in succs[k]:
            waiting[nxt] -= 1
            if not waiting[nxt]:
                heapq.heappush(heap, (groups[nxt][0], nxt))
    return order if len(order) == len(groups) else None


def replay_groups(
    ordering: Ordering, groups: tuple[tuple[int, ...], ...]
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Return exact (start, end) per send (µs) when ``groups`` travel as single transfers.

    Returns None when the merges make precedence cyclic (a group would wait for itself).
    """
    graph, sends = ordering.routing.graph, ordering.sends
    order = _group_order(ordering, groups)
    if order is None:
        return None
    start, end = [0.0] * len(sends), [0.0] * len(sends)
    tb_free: dict[tuple, float] = {}
    res_free: dict[tuple[str, str], float] = {}
    for k in order:
        group = groups[k]
        link = graph.links[sends[group[0]].link]
        ready = max((end[sends[i].parent] if sends[i].parent is not None else 0.0) for i in group)
        t0 = max(ready, tb_free.get(sends[group[0]].lane, 0.0))
        pipelined = ordering.pipelines(link)
        t1 = occupy_resources(link, t0, ordering.piece_bytes * len(group), res_free, pipelined)
        tb_free[sends[group[0]].lane] = lane_free_us(link, t1, pipelined)
        for i in group:
            start[i], end[i] = t0, t1
    return tuple(start), tuple(end)


def _batch_pairs(ordering: Ordering) -> set[tuple[int, int]]:
    """Return the consecutive pairs of the batches the ordering already sent together."""
    sends = ordering.sends
    return {(i - 1, i) for i, send in enumerate(sends) if send.batch is not None and send.batch != i}


def _greedy_merges(ordering: Ordering, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
    sends = ordering.sends
    return {
        (a, b)
        for a, b in pairs
        if (sends[sends[b].parent].end_us if sends[b].parent is not None else 0.0) <= sends[a].start_us
    }


def _resource_pairs(ordering: Ordering) -> list[tuple[int, int, float]]:
    """Return (a, b, bytes time of a on the resource) for consecutive sends of different links on a resource."""
    graph = ordering.routing.graph
    last: dict[tuple[str, str], int] = {}
    out: dict[tuple[int, int], float] = {}
    for i, send in enumerate(ordering.sends):
        link = graph.links[send.link]
        for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
            a = last.get(res)
            last[res] = i
            if a is not None and ordering.sends[a].lane != send.lane:
                a_link = graph.links[ordering.sends[a].link]
                a_bw = dict(zip(a_link.resources, a_link.resource_bandwidths_GBps))[res]
                busy = ordering.piece_bytes / (a_bw * BYTES_PER_US_PER_GBPS)
                out[(a, i)] = max(out.get((a, i), 0.0), busy)
    return [(a, b, busy) for (a, b), busy in out.items()]


def _contiguity_milp(
    ordering: Ordering,
    free_pairs: list[tuple[int, int]],
    forced: set[tuple[int, int]],
    horizon: float,
    options: SolverOptions,
    time_limit_s: float | None,
    progress: Callable[[str], None] | None = None,
) -> tuple[set[tuple[int, int]] | None, str]:
    """Return the merges among ``free_pairs`` the MILP picks (``forced`` pairs are merged anyway) and its status.

    The merges are None when the MILP found no solution within its budgets.
    """
    graph, sends, n = ordering.routing.graph, ordering.sends, len(ordering.sends)
    pairs = list(free_pairs) + sorted(forced)
    prob = pulp.LpProblem("contiguity", pulp.LpMinimize)
    s = prob.add_variable_dicts("s", range(n), lowBound=0, upBound=horizon)
    f = prob.add_variable_dicts("f", range(n), lowBound=0, upBound=horizon)
    e = prob.add_variable_dicts("e", range(n), lowBound=0, upBound=horizon)
    m = prob.add_variable_dicts("m", range(len(pairs)), cat=pulp.LpBinary)
    for k in range(len(free_pairs), len(pairs)):
        m[k].lowBound = 1
    makespan = prob.add_variable("makespan_us", lowBound=0, upBound=horizon)
    prob += makespan
    for i, send in enumerate(sends):
        link = graph.links[send.link]
        if send.parent is not None:
            prob += s[i] >= e[send.parent], f"data_{i}"
        prob += f[i] >= s[i] + link.time_us(ordering.piece_bytes), f"bytes_{i}"
        prob += e[i] >= f[i], f"deliver_{i}"
        prob += makespan >= e[i], f"makespan_{i}"
    merge_of = {pair: k for k, pair in enumerate(pairs)}
    last: dict[int, int] = {}
    for i, send in enumerate(sends):
        a = last.get(send.lane)
        last[send.lane] = i
        if a is None:
            continue
        k = merge_of.get((a, i))
        if k is None:
            prob += s[i] >= f[a], f"link_{i}"
            continue
        byte_time = ordering.piece_bytes / (graph.links[send.link].bandwidth_GBps * BYTES_PER_US_PER_GBPS)
        prob += s[i] >= f[a] - horizon * m[k], f"link_{i}"
        prob += s[a] >= s[i] - horizon * (1 - m[k]), f"together_{i}"
        prob += f[i] >= f[a] + byte_time - horizon * (1 - m[k]), f"stream_{i}"
        prob += e[a] >= e[i] - horizon * (1 - m[k]), f"deliver_together_{i}"
    for a, b, busy in _resource_pairs(ordering):
        alpha_a, alpha_b = graph.links[sends[a].link].alpha_us, graph.links[sends[b].link].alpha_us
        prob += s[b] + alpha_b >= s[a] + alpha_a + busy, f"resource_{a}_{b}"
    start = {m[k].name: float(k >= len(free_pairs)) for k in m}
    outcome = solve_model(prob, options, time_limit_s, start, progress=progress)
    if not outcome.has_solution:
        return None, outcome.status.value
    return {pairs[k] for k in range(len(free_pairs)) if (m[k].value() or 0.0) > 0.5}, outcome.status.value


def schedule_sends(
    ordering: Ordering,
    options: SolverOptions,
    time_limit_s: float | None = None,
    *,
    milp: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Schedule:
    """Return the schedule with the best contiguity found and exact send times.

    ``status`` names how the merges were chosen: ``none`` (nothing to merge), ``milp`` (the
    MILP's, optimal or at a budget), ``greedy`` (too large for the MILP, ``milp`` False, or the MILP
    found nothing better). The MILP runs to ``options``'s node budget; ``time_limit_s`` (s) is
    what is left of the wall-clock safety cap (default ``options.time_limit_s``). ``progress``
    gets the MILP's lines (``solve_model``).
    """
    batched = _batch_pairs(ordering)
    base = _groups_from_merges(ordering, batched)
    times = replay_groups(ordering, base)
    if times is None:  # the ordering's own start order is topological; this cannot happen
        raise RuntimeError("ordering is not causal")
    best = Schedule(ordering, base, times[0], times[1], "none")
    pairs = [pair for pair in _candidate_pairs(ordering, adjacent=False) if pair not in batched]
    if not pairs:
        return best
    options_tried = [(_greedy_merges(ordering, pairs), "greedy")]
    adjacent = [pair for pair in _candidate_pairs(ordering, adjacent=True) if pair not in batched]
    solve_status = None
    if milp and adjacent and len(ordering.sends) <= MAX_MILP_SENDS:
        chosen, solve_status = _contiguity_milp(
            ordering, adjacent, batched, best.makespan_us * (1 + 1e-6) + 1e-6, options, time_limit_s, progress
        )
        if chosen is not None:
            options_tried.append((chosen, "milp"))
    for merged, how in options_tried:
        groups = _groups_from_merges(ordering, merged | batched)
        times = replay_groups(ordering, groups)
        if times is not None and max(times[1], default=0.0) < best.makespan_us - 1e-9:
            best = Schedule(ordering, groups, times[0], times[1], how)
    return replace(best, solve_status=solve_status)
