"""Choose a library's bands again under another execution model, from the algorithms it already has.

A library's bands were chosen by simulating its synthesized candidates and the baselines under one
model of the runtime (``taccl_py.simulate.model``). Under another, such as MSCCL's slice loop, a
band synthesized for one size may lose to another band's algorithm or to a baseline. Choosing
again needs no synthesis: every band algorithm of the library and the loadable baselines are
simulated at the library's sizes under the new model, and the fastest per size is kept
(``choose_bands``), so no band is slower there than its best loadable baseline.

Below the first size at which the library's own band runs its chunks in more than one pass
(``single_pass_limit``), the new model gives every band the time it had, so the choice made
there by the synthesis stands (``keep_bands_below``): choosing again among band algorithms would
only merge narrow bands, whose protocol (LL for the smallest: ``taccl_py.msccl.protocol``) is
chosen per band.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from taccl_py.baselines.nccl import nccl_best_times
from taccl_py.bounds import lower_bounds
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, cluster_record
from taccl_py.msccl.selection import power_of_two_sizes
from taccl_py.simulate import (
    DEFAULT_MODEL,
    WHOLE_CHUNKS,
    ExecutionModel,
    SimulationResult,
    execution_model,
    simulate,
    simulate_sizes,
)
from taccl_py.simulate.model import slice_sizes
from taccl_py.solvers import SolverOptions
from taccl_py.synth.bands import SizeChoice, build_library
from taccl_py.synth.candidates import geometric_middle, simulate_at
from taccl_py.synth.outcome import best_baselines_per_size, choose_bands
from taccl_py.synth.switch_candidates import switch_candidates
from taccl_py.topology.model import Topology

__all__ = ["rechoose_bands", "band_algorithms", "single_pass_limit", "keep_bands_below", "refine_native_edges"]

logger = logging.getLogger(__name__)


def band_algorithms(library: AlgorithmLibrary) -> tuple[Algorithm, ...]:
    """Return the library's distinct band algorithms under the names they were synthesized with.

    A band's file name is only its position (``allgather-3``); ``source_algorithm`` keeps the name
    of the synthesized or baseline algorithm, which a new band list records again.
    """
    seen: dict[str, Algorithm] = {}
    for band in library.bands:
        if band.algorithm is None:
            continue
        source = band.algorithm.meta("source_algorithm") or band.algorithm.name
        seen.setdefault(source, replace(band.algorithm, name=source, min_bytes=0, max_bytes=None))
    return tuple(seen.values())


def rechoose_bands(
    library: AlgorithmLibrary,
    topology: Topology,
    *,
    model: ExecutionModel = DEFAULT_MODEL,
    progress: Callable[[str], None] | None = None,
    machine: str | None = None,
) -> tuple[AlgorithmLibrary, tuple[SizeChoice, ...]]:
    """Return ``library`` with its bands chosen under ``model``, and the choice at each of its sizes.

    The candidates are the library's band algorithms, the switch designs (on a machine whose
    NVSwitch reduces, split with the library's AllReduces: ``switch_candidates``) and the
    baselines that a band may hold, simulated on ``topology`` at the sizes in the library's
    provenance; sizes where NCCL's modelled algorithms are faster become native bands.
    ``choices`` hold the choice at every size; below ``single_pass_limit`` the returned library
    keeps its own bands instead (``keep_bands_below``), whose times the model does not change when
    the library's own model timed one pass alike (``times_one_pass_alike``; else every size anew).
    ``machine`` names another built-in machine of the same GPU graph (dgx-b200 for a dgx-h100
    library): its bands are then chosen from the library's algorithms on ``topology``'s rates,
    every size anew, and the result is that machine's library.

    Raises ``ArgumentError`` when the library records no sizes or was made for another rank count.
    """
    if library.provenance is None or not library.provenance.sizes:
        raise ArgumentError(library.topology, "provenance.sizes", "no sizes recorded", "a library built over sizes")
    if library.num_ranks != topology.num_ranks:
        raise ArgumentError(
            library.topology,
            "num_ranks",
            f"{library.num_ranks} ranks but topology {topology.name!r} has {topology.num_ranks} GPUs",
            "the topology the library was made for",
        )
    sizes = tuple(library.provenance.sizes)
    bounds = lower_bounds(topology, library.collective, sizes)
    pool: list[tuple[Algorithm, tuple[SimulationResult, ...]]] = []
    for algorithm in band_algorithms(library):
        pool.append((algorithm, simulate_at(algorithm, topology, sizes, bounds, progress, model=model)))
    parts = [algorithm for algorithm, _ in pool if not algorithm.uses_switch]
    pool += switch_candidates(topology, library.collective, sizes, parts, model=model, progress=progress)
    baselines = best_baselines_per_size(
        topology, library.collective, sizes, SolverOptions(), True, progress, model=model
    )
    choices, _ = choose_bands(sizes, True, pool, baselines)
    limit = single_pass_limit(library, model)
    note = f"bands chosen again under the {model.name} model from the library's band algorithms and the baselines"
    derived = machine is not None and machine != library.topology
    if derived:
        note = f"band algorithms of {library.topology} x{library.nodes} chosen again on {machine}'s rates"
    earlier = library.provenance.note
    provenance = replace(
        library.provenance,
        execution_model=model.name,
        note=note if not earlier or note in earlier else f"{earlier}; {note}",
    )
    stem = library.collective.value
    rechosen = build_library(
        machine if derived else library.topology,
        library.nodes,
        library.collective,
        library.num_ranks,
        choices,
        stem,
        provenance,
        cluster_record(topology) if derived else library.cluster,
    )
    # Bands the model leaves alone are kept, unless the choice now holds what the library could not:
    # a switch design, a size left to NCCL, or another machine's rates, or the library's own model
    # timed a single pass otherwise (msccl's sends between machines wait; msccl-net's do not).
    anew = derived or any(choice.native or choice.chosen.uses_switch for choice in choices)
    anew = anew or not times_one_pass_alike(library.provenance.execution_model, model, topology)
    if not anew and limit is None:  # every band runs one pass at every size: the model changes no band's time
        rechosen = replace(rechosen, bands=library.bands)
    elif not anew:
        rechosen = keep_bands_below(library, rechosen, limit, topology, model)
    logger.info(
        "%s x%d %s: %d bands under the %s model (was %d)",
        library.topology,
        library.nodes,
        stem,
        len(rechosen.bands),
        model.name,
        len(library.bands),
    )
    return rechosen, choices


def times_one_pass_alike(previous: str | None, model: ExecutionModel, topology: Topology) -> bool:
    """Return True when ``previous`` (a model's name; None: whole chunks) and ``model`` time one pass alike.

    They differ only in slicing when every send on ``topology`` is serialized or pipelined alike under both.
    """
    before = execution_model(previous or WHOLE_CHUNKS.name)
    crossings = (False, True) if topology.nodes > 1 else (False,)
    return all(before.pipelines(between) == model.pipelines(between) for between in crossings)


def single_pass_limit(library: AlgorithmLibrary, model: ExecutionModel) -> int | None:
    """Return the smallest of the library's sizes (bytes) at which its band there runs more than one pass.

    None: at every size each band runs its chunks in one pass of ``model``'s slice loop.
    """
    for size in library.provenance.sizes:
        algorithm = library.select(size)
        if algorithm is not None and len(slice_sizes(size / algorithm.chunks_per_loop, model, algorithm.protocol)) > 1:
            return size
    return None


def keep_bands_below(
    previous: AlgorithmLibrary, rechosen: AlgorithmLibrary, limit: int, topology: Topology, model: ExecutionModel
) -> AlgorithmLibrary:
    """Return ``previous``'s bands below ``limit``'s band boundary and ``rechosen``'s from there, renumbered.

    The boundary is the geometric middle between ``limit`` and the library size before it, where
    band boundaries always lie. A band cut at its low end gets the simulated time (µs, under
    ``model`` on ``topology``) of the first library size it now covers, as every band records.
    """
    sizes = previous.provenance.sizes
    index = sizes.index(limit)
    if index == 0:
        return rechosen
    boundary = geometric_middle(sizes[index - 1], limit)
    below = [_clipped(band, band.min_bytes, min(band.max_bytes or boundary, boundary)) for band in previous.bands]
    above = []
    for band in rechosen.bands:
        if band.max_bytes is not None and band.max_bytes <= boundary:
            continue
        clipped = _clipped(band, max(band.min_bytes, boundary), band.max_bytes)
        if clipped.min_bytes != band.min_bytes and clipped.algorithm is not None:
            first = next(size for size in sizes if clipped.covers(size))
            time_us = simulate(clipped.algorithm, topology, first, bound_time_us=0.0, model=model).time_us
            clipped = replace(clipped, simulated_time_us=time_us)
        above.append(clipped)
    bands = [band for band in below if band.min_bytes < boundary]
    if above and bands and _same_program(bands[-1], above[0]):  # one band, not two of one algorithm
        bands[-1] = _clipped(bands[-1], bands[-1].min_bytes, above[0].max_bytes)
        above = above[1:]
    bands += above
    numbered = tuple(
        replace(
            band,
            algorithm=band.algorithm.with_metadata(band=str(i)) if band.algorithm is not None else None,
        )
        for i, band in enumerate(bands)
    )
    return replace(rechosen, bands=numbered)


def _same_program(band: SizeBand, other: SizeBand) -> bool:
    """Return True when two bands run the same program (native bands: both native)."""
    if band.algorithm is None or other.algorithm is None:
        return band.algorithm is other.algorithm
    return band.algorithm.ranks == other.algorithm.ranks and band.algorithm.protocol == other.algorithm.protocol


def _clipped(band: SizeBand, low: int, high: int | None) -> SizeBand:
    """Return ``band`` over ``low`` <= size < ``high`` (its algorithm's own range too)."""
    algorithm = band.algorithm
    if algorithm is not None:
        algorithm = replace(algorithm, min_bytes=low, max_bytes=high)
    return replace(band, min_bytes=low, max_bytes=high, algorithm=algorithm)


def refine_native_edges(
    library: AlgorithmLibrary, topology: Topology, *, model: ExecutionModel = DEFAULT_MODEL
) -> AlgorithmLibrary:
    """Return ``library`` with each edge between a band of ours and a native band moved to where NCCL takes over.

    Bands are chosen at the library's sizes (x4 apart) and meet at their geometric middle, so a
    power-of-two size between two chosen sizes can fall in a band slower there than NCCL's
    modelled algorithm. At each power of two between the two sizes around such an edge, ours
    (simulated) and NCCL's best (``nccl_best_times``: what a native band runs) are compared, and the edge moves to the
    smallest power of two from which the later band's side wins at every probed size up to the
    next chosen size (the earlier side's band keeps the rest).
    """
    sizes = sorted(library.provenance.sizes) if library.provenance else []
    bands = list(library.bands)
    for index in range(len(bands) - 1):
        low, high = bands[index], bands[index + 1]
        if low.native == high.native:
            continue
        below = [s for s in sizes if s < high.min_bytes]
        above = [s for s in sizes if s >= high.min_bytes]
        if not below or not above:
            continue
        probes = [p for p in power_of_two_sizes(below[-1] + 1, above[0] - 1)]
        if not probes:
            continue
        ours_band = high if low.native else low
        ours = [r.time_us for r in simulate_sizes(ours_band.algorithm, topology, probes, model=model)]
        nccl = [best.time_us for best in nccl_best_times(topology, library.collective, probes, model=model)]
        later_wins = [(n < o) if low.native is False else (o <= n) for o, n in zip(ours, nccl)]
        edge = next((p for i, p in enumerate(probes) if all(later_wins[i:])), above[0])
        if edge != high.min_bytes:
            bands[index] = replace(low, max_bytes=edge, algorithm=_clip(low.algorithm, low.min_bytes, edge))
            bands[index + 1] = replace(high, min_bytes=edge, algorithm=_clip(high.algorithm, edge, high.max_bytes))
    return replace(library, bands=tuple(bands))


def _clip(algorithm: Algorithm | None, low: int, high: int | None) -> Algorithm | None:
    return None if algorithm is None else replace(algorithm, min_bytes=low, max_bytes=high)
