"""Compose the three stages into a verified algorithm for one collective and one chunking.

AllGather runs routing -> ordering -> scheduling on the logical graph. ReduceScatter runs them on
the reversed graph and turns the schedule around in time (``taccl_py.synth.lower_schedule``). AllReduce is
ReduceScatter followed by AllGather in one program, the reduced pieces of the first feeding the
second. Every algorithm is checked with ``check_algorithm`` before it is returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.synth.logical import LogicalGraph
from taccl_py.synth.lower_schedule import lower_schedule
from taccl_py.synth.ordering import order_sends
from taccl_py.synth.routing import route_candidates
from taccl_py.synth.scheduling import Schedule, schedule_sends
from taccl_py.synth.solver import SolverOptions
from taccl_py.synth.tree_packing import pack_trees, packed_routing
from taccl_py.verify import check_algorithm

__all__ = ["Chunking", "Candidate", "phase_graphs", "synthesize_chunking"]

logger = logging.getLogger(__name__)

# Share of a candidate's time budget the routing MILP gets; the contiguity MILP gets the rest.
ROUTING_TIME_SHARE = 0.8


@dataclass(frozen=True)
class Chunking:
    """How a candidate cuts the data: ``chunkup`` routed chunks per rank, ``pieces`` per chunk.

    ``design_bytes`` is the collective size the routes and orders are tuned for (the
    algorithm itself runs at any size).
    """

    chunkup: int
    pieces: int
    design_bytes: int

    @property
    def label(self) -> str:
        """Return a short name such as ``c2p4``."""
        return f"c{self.chunkup}p{self.pieces}"


@dataclass(frozen=True)
class Candidate:
    """A verified synthesized algorithm with how it was made."""

    algorithm: Algorithm
    chunking: Chunking
    schedules: tuple[Schedule, ...]
    routing_status: str
    wall_s: float


def phase_graphs(graph: LogicalGraph, collective: Collective) -> tuple[LogicalGraph, ...]:
    """Return the graphs the phases of ``collective`` route on: reversed for a reduction, both for AllReduce."""
    if collective is Collective.ALLGATHER:
        return (graph,)
    if collective is Collective.REDUCESCATTER:
        return (graph.reverse(),)
    return (graph.reverse(), graph)


def _schedule_phase(graph: LogicalGraph, chunking: Chunking, options: SolverOptions, budget_s: float) -> Schedule:
    """Return the fastest schedule over the candidate routings (contiguity MILP on the winner only)."""
    chunk_bytes = chunking.design_bytes / (graph.num_ranks * chunking.chunkup)
    piece_bytes = chunk_bytes / chunking.pieces
    # Packed trees carry the least load the graph allows; the MILP starts from them and weighs latency too.
    packed = packed_routing(pack_trees(graph), chunking.chunkup, chunk_bytes, piece_bytes)
    routings = route_candidates(
        graph, chunking.chunkup, chunk_bytes, piece_bytes, options, ROUTING_TIME_SHARE * budget_s, start=packed
    )
    orderings = [order_sends(routing, chunking.pieces, piece_bytes) for routing in routings]
    quick = [schedule_sends(ordering, options, milp=False) for ordering in orderings]
    best = min(range(len(quick)), key=lambda i: (quick[i].makespan_us, i))
    final = schedule_sends(orderings[best], options, (1 - ROUTING_TIME_SHARE) * budget_s)
    return final if final.makespan_us <= quick[best].makespan_us else quick[best]


def synthesize_chunking(
    graph: LogicalGraph,
    collective: Collective,
    chunking: Chunking,
    options: SolverOptions,
    budget_s: float,
    *,
    name: str,
    metadata: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Candidate:
    """Return the verified algorithm of ``collective`` for one chunking on ``graph``.

    ``budget_s`` (seconds) bounds the MILPs of all phases together. Raises
    ``VerificationError`` if the result is wrong (a bug, never expected).
    """
    began = time.perf_counter()
    phases = phase_graphs(graph, collective)
    schedules = []
    for index, phase_graph in enumerate(phases):
        if progress is not None:
            progress(
                f"{chunking.label}: routing, ordering, scheduling ({'reduce' if phase_graph.reversed else 'gather'} "
                "phase)"
            )
        schedules.append(_schedule_phase(phase_graph, chunking, options, budget_s / len(phases)))
    statuses = sorted({s.routing.status for s in schedules})
    meta = {
        "synthesizer": "taccl_py",
        "topology": graph.topology_name,
        "chunkup": str(chunking.chunkup),
        "pieces": str(chunking.pieces),
        "design_bytes": str(chunking.design_bytes),
        "routing": "+".join(statuses),
        "contiguity": "+".join(sorted({s.status for s in schedules})),
    }
    meta.update(metadata or {})
    algorithm = lower_schedule(name, collective, schedules, metadata=tuple(sorted(meta.items())))
    check_algorithm(algorithm)
    wall = time.perf_counter() - began
    logger.info(
        "%s %s: predicted %.1f us, routing %s, %.2f s",
        name,
        chunking.label,
        sum(s.makespan_us for s in schedules),
        "+".join(statuses),
        wall,
    )
    return Candidate(algorithm, chunking, tuple(schedules), "+".join(statuses), wall)
