"""Spanning-tree packing as a baseline: the published bandwidth-optimal method (Blink, ForestColl).

Each rank's data is split over ``chunkup`` broadcast trees chosen by ``pack_trees`` on the
automatic sketch's logical graph, pipelined into ``pieces`` and ordered by the synthesizer's
orderer. ReduceScatter runs the trees reversed; AllReduce is ReduceScatter then
AllGather. No MILP runs, so the baseline is cheap and the same on every machine.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

from taccl_py.errors import ArgumentError, SketchError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.solvers import SolverOptions
from taccl_py.stages.logical import LogicalGraph, build_logical_graph, phase_graphs
from taccl_py.stages.lower_schedule import lower_schedule
from taccl_py.stages.ordering import order_sends
from taccl_py.stages.scheduling import schedule_sends
from taccl_py.stages.sketch import auto_sketch, check_sketch
from taccl_py.stages.tree_packing import TreePacking, integral_loads, pack_trees, packed_routing
from taccl_py.topology.model import Topology
from taccl_py.units import BYTES_PER_US_PER_GBPS
from taccl_py.verify import check_algorithm

__all__ = [
    "packing_graph",
    "packed_trees_algorithm",
    "packing_pieces_by_size",
    "phase_packings",
    "default_packing_chunkup",
    "default_packing_pieces",
]

logger = logging.getLogger(__name__)

MAX_PACKING_CHUNKUP = 4  # trees per rank: more rarely lowers the load and multiplies MSCCL steps
MAX_PACKING_PIECES = 8  # default pipeline depth at most: MSCCL allows 64 steps per threadblock
MAX_REQUESTED = 32  # trees per rank, or pieces per tree, a caller may ask for
# A chunk count whose busiest load is within this factor of the fractional optimum is good enough:
# each further tree per rank multiplies the steps, and the simulated time rarely follows the last
# few percent of load (DGX-2 x2 ReduceScatter at 1 GB: 1 tree 0.81 of the bound, 4 trees 0.78).
_CHUNKUP_TOLERANCE = 1.10
DEFAULT_PACKING_PIECES = 4  # pipeline depth when no size is given
DEFAULT_DESIGN_BYTES = 64_000_000  # the size piece latencies are weighed at when none is given


def packing_graph(topology: Topology) -> LogicalGraph:
    """Return the logical graph the baseline packs trees on: the automatic sketch's.

    Opening every NIC pair (``direct-map``) leaves the fractional optimum unchanged on the
    built-in machines and makes the integral packings worse, so the sketch's relays stay.
    """
    sketch = auto_sketch(topology)
    try:
        return build_logical_graph(topology, sketch)
    except SketchError as error:
        # The automatic symmetry can propose a rotation the links do not share (one NIC for two
        # GPUs); the packing only gets slower without it.
        logger.info("%s; packing trees without rotations", error)
        return build_logical_graph(topology, check_sketch(dataclasses.replace(sketch, symmetry=()), topology))


def phase_packings(topology: Topology, collective: Collective | str) -> tuple[TreePacking, ...]:
    """Return the tree packings the baseline uses, one per phase of ``collective`` (``phase_graphs``).

    Packing a 64-GPU graph takes seconds; a caller building several pipeline depths packs once.
    """
    return tuple(pack_trees(graph) for graph in phase_graphs(packing_graph(topology), Collective(collective)))


def default_packing_chunkup(packing: TreePacking) -> int:
    """Return the fewest trees per rank whose integral packing is within 10% of the fractional optimum (or the best)."""
    best_k, best_load = 1, math.inf
    for k in range(1, MAX_PACKING_CHUNKUP + 1):
        _, load, _ = integral_loads(packing, k)
        if load <= _CHUNKUP_TOLERANCE * packing.load_us_per_byte:
            return k
        if load < best_load * (1 - 1e-9):
            best_k, best_load = k, load
    return best_k


def default_packing_pieces(graph: LogicalGraph, size_bytes: int, chunkup: int) -> int:
    """Return the pipeline depth (a power of two) that balances a deep tree's fill against α per piece.

    With depth d hops of α + piece / bandwidth, a chunk of c bytes takes about
    (d + p - 1) (α + c / (p bw)), smallest at p = sqrt((d - 1) c / (α bw)).
    """
    alpha_us = max(max(link.alpha_us for link in graph.links), 1e-3)
    bandwidth = min(link.bandwidth_GBps for link in graph.links) * BYTES_PER_US_PER_GBPS
    depth = max(2, math.ceil(math.log2(graph.num_ranks)) + 1)
    chunk_bytes = size_bytes / (graph.num_ranks * chunkup)
    best = math.sqrt((depth - 1) * chunk_bytes / (alpha_us * bandwidth))
    return int(min(MAX_PACKING_PIECES, 2 ** max(0, round(math.log2(max(best, 1.0))))))


def packed_trees_algorithm(
    topology: Topology,
    collective: Collective | str,
    *,
    chunkup: int | None = None,
    pieces: int | None = None,
    size_bytes: int | None = None,
    packings: Sequence[TreePacking] | None = None,
    verify: bool = True,
) -> Algorithm:
    """Return the verified tree-packing algorithm of ``collective`` on ``topology``.

    ``chunkup`` trees per rank (default ``default_packing_chunkup``), each chunk cut into
    ``pieces`` (default tuned to ``size_bytes`` when given, else ``DEFAULT_PACKING_PIECES``).
    ``packings`` are ``phase_packings(topology, collective)`` when the caller has them.
    """
    collective = Collective(collective)
    if collective not in (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE):
        raise ArgumentError(
            topology.name,
            "collective",
            f"no trees baseline for {collective.value}",
            "allgather, reducescatter or allreduce",
        )
    if topology.num_ranks < 2:
        raise ArgumentError(topology.name, "num_ranks", f"{topology.num_ranks} GPU", "at least 2 GPUs for trees")
    if chunkup is not None and not 1 <= chunkup <= MAX_REQUESTED:
        raise ArgumentError(topology.name, "channels", f"{chunkup} trees per rank", f"1..{MAX_REQUESTED}")
    if pieces is not None and not 1 <= pieces <= MAX_REQUESTED:
        raise ArgumentError(topology.name, "chunks", f"{pieces} chunks", f"1..{MAX_REQUESTED} pieces per tree")
    packings = tuple(packings) if packings is not None else phase_packings(topology, collective)
    # Reversal keeps every link's α and bandwidth, so any phase's graph tunes the pipeline depth.
    graph = packings[-1].graph
    # AllReduce's gather phase reads the reduce phase's chunks: both phases cut the data alike.
    k = chunkup if chunkup is not None else max(default_packing_chunkup(packing) for packing in packings)
    if pieces is None:
        pieces = DEFAULT_PACKING_PIECES if size_bytes is None else default_packing_pieces(graph, size_bytes, k)
    chunk_bytes = (size_bytes or DEFAULT_DESIGN_BYTES) / (graph.num_ranks * k)
    schedules = []
    for packing in packings:
        routing = packed_routing(packing, k, chunk_bytes, chunk_bytes / pieces)
        ordering = order_sends(routing, pieces, chunk_bytes / pieces)
        schedules.append(schedule_sends(ordering, SolverOptions(), milp=False))
    name = f"trees-c{k}-{pieces}p"
    metadata = (("baseline", "trees"), ("topology", topology.name), ("chunkup", str(k)), ("pieces", str(pieces)))
    algorithm = lower_schedule(name, collective, schedules, metadata=metadata)
    return check_algorithm(algorithm) if verify else algorithm


def packing_pieces_by_size(
    topology: Topology,
    collective: Collective,
    sizes: Sequence[int],
    packings: Sequence[TreePacking] | None = None,
) -> tuple[int, dict[int, list[int]]]:
    """Return the trees per rank and, per pipeline depth, the sizes (bytes) it is the default for.

    ``packings`` are ``phase_packings(topology, collective)`` when the caller has them.
    """
    packings = tuple(packings) if packings is not None else phase_packings(topology, collective)
    graph = packings[-1].graph
    chunkup = max(default_packing_chunkup(packing) for packing in packings)
    groups: dict[int, list[int]] = {}
    for size in sizes:
        groups.setdefault(default_packing_pieces(graph, size, chunkup), []).append(size)
    return chunkup, groups
