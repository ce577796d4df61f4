"""What a synthesis returns: the per-size choice among candidates and baselines, and its library.

``synthesize`` (and AlltoAll's ``synthesize_alltoall``) simulate their candidates, then
``best_baselines_per_size`` gives the baseline each size is compared with, ``choose_bands`` picks
per size the fastest that may be written, and ``library_of`` turns the choices into size bands
with their provenance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from taccl_py import __version__
from taccl_py.baselines.choice import ComparedBaseline, compare_baselines
from taccl_py.errors import InfeasibleError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, Provenance, cluster_record
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel
from taccl_py.solvers import BudgetBound, SolverOptions, describe_solver, prepare_highs_threads, solver_settings
from taccl_py.stages.sketch.model import Sketch
from taccl_py.synth.bands import SizeChoice, build_library, choose_per_size
from taccl_py.synth.candidates import band_writable, exportable
from taccl_py.topology.model import Topology

__all__ = ["SynthesisResult", "best_baselines_per_size", "choose_bands", "library_of", "synthesis_provenance"]


@dataclass(frozen=True)
class SynthesisResult:
    """What ``synthesize`` found: the algorithm, per-size choices and how the search went.

    ``algorithm`` is the fastest synthesized algorithm at the (largest) size; ``choices`` hold, per
    size, the fastest of the synthesized algorithms and the best baseline (``SizeChoice.chosen``,
    a baseline where it is faster, for one size too); ``library`` the size bands when several sizes
    were asked for. ``budget_bound`` names the budget that
    stopped a MILP before it proved its gap: ``node limit`` (the work budget: the same input gives
    the same bytes) or ``wall-clock cap`` (the safety cap: the result may differ run to run); None
    when every MILP finished. ``timed_out`` is True when the wall-clock cap bound. Either way the
    algorithm is the best verified schedule found. ``point_to_point`` is the fastest synthesized
    algorithm without switch steps where ``algorithm`` has them (what MSCCL XML can hold), else None.
    Where no chunking could be synthesized (one GPU per machine past ``MAX_ROUTED_CHUNKS``),
    ``algorithm`` is the baseline written at the largest size and ``candidates`` is empty.
    ``provenance`` says how it was made (the
    library's, for several sizes), for the file it is written to.
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
    budget_bound: BudgetBound | None = None
    provenance: Provenance | None = None
    point_to_point: Algorithm | None = None


def best_baselines_per_size(
    topology: Topology,
    collective: Collective,
    sizes: tuple[int, ...],
    options: SolverOptions,
    loadable_only: bool | str,
    progress: Callable[[str], None] | None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> tuple[ComparedBaseline, ...]:
    """Return, per size, the baseline results are compared with and the one that may be written instead.

    HiGHS's pool is sized first, as the candidates size it (packed trees). With ``loadable_only``
    (size bands) only baselines that load in the MSCCL runtimes may be written (a runtime's name:
    those that load there); the fastest baseline, loadable or not, is still what every printed
    ratio is against.
    """
    prepare_highs_threads(options.threads)
    runtime = loadable_only if isinstance(loadable_only, str) else "portable"
    keep = partial(exportable, runtime=runtime) if loadable_only else None
    return compare_baselines(topology, collective, sizes, progress=progress, keep=keep, model=model)


def choose_bands(
    sizes: tuple[int, ...],
    banded: bool,
    everything: list[tuple[Algorithm, tuple]],
    baselines: Sequence[ComparedBaseline],
    loadable_in: str | None = None,
) -> tuple[tuple[SizeChoice, ...], Algorithm]:
    """Return the choice per size and the fastest synthesized algorithm at the largest size.

    Each size's writable baseline (``ComparedBaseline.kept``) competes (for one size too: a slower
    synthesis must not be written as if it were better), and every choice is reported against the
    fastest baseline (``ComparedBaseline.fastest``). With bands, only algorithms a band may hold win
    (``band_writable``: MSCCL loads them, or MSCCL++ loads a switch schedule): synthesized ones are
    filtered here, the kept baselines already are; and a size where one of NCCL's modelled
    algorithms (NVLS, NVLS-Tree, PAT) is faster than all of them is left to NCCL (a native band).
    With ``loadable_in`` (an MSCCL runtime, or ``portable``: every one) only point-to-point
    algorithms that load there win, so a run that writes XML writes the fastest schedule the runtime
    loads (a switch schedule, which XML cannot hold, still wins: the caller writes the fastest
    loadable point-to-point one, ``SynthesisResult.point_to_point``, and says so).
    """
    usable = [
        pair
        for pair in everything
        if (not banded or band_writable(pair[0]))
        and (loadable_in is None or pair[0].uses_switch or exportable(pair[0], loadable_in))
    ]
    choices = choose_per_size(sizes, usable, baselines, fallback=everything, leave_to_native=banded)
    timed = [pair for pair in usable or everything if pair[1][-1] is not None]
    if timed:
        return choices, min(timed, key=lambda pair: pair[1][-1].time_us)[0]
    # No synthesized candidate at the largest size (no chunking fits the machine set): the written baseline.
    kept = [compared.kept[0] for compared in reversed(baselines) if compared.kept is not None]
    if not kept:
        raise InfeasibleError("synthesis: no candidate and no baseline that may be written; expected a smaller job")
    return choices, kept[0]


def synthesis_provenance(
    sizes: tuple[int, ...],
    sketch: Sketch,
    options: SolverOptions,
    budget_bound: BudgetBound | None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> Provenance:
    """Return how a synthesis at ``sizes`` (bytes) was made: version, solver and its budgets, sketch, model."""
    return Provenance(
        taccl_py=__version__,
        solver=describe_solver(options),
        solver_options=solver_settings(options),
        sketch=sketch.name if sketch.source.startswith("<") else sketch.source,
        sizes=sizes,
        timed_out=budget_bound is BudgetBound.WALL_CLOCK_CAP,
        budget_bound=None if budget_bound is None else budget_bound.value,
        execution_model=model.name,
    )


def library_of(
    topology: Topology,
    collective: Collective,
    sizes: tuple[int, ...],
    sketch: Sketch,
    options: SolverOptions,
    choices: tuple[SizeChoice, ...],
    budget_bound: BudgetBound | None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> AlgorithmLibrary:
    """Return the library of size bands of ``choices``, with its provenance (``model``: chosen under it).

    Band edges sit where neighbouring bands cross under ``model`` (``crossover_edge``).
    """
    provenance = synthesis_provenance(sizes, sketch, options, budget_bound, model)
    return build_library(
        topology.name,
        topology.nodes,
        collective,
        topology.num_ranks,
        choices,
        collective.value,
        provenance,
        cluster=cluster_record(topology),
        topology=topology,
        model=model,
    )
