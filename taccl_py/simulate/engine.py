"""Event-driven α-β replay of an Algorithm on a Topology, with max-min fair link sharing.

The model
---------
* Sizes: a chunk holds ``size_bytes / chunks_per_loop`` bytes, with ``size_bytes`` the
  nccl-tests size M (AllGather: total output; ReduceScatter: total input; AllReduce: the
  buffer); a step over ``count`` chunks moves ``count`` times that.
* The program is ``build_dataflow(algorithm)``: SEND, RECV and COMPUTE actions with their
  predecessors (program order inside a threadblock, cross-threadblock dependencies, and the
  SEND a RECV matches).
* A transfer is a matched SEND and RECV. It is *ready* when the SEND's predecessors are done.
  It then spends the latency α of its route (``route(topology, src, dst).alpha_us``, the sum of
  the links' α) without using bandwidth, and then moves its bytes over every link of the route
  at once (cut-through, a fluid flow).
* Links are shared by max-min fairness (progressive filling): every active flow gets the same
  rate unless a link elsewhere on its route limits it to less, in which case the others split
  what it leaves. Rates are recomputed whenever a flow starts or ends, only for the flows that
  share links (transitively) with it.
* The SEND completes when the last byte arrives; so does the RECV, unless its own predecessors
  finish later. COMPUTE actions (copies, reductions, nops) take 0 µs: memory bandwidth and
  reduction cost are not modelled.
* The collective's time is when the last action finishes.
* The wire protocol is the algorithm's ``protocol``: Simple is the model above as it is; LL and
  LL128 scale each link's α and bandwidth (``taccl_py.simulate.protocol``).
* The execution model (``taccl_py.simulate.model``) says how the runtime runs the program: once
  over whole chunks, or once per slice as MSCCL's kernel loops (``taccl_py.simulate.passes``);
  with serialized sends as above, or pipelined: a SEND's bytes move as soon as it is ready, the
  step after it starts when they have left, and its RECV has them α later. A model may pipeline
  only the sends between machines (``msccl-net``): the plan says per route.

So a lone transfer of b bytes takes α + b / B, two transfers of b bytes started together on one
link of B both take α + 2b / B, and with serialized sends a threadblock's consecutive sends each
pay their α (a threadblock runs its steps one after the other).
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

from taccl_py.errors import ArgumentError, VerificationError, Violation
from taccl_py.simulate.fairshare import MaxMinSharing
from taccl_py.simulate.model import slice_sizes
from taccl_py.simulate.passes import PassProgram, unroll
from taccl_py.simulate.plan import SimulationPlan

__all__ = ["ReplayOutcome", "replay"]

logger = logging.getLogger(__name__)

# event kinds: a flow's bytes start moving / have all arrived / (pipelined) reach the RECV α later
_START, _FINISH, _DELIVER = 0, 1, 2


@dataclass(frozen=True)
class ReplayOutcome:
    """Raw replay output: total time (µs), per-link busy µs and bytes, and passes run.

    When recorded, ``send_actions`` (every pass's SENDs, numbered ``pass × actions + action``) with
    their ``send_bytes`` and ready/start/end times (µs, indexed by that number).
    """

    time_us: float
    link_busy_us: tuple[float, ...]
    link_bytes: tuple[float, ...]
    ready_us: tuple[float, ...] | None
    start_us: tuple[float, ...] | None
    end_us: tuple[float, ...] | None
    num_passes: int = 1
    send_actions: tuple[int, ...] = ()
    send_bytes: tuple[float, ...] = ()


class _Replay:
    """Mutable state of one replay: event heap, flow progress, and link occupancy by route.

    Flows on the same route hold the same links, so max-min gives them the same rate: links
    track which routes are active (with a flow count), and rates are computed per route.
    """

    __slots__ = (
        "plan",
        "program",
        "route_pipelined",
        "flow_bytes",
        "pending",
        "done",
        "heap",
        "seq",
        "time_us",
        "remaining",
        "rate",
        "last_us",
        "version",
        "route_flows",
        "link_routes",
        "link_count",
        "busy_since",
        "busy_us",
        "link_bytes",
        "ready_us",
        "start_us",
        "end_us",
        "dirty",
        "sharing",
    )

    def __init__(self, plan: SimulationPlan, program: PassProgram) -> None:
        count = len(program.send_route)
        links = len(plan.link_keys)
        self.plan = plan
        self.program = program
        self.route_pipelined = plan.route_pipelined
        self.flow_bytes = program.flow_bytes
        self.pending = program.num_predecessors
        self.done = 0  # actions finished, to tell a finished replay from a stuck one
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.time_us = 0.0
        self.remaining = [0.0] * count
        self.rate = [0.0] * count
        self.last_us = [0.0] * count
        self.version = [0] * count
        self.route_flows: list[set[int]] = [set() for _ in plan.route_links]
        self.link_routes: list[set[int]] = [set() for _ in range(links)]
        self.link_count = [0] * links  # active flows on each link
        self.busy_since = [0.0] * links
        self.busy_us = [0.0] * links
        self.link_bytes = [0.0] * links
        self.ready_us = [0.0] * count
        self.start_us = [0.0] * count
        self.end_us = [0.0] * count
        self.dirty: set[int] = set()  # routes whose flow count changed since the last reshare
        self.sharing = MaxMinSharing(plan.route_links, plan.link_capacity)

    def push(self, time_us: float, kind: int, flow: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_us, self.seq, kind, flow, version))

    def release(self, stack: list[int], now: float) -> None:
        """Start every action on ``stack`` at ``now``; RECVs and COMPUTEs finish at once.

        A serialized SEND spends its route's α before its bytes move; a pipelined one moves them
        at once (its RECV gets them α after they have left).
        """
        send_route, alpha_us, pending, successors, pipelined = (
            self.program.send_route,
            self.plan.route_alpha_us,
            self.pending,
            self.program.successors,
            self.route_pipelined,
        )
        while stack:
            action = stack.pop()
            route_id = send_route[action]
            if route_id >= 0:
                self.ready_us[action] = now
                if alpha_us[route_id] > 0 and not pipelined[route_id]:
                    self.push(now + alpha_us[route_id], _START, action, 0)
                else:
                    self.start_flow(action, now, stack)
                continue
            self.done += 1
            if now > self.time_us:
                self.time_us = now
            for succ in successors[action]:
                pending[succ] -= 1
                if not pending[succ]:
                    stack.append(succ)

    def complete_send(self, action: int, now: float, stack: list[int]) -> None:
        """Finish SEND ``action`` at ``now`` and queue the successors it frees.

        Pipelined, the matched RECV is freed by a ``_DELIVER`` event the route's α later.
        """
        self.done += 1
        self.end_us[action] = now
        if now > self.time_us:
            self.time_us = now
        pending = self.pending
        route_id = self.program.send_route[action]
        deliver = self.program.matched_recv[action] if self.route_pipelined[route_id] else -1
        alpha_us = self.plan.route_alpha_us[route_id]
        for succ in self.program.successors[action]:
            if succ == deliver and alpha_us > 0:
                self.push(now + alpha_us, _DELIVER, succ, 0)
                continue
            pending[succ] -= 1
            if not pending[succ]:
                stack.append(succ)

    def deliver(self, recv: int, stack: list[int]) -> None:
        """Hand a pipelined SEND's bytes to its RECV ``recv``."""
        self.pending[recv] -= 1
        if not self.pending[recv]:
            stack.append(recv)

    def start_flow(self, flow: int, now: float, stack: list[int]) -> None:
        """Put ``flow``'s bytes on its route's links at ``now``."""
        self.start_us[flow] = now
        size = self.flow_bytes[flow]
        route_id = self.program.send_route[flow]
        links = self.plan.route_links[route_id]
        if size <= 0 or not links:
            self.complete_send(flow, now, stack)
            return
        self.remaining[flow] = size
        self.last_us[flow] = now
        self.rate[flow] = 0.0
        flows = self.route_flows[route_id]
        flows.add(flow)
        alone = len(flows) == 1
        link_count = self.link_count
        for link in links:
            self.link_bytes[link] += size
            link_count[link] += 1
            routes = self.link_routes[link]
            if routes:
                alone = False
            else:
                self.busy_since[link] = now
            routes.add(route_id)
        if alone:  # idle links: the bottleneck rate, revised if another flow joins this instant
            capacity = self.plan.link_capacity
            self.set_rate(flow, min(capacity[link] for link in links), now)
        else:
            self.dirty.add(route_id)

    def finish_flow(self, flow: int, now: float, stack: list[int]) -> None:
        """Take ``flow`` off its links at ``now`` and complete its SEND; its neighbours need a reshare."""
        route_id = self.program.send_route[flow]
        flows = self.route_flows[route_id]
        flows.discard(flow)
        dirty = self.dirty
        link_count = self.link_count
        for link in self.plan.route_links[route_id]:
            link_count[link] -= 1
        if flows:
            dirty.add(route_id)
        else:
            dirty.discard(route_id)
            for link in self.plan.route_links[route_id]:
                routes = self.link_routes[link]
                routes.discard(route_id)
                if routes:
                    dirty.update(routes)
                else:
                    self.busy_us[link] += now - self.busy_since[link]
        self.rate[flow] = 0.0
        self.complete_send(flow, now, stack)

    def set_rate(self, flow: int, new: float, now: float) -> None:
        """Settle ``flow``'s bytes at its old rate up to ``now`` and reschedule its end at ``new``."""
        old = self.rate[flow]
        left = self.remaining[flow] - old * (now - self.last_us[flow])
        left = left if left > 0.0 else 0.0
        self.remaining[flow] = left
        self.last_us[flow] = now
        self.rate[flow] = new
        self.version[flow] = version = self.version[flow] + 1
        self.seq = seq = self.seq + 1
        heapq.heappush(self.heap, (now + left / new, seq, _FINISH, flow, version))

    def reshare(self, seeds: set[int], now: float) -> None:
        """Recompute max-min fair rates for the routes sharing links (transitively) with ``seeds``."""
        members, links = self.sharing.component(seeds, self.link_routes)
        new_rate = self.sharing.rates(links, self.link_routes, self.route_flows, self.link_count)
        route_flows, rate, set_rate = self.route_flows, self.rate, self.set_rate
        for route_id in members:
            new = new_rate[route_id]
            for flow in route_flows[route_id]:
                if rate[flow] != new:
                    set_rate(flow, new, now)

    def run(self) -> float:
        """Replay the whole program; return the time (µs) the last action finishes.

        Events at the same instant are applied together and the links re-shared once after
        them, so flows that end and start at one instant cost one max-min computation.
        """
        stack = [a for a, n in enumerate(self.pending) if n == 0]
        self.release(stack, 0.0)
        heap, version, dirty = self.heap, self.version, self.dirty
        if dirty:
            self.reshare(dirty, 0.0)
            dirty.clear()
        pop, start_flow, finish_flow, release = heapq.heappop, self.start_flow, self.finish_flow, self.release
        while heap:
            now = heap[0][0]
            while heap and heap[0][0] == now:
                _, _, kind, flow, flow_version = pop(heap)
                if kind == _START:
                    start_flow(flow, now, stack)
                elif kind == _DELIVER:
                    self.deliver(flow, stack)
                elif flow_version == version[flow]:
                    finish_flow(flow, now, stack)
                else:
                    continue  # a finish time revised since: nothing happens
                if stack:
                    release(stack, now)
            if dirty:
                self.reshare(dirty, now)
                dirty.clear()
        return self.time_us


def replay(plan: SimulationPlan, size_bytes: float, *, record: bool = False) -> ReplayOutcome:
    """Return the raw outcome of replaying ``plan`` at nccl-tests size ``size_bytes``.

    ``record`` keeps every SEND's ready, start and end times (µs) for a timeline. Raises
    ``VerificationError`` when pipelined sends wait on each other in a circle (the program needs
    more slots than the model's ``send_slots``).
    """
    if not size_bytes > 0:
        raise ArgumentError(plan.algorithm.name, "size_bytes", f"size {size_bytes!r}", "a positive number of bytes")
    algorithm = plan.algorithm
    slices = slice_sizes(size_bytes / algorithm.chunks_per_loop, plan.model, algorithm.protocol)
    program = unroll(plan, slices)
    state = _Replay(plan, program)
    time_us = state.run()
    if state.done != len(program.send_route):
        stuck = len(program.send_route) - state.done
        raise VerificationError(
            algorithm.name,
            (
                Violation(
                    "deadlock",
                    f"{stuck} actions never run with {plan.model.send_slots} send slots per connection "
                    f"({plan.model.name} model)",
                ),
            ),
        )
    logger.debug(
        "%s: replayed %d transfers x %d passes at %d bytes: %.3f us",
        algorithm.name,
        plan.num_transfers,
        program.num_passes,
        size_bytes,
        time_us,
    )
    return ReplayOutcome(
        time_us=time_us,
        link_busy_us=tuple(state.busy_us),
        link_bytes=tuple(state.link_bytes),
        ready_us=tuple(state.ready_us) if record else None,
        start_us=tuple(state.start_us) if record else None,
        end_us=tuple(state.end_us) if record else None,
        num_passes=program.num_passes,
        send_actions=program.send_actions if record else (),
        send_bytes=tuple(program.flow_bytes[a] for a in program.send_actions) if record else (),
    )
