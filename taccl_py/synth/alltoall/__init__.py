"""AlltoAll synthesis: LP routing over direct and NIC-relay paths, aggregation, lowering, verification.

``alltoall_candidates`` routes the N² blocks twice with the LP of ``routing`` (once
free to send across machines directly or through a GPU next to any NIC, once through one rail's
NIC relays per destination only, which keeps a GPU's peers and so its threadblocks few enough
for MSCCL at 64 GPUs), cuts blocks into ``PIECES`` where the LP splits a class over paths or
relays inside a machine, lowers each routing with and without ``split_own`` (``plan``),
verifies every one, keeps those within the MSCCL limits and simulates them at every size.
``synthesize`` then takes, per size, the fastest of these and the baselines (``direct``,
``hierarchical``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from taccl_py.bounds import LowerBound, lower_bounds
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel, SimulationResult
from taccl_py.solvers import (
    BudgetBound,
    SolverOptions,
    budget_of_status,
    first_budget_bound,
    prepare_highs_threads,
)
from taccl_py.stages.sketch.model import Sketch
from taccl_py.synth.alltoall.plan import alltoall_algorithm
from taccl_py.synth.alltoall.routing import AlltoallRouting, PathKind, round_routing, route_alltoall
from taccl_py.synth.candidates import exportable, simulate_at
from taccl_py.synth.outcome import (
    SynthesisResult,
    best_baselines_per_size,
    choose_bands,
    library_of,
    synthesis_provenance,
)
from taccl_py.topology.model import Topology

__all__ = ["PIECES", "AlltoallCandidate", "alltoall_candidates", "synthesize_alltoall"]

logger = logging.getLogger(__name__)

# Pieces per block tried where the LP splits a class over several paths or relays blocks inside
# a machine (relayed pieces there go one by one, so more pieces pipeline the two hops).
PIECES = (1, 2, 4, 8)


@dataclass(frozen=True)
class AlltoallCandidate:
    """A verified synthesized AlltoAll, its simulated results per size and how it was made.

    ``routing_status`` is the routing LP's ``SolveStatus`` value; ``design_bytes`` the size the
    LP was solved for.
    """

    algorithm: Algorithm
    results: tuple[SimulationResult, ...]
    label: str
    routing_status: str
    design_bytes: int


def _design_bytes(sizes: Sequence[int]) -> int:
    """Return the size the routing LP is solved for: the geometric middle of the sizes asked for."""
    return int(round(math.sqrt(min(sizes) * max(sizes))))


def _variants(routing: AlltoallRouting) -> list[int]:
    """Return the piece counts worth lowering ``routing`` with: every one where a block is relayed inside
    a machine, else those whose rounding differs."""
    local_relays = any(
        share > 0 and kind is PathKind.LOCAL_RELAY
        for path_class, shares in zip(routing.classes, routing.shares)
        for kind, share in zip(path_class.kinds, shares)
    )
    if local_relays:
        return list(PIECES)
    out: dict[tuple, int] = {}
    for pieces in PIECES:
        counts = round_routing(routing, pieces)
        fractions = tuple(tuple(c / pieces for c in row) for row in counts)
        out.setdefault(fractions, pieces)
    return sorted(out.values())


def alltoall_candidates(
    topology: Topology,
    sizes: Sequence[int],
    bounds: Sequence[LowerBound],
    options: SolverOptions | None = None,
    progress: Callable[[str], None] | None = None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> list[AlltoallCandidate]:
    """Return the verified synthesized AlltoAll candidates for ``topology``, simulated at ``sizes`` (bytes).

    Parameters
    ----------
    topology : Topology
        Two or more GPUs; across machines the relays come from ``alltoall_relays``.
    sizes : sequence of int
        nccl-tests sizes (bytes per rank's buffer); the LP is solved at their geometric middle.
    bounds : sequence of LowerBound
        The AlltoAll bound at each size (``lower_bounds(topology, "alltoall", sizes)``).
    options : SolverOptions, optional
        The LP's solver; an LP needs no work budget, so the result is the same on every run.
    progress : callable, optional
        Gets one line per stage.
    model : ExecutionModel
        The execution model the candidates are simulated under (default MSCCL's slice loop).

    Returns
    -------
    list of AlltoallCandidate
        In a fixed order; identical schedules appear once. Only those that fit every MSCCL
        runtime's limits (``exportable``: threadblocks, steps) are kept, unless none does.

    Notes
    -----
    The LP has one column per (path class, path kind): G² classes per pair of machine kinds
    times at most 4 kinds, whatever the node count. Lowering and verification are linear in
    the transfers (N² blocks); simulation dominates at 64 GPUs (about a second per size).
    """
    design = _design_bytes(sizes)
    made = _lowered(topology, design, options, progress)
    fitting = [entry for entry in made if exportable(entry[0])]
    if not fitting:
        logger.warning("%s: no synthesized AlltoAll fits the MSCCL limits; keeping them all", topology.name)
    found = []
    for algorithm, label, status in fitting or made:
        if progress is not None:
            progress(f"{label}: verified; simulating")
        results = simulate_at(algorithm, topology, sizes, bounds, progress, model)
        found.append(AlltoallCandidate(algorithm, results, label, status, design))
    return found


def _lowered(
    topology: Topology, design: int, options: SolverOptions | None, progress: Callable[[str], None] | None
) -> list[tuple[Algorithm, str, str]]:
    """Return each distinct verified lowering of the LP routings at ``design`` bytes, with its label and LP status."""
    found: list[tuple[Algorithm, str, str]] = []
    seen: set[tuple] = set()
    for direct in (True, False) if topology.nodes > 1 else (True,):
        tag = "lp" if direct else "relay"
        if progress is not None:
            progress(f"alltoall routing LP ({tag}) at {design} B")
        routing = route_alltoall(topology, design, options, direct=direct, progress=progress)
        for pieces in _variants(routing):
            for split_own in (True, False):
                label = f"{tag}-p{pieces}-{'split' if split_own else 'gather'}"
                name = f"taccl-alltoall-{topology.name}-{label}-d{design}"
                metadata = (("routing", tag), ("pieces", str(pieces)), ("topology", topology.name))
                algorithm = alltoall_algorithm(
                    topology, routing, pieces, split_own=split_own, name=name, metadata=metadata
                )
                if algorithm.ranks not in seen:
                    seen.add(algorithm.ranks)
                    found.append((algorithm, label, routing.status))
    return found


def synthesize_alltoall(
    topology: Topology,
    sizes: tuple[int, ...],
    banded: bool,
    sketch: Sketch,
    options: SolverOptions,
    progress: Callable[[str], None] | None,
    began: float,
    model: ExecutionModel = DEFAULT_MODEL,
) -> SynthesisResult:
    """Return the AlltoAll synthesis: the LP-routed candidates against the baselines, per size, under ``model``.

    ``synthesize`` calls it for alltoall; ``began`` is its start (``time.perf_counter``). The
    sketch only names the result: AlltoAll's routes come from the topology's NIC relays.
    """
    bounds = lower_bounds(topology, Collective.ALLTOALL, sizes)
    prepare_highs_threads(options.threads)
    candidates = alltoall_candidates(topology, sizes, bounds, options, progress, model)
    baselines = best_baselines_per_size(topology, Collective.ALLTOALL, sizes, options, banded, progress, model)
    everything = [(candidate.algorithm, candidate.results) for candidate in candidates]
    choices, best_at_top = choose_bands(sizes, banded, everything, baselines)
    budget_bound = first_budget_bound(budget_of_status(c.routing_status) for c in candidates)
    library = None
    if banded:
        library = library_of(topology, Collective.ALLTOALL, sizes, sketch, options, choices, budget_bound, model)
    return SynthesisResult(
        best_at_top,
        Collective.ALLTOALL,
        topology.name,
        sketch,
        choices,
        library,
        tuple(f"{c.label}@{c.design_bytes}:{c.routing_status}" for c in candidates),
        budget_bound is BudgetBound.WALL_CLOCK_CAP,
        time.perf_counter() - began,
        budget_bound,
        synthesis_provenance(sizes, sketch, options, budget_bound, model),
    )
