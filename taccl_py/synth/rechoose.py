"""Choose a library's bands again under another execution model, from the algorithms it already has.

A library's bands were chosen by simulating its synthesized candidates and the baselines under one
model of the runtime (``taccl_py.simulate.model``). Under another, such as MSCCL's slice loop, a
band synthesized for one size may lose to another band's algorithm or to a baseline. Choosing
again needs no synthesis: every band algorithm of the library and the loadable baselines are
simulated at the library's sizes under the new model, and the fastest per size is kept
(``choose_bands``), so no band is slower there than its best loadable baseline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.simulate import MSCCL_LOOP, ExecutionModel, SimulationResult
from taccl_py.synth.bands import SizeChoice, build_library
from taccl_py.synth.candidates import simulate_at
from taccl_py.synth.outcome import best_baselines_per_size, choose_bands
from taccl_py.synth.solver import SolverOptions
from taccl_py.topology.bounds import lower_bounds
from taccl_py.topology.model import Topology

__all__ = ["rechoose_bands", "band_algorithms"]

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
    model: ExecutionModel = MSCCL_LOOP,
    progress: Callable[[str], None] | None = None,
) -> tuple[AlgorithmLibrary, tuple[SizeChoice, ...]]:
    """Return ``library`` with its bands chosen under ``model``, and the choice at each of its sizes.

    The candidates are the library's band algorithms and the baselines that load in MSCCL,
    simulated on ``topology`` at the sizes in the library's provenance.

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
    baselines = best_baselines_per_size(
        topology, library.collective, sizes, SolverOptions(), True, progress, model=model
    )
    choices, _ = choose_bands(sizes, True, pool, baselines)
    note = f"bands chosen again under the {model.name} model from the library's band algorithms and the baselines"
    earlier = library.provenance.note
    provenance = replace(
        library.provenance,
        execution_model=model.name,
        note=note if not earlier or note in earlier else f"{earlier}; {note}",
    )
    stem = library.collective.value
    rechosen = build_library(
        library.topology,
        library.nodes,
        library.collective,
        library.num_ranks,
        choices,
        stem,
        provenance,
        library.cluster,
    )
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
