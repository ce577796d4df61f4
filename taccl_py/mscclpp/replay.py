"""Verify an MSCCL++ execution plan by symbolic replay with the executor's semantics.

Every op becomes an event (a pipeline's body once per modelled iteration), and events are joined
by two relations. *Order* says what must finish before an event can run: program order (per
thread, below); the k-th ``wait`` on a channel after the k-th ``signal`` (relaxed or not) on the
peer's paired channel (channels pair in order: the m-th channel of GPU a to b with the m-th of b
to a); the n-th ``sem_acquire`` after release n - init; a ``barrier`` round after all its
threadblocks arrive; a packet read after the one packet write of its location (the LL flag).
*Visibility* is order without relaxed signals and waits and without packet edges: a fence-less
signal or a packet's flag orders, but publishes no other data. A port-channel put is a proxy
write after its issue, chained in order with the channel's later port signals; ``flush`` waits for it
on as many channels as it has ``dst_buff`` entries (none without one, as the executor counts).
A port ``rppkt``'s proxy copies packets raw after every thread saw their flags, so it reads them
after their write as a packet read does.

Program order is per thread. The executor runs a control op's ids one per thread with no
``__syncthreads`` (``if (tid < n)`` in ``handleWait``, ``handleSemAcquire``, ``handleFlush``,
``handleSignal``, ``handleSemRelease`` and a port put; execution_kernel.hpp): thread 0 runs the
first id as the op's event, and thread k runs the k-th as an event of its own, after its own last
event or else the last sync, so a ``wait`` on several channels or a ``sem_acquire`` of several
semaphores holds up only thread 0 for the first, and a signal, release or port put of thread k
carries none of thread 0's gates. ``nop`` (``__syncthreads``), ``barrier`` and a port ``rppkt``
(between its flag reads and its puts) join every thread. Data ops run on every thread and are taken
as one event after thread 0's, so a data op right after a gate, or thread 0's signal, release or
put right after a data op, with no ``nop`` between, is taken as ordered though the executor does
not order it.

A plan is refused (``Violation`` records) when events wait for ever (an unmatched wait, barrier
or packet, or a cycle: ``deadlock``), when two accesses to a location, one a write, are not
ordered by visibility (``race``: a read that can come too early, or a write over data still
being read), when an op reads a location nothing wrote, or when a rank's output does not hold
the collective's postcondition. Buffers are split into slices so that thread-block groups
(``tbg_info``) and ``pipeline_iterations`` pipeline iterations touch exact parts of chunks.

A channel or semaphore several threadblocks (or threads of one) share matches in the order the plan forces on
their uses (a threadblock cut in pieces chained by a semaphore); where no order is forced, which
wait meets which signal depends on timing, and the plan is refused as not modelled. Scratch
reuse across pipeline iterations (``reuse_resources``) and packet and plain data in overlapping
scratch bytes are taken as separate storage.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

from taccl_py.errors import ArgumentError, VerificationError, Violation
from taccl_py.ir.collectives import ChunkLayout, Collective, chunk_layout, expected_output, initial_value
from taccl_py.mscclpp.event_order import reaching_pairs, topological_order
from taccl_py.mscclpp.plan import BufferKind, ExecutionPlan, OpName
from taccl_py.mscclpp.replay_graph import (
    DEFAULT_PIPELINE_ITERATIONS,
    Location,
    ReplayBuilder,
    ReplayGraph,
    all_ops,
    describe_location,
    violation_at,
)
from taccl_py.verify.replay import VerificationReport, describe_value

__all__ = ["mscclpp_report", "check_mscclpp_plan", "verify_mscclpp_plan", "DEFAULT_PIPELINE_ITERATIONS"]

logger = logging.getLogger(__name__)


def verify_mscclpp_plan(plan: ExecutionPlan, pipeline_iterations: int = DEFAULT_PIPELINE_ITERATIONS) -> None:
    """Return None when ``plan`` implements its collective; raise ``VerificationError`` naming the first fault.

    The message names the GPU (``rank``), threadblock and op index (``step``) of the fault.
    """
    problems = check_mscclpp_plan(plan, pipeline_iterations)
    if problems:
        raise VerificationError(plan.name, problems)


def check_mscclpp_plan(plan: ExecutionPlan, pipeline_iterations: int = DEFAULT_PIPELINE_ITERATIONS) -> list[Violation]:
    """Return every fault of ``plan`` found by symbolic replay (empty when it is correct)."""
    try:
        collective = Collective(plan.collective)
    except ValueError:
        return [Violation("unsupported", f"collective {plan.collective!r} has no postcondition here")]
    if collective is Collective.ALLTOALL and plan.inplace:
        return [Violation("unsupported", "in-place alltoall has no postcondition here")]
    gpu0 = plan.gpus[0]
    per_loop = {Collective.ALLGATHER: gpu0.output_chunks}.get(collective, max(gpu0.input_chunks, gpu0.output_chunks))
    try:
        layout = chunk_layout(collective, len(plan.gpus), per_loop)
    except ArgumentError as exc:
        return [Violation("layout", f"{per_loop} chunks per rank: {exc.fault}")]
    for gpu in plan.gpus:
        outputs = (layout.output_chunks, 0) if plan.inplace else (layout.output_chunks,)
        if gpu.input_chunks != layout.input_chunks or gpu.output_chunks not in outputs:
            message = (
                f"GPU {gpu.id} has {gpu.input_chunks} input and {gpu.output_chunks} output chunks; "
                f"{collective.value} over {len(plan.gpus)} GPUs needs {layout.input_chunks} and "
                f"{layout.output_chunks}"
            )
            return [Violation("layout", message, rank=gpu.id)]
    has_pipeline = any(op.name is OpName.PIPELINE for gpu in plan.gpus for tb in gpu.threadblocks for op in tb.ops)
    groups = [op.tbg.tbg_size for gpu in plan.gpus for tb in gpu.threadblocks for op in all_ops(tb.ops) if op.tbg]
    iterations = pipeline_iterations if has_pipeline else 1
    slices = iterations * math.lcm(1, *groups)
    builder = ReplayBuilder(plan, slices, iterations)
    graph = builder.build()
    if graph.problems:
        return graph.problems
    order = topological_order(graph.order, lambda node: graph.events[node].blocked is None)
    logger.debug("%s: %d events, %d slices per chunk", plan.name, len(graph.events), slices)
    if len(order) < len(graph.events):
        return [_deadlock(graph, set(order))]
    races = _races(graph, order)
    if races:
        return races
    return _replay_values(plan, layout, builder, graph, order)


def _deadlock(graph: ReplayGraph, done: set[int]) -> Violation:
    """Return the deadlock: an event waiting for something that never comes, else a cycle of waits."""
    stuck = [n for n in range(len(graph.events)) if n not in done]
    for node in stuck:
        event = graph.events[node]
        if event.blocked is not None and all(p in done for p in graph.order[node]):
            return violation_at(event, "deadlock", event.blocked)
    seen: dict[int, int] = {}
    node = stuck[0]
    while node not in seen:
        seen[node] = len(seen)
        node = next(p for p in graph.order[node] if p not in done)
    cycle = [n for n, _ in sorted(seen.items(), key=lambda item: item[1])][seen[node] :]
    labels = [graph.events[n].label for n in reversed(cycle) if graph.events[n].tb is not None]
    unique = list(dict.fromkeys(labels))
    return violation_at(graph.events[node], "deadlock", "a cycle of waits: " + " -> ".join(unique))


def _races(graph: ReplayGraph, order: list[int]) -> list[Violation]:
    """Return unordered conflicting accesses to one location (first per location).

    A read of data (or two writes) needs visibility between the two; a write after a read needs
    only order, since the read's value was used before anything that follows it could happen.

    Notes
    -----
    Every pair of accesses to a location, one a write, is judged in the order of the accesses
    (events in ``order``, an event's reads before its writes), and the first pair that fails is the
    location's fault, as when every event's full ancestor set was built. Whether the earlier event
    reaches the later one comes from ``reaching_pairs``, the same sweep of ancestor bit sets in
    ``order`` with bits only for events some pair asks about as the earlier, each set dropped once
    its successors have taken it in: bits nobody asks about and sets nobody reads again change no
    answer, so verdicts and messages are unchanged, at O(edges x accessing events / 64) word
    operations and memory for the live sets, not O(events^2) bits.
    """
    accesses: dict[Location, list[tuple[int, bool]]] = defaultdict(list)
    for node in order:
        for dst_locs, sources in graph.events[node].writes:
            for loc in (loc for locs in sources for loc in locs):
                accesses[loc].append((node, False))
            for loc in dst_locs:
                accesses[loc].append((node, True))
    pairs = {(early, late) for items in accesses.values() for early, late, _ in _conflicts(items)}
    seen_by = reaching_pairs(graph.visible, order, pairs)
    after = reaching_pairs(graph.order, order, pairs)
    problems = []
    for loc, items in accesses.items():
        writers = {node for node, writes in items if writes}
        for early, late, late_writes in _conflicts(items):
            relation = after if late_writes and early not in writers else seen_by
            packet_edge = loc[3] and early in graph.order[late] and not late_writes
            if (early, late) in relation or packet_edge:
                continue
            other = graph.events[early].label
            if late_writes:
                message = f"writes {describe_location(loc)} while {other} may still use it"
            else:
                message = f"reads {describe_location(loc)} before it is guaranteed written by {other}"
            problems.append(violation_at(graph.events[late], "race", message))
            break
    # A read that can come too early is the more telling fault; it goes first.
    return sorted(problems, key=lambda problem: "reads " not in problem.message)


def _conflicts(items: list[tuple[int, bool]]):
    """Yield (earlier, later, later writes) for access pairs of different events, one a write.

    ``items`` lists a location's accesses in the order of their events, so the first is the earlier.
    """
    for i, (first, first_writes) in enumerate(items):
        for second, second_writes in items[i + 1 :]:
            if first != second and (first_writes or second_writes):
                yield first, second, second_writes


def _replay_values(
    plan: ExecutionPlan, layout: ChunkLayout, builder: ReplayBuilder, graph: ReplayGraph, order: list[int]
) -> list[Violation]:
    """Replay the writes in ``order`` and return where a read finds nothing or an output is wrong."""
    values: dict[Location, tuple] = {}
    for gpu in plan.gpus:
        for chunk in range(layout.input_chunks):
            for part in range(builder.slices):
                values[builder.canonical(gpu.id, BufferKind.INPUT, chunk * builder.slices + part)] = initial_value(
                    gpu.id, chunk
                )
    problems = []
    for node in order:
        event, results = graph.events[node], {}
        # Every source is read before any destination is written: an op reads, reduces, then stores.
        for dst_locs, sources in event.writes:
            for j, loc in enumerate(dst_locs):
                parts = [values.get(locs[j]) for locs in sources]
                if any(part is None for part in parts):
                    empty = next(locs[j] for locs in sources if values.get(locs[j]) is None)
                    problems.append(
                        violation_at(event, "uninitialized read", f"reads {describe_location(empty)}, never written")
                    )
                    return problems
                results[loc] = tuple(sorted(pair for part in parts for pair in part))
        values.update(results)
    for gpu in plan.gpus:
        for chunk in range(layout.output_chunks):
            want = expected_output(layout, gpu.id, chunk)
            for part in range(builder.slices):
                got = values.get(builder.canonical(gpu.id, BufferKind.OUTPUT, chunk * builder.slices + part))
                if got != want:
                    kind = "missing chunk" if got is None else "wrong result"
                    problems.append(
                        Violation(
                            kind,
                            f"GPU {gpu.id} output chunk {chunk} holds {describe_value(got)}; "
                            f"expected {describe_value(want)}",
                            rank=gpu.id,
                            chunk=chunk,
                        )
                    )
                    break
    return problems


def mscclpp_report(plan: ExecutionPlan) -> VerificationReport:
    """Return the verdict on ``plan`` as ``taccl verify`` reports an algorithm's (no replay rounds: ``rounds`` 0)."""
    violations = tuple(check_mscclpp_plan(plan))
    return VerificationReport(plan.name, not violations, violations, 0)
