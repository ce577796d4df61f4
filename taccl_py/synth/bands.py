"""Size bands: the best algorithm per size among synthesized candidates and the baselines.

For a list of sizes, every candidate chunking proposed for some size is synthesized once, tuned
for the geometric middle of the sizes that proposed it, and simulated at every size; so is the
best baseline of each size. Each size takes the fastest exportable algorithm; neighbouring sizes
with the same winner share a band. A boundary sits at the geometric middle between the sizes on
either side, or, given the topology, where its two bands cross (``crossover_edge``).
``write_library`` writes the library JSON with one algorithm JSON per band beside it
(``taccl_py.ir.library``'s format); ``taccl export-msccl`` derives the MSCCL XML.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from taccl_py._io import write_text_atomic
from taccl_py.baselines.choice import ComparedBaseline
from taccl_py.baselines.nccl import is_schedule, nccl_best_times
from taccl_py.errors import InfeasibleError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import (
    NATIVE_ALGORITHM,
    AlgorithmLibrary,
    ClusterRecord,
    Provenance,
    SizeBand,
    generate_library,
)
from taccl_py.msccl.selection import power_of_two_sizes
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel, SimulationResult, faster, simulate_sizes
from taccl_py.synth.candidates import geometric_middle
from taccl_py.topology.model import Topology

__all__ = ["SizeChoice", "choose_per_size", "build_library", "crossover_edge", "band_file_stem", "write_library"]


@dataclass(frozen=True)
class SizeChoice:
    """The winner at one size, with the best synthesized result and the baseline it is compared with.

    ``baseline`` and ``baseline_name`` are the fastest baseline (``ComparedBaseline.fastest``), the
    one every printed ratio is against; ``baseline_chosen`` says the winner is a baseline, which
    where only some may be written (library bands) can be a slower one than ``baseline_name``.
    ``baseline_is_schedule`` is False where the fastest baseline is one of NCCL's modelled
    algorithms (``baselines.nccl``: NVLS, PAT), which is compared with but never written.
    ``native`` says a library leaves this size to NCCL: its fastest modelled algorithm (``nccl``)
    is faster than everything a band may hold, by more than rounding (``faster``; ``chosen`` is then
    the fastest of those, not written), whether or not a schedule that may not be written is faster
    still. Where a band may hold nothing at this size, it is left to NCCL too, and ``chosen`` is the
    fastest schedule built.
    """

    size_bytes: int
    chosen: Algorithm
    chosen_result: SimulationResult
    synthesized: SimulationResult | None
    baseline: SimulationResult | None
    baseline_name: str | None
    baseline_chosen: bool = False
    baseline_is_schedule: bool = True
    native: bool = False
    nccl: SimulationResult | None = None

    @property
    def runs_us(self) -> float:
        """Return the time of what runs at this size (µs): NCCL's modelled time where native, else the chosen one's."""
        return self.nccl.time_us if self.native and self.nccl is not None else self.chosen_result.time_us


def choose_per_size(
    sizes: Sequence[int],
    synthesized: Sequence[tuple[Algorithm, Sequence[SimulationResult]]],
    baselines: Sequence[ComparedBaseline],
    *,
    eligible: Sequence[bool] | None = None,
    fallback: Sequence[tuple[Algorithm, Sequence[SimulationResult]]] = (),
    leave_to_native: bool = False,
) -> tuple[SizeChoice, ...]:
    """Return, per size, the fastest of the synthesized algorithms and that size's writable baseline.

    ``synthesized`` pairs each algorithm with its results at every size (None where it was not
    simulated); ``baselines[i]`` holds the fastest baseline at ``sizes[i]`` (what the choice is
    reported against) and the fastest that may be written (what competes). Ties go to the
    synthesized algorithm. Where ``eligible[i]`` is False the baseline is only reported, never
    chosen (default: all eligible). ``fallback`` candidates are used at a size where nothing else
    may be chosen.
    """
    choices = []
    for i, size in enumerate(sizes):
        simulated = [pair for pair in synthesized if pair[1][i] is not None]
        base, reference, nccl = baselines[i].kept, baselines[i].fastest, baselines[i].native
        competes = base is not None and (eligible is None or eligible[i])
        if not simulated and not competes:  # nothing preferred at this size: take any candidate
            simulated = [pair for pair in fallback if pair[1][i] is not None]
        best_syn = min(simulated, key=lambda pair: pair[1][i].time_us, default=None)
        options = []
        if best_syn is not None:
            options.append((best_syn[1][i].time_us, 0, best_syn[0], best_syn[1][i]))
        if base is not None and (competes or not options):
            options.append((base[1].time_us, 1, base[0], base[1]))
        if not options:
            choices.append(_left_to_nccl(size, baselines[i], leave_to_native))
            continue
        _, from_baseline, algorithm, result = min(options, key=lambda o: (o[0], o[1]))
        choices.append(
            SizeChoice(
                size,
                algorithm,
                result,
                None if best_syn is None else best_syn[1][i],
                None if reference is None else reference[1],
                None if reference is None else reference[0].name,
                from_baseline == 1,
                reference is None or is_schedule(reference[0]),
                leave_to_native and nccl is not None and faster(nccl[1].time_us, result.time_us),
                None if nccl is None else nccl[1],
            )
        )
    return tuple(choices)


def _left_to_nccl(size: int, compared: ComparedBaseline, leave_to_native: bool) -> SizeChoice:
    """Return the native choice at a size where nothing a band may hold runs (every schedule over a runtime limit).

    ``chosen`` is then the fastest schedule built (``ComparedBaseline.schedule``), reported but never
    written. Raises ``InfeasibleError`` where no size may be left to NCCL (a one-size run), NCCL has
    no algorithm there, or no schedule was built.
    """
    reference, nccl, schedule = compared.fastest, compared.native, compared.schedule
    if not leave_to_native or nccl is None or schedule is None:
        raise InfeasibleError(f"synthesis: nothing that may be written runs {size} bytes; expected a smaller job")
    return SizeChoice(
        size,
        schedule[0],
        schedule[1],
        None,
        None if reference is None else reference[1],
        None if reference is None else reference[0].name,
        baseline_chosen=True,
        baseline_is_schedule=reference is None or is_schedule(reference[0]),
        native=True,
        nccl=nccl[1],
    )


def build_library(
    topology_name: str,
    nodes: int,
    collective: Collective,
    num_ranks: int,
    choices: Sequence[SizeChoice],
    stem: str,
    provenance: Provenance | None = None,
    cluster: ClusterRecord | None = None,
    *,
    topology: Topology | None = None,
    model: ExecutionModel = DEFAULT_MODEL,
) -> AlgorithmLibrary:
    """Return the library whose bands cover all sizes, one band per run of equal winners.

    ``cluster`` (``taccl_py.ir.library.cluster_record`` of the topology) lets the runtime check
    that the live cluster is the one the library was made for. Band edges sit at the geometric
    middle of the sizes on either side; with ``topology``, where the two bands cross under
    ``model`` (``crossover_edge``).
    """
    runs: list[list[SizeChoice]] = []
    for choice in choices:
        if runs and _runs_the_same(runs[-1][-1], choice):
            runs[-1].append(choice)
        else:
            runs.append([choice])
    edges = [
        geometric_middle(below[-1].size_bytes, above[0].size_bytes)
        if topology is None
        else crossover_edge(below[-1], above[0], topology, model)
        for below, above in zip(runs, runs[1:])
    ]
    bands = []
    for index, run in enumerate(runs):
        low = 0 if index == 0 else edges[index - 1]
        high = None if index == len(runs) - 1 else edges[index]
        if run[0].native:  # NCCL's own collective runs here; the band records NCCL's modelled time
            bands.append(SizeBand(low, high, None, NATIVE_ALGORITHM, run[0].runs_us))
            continue
        algorithm = replace(run[0].chosen, name=f"{stem}-{index}", min_bytes=low, max_bytes=high)
        algorithm = algorithm.with_metadata(source_algorithm=run[0].chosen.name, band=str(index))
        bands.append(SizeBand(low, high, algorithm, f"{stem}-{index}.json", run[0].chosen_result.time_us))
    return AlgorithmLibrary(topology_name, nodes, collective, num_ranks, tuple(bands), provenance, cluster)


def crossover_edge(
    below: SizeChoice, above: SizeChoice, topology: Topology, model: ExecutionModel = DEFAULT_MODEL
) -> int:
    """Return the edge (bytes) between the band of ``below`` and the next one, of ``above``, where the two cross.

    Both are timed at each power of two between their sizes (a native band at NCCL's best time,
    ``nccl_best_times``; a schedule simulated under ``model``). The edge is the geometric middle of
    the first probe from which ``above``'s is faster at every probe and the size before it (without
    probes: of the two sizes), so chosen sizes a factor of 4 apart no longer fix it 2x from the crossover.
    """
    low, high = below.size_bytes, above.size_bytes
    probes = power_of_two_sizes(low + 1, high - 1)
    if not probes:
        return geometric_middle(low, high)
    lower = _times_us(below, topology, probes, model)
    upper = _times_us(above, topology, probes, model)
    wins = [up < down for down, up in zip(lower, upper)]
    first = next((i for i in range(len(probes)) if all(wins[i:])), len(probes))
    points = (low, *probes, high)
    return geometric_middle(points[first], points[first + 1])


def _times_us(choice: SizeChoice, topology: Topology, sizes: Sequence[int], model: ExecutionModel) -> list[float]:
    """Return what runs in ``choice``'s band at ``sizes`` (µs): NCCL's best where native, else its algorithm."""
    if choice.native:
        return [best.time_us for best in nccl_best_times(topology, choice.chosen.collective, sizes, model=model)]
    return [result.time_us for result in simulate_sizes(choice.chosen, topology, sizes, model=model)]


def _runs_the_same(one: SizeChoice, other: SizeChoice) -> bool:
    """Return True when two sizes' choices make one band: both native, or both the same algorithm."""
    return (one.native, None if one.native else one.chosen) == (other.native, None if other.native else other.chosen)


