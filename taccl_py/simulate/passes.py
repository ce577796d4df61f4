"""The program a replay runs at one size: the plan's actions once per pass of MSCCL's slice loop.

A plan (``taccl_py.simulate.plan.SimulationPlan``) holds one pass of the program over whole
chunks. MSCCL runs it once per slice of a chunk (``taccl_py.simulate.model``), so at a size whose
chunks span P slices the replay runs P copies of every action, joined as the kernel joins them:

* within a pass, the plan's own precedence (program order, cross-threadblock dependencies, a
  RECV after the SEND it matches), as MSCCL's flags compare the pass (``iter``) and the step;
* between passes, a threadblock's last action precedes its first action of the next pass (a
  threadblock runs its steps in order, pass after pass, and nothing else waits at a pass's end);
* with pipelined sends, the k-th SEND on a connection (rank, peer, channel), counted over all
  passes, also waits for the RECV of the (k - slots)-th: the sender has no free slot before
  (only on the routes the plan pipelines: ``SimulationPlan.route_pipelined``).

Pass p moves ``slices[p]`` bytes of each chunk, so a SEND of ``count`` chunks moves
``count × slices[p]`` bytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PassProgram", "unroll"]


@dataclass(frozen=True)
class PassProgram:
    """Integer tables of P passes of a plan; action ``p·A + a`` is action ``a`` of pass ``p``.

    ``flow_bytes[x]`` is what SEND ``x`` moves (0 for other actions) and ``matched_recv[x]`` the
    RECV it meets (-1 for other actions).
    """

    num_passes: int
    successors: Sequence[Sequence[int]]
    num_predecessors: list[int]
    send_route: Sequence[int]
    flow_bytes: list[float]
    matched_recv: Sequence[int]
    send_actions: tuple[int, ...]


def unroll(plan, slices: Sequence[float]) -> PassProgram:
    """Return ``plan``'s program run once per entry of ``slices`` (bytes of a chunk per pass).

    One pass without slot limits is the plan's own tables, so whole-chunk replays build nothing.
    """
    count = len(plan.send_route)
    passes = len(slices)
    slots = plan.model.send_slots if any(plan.route_pipelined) else None
    if passes == 1 and slots is None:
        return PassProgram(
            1,
            plan.successors,
            list(plan.num_predecessors),
            plan.send_route,
            [chunks * slices[0] for chunks in plan.send_chunks],
            plan.matched_recv,
            plan.send_actions,
        )
    successors: list[list[int]] = []
    pending: list[int] = []
    for p in range(passes):
        base = p * count
        successors.extend([s + base for s in succ] for succ in plan.successors)
        pending.extend(plan.num_predecessors)
    for first, last in plan.threadblock_spans:
        for p in range(passes - 1):
            successors[p * count + last].append((p + 1) * count + first)
            pending[(p + 1) * count + first] += 1
    if slots is not None:
        _add_slot_waits(plan, passes, slots, successors, pending)
    flow_bytes = [chunks * size for size in slices for chunks in plan.send_chunks]
    matched = [r + p * count if r >= 0 else -1 for p in range(passes) for r in plan.matched_recv]
    return PassProgram(
        passes,
        successors,
        pending,
        tuple(plan.send_route) * passes,
        flow_bytes,
        matched,
        tuple(a + p * count for p in range(passes) for a in plan.send_actions),
    )


def _add_slot_waits(plan, passes: int, slots: int, successors: list[list[int]], pending: list[int]) -> None:
    """Make each connection's k-th SEND (over all passes) wait for the RECV of its (k - slots)-th."""
    count = len(plan.send_route)
    by_connection: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for action in plan.send_actions:  # in id order, so in each threadblock's program order
        # a switch step holds no connection's slots; a serialized send waits for its bytes anyway
        if action in plan.send_connection and plan.route_pipelined[plan.send_route[action]]:
            by_connection[plan.send_connection[action]].append(action)
    for sends in by_connection.values():
        per_pass = len(sends)
        for k in range(slots, per_pass * passes):
            earlier = (k - slots) // per_pass * count + plan.matched_recv[sends[(k - slots) % per_pass]]
            later = k // per_pass * count + sends[k % per_pass]
            successors[earlier].append(later)
            pending[later] += 1
