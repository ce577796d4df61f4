"""Compose the three stages into a verified algorithm for one collective and one chunking.

AllGather runs routing -> ordering -> scheduling on the logical graph. ReduceScatter runs them on
the reversed graph and turns the schedule around in time (``taccl_py.stages.lower_schedule``). AllReduce is
ReduceScatter followed by AllGather in one program, the reduced pieces of the first feeding the
second; ``mixed_allreduce`` also pairs the reduce phase of one chunking with the gather phase of
another, since the best way to cut the data differs between the phases (on DGX-2, reducing
wants two chunks per rank where gathering wants one). ``gather_after_reduce`` lowers an
AllReduce again so that a rank gathers only once its reduction is done: the schedules assume the
phases do not overlap, and gather traffic sharing links with a reduction still under way can
slow the whole (DGX-2 x2 at 1 GB: 16.6 ms without, 15.9 ms with). Every algorithm is checked
with ``check_algorithm`` before it is returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from taccl_py.errors import ArgumentError, InfeasibleError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.msccl import check_msccl_limits
from taccl_py.msccl.limits import runtime_limits
from taccl_py.progress import heartbeat, no_progress, prefixed
from taccl_py.solvers import (
    BudgetBound,
    SolverOptions,
    budget_of_status,
    first_budget_bound,
    prepare_highs_threads,
)
from taccl_py.stages.hierarchy import hierarchical_routing, machine_packings, star_inside_machines
from taccl_py.stages.logical import LogicalGraph, phase_graphs
from taccl_py.stages.lower_schedule import busiest_threadblocks, lower_schedule
from taccl_py.stages.ordering import lacks_machine_rotation, order_sends
from taccl_py.stages.routing import Routing, route_candidates
from taccl_py.stages.scheduling import Schedule, schedule_sends
from taccl_py.stages.tree_packing import TreePacking, pack_trees, packed_routing
from taccl_py.verify import check_algorithm

__all__ = [
    "Chunking",
    "Candidate",
    "MAX_ROUTED_CHUNKS",
    "PhaseStarts",
    "composed_only",
    "gather_after_reduce",
    "mixed_allreduce",
    "phase_starts",
    "synthesize_chunking",
]

logger = logging.getLogger(__name__)

# Cap on routed chunks (ranks x chunkup) so that the routing MILP stays small; past it, routes are composed.
MAX_ROUTED_CHUNKS = 128


@dataclass(frozen=True)
class Chunking:
    """How a candidate cuts the data: ``chunkup`` routed chunks per rank, ``pieces`` per chunk.

    ``design_bytes`` is the collective size the routes and orders are tuned for (the
    algorithm itself runs at any size); ``pipelined_sends`` orders sends for the simulator's
    pipelined model (``taccl_py.simulate.model``) instead of serialized sends,
    ``pipelined_internode`` only the sends between machines (``msccl-net``).
    """

    chunkup: int
    pieces: int
    design_bytes: int
    pipelined_sends: bool = False
    pipelined_internode: bool = False

    @property
    def label(self) -> str:
        """Return a short name such as ``c2p4``."""
        return f"c{self.chunkup}p{self.pieces}"


@dataclass(frozen=True)
class Candidate:
    """A verified synthesized algorithm with how it was made.

    ``budget_bound`` names the budget that stopped one of its MILPs before it proved its gap:
    the node limit (reproducible) or the wall-clock cap (may differ run to run); None: none did.
    """

    algorithm: Algorithm
    chunking: Chunking
    schedules: tuple[Schedule, ...]
    routing_status: str
    wall_s: float
    budget_bound: BudgetBound | None = None
    phase_barrier: bool = False

    @property
    def label(self) -> str:
        """Return how the phases cut the data (``c2p4``, or ``c2p4+c1p8`` when they differ), ``-barrier`` appended."""
        labels = _joined(f"c{s.routing.chunkup}p{s.ordering.pieces}" for s in self.schedules)
        return labels + ("-barrier" if self.phase_barrier else "")


def _joined(values: Iterable[object]) -> str:
    """Return distinct values in order joined by ``+``: ``2`` for both phases alike, ``2+1`` when they differ."""
    return "+".join(dict.fromkeys(str(v) for v in values))


def _schedule_metadata(schedules: Sequence[Schedule]) -> dict[str, str]:
    """Return how the phases were cut and how their routing and contiguity MILPs ended."""
    return {
        "chunkup": _joined(s.routing.chunkup for s in schedules),
        "pieces": _joined(s.ordering.pieces for s in schedules),
        "routing": "+".join(sorted({s.routing.status for s in schedules})),
        "contiguity": "+".join(sorted({s.status for s in schedules})),
    }


@dataclass(frozen=True)
class PhaseStarts:
    """The tree packings every chunking of one phase starts from, computed once per synthesis.

    ``graph``: the phase graph's (``pack_trees``; None where routes are only composed, ``composed_only``);
    ``machines``: each kind of machine's own links' (``machine_packings``), the hierarchical designs' starts.
    """

    graph: TreePacking | None
    machines: Mapping[int, TreePacking]


def composed_only(graph: LogicalGraph, chunkup: int) -> bool:
    """Return True when ``chunkup`` chunks per rank are too many to route on the whole graph, and machines compose.

    Past ``MAX_ROUTED_CHUNKS`` the synthesizer routes hierarchically only: one machine's design,
    solved once per kind of machine and replicated, and a greedy network exchange between them
    (``hierarchical_routing``), as SyCCL composes one machine's and one rail's sub-problems.
    That needs several machines of several GPUs each.
    """
    machines = graph.num_ranks // graph.gpus_per_node
    return graph.num_ranks * chunkup > MAX_ROUTED_CHUNKS and machines >= 2 and graph.gpus_per_node >= 2


def phase_starts(
    graph: LogicalGraph, collective: Collective, progress: Callable[[str], None] | None = None
) -> tuple[PhaseStarts, ...]:
    """Return the ``PhaseStarts`` of each of ``phase_graphs(graph, collective)``."""
    return tuple(
        PhaseStarts(None if composed_only(phase, 1) else pack_trees(phase, progress=progress), machine_packings(phase))
        for phase in phase_graphs(graph, collective)
    )


def _phase_fits_msccl(schedule: Schedule) -> bool:
    """Return True when ``schedule`` lowered alone (AllGather, or ReduceScatter if reversed) fits MSCCL's limits."""
    collective = Collective.REDUCESCATTER if schedule.routing.graph.reversed else Collective.ALLGATHER
    # Lowering a 256-GPU phase takes seconds; a routing over the threadblock limit is refused without it.
    if busiest_threadblocks(schedule) > runtime_limits().max_threadblocks_per_gpu:
        logger.debug("routing %s needs more threadblocks per GPU than MSCCL allows", schedule.routing.status)
        return False
    try:
        check_msccl_limits(lower_schedule("phase", collective, [schedule]))
    except ArgumentError as error:
        logger.debug("routing %s does not fit MSCCL: %s", schedule.routing.status, error)
        return False
    return True


