"""Contiguity and exact scheduling, TACCL's third stage, over fixed routes and link orders.

On a slow link (across machines, or any link whose α outweighs a piece's transfer) consecutive
sends of contiguous pieces can travel as one transfer: the threadblock then pays α once instead
of once per piece, but the first piece arrives only with the last. Which neighbours to merge is
decided by a MILP over the fixed orders (TACCL's contiguity stage), with the model the ordering
stage uses (``taccl_py.synth.ordering``):

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
from dataclasses import dataclass

import pulp

from taccl_py.synth.logical import LogicalGraph
from taccl_py.synth.ordering import Ordering, Send
from taccl_py.synth.routing import Routing
from taccl_py.synth.solver import SolverOptions, solve_model

__all__ = ["Schedule", "schedule_sends", "replay_groups", "MAX_MILP_SENDS"]

logger = logging.getLogger(__name__)

_BYTES_PER_US_PER_GBPS = 1e3
# The contiguity MILP has ~(2 + resources per link) rows per send; beyond this many sends pulp's
# model building alone would take seconds, and the greedy rule is used instead.
MAX_MILP_SENDS = 1500


@dataclass(frozen=True)
class Schedule:
    """Sends merged into groups (send indices, in link order) with exact start/end times (µs)."""

    ordering: Ordering
    groups: tuple[tuple[int, ...], ...]
    start_us: tuple[float, ...]
    end_us: tuple[float, ...]
    status: str

    @property
    def routing(self) -> Routing:
        """Return the routing the schedule is built on."""
        return self.ordering.routing

    @property
    def makespan_us(self) -> float:
        """Return when the last piece arrives (µs)."""
        return max(self.end_us, default=0.0)


def _is_slow(graph: LogicalGraph, link: int, piece_bytes: float) -> bool:
    l = graph.links[link]
    return l.internode or l.alpha_us >= piece_bytes / (l.bandwidth_GBps * _BYTES_PER_US_PER_GBPS)


def _role(routing: Routing, send: Send, leaves: set[tuple[int, int]]) -> tuple[bool, bool]:
    link = routing.graph.links[send.link]
    return (link.src == routing.root(send.chunk), (send.chunk, link.dst) in leaves)


def _candidate_pairs(ordering: Ordering) -> list[tuple[int, int]]:
    """Return consecutive (a, b) on a slow link whose pieces are contiguous buffer chunks of one role."""
    routing, pieces = ordering.routing, ordering.pieces
    graph = routing.graph
    inner = {(c, graph.links[l].src) for c, tree in enumerate(routing.trees) for l in tree}
    leaves = {(c, v) for c in range(len(routing.trees)) for v in range(graph.num_ranks) if (c, v) not in inner}
    last: dict[int, int] = {}
    pairs = []
    for i, send in enumerate(ordering.sends):
        a = last.get(send.link)
        last[send.link] = i
        if a is None or not _is_slow(graph, send.link, ordering.piece_bytes):
            continue
        prev = ordering.sends[a]
        contiguous = send.chunk * pieces + send.piece == prev.chunk * pieces + prev.piece + 1
        if contiguous and _role(routing, prev, leaves) == _role(routing, send, leaves):
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
            preds[k].add(group_of[send.parent])
        for key in (send.link,) + graph.links[send.link].resources:
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


def replay_groups(ordering: Ordering, groups: tuple[tuple[int, ...], ...]) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Return exact (start, end) per send (µs) when ``groups`` travel as single transfers.

    Returns None when the merges make precedence cyclic (a group would wait for itself).
    """
    graph, sends = ordering.routing.graph, ordering.sends
    order = _group_order(ordering, groups)
    if order is None:
        return None
    start, end = [0.0] * len(sends), [0.0] * len(sends)
    tb_free = [0.0] * len(graph.links)
    res_free: dict[tuple[str, str], float] = {}
    for k in order:
        group = groups[k]
        link = graph.links[sends[group[0]].link]
        ready = max((end[sends[i].parent] if sends[i].parent is not None else 0.0) for i in group)
        t0 = max(ready, tb_free[sends[group[0]].link], max(res_free.get(r, 0.0) for r in link.resources) - link.alpha_us)
        size = ordering.piece_bytes * len(group)
        t1 = t0 + link.alpha_us + size / (link.bandwidth_GBps * _BYTES_PER_US_PER_GBPS)
        for res, bw in zip(link.resources, link.resource_bandwidths_GBps):
            res_free[res] = t0 + link.alpha_us + size / (bw * _BYTES_PER_US_PER_GBPS)
        tb_free[sends[group[0]].link] = t1
        for i in group:
            start[i], end[i] = t0, t1
    return tuple(start), tuple(end)