def band_file_stem(path: str | Path) -> str:
    """Return the stem band files are named after: ``allgather`` for ``allgather.library.json``."""
    name = Path(path).name
    for suffix in (".library.json", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def write_library(
    library: AlgorithmLibrary,
    path: str | Path,
    progress: Callable[[str], None] | None = None,
    *,
    compress: bool = False,
) -> None:
    """Write the library JSON at ``path`` and its band algorithms (taccl JSON) beside it.

    Band files are named after the library file: ``ar-0.json`` for ``ar.library.json``; with
    ``compress`` they are xz files (``ar-0.json.xz``), as the shipped libraries are, since 64-rank
    schedules run to megabytes of text. Every text is generated before the first file is written.
    """
    folder = Path(path).parent
    stem = band_file_stem(path)
    suffix = ".json.xz" if compress else ".json"
    library = replace(
        library,
        bands=tuple(
            band
            if band.algorithm is None  # native: no file
            else replace(
                band, algorithm=replace(band.algorithm, name=f"{stem}-{i}"), algorithm_file=f"{stem}-{i}{suffix}"
            )
            for i, band in enumerate(library.bands)
        ),
    )
    texts = {
        folder / band.algorithm_file: generate_algorithm_json(band.algorithm)
        for band in library.bands
        if band.algorithm is not None
    }
    texts[Path(path)] = generate_library(library)
    for file, text in texts.items():
        write_text_atomic(file, text)
        if progress is not None:
            progress(f"wrote {file}")
