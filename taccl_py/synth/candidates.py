"""Candidate chunkings and their evaluation under the simulator.

Which chunking wins depends on the size: below a few latencies' worth of bandwidth time one
piece per rank on the shallowest trees wins (every extra transfer costs α); above, routes must
pack bandwidth (more chunks per rank spread a rank's data over more trees) and pipeline (more
pieces shorten the fill and drain of every tree). ``candidate_chunkings`` proposes a handful per
regime; each is synthesized (``synthesize_chunking``) and simulated, and the fastest is kept.

Under a model that runs the program once per slice (MSCCL's loop, ``taccl_py.simulate.model``), a
chunk that spans several slices is already pipelined by the runtime's loop: pieces then only
deepen the chain every pass pays, so chunkings of one piece are tried first there.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from taccl_py.bounds import LowerBound
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.progress import ProgressTicker, heartbeat
from taccl_py.simulate import (
    DEFAULT_MODEL,
    ExecutionModel,
    SimulationResult,
    prepare_simulation,
    simulate_plan,
)
from taccl_py.simulate.model import slice_sizes
from taccl_py.simulate.protocol import SIMPLE
from taccl_py.stages.logical import LogicalGraph
from taccl_py.synth.compose import MAX_ROUTED_CHUNKS, Chunking, composed_only
from taccl_py.topology.model import Topology

__all__ = [
    "LATENCY_REGIME",
    "BANDWIDTH_REGIME",
    "MAX_ROUTED_CHUNKS",
    "candidate_chunkings",
    "simulate_at",
    "exportable",
    "band_writable",
    "geometric_middle",
]

logger = logging.getLogger(__name__)

# Regimes by the ratio of the bound's bandwidth term to its latency floor.
LATENCY_REGIME = 4.0  # below: latency-bound, one piece per rank
BANDWIDTH_REGIME = 64.0  # above: bandwidth-bound, pipelined
# (chunkup, pieces) tried per regime, in order of preference; duplicates are dropped.
_LATENCY_CHUNKINGS = ((1, 1),)
_MIDDLE_CHUNKINGS = ((1, 1), (1, 2), (2, 1))
_BANDWIDTH_CHUNKINGS = ((1, 2), (1, 4), (2, 2), (2, 4), (1, 8))
# One machine without a switch (NVLink meshes): more routed chunks spread each rank's data over
# links of unequal bandwidth. TACCL's NDv2 sketch uses input_chunkup 6, but a loop of 6 chunks per
# rank never divides the power-of-two counts users pass, so MSCCL would never select it.
_MESH_CHUNKINGS = ((2, 1), (4, 1), (4, 2), (8, 1))
# Cap on the piece sends of a composed candidate (ranks² x pieces, an AllGather's count), which every later
# stage (ordering, lowering, verification, simulation) walks: 512 GPUs take one and two pieces per chunk
# (AllReduce, two phases: one piece at 512 GPUs, up to four at 256).
MAX_COMPOSED_SENDS = 2**19
# One piece per chunk, tried first where the runtime's slice loop pipelines each chunk itself.
_SLICED_CHUNKINGS = ((1, 1), (2, 1), (4, 1))


def _is_mesh(graph: LogicalGraph) -> bool:
    """Return True for one machine whose logical links are direct (no switch, no network)."""
    return graph.num_ranks == graph.gpus_per_node and all(len(link.resources) == 1 for link in graph.links)


def candidate_chunkings(
    graph: LogicalGraph,
    collective: Collective,
    bound: LowerBound,
    chunkup: int | None = None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> tuple[Chunking, ...]:
    """Return the chunkings worth synthesizing for one size (``bound`` holds the size) under ``model``.

    ``chunkup`` (a sketch's ``input_chunkup``) fixes the routed chunks per rank.
    """
    ratio = bound.bandwidth_time_us / max(bound.latency_floor_us, 1e-9)
    if ratio < LATENCY_REGIME:
        pairs = _LATENCY_CHUNKINGS
    elif ratio < BANDWIDTH_REGIME:
        pairs = _MIDDLE_CHUNKINGS
    else:
        pairs = _BANDWIDTH_CHUNKINGS + (_MESH_CHUNKINGS if _is_mesh(graph) else ())
        if _spans_slices(graph, bound.size_bytes, model):
            pairs = _SLICED_CHUNKINGS + pairs
    if chunkup is not None:
        pairs = tuple(dict.fromkeys((chunkup, p) for _, p in pairs))
    # An AllReduce orders, lowers and verifies both phases' sends: half the cap for each.
    most_sends = MAX_COMPOSED_SENDS // (2 if collective is Collective.ALLREDUCE else 1)
    sends = (model.pipelined, model.pipelined_between_machines)  # how the ordering times them
    out = []
    for k, p in pairs:
        if graph.num_ranks * k <= MAX_ROUTED_CHUNKS or chunkup is not None:
            out.append(Chunking(k, p, bound.size_bytes, *sends))
        elif k == 1 and composed_only(graph, k) and graph.num_ranks**2 * p <= most_sends:
            out.append(Chunking(k, p, bound.size_bytes, *sends))
    if not out and composed_only(graph, 1) and graph.num_ranks**2 <= most_sends:
        # Every pipelined chunking is past the cap: one piece per chunk still puts a synthesis beside the baselines.
        out.append(Chunking(1, 1, bound.size_bytes, *sends))
    return tuple(dict.fromkeys(out))


def _spans_slices(graph: LogicalGraph, size_bytes: int, model: ExecutionModel) -> bool:
    """Return True when ``model`` runs a chunk of one routed chunk per rank in two or more slices."""
    return len(slice_sizes(size_bytes / graph.num_ranks, model, SIMPLE)) > 1


def simulate_at(
    algorithm: Algorithm,
    topology: Topology,
    sizes: Sequence[int],
    bounds: Sequence[LowerBound],
    progress: Callable[[str], None] | None = None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> tuple[SimulationResult, ...]:
    """Return the simulated runs of ``algorithm`` at ``sizes`` under ``model`` (bounds given, computed once).

    ``progress`` gets a line every few seconds with the sizes simulated so far (``ProgressTicker``),
    and from a ``heartbeat`` while one size takes longer.
    """
    ticker = ProgressTicker(progress)
    results = []
    with heartbeat(progress, f"simulating {algorithm.name}"):
        plan = prepare_simulation(algorithm, topology, model=model)
        for size, bound in zip(sizes, bounds):
            ticker.tick(lambda: f"simulating {algorithm.name}: {len(results)} of {len(sizes)} sizes done")
            results.append(simulate_plan(plan, size, bound_time_us=bound.time_us))
    return tuple(results)


def exportable(algorithm: Algorithm, runtime: str = "portable") -> bool:
    """Return True when an MSCCL runtime loads ``algorithm`` and selects it for the counts users pass.

    Loads: ``runtime``'s limits (default: every runtime's) allow its steps and threadblocks.
    Selects: its chunk loop divides power-of-two element counts where some loop can
    (``selectable_for_powers_of_two``).
    """
    from taccl_py.msccl import check_msccl_limits
    from taccl_py.msccl.selection import selectable_for_powers_of_two

    if not selectable_for_powers_of_two(algorithm):
        logger.info("%s: %d chunks per loop: MSCCL never selects it", algorithm.name, algorithm.chunks_per_loop)
        return False
    try:
        check_msccl_limits(algorithm, runtime=runtime)
    except ArgumentError as error:
        logger.info("%s: not exportable to MSCCL XML: %s", algorithm.name, error)
        return False
    return True


def band_writable(algorithm: Algorithm) -> bool:
    """Return True when a library band may hold ``algorithm``: MSCCL loads it, or MSCCL++ does.

    A schedule with switch steps has no MSCCL-IR form: it is writable where MSCCL++ selects its
    loop at power-of-two sizes, and ``export-msccl`` leaves its sizes to NCCL (NVLS there).
    """
    from taccl_py.msccl.selection import selectable_for_powers_of_two

    if algorithm.uses_switch:
        return selectable_for_powers_of_two(algorithm)
    return exportable(algorithm)


def geometric_middle(low: int, high: int) -> int:
    """Return the geometric mean of two sizes, rounded (the boundary between their bands)."""
    return int(round(math.sqrt(low * high)))
