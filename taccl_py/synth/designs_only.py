"""A library chosen among the switch designs and the baselines alone, for machines too large to route.

The routing MILPs grow with the GPU pairs a sketch lets talk: on one NVLink domain of 72 GPUs
(GB200 NVL72) every pair does, and a synthesis would run for hours on two cores. There,
``choose_designs`` builds a library from what needs no MILP: the switch designs
(``taccl_py.synth.switch_candidates``, with the writable baselines as the point-to-point parts of
the splits) and the baselines (``best_baselines_per_size``, NCCL's modelled algorithms among the
ones reported). Its provenance says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective, parse_collective
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel
from taccl_py.solvers import SolverOptions
from taccl_py.stages.sketch.model import Sketch
from taccl_py.synth.bands import choose_per_size
from taccl_py.synth.candidates import band_writable
from taccl_py.synth.outcome import SynthesisResult, best_baselines_per_size, library_of
from taccl_py.synth.switch_candidates import switch_candidates
from taccl_py.topology.model import Topology

__all__ = ["DESIGNS_ONLY_NOTE", "choose_designs"]

DESIGNS_ONLY_NOTE = "no routing MILP: bands chosen among the switch designs and the baselines"
SPLIT_PART_SIZES = 3  # the largest sizes whose kept baselines split the buffer with the switch


def choose_designs(
    topology: Topology,
    collective: Collective | str,
    sizes: Sequence[int],
    *,
    model: ExecutionModel = DEFAULT_MODEL,
    progress: Callable[[str], None] | None = None,
) -> SynthesisResult:
    """Return the library (and per-size choices) of the switch designs and baselines at ``sizes`` (bytes).

    Raises
    ------
    ArgumentError
        For AlltoAll (its LP is its synthesis), fewer than two sizes or one GPU.
    """
    began = time.perf_counter()
    collective = parse_collective(collective)
    sizes = tuple(sorted(set(sizes)))
    if collective is Collective.ALLTOALL or len(sizes) < 2 or topology.num_ranks < 2:
        raise ArgumentError(
            topology.name,
            "collective",
            f"{collective.value} at {len(sizes)} sizes on {topology.num_ranks} GPUs",
            "allgather, reducescatter or allreduce at two or more sizes on two or more GPUs",
        )
    options = SolverOptions()
    baselines = best_baselines_per_size(topology, collective, sizes, options, True, progress, model=model)
    # The splits pay where the buffer is large (the switch part's α is NCCL's NVLS latency): the
    # point-to-point parts are the baselines kept at the largest sizes, each simulated at every size.
    parts = list({c.kept[0].name: c.kept[0] for c in baselines[-SPLIT_PART_SIZES:] if c.kept is not None}.values())
    designs = switch_candidates(topology, collective, sizes, parts, model=model, progress=progress)
    usable = [pair for pair in designs if band_writable(pair[0])]
    choices = choose_per_size(sizes, usable, baselines, fallback=designs, leave_to_native=True)
    sketch = Sketch(name="none")
    library = library_of(topology, collective, sizes, sketch, options, choices, None, model)
    provenance = replace(library.provenance, note=DESIGNS_ONLY_NOTE)
    return SynthesisResult(
        choices[-1].chosen,
        collective,
        topology.name,
        sketch,
        choices,
        replace(library, provenance=provenance),
        tuple(algorithm.name for algorithm, _ in designs),
        False,
        time.perf_counter() - began,
        None,
        provenance,
    )