def _schedule_phase(
    graph: LogicalGraph,
    chunking: Chunking,
    options: SolverOptions,
    cap_s: float | None = None,
    starts: PhaseStarts | None = None,
    progress: Callable[[str], None] | None = None,
    machines_differ: bool = False,
) -> tuple[Schedule, frozenset[str]]:
    """Return the fastest schedule over the candidate routings that MSCCL can load (contiguity MILP on the winner).

    When no routing's phase fits MSCCL's limits, the fastest is returned all the same.

    Also returns how the phase's MILPs ended (routing and contiguity statuses), whichever routing
    won. Each MILP has its own node budget (``options``); ``cap_s`` (s) is what is left of the
    wall-clock safety cap for this phase's MILPs (default ``options.time_limit_s``). ``starts``
    are the phase's tree packings when the caller has them already. ``progress`` gets a line per step
    and, inside the long ones (MILPs, ordering), one every few seconds. ``machines_differ``: the
    topology's machines are not copies of one another (``machines_alike``), also where the graph
    hides it (a NIC down on one machine, its rail left out on all).
    """
    say = progress if progress is not None else no_progress
    deadline = time.monotonic() + (cap_s if cap_s is not None else options.time_limit_s)
    chunk_bytes = chunking.design_bytes / (graph.num_ranks * chunking.chunkup)
    piece_bytes = chunk_bytes / chunking.pieces
    # Packed trees carry the least load the graph allows; hierarchical routes reuse one machine's
    # MILP design on every machine. The whole-graph MILP starts from the better and weighs latency too.
    if starts is None:
        packing = None if composed_only(graph, chunking.chunkup) else pack_trees(graph)
        starts = PhaseStarts(packing, machine_packings(graph))
    hierarchical = hierarchical_routing(
        graph,
        chunking.chunkup,
        chunk_bytes,
        piece_bytes,
        options,
        deadline - time.monotonic(),
        progress=progress,
        packings=starts.machines,
    )
    if composed_only(graph, chunking.chunkup):
        if hierarchical is None:
            raise InfeasibleError(
                f"{graph.topology_name}: routing: machines that do not compose; expected alike machines"
            )
        routings: tuple[Routing, ...] = (hierarchical,)
    else:
        packed = packed_routing(starts.graph, chunking.chunkup, chunk_bytes, piece_bytes)
        start_routes = [r for r in (packed, hierarchical) if r is not None]
        start = min(start_routes, key=lambda r: r.objective_us)
        routings = route_candidates(
            graph,
            chunking.chunkup,
            chunk_bytes,
            piece_bytes,
            options,
            deadline - time.monotonic(),
            start=start,
            progress=progress,
        )
        routings += tuple(r for r in start_routes if all(r.trees != other.trees for other in routings))
    differ = machines_differ or lacks_machine_rotation(graph)
    if differ:
        # Machines that differ: the slowest machine's NICs bind, and a piece one of them lands
        # must reach the rest of its machine before the next lands; one NVSwitch hop from
        # where it enters keeps up where a path inside the machine falls behind.
        stars = (star_inside_machines(r, chunk_bytes, piece_bytes) for r in routings)
        routings += tuple(r for r in stars if r is not None)
    say(f"ordering and scheduling {len(routings)} routings, {chunking.pieces} pieces per chunk")
    send_timing = {"pipelined": chunking.pipelined_sends, "pipelined_internode": chunking.pipelined_internode}
    orderings = [
        order_sends(routing, chunking.pieces, piece_bytes, progress=progress, **send_timing) for routing in routings
    ]
    if differ:
        # Machines that differ: no one priority rule orders every routing well; keep the faster.
        # Unchained, a NIC takes several senders at once and hides each send's α behind another's
        # bytes (DGX-A100 x2 + DGX-H100 x2 AllGather at 64 MB: 0.78 -> 0.86 of the bound).
        orderings += [
            order_sends(routing, chunking.pieces, piece_bytes, progress=progress, **send_timing, **variant)
            for variant in ({"busiest_first": True}, {"chain_hops": False})
            for routing in routings
        ]
    quick = [schedule_sends(ordering, options, milp=False) for ordering in orderings]
    ranked = sorted(range(len(quick)), key=lambda i: (quick[i].makespan_us, i))
    # A library band takes only what the MSCCL runtimes load, so a routing whose phase breaks their
    # limits (greedy routes on 64 GPUs can need 100 steps in one threadblock) would sink the candidate.
    best = next((i for i in ranked if _phase_fits_msccl(quick[i])), ranked[0])
    final = schedule_sends(orderings[best], options, deadline - time.monotonic(), progress=progress)
    solves = (routings[0].solve_status, hierarchical.solve_status if hierarchical else None, final.solve_status)
    statuses = frozenset(status for status in solves if status is not None)
    return (final if final.makespan_us <= quick[best].makespan_us else quick[best]), statuses