def _greedy_merges(ordering: Ordering, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
    sends = ordering.sends
    return {(a, b) for a, b in pairs if (sends[sends[b].parent].end_us if sends[b].parent is not None else 0.0) <= sends[a].start_us}


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
            if a is not None and ordering.sends[a].link != send.link:
                a_link = graph.links[ordering.sends[a].link]
                a_bw = dict(zip(a_link.resources, a_link.resource_bandwidths_GBps))[res]
                busy = ordering.piece_bytes / (a_bw * _BYTES_PER_US_PER_GBPS)
                out[(a, i)] = max(out.get((a, i), 0.0), busy)
    return [(a, b, busy) for (a, b), busy in out.items()]


def _contiguity_milp(ordering: Ordering, pairs: list[tuple[int, int]], horizon: float, options: SolverOptions, time_limit_s: float | None) -> set[tuple[int, int]] | None:
    graph, sends, n = ordering.routing.graph, ordering.sends, len(ordering.sends)
    prob = pulp.LpProblem("contiguity", pulp.LpMinimize)
    s = prob.add_variable_dicts("s", range(n), lowBound=0, upBound=horizon)
    f = prob.add_variable_dicts("f", range(n), lowBound=0, upBound=horizon)
    e = prob.add_variable_dicts("e", range(n), lowBound=0, upBound=horizon)
    m = prob.add_variable_dicts("m", range(len(pairs)), cat=pulp.LpBinary)
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
        a = last.get(send.link)
        last[send.link] = i
        if a is None:
            continue
        k = merge_of.get((a, i))
        if k is None:
            prob += s[i] >= f[a], f"link_{i}"
            continue
        byte_time = ordering.piece_bytes / (graph.links[send.link].bandwidth_GBps * _BYTES_PER_US_PER_GBPS)
        prob += s[i] >= f[a] - horizon * m[k], f"link_{i}"
        prob += s[a] >= s[i] - horizon * (1 - m[k]), f"together_{i}"
        prob += f[i] >= f[a] + byte_time - horizon * (1 - m[k]), f"stream_{i}"
        prob += e[a] >= e[i] - horizon * (1 - m[k]), f"deliver_together_{i}"
    for a, b, busy in _resource_pairs(ordering):
        alpha_a, alpha_b = graph.links[sends[a].link].alpha_us, graph.links[sends[b].link].alpha_us
        prob += s[b] + alpha_b >= s[a] + alpha_a + busy, f"resource_{a}_{b}"
    outcome = solve_model(prob, options, time_limit_s, {m[k].name: 0.0 for k in m})
    if not outcome.has_solution:
        return None
    return {pairs[k] for k in m if (m[k].value() or 0.0) > 0.5}


def schedule_sends(ordering: Ordering, options: SolverOptions, time_limit_s: float | None = None) -> Schedule:
    """Return the schedule with the best contiguity found and exact send times.

    ``status`` names how the merges were chosen: ``none`` (nothing to merge), ``milp`` (optimal
    or time-limited MILP), ``greedy`` (too large for the MILP, or it found nothing in time).
    """
    singles = tuple((i,) for i in range(len(ordering.sends)))
    times = replay_groups(ordering, singles)
    if times is None:  # the ordering's own start order is topological; this cannot happen
        raise RuntimeError("ordering is not causal")
    best = Schedule(ordering, singles, times[0], times[1], "none")
    pairs = _candidate_pairs(ordering)
    if not pairs:
        return best
    options_tried = []
    if len(ordering.sends) <= MAX_MILP_SENDS:
        chosen = _contiguity_milp(ordering, pairs, best.makespan_us * (1 + 1e-6) + 1e-6, options, time_limit_s)
        if chosen is not None:
            options_tried.append((chosen, "milp"))
    options_tried.append((_greedy_merges(ordering, pairs), "greedy"))
    for merged, how in options_tried:
        groups = _groups_from_merges(ordering, merged)
        times = replay_groups(ordering, groups)
        if times is not None and max(times[1], default=0.0) < best.makespan_us - 1e-9:
            best = Schedule(ordering, groups, times[0], times[1], how)
    return best
