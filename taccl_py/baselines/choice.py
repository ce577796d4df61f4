"""Which baseline a result is compared with: the fastest applicable baseline per size, simulated.

``compare_baselines`` is the one place that choice is made. Every figure the project prints
against "the best baseline" (``taccl synthesize`` for one size or a library, ``taccl simulate``, the
exporters' rival checks, the benchmark scripts) comes from it, so the same algorithm at the same
size is compared with the same baseline everywhere. Where only some baselines may be written (a
library's bands must load in the MSCCL runtimes), it also names the fastest of those.

NCCL's algorithms that no schedule expresses (NVLS, NVLS-Tree, PAT: ``baselines.nccl``) compete
for the fastest, as a ``ModelledBaseline`` with its modelled time, never for the one that may be
written: a library band cannot be replaced by them, but every ratio is against them where they win.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from taccl_py.baselines.build import BaselineKind, applicable_kinds, build_baseline, size_groups
from taccl_py.baselines.nccl import ModelledBaseline, closed_form_applies, modelled_results
from taccl_py.baselines.packing import phase_packings
from taccl_py.baselines.shipped import shipped_alternatives
from taccl_py.bounds import lower_bounds
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective, parse_collective
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.ir.lowering import MAX_TRANSFERS_PER_THREADBLOCK
from taccl_py.msccl.limits import runtime_limits
from taccl_py.msccl.selection import selectable_for_powers_of_two
from taccl_py.simulate import (
    DEFAULT_MODEL,
    ExecutionModel,
    SimulationResult,
    prepare_simulation,
    simulate_plan,
)
from taccl_py.simulate.protocol import band_sample_sizes
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = ["ComparedBaseline", "compare_baselines", "best_baselines", "best_baseline", "best_baselines_by_band"]

# The kinds built as NCCL runs them (``nccl_best_times``): its ring, double binary tree and direct AlltoAll.
_NCCLS_OWN = frozenset({BaselineKind.RING, BaselineKind.TREE, BaselineKind.DIRECT})

# Above CLOSED_FORM_ABOVE_RANKS GPUs NCCL's ring is timed in closed form; up to this many it is also
# built, in the variant MSCCL loads, to compete for ``kept``: on 128 H100s at 1 GB it is the fastest
# schedule MSCCL runs (doubling 0.90x). A ring of 256 GPUs is 520k transfers, minutes per size.
LOADABLE_RING_MAX_RANKS = 128


@dataclass(frozen=True)
class ComparedBaseline:
    """The fastest baseline at one size, and the fastest that ``keep`` accepts (each with its result, or None).

    ``fastest`` is what a result is compared with: an ``Algorithm``, or a ``ModelledBaseline`` (NCCL's
    NVLS, NVLS-Tree or PAT, modelled: ``is_schedule`` False, its result's ``model`` ``nccl-model``)
    where one is faster than every schedule. ``kept`` is what may be written in a result's place:
    always an ``Algorithm`` (the fastest schedule without ``keep``). ``native`` is the fastest of
    NCCL's own algorithms, faster than ``fastest`` or not: what a library band left to NCCL runs. Its
    modelled ones, and at 64 GPUs and below its ring and tree (AlltoAll: direct) as built with NCCL's
    channel counts, which ``keep`` may refuse (NDv2's 6-channel ring, DGX-A100's 8-channel one).
    ``schedule`` is the fastest ``Algorithm`` built, whether ``keep`` accepts it or not.
    """

    size_bytes: int
    fastest: tuple[Algorithm | ModelledBaseline, SimulationResult] | None
    kept: tuple[Algorithm, SimulationResult] | None
    native: tuple[Algorithm | ModelledBaseline, SimulationResult] | None = None
    schedule: tuple[Algorithm, SimulationResult] | None = None


def compare_baselines(
    topology: Topology,
    collective: Collective | str,
    sizes_bytes: Iterable[int],
    progress: Callable[[str], None] | None = None,
    keep: Callable[[Algorithm], bool] | None = None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> tuple[ComparedBaseline, ...]:
    """Return, per size, the fastest baseline under ``model`` and the fastest that ``keep`` accepts.

    Every applicable family competes (rings, trees, hierarchical, packed trees; AlltoAll: direct and
    hierarchical), and on a degraded or mixed cluster the healthy machines' shipped algorithms too
    (what its users already run). A ring, tree or hierarchical baseline ``keep`` refuses competes
    for ``kept`` reshaped where that is accepted (sends spread over more channels, or fewer
    channels: ``_loadable_variant``). Rings and hierarchical algorithms are built once; trees and
    packed trees once per pipeline depth the sizes call for. Ties go to the earlier of ring, tree,
    hierarchical, trees (AlltoAll: direct, hierarchical), and all of them to NCCL's modelled
    algorithms (``modelled_results``: NVLS, NVLS-Tree, PAT), which compete for ``fastest`` only.
    Above ``CLOSED_FORM_ABOVE_RANKS`` GPUs of identical machines the ring and tree are not built:
    they are modelled in closed form (``baselines.closed_form``) and compete for ``fastest`` only;
    with ``keep``, up to ``LOADABLE_RING_MAX_RANKS`` GPUs, the ring's loadable variant competes for ``kept``.
    ``native`` takes NCCL's own: the modelled ones and the ring, tree and direct as built, never a
    reshaped variant (NCCL does not run those), as ``nccl_best_times`` counts them.
    ``progress`` receives one line per baseline built. Baselines are built unverified and only the
    schedules returned are verified, once each (``VerificationError`` if one is wrong).
    """
    collective = parse_collective(collective)
    sizes = tuple(sizes_bytes)
    if not sizes:
        return ()
    bounds = dict(zip(sizes, (bound.time_us for bound in lower_bounds(topology, collective, sizes))))
    fastest: dict[int, tuple[Algorithm | ModelledBaseline, SimulationResult]] = {}
    kept: dict[int, tuple[Algorithm, SimulationResult]] = {}
    native: dict[int, tuple[Algorithm | ModelledBaseline, SimulationResult]] = {}
    schedules: dict[int, tuple[Algorithm, SimulationResult]] = {}
    # Above CLOSED_FORM_ABOVE_RANKS GPUs of identical machines the ring and tree are NCCL's in closed
    # form (modelled_results): too many transfers to build; they compete for ``fastest`` only.
    closed = closed_form_applies(topology, collective)
    for kind in applicable_kinds(topology, collective):
        if closed and kind in (BaselineKind.RING, BaselineKind.TREE):
            if kind is BaselineKind.RING and keep is not None and topology.num_ranks <= LOADABLE_RING_MAX_RANKS:
                ring = _loadable_ring(topology, collective, keep)
                if ring is not None:
                    results = _simulated(ring, topology, sizes, bounds, model, progress)
                    _keep_faster(kept, ring, sizes, results)
                    _keep_faster(schedules, ring, sizes, results)
            continue
        # Packed trees of every pipeline depth share one packing (seconds on 64 GPUs).
        packings = phase_packings(topology, collective) if kind is BaselineKind.TREES else None
        channels, groups = size_groups(kind, topology, collective, sizes, packings)
        for chunks, group in groups.items():
            algorithm = build_baseline(
                kind,
                topology,
                collective,
                chunks,
                channels=channels,
                size_bytes=group[-1],
                packings=packings,
                verify=False,
            )
            results = _simulated(algorithm, topology, group, bounds, model, progress)
            _keep_faster(fastest, algorithm, group, results)
            _keep_faster(schedules, algorithm, group, results)
            if kind in _NCCLS_OWN:  # built as NCCL runs it (its channels): what a band left to NCCL runs
                _keep_faster(native, algorithm, group, results)
            if keep is None or keep(algorithm):
                _keep_faster(kept, algorithm, group, results)
                continue
            variant = _loadable_variant(algorithm, keep, kind, topology, collective, chunks, group[-1])
            if variant is not None:
                _keep_faster(kept, variant, group, _simulated(variant, topology, group, bounds, model, progress))
    for size, shipped in zip(sizes, shipped_alternatives(topology, collective, sizes, model)):
        if shipped is not None:
            _keep_faster(fastest, shipped[0], (size,), (shipped[1],))
            _keep_faster(schedules, shipped[0], (size,), (shipped[1],))
            if keep is None or keep(shipped[0]):
                _keep_faster(kept, shipped[0], (size,), (shipped[1],))
    for modelled, results in modelled_results(topology, collective, sizes, model, bounds):
        if progress is not None:
            progress(f"baseline {modelled.name}: modelled from NCCL's tuning, not a schedule")
        _keep_faster(fastest, modelled, [result.size_bytes for result in results], results)
        _keep_faster(native, modelled, [result.size_bytes for result in results], results)
    compared = tuple(
        ComparedBaseline(size, fastest.get(size), kept.get(size), native.get(size), schedules.get(size))
        for size in sizes
    )
    _verify_returned(compared)
    return compared


def _verify_returned(compared: Sequence[ComparedBaseline]) -> None:
    """Verify each schedule ``compared`` holds, once: the baselines were built unverified.

    Most baselines built lose at every size; only what is returned is printed, compared with or
    written, so only that is replayed. A fault is a bug in a builder and raises ``VerificationError``.
    """
    seen: set[int] = set()
    for entry in compared:
        for held in (entry.fastest, entry.kept, entry.native, entry.schedule):
            if held is not None and isinstance(held[0], Algorithm) and id(held[0]) not in seen:
                seen.add(id(held[0]))
                check_algorithm(held[0])


def _simulated(
    algorithm: Algorithm,
    topology: Topology,
    sizes: Sequence[int],
    bounds: dict[int, float],
    model: ExecutionModel,
    progress: Callable[[str], None] | None,
) -> list[SimulationResult]:
    """Return ``algorithm``'s results at ``sizes`` under ``model``, each against its size's bound (µs)."""
    if progress is not None:
        progress(f"baseline {algorithm.name}: simulating {len(sizes)} size{'s' if len(sizes) != 1 else ''}")
    plan = prepare_simulation(algorithm, topology, model=model)
    return [simulate_plan(plan, size, bound_time_us=bounds[size]) for size in sizes]


def _keep_faster(
    best: dict,
    algorithm: Algorithm | ModelledBaseline,
    sizes: Sequence[int],
    results: Sequence[SimulationResult],
) -> None:
    """Record ``algorithm`` at each size where it is strictly faster than what ``best`` holds."""
    for size, result in zip(sizes, results):
        if size not in best or result.time_us < best[size][1].time_us:
            best[size] = (algorithm, result)


def best_baselines(
    topology: Topology,
    collective: Collective | str,
    sizes_bytes: Iterable[int],
    progress: Callable[[str], None] | None = None,
    keep: Callable[[Algorithm], bool] | None = None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> tuple[tuple[Algorithm, SimulationResult] | None, ...]:
    """Return, per size, the fastest baseline ``keep`` accepts (all without it) and its result; None where none.

    The ``kept`` half of ``compare_baselines``: always a schedule, never NCCL's modelled algorithms.
    """
    return tuple(c.kept for c in compare_baselines(topology, collective, sizes_bytes, progress, keep, model))


def _loadable_variant(
    algorithm: Algorithm,
    keep: Callable[[Algorithm], bool],
    kind: BaselineKind,
    topology: Topology,
    collective: Collective,
    chunks: int | None,
    size_bytes: int,
) -> Algorithm | None:
    """Return ``kind`` reshaped within the portable MSCCL limits, as ``keep`` accepts it, or None.

    Three refusals have a cure. Steps per threadblock: rings, hierarchical and doubling algorithms
    spread their longer runs of sends over more channels (an AllReduce ring of 64 GPUs sends 126
    times on one; doubling's AllReduce on two channels forwards 126 blocks to a peer at 512 GPUs),
    28 sends a threadblock or, where that needs more than MSCCL's channels, the runtime's step limit.
    Threadblocks per GPU: rings, trees, hierarchical and doubling algorithms take the most channels
    under the original's that fit (16 trees on 64 GPUs need 69 threadblocks, over the 64 MSCCL
    loads). A chunk loop MSCCL never selects (6 rings on NDv2: 48 chunks, which divide no
    power-of-two count) also takes the most channels under the original's that ``keep`` accepts.
    None when neither applies or no variant is accepted.
    """
    if kind not in (BaselineKind.RING, BaselineKind.TREE, BaselineKind.HIERARCHICAL, BaselineKind.DOUBLING):
        return None
    if collective is Collective.ALLTOALL:
        return None
    limits = runtime_limits()
    spread = None
    longest = max(len(tb.steps) for program in algorithm.ranks for tb in program.threadblocks)
    # Dependency nops count against MSCCL's steps too, so spread whatever spreading would change.
    if kind is not BaselineKind.TREE and longest > MAX_TRANSFERS_PER_THREADBLOCK:
        spread = MAX_TRANSFERS_PER_THREADBLOCK
        algorithm = build_baseline(
            kind, topology, collective, chunks, max_transfers_per_threadblock=spread, verify=False
        )
        if keep(algorithm):
            return algorithm
        # At our pace a ring of 128 GPUs needs 40 channels, over MSCCL's 32; at the runtime's own
        # step limit (no dependency nops in a ring) it needs 16.
        if longest > limits.max_steps_per_threadblock:
            runtime_paced = build_baseline(
                kind,
                topology,
                collective,
                chunks,
                max_transfers_per_threadblock=limits.max_steps_per_threadblock,
                verify=False,
            )
            if keep(runtime_paced):
                return runtime_paced
    most = _most_threadblocks(algorithm)
    if most <= limits.max_threadblocks_per_gpu and selectable_for_powers_of_two(algorithm):
        return None
    channels = int(algorithm.meta("channels", str(algorithm.num_channels)))
    # A hierarchical name counts the cross-machine ring's channel; its builder takes the local rings.
    built_with = channels - 1 if kind is BaselineKind.HIERARCHICAL and topology.nodes > 1 else channels
    # Threadblocks grow about in proportion to the channels: start where the count should fit.
    start = min(built_with - 1, max(1, channels * limits.max_threadblocks_per_gpu // most))
    for fewer_channels in range(start, 0, -1):
        fewer = build_baseline(
            kind,
            topology,
            collective,
            chunks,
            channels=fewer_channels,
            size_bytes=size_bytes,
            max_transfers_per_threadblock=spread,
            verify=False,
        )
        if keep(fewer):
            return fewer
        if _most_threadblocks(fewer) <= limits.max_threadblocks_per_gpu and selectable_for_powers_of_two(fewer):
            return None
    return None


def _loadable_ring(topology: Topology, collective: Collective, keep: Callable[[Algorithm], bool]) -> Algorithm | None:
    """Return NCCL's ring on ``topology`` as ``keep`` accepts it, spread or with fewer channels; None if no form is."""
    ring = build_baseline(BaselineKind.RING, topology, collective, verify=False)
    if keep(ring):
        return ring
    return _loadable_variant(ring, keep, BaselineKind.RING, topology, collective, None, 0)  # a ring takes no size


def _most_threadblocks(algorithm: Algorithm) -> int:
    """Return the most threadblocks any rank of ``algorithm`` runs."""
    return max(len(program.threadblocks) for program in algorithm.ranks)


def best_baseline(
    topology: Topology, collective: Collective | str, size_bytes: int
) -> tuple[Algorithm, SimulationResult]:
    """Return the baseline with the smallest simulated time at ``size_bytes``, with its result.

    See ``best_baselines`` to compare at several sizes at once (cheaper).
    """
    (best,) = best_baselines(topology, collective, (size_bytes,))
    return best  # type: ignore[return-value]  # without ``keep`` every size has a ring or a direct baseline


def best_baselines_by_band(
    library: AlgorithmLibrary,
    topology: Topology,
    model: ExecutionModel = DEFAULT_MODEL,
    keep: Callable[[Algorithm], bool] | None = None,
) -> dict[int, tuple[Algorithm, ...]]:
    """Return, per band index of ``library`` with an algorithm, the baselines fastest at some of its sample sizes.

    Each band is sampled at ``band_sample_sizes``; all bands share one ``best_baselines`` call, so
    each baseline is built once. ``keep`` as ``best_baselines``: only baselines it accepts compete.
    """
    samples = {
        index: band_sample_sizes(band.min_bytes, band.max_bytes)
        for index, band in enumerate(library.bands)
        if band.algorithm is not None
    }
    sizes = sorted({size for band_sizes in samples.values() for size in band_sizes})
    best = dict(zip(sizes, best_baselines(topology, library.collective, sizes, keep=keep, model=model)))
    return {
        index: tuple({best[size][0].name: best[size][0] for size in band_sizes if best[size]}.values())
        for index, band_sizes in samples.items()
    }
