"""Simulate an MSCCL++ execution plan with the α-β engine that times our algorithms.

The plan's replay graph (``taccl_py.mscclpp.replay_graph.ReplayBuilder``: events per op, program
order, the k-th wait after the peer's k-th signal, semaphores, barriers, port proxy writes and
flushes, packet reads after their writes) becomes the engine's actions
(``taccl_py.simulate.engine``):

* an event that moves data between GPUs (``put``, ``get``, a remote read or write of a reduce, a
  packet put, a port channel's proxy write) is one SEND per (source GPU,
  destination GPU) over ``route(topology, src, dst)`` of the chunks it moves there, with a RECV
  when the bytes have arrived; its threadblock goes on when what it sends has left (serialized:
  arrived) and what it reads has arrived;
* local copies and reduces, nops, semaphores, barriers and waits take 0 µs, as COMPUTE does;
* an edge into another GPU (a wait after its signal, a packet read after its write) and a flush
  after its port proxy writes follow the arrival of the bytes; other edges follow the event's end;
* a signal that directly follows puts to the same peer in its threadblock (after at most a nop)
  travels with them: the flag store is behind the data, so it costs no α and arrives when the
  puts it follows since the last signal have; any other signal (the exporter's entry handshake: a
  receiving threadblock signals once on entry and the sender waits for it before its first put)
  is a 0-byte transfer costing its route's α;
* MSCCL++ has no connection FIFO (a put writes the peer's memory, paced only by the plan's own
  signals), so under the ``pipelined`` and ``msccl-net`` models no SEND waits for a slot;
* a chunk holds ``size_bytes / C`` bytes, C the chunks per loop of the plan's collective
  (``taccl_py.ir.collectives.chunk_layout``), so a plan and the Algorithm it was exported from
  move the same bytes.

A switch op (NVLS multimem: ``glres``, ``gstore``, ``gstorepkt``) is one switch flow, as our
simulator charges a switch step (``taccl_py.simulate.switch.switch_path``): ``glres`` a
reduce-store, the others a store, over the GPUs its switch channel spans, of the chunks it writes
on its own GPU; it needs a switch that reduces in the network under those GPUs. What follows it
goes on when the flow is done (the plan's own signals order the other GPUs after it). A pipeline
op's body runs ``DEFAULT_PIPELINE_ITERATIONS``
times, each over its share of the range, as the verifier replays it. MSCCL++ runs a plan once over
whole chunks, so ``model="chunks"`` is how its executor runs; the sliced models run the whole plan
once per slice as MSCCL would (entry handshake included, so it is paid once per pass), for
comparison with an MSCCL XML file under the same model.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from taccl_py.bounds.reduction import schedule_bounds
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.collectives import Collective, chunk_layout
from taccl_py.mscclpp.event_order import topological_order
from taccl_py.mscclpp.plan import ExecutionPlan, OpName
from taccl_py.mscclpp.replay_graph import (
    DEFAULT_PIPELINE_ITERATIONS,
    ReplayBuilder,
    ReplayGraph,
    all_ops,
    violation_at,
)
from taccl_py.simulate import (
    DEFAULT_MODEL,
    NCCL_PROTOCOL_COSTS,
    ExecutionModel,
    ProtocolCost,
    SimulationResult,
    execution_model,
    simulate_plan,
)
from taccl_py.simulate.plan import (
    PlannedSend,
    PlannedSwitch,
    ProgramSummary,
    SimulationPlan,
    assemble_simulation_plan,
)
from taccl_py.topology.model import Topology

__all__ = ["plan_summary", "prepare_plan_simulation", "simulate_mscclpp_plan"]

logger = logging.getLogger(__name__)

_SIGNALS = frozenset({OpName.SIGNAL, OpName.RELAXED_SIGNAL})
_SWITCH_OPS = frozenset({OpName.MULTI_LOAD_REDUCE_STORE, OpName.MULTI_STORE, OpName.MULTI_STORE_PACKETS})


def plan_summary(plan: ExecutionPlan) -> ProgramSummary:
    """Return what the replay reads of ``plan``: name, collective, ranks, chunks per loop and protocol.

    Raises ``ArgumentError`` when the collective has no chunk layout here or the GPUs' chunk counts
    do not fit it.

    >>> from taccl_py.mscclpp.plan import Gpu, Protocol
    >>> gpus = (Gpu(0, 1, 2, 0, ()), Gpu(1, 1, 2, 0, ()))
    >>> plan_summary(ExecutionPlan("p", "allgather", Protocol.SIMPLE, False, gpus)).chunks_per_loop
    2
    """
    try:
        collective = Collective(plan.collective)
    except ValueError:
        expected = ", ".join(c.value for c in Collective)
        raise ArgumentError(plan.name, "collective", f"collective {plan.collective!r}", expected) from None
    gpu0 = plan.gpus[0]
    per_loop = gpu0.output_chunks if collective is Collective.ALLGATHER else max(gpu0.input_chunks, gpu0.output_chunks)
    layout = chunk_layout(collective, len(plan.gpus), max(per_loop, 1))
    for gpu in plan.gpus:
        outputs = (layout.output_chunks, 0) if plan.inplace else (layout.output_chunks,)
        if gpu.input_chunks != layout.input_chunks or gpu.output_chunks not in outputs:
            raise ArgumentError(
                plan.name,
                f"gpu {gpu.id}",
                f"{gpu.input_chunks} input and {gpu.output_chunks} output chunks",
                f"{layout.input_chunks} and {layout.output_chunks} ({collective.value} over {len(plan.gpus)} GPUs)",
            )
    reduces = any(
        op.name is OpName.MULTI_LOAD_REDUCE_STORE
        for gpu in plan.gpus
        for tb in gpu.threadblocks
        for op in all_ops(tb.ops)
    )
    return ProgramSummary(plan.name, collective, len(plan.gpus), per_loop, plan.protocol.value, reduces)


def prepare_plan_simulation(
    plan: ExecutionPlan,
    topology: Topology,
    *,
    model: ExecutionModel | str = DEFAULT_MODEL,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
) -> SimulationPlan:
    """Return the replay's tables for ``plan`` on ``topology``; reuse them to simulate several sizes.

    Parameters
    ----------
    plan : ExecutionPlan
        The MSCCL++ plan; GPU ``i`` runs on the topology's rank ``i``.
    topology : Topology
        The machine; a transfer from GPU a to b takes ``route(topology, a, b)``.
    model : ExecutionModel or str
        ``msccl`` (default), ``pipelined`` or ``chunks`` (whole chunks: how MSCCL++ runs a plan).
    protocol_costs : mapping of str to ProtocolCost
        What the plan's protocol (Simple, LL) does to α (µs) and bandwidth (GB/s).

    Returns
    -------
    SimulationPlan
        For ``taccl_py.simulate.simulate_plan``; its ``algorithm`` is the plan's ``ProgramSummary``.

    Raises
    ------
    ArgumentError
        When the rank counts differ, the collective or its chunk counts are not ones we model, or
        the protocol is not in ``protocol_costs``.
    VerificationError
        When the plan has no finishing time: an unmatched wait, barrier or packet read, a cycle of
        waits, or a channel or semaphore shared in no fixed order.

    Notes
    -----
    The mapping and the cost of signals are in this module's docstring; time and memory are linear
    in the replay graph's events and edges.
    """
    if len(plan.gpus) != topology.num_ranks:
        raise ArgumentError(
            plan.name,
            "gpus",
            f"{len(plan.gpus)} GPUs but topology {topology.name!r} has {topology.num_ranks}",
            "a plan for the topology's rank count",
        )
    summary = plan_summary(plan)
    graph, slices = _replay_graph(plan)
    tables = _ActionTables(graph, slices)
    predecessors, sends, spans = tables.build()
    logger.debug(
        "%s: %d events as %d actions, %d transfers, %d switch flows",
        plan.name,
        len(graph.events),
        len(predecessors),
        len(sends),
        len(tables.switches),
    )
    return assemble_simulation_plan(
        summary,
        topology,
        predecessors,
        sends,
        spans,
        protocol_costs=protocol_costs,
        model=execution_model(model),
        switches=tables.switches,
    )


def simulate_mscclpp_plan(
    plan: ExecutionPlan,
    topology: Topology,
    sizes_bytes: Iterable[int],
    *,
    model: ExecutionModel | str = DEFAULT_MODEL,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
) -> tuple[SimulationResult, ...]:
    """Return the simulated run (time µs, bandwidths GB/s, bound ratio) of ``plan`` at each nccl-tests size.

    As ``taccl_py.simulate.simulate_sizes`` for an Algorithm; see ``prepare_plan_simulation`` for
    the arguments and errors.
    """
    prepared = prepare_plan_simulation(plan, topology, model=model, protocol_costs=protocol_costs)
    sizes = tuple(sizes_bytes)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ArgumentError(plan.name, "size_bytes", f"size {size!r}", "an integer number of bytes >= 1")
    # a plan that sums in a switch is held to the in-network bound, as its Algorithm would be
    reduces = prepared.algorithm.reduces_in_switch
    bounds = schedule_bounds(topology, prepared.algorithm.collective, sizes, reduces_in_switch=reduces)
    return tuple(simulate_plan(prepared, size, bound_time_us=b.time_us) for size, b in zip(sizes, bounds))


def _replay_graph(plan: ExecutionPlan) -> tuple[ReplayGraph, int]:
    """Return the plan's replay graph and its slices per chunk (as the verifier cuts them).

    Refuses (``VerificationError``) a graph with problems or events that can never run.
    """
    has_pipeline = any(op.name is OpName.PIPELINE for gpu in plan.gpus for tb in gpu.threadblocks for op in tb.ops)
    groups = [op.tbg.tbg_size for gpu in plan.gpus for tb in gpu.threadblocks for op in all_ops(tb.ops) if op.tbg]
    iterations = DEFAULT_PIPELINE_ITERATIONS if has_pipeline else 1
    slices = iterations * math.lcm(1, *groups)
    graph = ReplayBuilder(plan, slices, iterations).build()
    if graph.problems:
        raise VerificationError(plan.name, tuple(graph.problems))
    blocked = [violation_at(event, "deadlock", event.blocked) for event in graph.events if event.blocked]
    if blocked:
        raise VerificationError(plan.name, tuple(blocked))
    finished = set(topological_order(graph.order))
    if len(finished) < len(graph.events):
        stuck = next(event for index, event in enumerate(graph.events) if index not in finished)
        raise VerificationError(plan.name, (violation_at(stuck, "deadlock", "waits in a cycle"),))
    return graph, slices


def _flows(graph: ReplayGraph, event_id: int, slices: int) -> dict[tuple[int, int], float]:
    """Return the chunks an event moves per (source GPU, destination GPU), each remote location counted once."""
    event = graph.events[event_id]
    remote: dict[tuple[int, int], set] = defaultdict(set)
    for dst_locs, sources in event.writes:
        for loc in dst_locs:
            if loc[0] != event.gpu:
                remote[(event.gpu, loc[0])].add(loc)
        for loc in (loc for locs in sources for loc in locs):
            if loc[0] != event.gpu:
                remote[(loc[0], event.gpu)].add(loc)
    return {pair: len(locs) / slices for pair, locs in remote.items()}


def _switch_flow(graph: ReplayGraph, event_id: int, slices: int) -> tuple[tuple[int, ...], float] | None:
    """Return a switch op's group (the GPUs it writes) and the chunks it writes on its own GPU; None for others."""
    event = graph.events[event_id]
    if event.name not in _SWITCH_OPS:
        return None
    written = [loc for dst_locs, _ in event.writes for loc in dst_locs]
    group = tuple(sorted({loc[0] for loc in written} | {event.gpu}))
    return group, sum(1 for loc in written if loc[0] == event.gpu) / slices


