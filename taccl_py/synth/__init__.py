"""The synthesizer: TACCL's three stages (routing MILP, ordering heuristic, contiguity MILP) on a
logical topology shaped by a communication sketch, for AllGather, ReduceScatter and AllReduce.

``synthesize`` is the one entry point. For one size it synthesizes a few chunkings
(``taccl_py.synth.candidates``), verifies each, simulates them and returns the fastest with the
best baseline's time beside it. For several sizes it also builds a library of size bands that
keeps, per size, the fastest of the synthesized algorithms and the baselines
(``taccl_py.synth.bands``). The stages live in ``logical``, ``routing``, ``ordering``,
``scheduling``, ``lower_schedule`` and ``compose``; ``taccl_py.synth.sketch`` reads sketches and derives one
automatically.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from taccl_py import __version__
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, Provenance
from taccl_py.synth.bands import SizeChoice, build_library, choose_per_size, write_library
from taccl_py.synth.candidates import candidate_chunkings, exportable, geometric_middle, simulate_at
from taccl_py.synth.compose import Candidate, Chunking, synthesize_chunking
from taccl_py.synth.logical import LogicalGraph, build_logical_graph
from taccl_py.synth.sketch import auto_sketch
from taccl_py.synth.sketch_model import Sketch
from taccl_py.synth.solver import SolverOptions, describe_solver, solver_settings
from taccl_py.topology.bounds import lower_bounds
from taccl_py.topology.model import Topology

__all__ = [
    "DEFAULT_SIZE_BYTES",
    "SynthesisResult",
    "SizeChoice",
    "default_time_limit_s",
    "synthesize",
    "write_library",
]

logger = logging.getLogger(__name__)

DEFAULT_SIZE_BYTES = 64_000_000  # a typical DDP gradient bucket is 25-100 MB
# MILP time budget (s) for a whole synthesis by rank count: the targets are 10 s for 16 GPUs,
# 60 s for 32 and 10 min for 64 on two cores, and ordering, verification and simulation need
# the rest.
_TIME_LIMITS_S = ((8, 4.0), (16, 6.0), (32, 40.0))
_TIME_LIMIT_LARGE_S = 240.0
_SYNTHESIZED = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
SIZES_PER_DESIGN = 2  # neighbouring sizes (of a x4 progression) that share one synthesized design


def default_time_limit_s(num_ranks: int) -> float:
    """Return the default MILP time budget (s) of a synthesis over ``num_ranks`` GPUs.

    >>> default_time_limit_s(16)
    6.0
    """
    for ranks, limit in _TIME_LIMITS_S:
        if num_ranks <= ranks:
            return limit
    return _TIME_LIMIT_LARGE_S


@dataclass(frozen=True)
class SynthesisResult:
    """What ``synthesize`` found: the algorithm, per-size choices and how the search went.

    ``algorithm`` is the fastest synthesized algorithm at the (largest) size; ``library`` the
    size bands when several sizes were asked for. ``timed_out`` is True when a MILP stopped at
    its time limit (the algorithm is then the best verified schedule found in time).
    """

    algorithm: Algorithm
    collective: Collective
    topology: str
    sketch: Sketch
    choices: tuple[SizeChoice, ...]
    library: AlgorithmLibrary | None
    candidates: tuple[str, ...]
    timed_out: bool
    wall_s: float


def _check_arguments(
    topology: Topology, collective: Collective | str, size_bytes: int | None, sizes: Sequence[int] | None
) -> tuple[Collective, tuple[int, ...]]:
    try:
        collective = Collective(collective)
    except ValueError:
        raise ArgumentError(
            None, "collective", f"unknown collective {collective!r}", "allgather, reducescatter or allreduce"
        ) from None
    if collective not in _SYNTHESIZED:
        raise ArgumentError(
            None, "collective", f"{collective.value} is not synthesized", "allgather, reducescatter or allreduce"
        )
    if size_bytes is not None and sizes is not None:
        raise ArgumentError(None, "size", "both a size and a list of sizes", "either --size or --sizes")
    chosen = (
        tuple(sorted(set(sizes))) if sizes is not None else (DEFAULT_SIZE_BYTES if size_bytes is None else size_bytes,)
    )
    if not chosen or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in chosen):
        raise ArgumentError(None, "size", f"sizes {chosen!r}", "positive integers (bytes)")
    if topology.num_ranks < 2:
        raise ArgumentError(
            topology.name, "num_ranks", f"{topology.num_ranks} GPU", "at least 2 GPUs to synthesize a collective"
        )
    return collective, chosen


def _plan_chunkings(
    graph: LogicalGraph, collective: Collective, bounds: Sequence, chunkup: int | None
) -> list[tuple[Chunking, tuple[int, ...]]]:
    """Return the chunkings to synthesize with the indices of the sizes to simulate each at.

    Routes and orders depend on the size (α against bandwidth), so a chunking wanted at many
    sizes is synthesized once per ``SIZES_PER_DESIGN`` neighbouring sizes, tuned for their
    geometric middle, and simulated at those sizes and one more on either side (simulating
    every candidate at every size costs more than synthesizing it on large machines).
    """
    wanted: dict[tuple[int, int], list[int]] = {}
    for index, bound in enumerate(bounds):
        for chunking in candidate_chunkings(graph, collective, bound, chunkup):
            wanted.setdefault((chunking.chunkup, chunking.pieces), []).append(index)
    out = []
    for (k, p), indices in wanted.items():
        for start in range(0, len(indices), SIZES_PER_DESIGN):
            run = indices[start : start + SIZES_PER_DESIGN]
            design = geometric_middle(bounds[run[0]].size_bytes, bounds[run[-1]].size_bytes)
            near = tuple(i for i in range(len(bounds)) if run[0] - 1 <= i <= run[-1] + 1)
            out.append((Chunking(k, p, design), near))
    return sorted(out, key=lambda item: (item[0].design_bytes, item[0].chunkup, item[0].pieces))


def _run_candidates(
    graph: LogicalGraph,
    topology: Topology,
    collective: Collective,
    chunkings: Sequence[tuple[Chunking, tuple[int, ...]]],
    options: SolverOptions,
    sizes: Sequence[int],
    bounds: Sequence,
    progress: Callable[[str], None] | None,
) -> list[tuple[Candidate, tuple]]:
    """Return each candidate with its simulated results (None at the sizes it was not simulated at)."""
    deadline = time.perf_counter() + options.time_limit_s
    out = []
    for index, (chunking, near) in enumerate(chunkings, 1):
        # share what is left of the budget among the candidates still to run
        budget = max(0.1, (deadline - time.perf_counter()) / (len(chunkings) - index + 1))
        if progress is not None:
            progress(f"[{index}/{len(chunkings)}] candidate {chunking.label} (tuned for {chunking.design_bytes} B)")
        name = f"taccl-{collective.value}-{topology.name}-{chunking.label}-d{chunking.design_bytes}"
        candidate = synthesize_chunking(graph, collective, chunking, options, budget, name=name, progress=progress)
        if progress is not None:
            progress(
                f"[{index}/{len(chunkings)}] {chunking.label}: verified; routing {candidate.routing_status}; simulating"
            )
        found = simulate_at(candidate.algorithm, topology, [sizes[i] for i in near], [bounds[i] for i in near])
        results = dict(zip(near, found))
        out.append((candidate, tuple(results.get(i) for i in range(len(sizes)))))
    return out


def synthesize(
    topology: Topology,
    collective: Collective | str,
    size_bytes: int | None = None,
    sizes: Sequence[int] | None = None,
    sketch: Sketch | None = None,
    time_limit_s: float | None = None,
    solver: str = "highs",
    progress: Callable[[str], None] | None = None,
) -> SynthesisResult:
    """Return a verified algorithm for ``collective`` on ``topology``, fastest under the simulator.

    Parameters
    ----------
    topology : Topology
        The machine(s); ``load_topology(name, nodes)`` builds one.
    collective : Collective or str
        ``allgather``, ``reducescatter`` or ``allreduce``.
    size_bytes : int, optional
        The nccl-tests size (bytes) to synthesize for; default ``DEFAULT_SIZE_BYTES``.
    sizes : sequence of int, optional
        Several sizes (bytes): also build a library of size bands that keeps, per size, the
        fastest of the synthesized algorithms and the baselines.
    sketch : Sketch, optional
        Hints (``taccl_py.synth.sketch``); default ``auto_sketch(topology)``.
    time_limit_s : float, optional
        MILP time budget (s) for the whole synthesis; default ``default_time_limit_s``.
    solver : {"highs", "cbc"}
        The MILP solver.
    progress : callable, optional
        Called with one line per stage.

    Returns
    -------
    SynthesisResult

    Raises
    ------
    ArgumentError
        For an unknown collective or solver, both ``size_bytes`` and ``sizes``, or one GPU.
    SketchError
        When the sketch does not fit the topology (node or GPU count, symmetry).
    InfeasibleError
        When the sketch's links cannot reach every GPU.

    Notes
    -----
    A MILP that reaches its time limit returns its best incumbent; without one, the greedy
    routes are used, so there is always a verified result. ``timed_out`` reports it.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> result = synthesize(load_topology("dgx2"), "allgather", size_bytes=1_000_000, time_limit_s=2)
    >>> result.algorithm.num_ranks, result.choices[0].chosen_result.fraction_of_bound > 0.5
    (16, True)
    """
    began = time.perf_counter()
    collective, chosen_sizes = _check_arguments(topology, collective, size_bytes, sizes)
    options = SolverOptions(
        solver=solver,
        time_limit_s=time_limit_s if time_limit_s is not None else default_time_limit_s(topology.num_ranks),
    )
    return _synthesize_impl(topology, collective, chosen_sizes, sizes is not None, sketch, options, progress, began)


def _synthesize_impl(
    topology: Topology,
    collective: Collective,
    sizes: tuple[int, ...],
    banded: bool,
    sketch: Sketch | None,
    options: SolverOptions,
    progress: Callable[[str], None] | None,
    began: float,
) -> SynthesisResult:
    sketch = sketch if sketch is not None else auto_sketch(topology)
    if progress is not None:
        progress(f"logical topology of {topology.name} under sketch {sketch.name}")
    graph = build_logical_graph(topology, sketch)
    bounds = lower_bounds(topology, collective, sizes)
    chunkings = _plan_chunkings(graph, collective, bounds, sketch.chunkup)
    runs = _run_candidates(graph, topology, collective, chunkings, options, sizes, bounds, progress)
    everything = [(c.algorithm, r) for c, r in runs]
    usable = [(c.algorithm, r) for c, r in runs if not banded or exportable(c.algorithm)]
    baselines = _baselines(topology, collective, sizes, progress)
    eligible = [banded] * len(sizes)
    if banded:  # a band's algorithm must load in the MSCCL runtimes; so must a baseline that takes one
        fits = {base[0].name: exportable(base[0]) for base in baselines if base is not None}
        eligible = [base is not None and fits[base[0].name] for base in baselines]
    choices = choose_per_size(sizes, usable, baselines, eligible=eligible, fallback=everything)
    best_at_top = min(
        (pair for pair in usable or everything if pair[1][-1] is not None), key=lambda pair: pair[1][-1].time_us
    )[0]
    timed_out = any("time-limit" in c.routing_status or c.routing_status == "heuristic" for c, _ in runs)
    library = None
    if banded:
        provenance = Provenance(
            taccl_py=__version__,
            solver=describe_solver(options),
            solver_options=solver_settings(options),
            sketch=sketch.name if sketch.source.startswith("<") else sketch.source,
            sizes=sizes,
            timed_out=timed_out,
        )
        library = build_library(
            topology.name, topology.nodes, collective, topology.num_ranks, choices, collective.value, provenance
        )
    return SynthesisResult(
        best_at_top,
        collective,
        topology.name,
        sketch,
        choices,
        library,
        tuple(f"{c.chunking.label}@{c.chunking.design_bytes}:{c.routing_status}" for c, _ in runs),
        timed_out,
        time.perf_counter() - began,
    )


def _baselines(
    topology: Topology, collective: Collective, sizes: Sequence[int], progress: Callable[[str], None] | None
) -> list:
    from taccl_py.baselines import best_baselines

    return list(best_baselines(topology, collective, sizes, progress=progress))