def synthesize_chunking(
    graph: LogicalGraph,
    collective: Collective,
    chunking: Chunking,
    options: SolverOptions,
    cap_s: float | None = None,
    *,
    name: str,
    metadata: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    starts: Sequence[PhaseStarts] | None = None,
    machines_differ: bool = False,
) -> Candidate:
    """Return the verified algorithm of ``collective`` for one chunking on ``graph``.

    Every MILP runs to its own node budget (``options``), so the result does not depend on the
    machine's load; ``cap_s`` (s) is what is left of the wall-clock safety cap for all phases
    (default ``options.time_limit_s``). ``starts`` are ``phase_starts(graph, collective)``,
    shared by a synthesis's candidates (default: packed here); ``machines_differ`` as in
    ``_schedule_phase``. Raises ``VerificationError`` if the result is wrong (a bug, never expected).
    """
    began = time.perf_counter()
    deadline = time.monotonic() + (cap_s if cap_s is not None else options.time_limit_s)
    # HiGHS's thread pool outlives a candidate; size it for this one (tree packing runs on it first).
    prepare_highs_threads(options.threads)
    phases = phase_graphs(graph, collective)
    starts = starts if starts is not None else [None] * len(phases)
    schedules, solve_statuses = [], set()
    for phase_graph, phase_start in zip(phases, starts, strict=True):
        phase = "reduce" if phase_graph.reversed else "gather"
        if progress is not None:
            progress(f"{chunking.label}: routing, ordering, scheduling ({phase} phase)")
        schedule, statuses = _schedule_phase(
            phase_graph,
            chunking,
            options,
            deadline - time.monotonic(),
            phase_start,
            prefixed(progress, f"{chunking.label} {phase}: "),
            machines_differ,
        )
        schedules.append(schedule)
        solve_statuses |= statuses
    capped = BudgetBound.WALL_CLOCK_CAP if time.monotonic() >= deadline else None
    bound = first_budget_bound([capped, *(budget_of_status(status) for status in solve_statuses)])
    phase_meta = _schedule_metadata(schedules)
    meta = {
        "synthesizer": "taccl_py",
        "topology": graph.topology_name,
        "design_bytes": str(chunking.design_bytes),
        **phase_meta,
        **(metadata or {}),
    }
    algorithm = lower_schedule(name, collective, schedules, metadata=tuple(sorted(meta.items())))
    if progress is not None:
        steps = sum(len(tb.steps) for program in algorithm.ranks for tb in program.threadblocks)
        progress(f"{chunking.label}: verifying {name} ({steps} steps on {algorithm.num_ranks} ranks)")
    with heartbeat(progress, f"{chunking.label}: verifying"):
        check_algorithm(algorithm)
    wall = time.perf_counter() - began
    logger.info(
        "%s %s: predicted %.1f us, routing %s, %.2f s",
        name,
        chunking.label,
        sum(s.makespan_us for s in schedules),
        phase_meta["routing"],
        wall,
    )
    return Candidate(algorithm, chunking, tuple(schedules), phase_meta["routing"], wall, bound)