def _proxies(graph: ReplayGraph) -> dict[int, list[int]]:
    """Return each port op's issue event -> its proxy events (an unnamed event labelled as the issue it follows)."""
    found: dict[int, list[int]] = defaultdict(list)
    for index, event in enumerate(graph.events):
        if event.name is None and event.tb is not None:
            for pred in sorted(graph.order[index]):
                issue = graph.events[pred]
                if (
                    issue.name is not None
                    and issue.label == event.label
                    and (issue.gpu, issue.tb) == (event.gpu, event.tb)
                ):
                    found[pred].append(index)
                    break
    return found


class _ActionTables:
    """The engine's actions for a replay graph: per event its start, end (done) and arrival action."""

    __slots__ = (
        "graph",
        "slices",
        "preds",
        "sends",
        "switches",
        "switch_of",
        "start",
        "done",
        "arrive",
        "flows",
        "proxy_of",
        "issues",
    )

    def __init__(self, graph: ReplayGraph, slices: int) -> None:
        self.graph, self.slices = graph, slices
        self.preds: list[set[int]] = []
        self.sends: list[PlannedSend] = []
        self.switches: list[PlannedSwitch] = []
        count = len(graph.events)
        self.start, self.done, self.arrive = [-1] * count, [-1] * count, [-1] * count
        self.switch_of = {i: flow for i in range(count) if (flow := _switch_flow(graph, i, slices)) is not None}
        self.flows = [{} if index in self.switch_of else _flows(graph, index, slices) for index in range(count)]
        self.issues = _proxies(graph)
        self.proxy_of = {proxy: issue for issue, proxies in self.issues.items() for proxy in proxies}

    def build(self) -> tuple[list[set[int]], list[PlannedSend], list[tuple[int, int]]]:
        """Return every action's predecessors, the SENDs, and each threadblock's (first, last) action."""
        chains: dict[tuple[int, int], list[int]] = defaultdict(list)
        for index, event in enumerate(self.graph.events):
            if event.tb is not None and index not in self.proxy_of:
                chains[(event.gpu, event.tb)].append(index)
        behind = self._signals(chains)
        for index in range(len(self.graph.events)):
            self._allocate(index, index in behind)
        for index, preds in enumerate(self.graph.order):
            event = self.graph.events[index]
            for pred in preds:
                other = self.graph.events[pred]
                # bytes are used where they land: on another GPU, or by a flush after the proxy's writes
                arrived = other.gpu != event.gpu or (pred in self.proxy_of and index not in self.proxy_of)
                self.preds[self.start[index]].add(self.arrive[pred] if arrived else self.done[pred])
        for signal, puts in behind.items():
            self.preds[self.arrive[signal]].update(self.arrive[put] for put in puts)
        spans = [(self.start[chain[0]], self.done[chain[-1]]) for chain in chains.values()]
        return self.preds, self.sends, spans

    def _action(self, preds: Iterable[int] = ()) -> int:
        self.preds.append(set(preds))
        return len(self.preds) - 1

    def _allocate(self, index: int, travels: bool) -> None:
        """Create event ``index``'s actions: one COMPUTE, or a SEND and RECV per flow with joins."""
        event, flows = self.graph.events[index], self.flows[index]
        if index in self.switch_of:  # one switch flow: done when its bytes are through the switch
            group, chunks = self.switch_of[index]
            action = self._action()
            reduces = event.name is OpName.MULTI_LOAD_REDUCE_STORE
            self.switches.append(PlannedSwitch(action, event.gpu, group, chunks, reduces))
            self.start[index] = self.done[index] = self.arrive[index] = action
            return
        if not flows:
            action = self._action()
            self.start[index] = self.done[index] = self.arrive[index] = action
            if travels:  # a signal behind puts arrives when they have
                self.arrive[index] = self._action((action,))
            return
        first = self._action() if len(flows) > 1 else None
        ends, arrivals = [], []
        for (src, dst), chunks in flows.items():
            send = self._action(() if first is None else (first,))
            recv = self._action((send,))
            # no connection FIFO: a put writes the peer's memory, paced by the plan's own signals
            self.sends.append(PlannedSend(send, src, dst, chunks, recv, (src, dst, -1 - send)))
            ends.append(send if src == event.gpu else recv)
            arrivals.append(recv)
            first = send if first is None else first
        if len(flows) == 1:
            self.start[index], self.done[index], self.arrive[index] = first, ends[0], arrivals[0]
        else:
            self.start[index], self.done[index], self.arrive[index] = first, self._action(ends), self._action(arrivals)

    def _signals(self, chains: dict[tuple[int, int], list[int]]) -> dict[int, list[int]]:
        """Return the signals that travel behind puts -> those puts; give every other waited-on signal a 0-byte flow."""
        successors: list[list[int]] = [[] for _ in self.graph.events]
        for index, preds in enumerate(self.graph.order):
            for pred in preds:
                successors[pred].append(index)
        behind: dict[int, list[int]] = {}
        for (gpu, _tb), chain in chains.items():
            pending: dict[int, list[int]] = defaultdict(list)  # peer -> puts to it since the last signal
            for position, index in enumerate(chain):
                for data in [index, *self.issues.get(index, ())]:
                    for src, dst in self.flows[data]:
                        if src == gpu:
                            pending[dst].append(data)
                if self.graph.events[index].name not in _SIGNALS:
                    continue
                signal = self.issues[index][0] if index in self.issues else index
                peers = {self.graph.events[w].gpu for w in successors[signal]} - {gpu}
                for peer in sorted(peers):
                    if not self._follows_put(chain, position, gpu, peer):
                        self.flows[signal][(gpu, peer)] = 0.0  # a flag alone: the route's α
                    behind.setdefault(signal, []).extend(pending.pop(peer, []))
        return behind

    def _follows_put(self, chain: list[int], position: int, gpu: int, peer: int) -> bool:
        """Return True when the op before ``chain[position]`` (past at most one nop) puts data to ``peer``."""
        before = position - 1
        if before >= 1 and self.graph.events[chain[before]].name is OpName.NOP:
            before -= 1
        if before < 0:
            return False
        previous = chain[before]
        return any((gpu, peer) in self.flows[data] for data in [previous, *self.issues.get(previous, ())])
