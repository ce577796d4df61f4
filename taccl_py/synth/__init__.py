"""The synthesizer: TACCL's three stages (routing MILP, ordering heuristic, contiguity MILP) on a
logical topology shaped by a communication sketch, for AllGather, ReduceScatter and AllReduce.

``synthesize`` is the one entry point. For one size it synthesizes a few chunkings
(``taccl_py.synth.candidates``), verifies each, simulates them and returns the fastest with the
best baseline's time beside it; its ``SizeChoice`` names the baseline as chosen where that is
faster. For several sizes it also builds a library of size bands that keeps, per size, the
fastest of the synthesized algorithms and the baselines that load in MSCCL (``outcome``,
``bands``). The stages themselves live one per module in :mod:`taccl_py.stages` (sketch,
logical graph, routing with packed and hierarchical trees, ordering, scheduling, lowering);
``compose`` walks them for one chunking. AlltoAll takes its own path (``synth.alltoall``): an LP
routes its blocks over direct and NIC-relay paths (``alltoall.routing``), ``alltoall.plan``
aggregates and lowers them, and ``alltoall`` keeps the candidates that fit the MSCCL limits and
chooses per size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from taccl_py.baselines import ComparedBaseline
from taccl_py.bounds import LowerBound, lower_bounds
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.progress import prefixed
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel, execution_model
from taccl_py.solvers import (
    BudgetBound,
    SolverOptions,
    first_budget_bound,
    prepare_highs_threads,
)
from taccl_py.stages.logical import LogicalGraph, build_logical_graph
from taccl_py.stages.sketch import auto_sketch
from taccl_py.stages.sketch.model import Sketch
from taccl_py.synth.alltoall import synthesize_alltoall
from taccl_py.synth.bands import SizeChoice, write_library
from taccl_py.synth.candidates import candidate_chunkings, exportable, geometric_middle, simulate_at
from taccl_py.synth.compose import (
    Candidate,
    Chunking,
    PhaseStarts,
    composed_only,
    gather_after_reduce,
    mixed_allreduce,
    phase_starts,
    synthesize_chunking,
)
from taccl_py.synth.jobs import check_jobs, run_jobs
from taccl_py.synth.outcome import (
    SynthesisResult,
    best_baselines_per_size,
    choose_bands,
    library_of,
    synthesis_provenance,
)
from taccl_py.synth.switch_candidates import switch_candidates
from taccl_py.topology.compose import machines_alike
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
# Wall-clock safety cap (s) on the MILPs of a whole synthesis by rank count: ten times the
# targets (10 s for 16 GPUs, 60 s for 32, 3 min for 64 on two cores), which the node budgets
# meet; the cap only stops a run on a machine far slower or busier than expected.
_TIME_LIMITS_S = ((16, 600.0), (32, 1200.0))
_TIME_LIMIT_LARGE_S = 1800.0
_SYNTHESIZED_WORDS = "allgather, reducescatter, allreduce or alltoall"  # every Collective
SIZES_PER_DESIGN = 2  # neighbouring sizes (of a x4 progression) that share one synthesized design


def default_time_limit_s(num_ranks: int) -> float:
    """Return the default wall-clock safety cap (s) on the MILPs of a synthesis over ``num_ranks`` GPUs.

    >>> default_time_limit_s(16)
    600.0
    """
    for ranks, limit in _TIME_LIMITS_S:
        if num_ranks <= ranks:
            return limit
    return _TIME_LIMIT_LARGE_S


def _check_arguments(
    topology: Topology,
    collective: Collective | str,
    size_bytes: int | None,
    sizes: Sequence[int] | None,
    sketch: Sketch | None = None,
) -> tuple[Collective, tuple[int, ...]]:
    try:
        collective = Collective(collective)
    except ValueError:
        raise ArgumentError(None, "collective", f"unknown collective {collective!r}", _SYNTHESIZED_WORDS) from None
    if collective is Collective.ALLTOALL and sketch is not None:
        raise ArgumentError(
            sketch.source,
            "sketch",
            "a sketch with alltoall",
            "no sketch: AlltoAll routes over the topology's NIC relays",
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
    graph: LogicalGraph, collective: Collective, bounds: Sequence, chunkup: int | None, model: ExecutionModel
) -> list[tuple[Chunking, tuple[int, ...]]]:
    """Return the chunkings to synthesize with the indices of the sizes to simulate each at.

    Routes and orders depend on the size (α against bandwidth), so a chunking wanted at many
    sizes is synthesized once per ``SIZES_PER_DESIGN`` neighbouring sizes, tuned for their
    geometric middle, and simulated at those sizes and one more on either side (simulating
    every candidate at every size costs more than synthesizing it on large machines).
    """
    wanted: dict[tuple[int, int], list[int]] = {}
    for index, bound in enumerate(bounds):
        for chunking in candidate_chunkings(graph, collective, bound, chunkup, model):
            wanted.setdefault((chunking.chunkup, chunking.pieces), []).append(index)
    out = []
    for (k, p), indices in wanted.items():
        for start in range(0, len(indices), SIZES_PER_DESIGN):
            run = indices[start : start + SIZES_PER_DESIGN]
            design = geometric_middle(bounds[run[0]].size_bytes, bounds[run[-1]].size_bytes)
            near = tuple(i for i in range(len(bounds)) if run[0] - 1 <= i <= run[-1] + 1)
            out.append((Chunking(k, p, design, model.pipelined, model.pipelined_between_machines), near))
    return sorted(out, key=lambda item: (item[0].design_bytes, item[0].chunkup, item[0].pieces))


def _algorithm_name(collective: Collective, topology: Topology, label: str, design_bytes: int) -> str:
    return f"taccl-{collective.value}-{topology.name}-{label}-d{design_bytes}"


def _simulated_variants(
    candidate: Candidate,
    topology: Topology,
    near: Sequence[int],
    sizes: tuple[int, ...],
    bounds: tuple[LowerBound, ...],
    model: ExecutionModel,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[Candidate, tuple]]:
    """Return ``candidate`` (and for AllReduce its ``gather_after_reduce`` twin), each with its results under ``model``.

    Results are None at the sizes outside ``near``; ``progress`` gets a line per simulated size.
    """

    def simulated(variant: Candidate) -> tuple[Candidate, tuple]:
        found = simulate_at(
            variant.algorithm, topology, [sizes[i] for i in near], [bounds[i] for i in near], progress, model
        )
        return variant, tuple(dict(zip(near, found)).get(i) for i in range(len(sizes)))

    # Each variant is simulated right after it was verified: the dataflow both need is cached for
    # the last algorithm only (taccl_py.ir.flow_cache), so building the twin first rebuilt both.
    out = [simulated(candidate)]
    if candidate.algorithm.collective is Collective.ALLREDUCE:
        name = _algorithm_name(
            Collective.ALLREDUCE, topology, candidate.label + "-barrier", candidate.chunking.design_bytes
        )
        out.append(simulated(gather_after_reduce(candidate, name)))
    return out


def _run_candidate(
    graph: LogicalGraph,
    topology: Topology,
    collective: Collective,
    chunking: Chunking,
    near: tuple[int, ...],
    options: SolverOptions,
    sizes: tuple[int, ...],
    bounds: tuple[LowerBound, ...],
    deadline_s: float,
    starts: tuple[PhaseStarts, ...],
    model: ExecutionModel,
    label: str,
    progress: Callable[[str], None] | None,
    machines_differ: bool = False,
) -> list[tuple[Candidate, tuple]]:
    """Return one chunking's candidates (AllReduce: with and without a phase barrier) with their simulated results.

    ``deadline_s`` (``time.time()``, comparable across processes) ends the wall-clock safety cap;
    ``starts`` are the phases' tree packings (``phase_starts``), computed once for all candidates;
    ``machines_differ``: not ``machines_alike(topology)``.
    """
    if progress is not None:
        progress(f"{label} candidate {chunking.label} (tuned for {chunking.design_bytes} B)")
    name = _algorithm_name(collective, topology, chunking.label, chunking.design_bytes)
    cap_s = deadline_s - time.time()
    candidate = synthesize_chunking(
        graph,
        collective,
        chunking,
        options,
        cap_s,
        name=name,
        progress=prefixed(progress, f"{label} "),
        starts=starts,
        machines_differ=machines_differ,
    )
    if progress is not None:
        progress(f"{label} {chunking.label}: verified; routing {candidate.routing_status}; simulating")
    return _simulated_variants(candidate, topology, near, sizes, bounds, model, prefixed(progress, f"{label} "))


def _mixed_allreduce_runs(
    runs: Sequence[tuple[Candidate, tuple]],
    topology: Topology,
    sizes: tuple[int, ...],
    bounds: tuple[LowerBound, ...],
    model: ExecutionModel,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[Candidate, tuple]]:
    """Return, per design size, the AllReduce of the fastest reduce phase and the fastest gather phase.

    Only where those come from different chunkings (otherwise that candidate exists already);
    each is simulated (with and without a phase barrier) at the sizes its design's candidates were.
    """
    designs: dict[int, list[tuple[Candidate, tuple]]] = {}
    for candidate, results in runs:
        if not candidate.phase_barrier:
            designs.setdefault(candidate.chunking.design_bytes, []).append((candidate, results))
    out = []
    for group in designs.values():
        reduce = min(group, key=lambda run: run[0].schedules[0].makespan_us)
        gather = min(group, key=lambda run: run[0].schedules[1].makespan_us)
        if reduce is gather:
            continue
        label = f"{reduce[0].label}+{gather[0].label}"
        name = _algorithm_name(Collective.ALLREDUCE, topology, label, reduce[0].chunking.design_bytes)
        mixed = mixed_allreduce(reduce[0], gather[0], name)
        near = [i for i, result in enumerate(reduce[1]) if result is not None]
        out += _simulated_variants(mixed, topology, near, sizes, bounds, model, prefixed(progress, f"{label}: "))
    return out


def _run_candidates(
    graph: LogicalGraph,
    topology: Topology,
    collective: Collective,
    chunkings: Sequence[tuple[Chunking, tuple[int, ...]]],
    options: SolverOptions,
    sizes: Sequence[int],
    bounds: Sequence,
    loadable_only: bool | str,
    progress: Callable[[str], None] | None,
    model: ExecutionModel,
    jobs: int = 1,
) -> tuple[list[tuple[Candidate, tuple]], list]:
    """Return each candidate with its simulated results, and the best baseline per size.

    Every candidate gets the same work budgets whatever earlier ones took, so ``jobs`` worker
    processes give the serial result; only the wall-clock safety cap is shared (one deadline).
    """
    deadline_s = time.time() + options.time_limit_s
    sizes, bounds = tuple(sizes), tuple(bounds)
    # Every candidate starts from the same packings; packing a 64-GPU graph takes seconds.
    prepare_highs_threads(options.threads)
    if progress is not None and chunkings:
        whole = "each machine" if composed_only(graph, 1) else f"{graph.num_ranks} GPUs"
        progress(f"tree packing on {whole} (the routing MILPs' starting routes)")
    starts = phase_starts(graph, collective, progress) if chunkings else ()
    machines_differ = bool(chunkings) and not machines_alike(topology)
    work = [
        partial(
            _run_candidate,
            graph,
            topology,
            collective,
            chunking,
            near,
            options,
            sizes,
            bounds,
            deadline_s,
            starts,
            model,
            f"[{index}/{len(chunkings)}]",
            machines_differ=machines_differ,
        )
        for index, (chunking, near) in enumerate(chunkings, 1)
    ]
    work.append(partial(best_baselines_per_size, topology, collective, sizes, options, loadable_only, model=model))
    # The routing MILPs, most of a candidate's time, grow with its chunks per rank. Among equals
    # the fewer pieces (less memory) go first, so two of the largest rarely run side by side.
    costs = [chunking.chunkup for chunking, _ in chunkings] + [0]
    values = run_jobs(work, jobs, progress, costs)
    return [run for runs in values[:-1] for run in runs], values[-1]


def _split_parts(
    everything: Sequence[tuple[Algorithm, tuple]], baselines: Sequence[ComparedBaseline], most: int = 4
) -> list[Algorithm]:
    """Return the point-to-point AllReduces to split the buffer with: the fastest per size, then kept baselines."""
    parts: dict[str, Algorithm] = {}
    for index in range(len(baselines)):
        timed = [(pair[1][index].time_us, pair[0]) for pair in everything if pair[1][index] is not None]
        if timed:
            fastest = min(timed, key=lambda item: item[0])[1]
            parts.setdefault(fastest.name, fastest)
    for compared in baselines:
        if compared.kept is not None:
            parts.setdefault(compared.kept[0].name, compared.kept[0])
    return [part for part in parts.values() if part.collective is Collective.ALLREDUCE][:most]


def synthesize(
    topology: Topology,
    collective: Collective | str,
    size_bytes: int | None = None,
    sizes: Sequence[int] | None = None,
    sketch: Sketch | None = None,
    time_limit_s: float | None = None,
    solver: str = "highs",
    progress: Callable[[str], None] | None = None,
    *,
    node_limit: int | None = None,
    jobs: int | None = 1,
    model: ExecutionModel | str = DEFAULT_MODEL,
    loadable_in: str | None = None,
) -> SynthesisResult:
    """Return a verified algorithm for ``collective`` on ``topology``, fastest under the simulator.

    Parameters
    ----------
    topology : Topology
        The machine(s); ``load_topology(name, nodes)`` builds one.
    collective : Collective or str
        ``allgather``, ``reducescatter``, ``allreduce`` or ``alltoall`` (routed by an LP over
        direct and relay paths, ``taccl_py.synth.alltoall``; it takes no sketch, its LP needs no
        node limit and it runs in this process whatever ``jobs`` says).
    size_bytes : int, optional
        The nccl-tests size (bytes) to synthesize for; default ``DEFAULT_SIZE_BYTES``. Its
        ``SizeChoice`` names the best baseline as chosen where that is faster than every synthesis.
    sizes : sequence of int, optional
        Several sizes (bytes): also build a library of size bands that keeps, per size, the
        fastest of the synthesized algorithms and the baselines.
    sketch : Sketch, optional
        Hints (``taccl_py.stages.sketch``); default ``auto_sketch(topology)``.
    time_limit_s : float, optional
        Wall-clock safety cap (s) on the MILPs of the whole synthesis; default
        ``default_time_limit_s``. When it binds, ``timed_out`` says so.
    solver : {"highs", "cbc", "cpsat"}
        The MILP solver.
    progress : callable, optional
        Called with one line per stage and, inside long stages (MILPs, ordering, verification,
        simulation), one at least every ``REPORT_INTERVAL_S`` seconds
        (``taccl_py.progress``). It runs in this process, also with ``jobs`` > 1 (workers'
        lines arrive as they are written), and may be called from a helper thread while a
        solver or the verifier holds this one. Wall time decides only when a line comes, never
        what is computed.
    node_limit : int, optional
        Branch-and-bound nodes per MILP; default by model size (``default_node_limit``).
    jobs : int or None
        Worker processes for the candidates and baselines; 1 (default): run here; None: the
        cores this process may use. The result is the same for every value. Workers re-import
        the caller's main script, which then needs an ``if __name__ == "__main__":`` guard.
    model : ExecutionModel or str
        How the runtime runs the program (``taccl_py.simulate.model``): candidates and baselines
        are simulated, and sends ordered, under it. Default ``msccl`` (MSCCL's slice loop,
        serialized sends); ``pipelined`` orders and simulates pipelined sends.
    loadable_in : str, optional
        An MSCCL runtime (``taccl_py.msccl.limits``; ``portable``: every one) the chosen algorithm
        must load in: candidates and baselines over its limits (threadblocks, steps) are not chosen.

    Returns
    -------
    SynthesisResult

    Raises
    ------
    ArgumentError
        For an unknown collective or solver, both ``size_bytes`` and ``sizes``, one GPU, a
        sketch with alltoall, or a non-positive cap, node limit or job count.
    SketchError
        When the sketch does not fit the topology (node or GPU count, symmetry).
    InfeasibleError
        When the sketch's links cannot reach every GPU.

    Notes
    -----
    Budgets are work, not time: every MILP of every candidate gets its node limit, one HiGHS
    thread and a fixed seed, so the same input writes the same algorithm on a busy or an idle
    machine. A MILP stopped by a budget returns its best incumbent; without one, the greedy
    routes are used, so there is always a verified result. ``budget_bound`` names the budget.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> result = synthesize(load_topology("dgx2"), "allgather", size_bytes=1_000_000)
    >>> result.algorithm.num_ranks, result.choices[0].chosen_result.fraction_of_bound > 0.5
    (16, True)
    """
    began = time.perf_counter()
    collective, chosen_sizes = _check_arguments(topology, collective, size_bytes, sizes, sketch)
    options = SolverOptions(
        solver=solver,
        time_limit_s=time_limit_s if time_limit_s is not None else default_time_limit_s(topology.num_ranks),
        node_limit=node_limit,
    )
    workers = check_jobs(jobs)
    return _synthesize_impl(
        topology,
        collective,
        chosen_sizes,
        sizes is not None,
        sketch,
        options,
        progress,
        began,
        execution_model(model),
        workers,
        loadable_in,
    )


def _synthesize_impl(
    topology: Topology,
    collective: Collective,
    sizes: tuple[int, ...],
    banded: bool,
    sketch: Sketch | None,
    options: SolverOptions,
    progress: Callable[[str], None] | None,
    began: float,
    model: ExecutionModel,
    jobs: int = 1,
    loadable_in: str | None = None,
) -> SynthesisResult:
    if collective is Collective.ALLTOALL:
        return synthesize_alltoall(
            topology, sizes, banded, sketch if sketch is not None else Sketch(), options, progress, began, model
        )
    sketch = sketch if sketch is not None else auto_sketch(topology)
    if progress is not None:
        progress(f"logical topology of {topology.name} under sketch {sketch.name}")
    graph = build_logical_graph(topology, sketch)
    bounds = lower_bounds(topology, collective, sizes)
    chunkings = _plan_chunkings(graph, collective, bounds, sketch.chunkup, model)
    runs, baselines = _run_candidates(
        graph, topology, collective, chunkings, options, sizes, bounds, loadable_in or banded, progress, model, jobs
    )
    if collective is Collective.ALLREDUCE:
        runs += _mixed_allreduce_runs(runs, topology, sizes, bounds, model, progress)
    everything = [(c.algorithm, r) for c, r in runs]
    parts = _split_parts(everything, baselines)
    everything += switch_candidates(topology, collective, sizes, parts, model=model, progress=progress)
    choices, best_at_top = choose_bands(sizes, banded, everything, baselines, loadable_in)
    budget_bound = first_budget_bound(candidate.budget_bound for candidate, _ in runs)
    timed_out = budget_bound is BudgetBound.WALL_CLOCK_CAP
    library = None
    if banded:
        library = library_of(topology, collective, sizes, sketch, options, choices, budget_bound, model)
    return SynthesisResult(
        best_at_top,
        collective,
        topology.name,
        sketch,
        choices,
        library,
        tuple(f"{c.label}@{c.chunking.design_bytes}:{c.routing_status}" for c, _ in runs),
        timed_out,
        time.perf_counter() - began,
        budget_bound,
        synthesis_provenance(sizes, sketch, options, budget_bound, model),
        _fastest_point_to_point(everything, loadable_in) if best_at_top.uses_switch else None,
    )


def _fastest_point_to_point(everything: Sequence[tuple[Algorithm, tuple]], loadable_in: str | None) -> Algorithm | None:
    """Return the fastest algorithm without switch steps at the largest size, loading in ``loadable_in`` if given."""
    timed = [(pair[1][-1].time_us, pair[0]) for pair in everything if pair[1][-1] is not None]
    plain = [item for item in timed if not item[1].uses_switch]
    plain = [item for item in plain if loadable_in is None or exportable(item[1], loadable_in)] or plain
    return min(plain, key=lambda item: item[0])[1] if plain else None