def mixed_allreduce(reduce: Candidate, gather: Candidate, name: str) -> Candidate:
    """Return the verified AllReduce of ``reduce``'s reduce phase followed by ``gather``'s gather phase.

    Both must be AllReduce candidates for the same graph and design size; their chunkings may
    differ (``lower_schedule`` cuts the buffer into the finer of the two).
    """
    schedules = (reduce.schedules[0], gather.schedules[1])
    meta = {**dict(reduce.algorithm.metadata), **_schedule_metadata(schedules)}
    algorithm = lower_schedule(name, Collective.ALLREDUCE, schedules, metadata=tuple(sorted(meta.items())))
    check_algorithm(algorithm)
    bound = first_budget_bound([reduce.budget_bound, gather.budget_bound])
    return Candidate(algorithm, reduce.chunking, schedules, meta["routing"], 0.0, bound)


def gather_after_reduce(candidate: Candidate, name: str) -> Candidate:
    """Return the AllReduce ``candidate`` lowered again with each rank's gather waiting for its reduction; verified."""
    metadata = tuple(sorted({**dict(candidate.algorithm.metadata), "phase_barrier": "rank"}.items()))
    algorithm = lower_schedule(name, Collective.ALLREDUCE, candidate.schedules, metadata=metadata, phase_barrier=True)
    check_algorithm(algorithm)
    return replace(candidate, algorithm=algorithm, phase_barrier=True)
