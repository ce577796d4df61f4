"""Build one instance in this process: synthesize its library and return every file's bytes and the run's metrics.

Each engine runs this function, in a process of its own per instance, and hands the result to the
driver, which alone writes files. ``TACCL_BUILD_FAULTS`` makes chosen instances fail their first
attempts, so that the retry path can be tested through the engines' real failure modes.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from taccl_py.build.instance import BuildOptions, Instance, InstanceResult, instance_command
from taccl_py.build.memory import TreeMemory
from taccl_py.stages.routing import ALTERNATIVE_STATUS
from taccl_py.synth import SynthesisResult, synthesize, write_library
from taccl_py.synth.designs_only import choose_designs
from taccl_py.topology import load_topology
from taccl_py.units import parse_sizes

__all__ = ["FAULTS_ENV", "build_instance"]

#: Names a JSON file ``{"ndv2/n1/allgather": {"fail": 1, "how": "raise"}}``: that instance's first ``fail``
#: attempts raise (``"raise"``), end their process at once (``"exit"``, as a crashed worker does) or never
#: finish (``"hang"``, until the engine's cap stops them). The attempts are counted in marker files beside
#: it, so they add up across processes and machines that share it.
FAULTS_ENV = "TACCL_BUILD_FAULTS"
_CRASH_STATUS = 70  # what an injected crash exits with (EX_SOFTWARE)
_HANG_S = 86400.0  # how long an injected hang sleeps: past any engine's cap


def build_instance(
    instance: Instance, options: BuildOptions, progress: Callable[[str], None] | None = None
) -> InstanceResult:
    """Return the library files (bytes, by path relative to the output folder) and the metrics of ``instance``.

    The files are exactly those ``write_library(..., compress=True)`` writes, the provenance holding
    ``options.source_commit`` and ``instance_command``; nothing is left on disk.
    """
    _inject_fault(instance)
    memory = TreeMemory(os.getpid()).start()
    try:
        topology = load_topology(instance.machine, nodes=instance.nodes)
        began = time.perf_counter()
        sizes = parse_sizes(options.sizes)
        if options.designs_only:
            result = choose_designs(topology, instance.collective, sizes, progress=progress)
        else:
            result = synthesize(
                topology,
                instance.collective,
                sizes=sizes,
                time_limit_s=options.time_limit_s,
                progress=progress,
                jobs=options.jobs,
            )
        wall_s = time.perf_counter() - began
    finally:
        memory.stop()
    provenance = replace(
        result.library.provenance, source_commit=options.source_commit, command=instance_command(instance, options)
    )
    library = replace(result.library, topology=instance.machine, provenance=provenance)
    with tempfile.TemporaryDirectory(prefix="taccl-build-") as scratch:
        path = Path(scratch) / instance.library_file
        path.parent.mkdir(parents=True)
        write_library(library, path, compress=True)
        written = sorted(path for path in Path(scratch).rglob("*") if path.is_file())
        files = {path.relative_to(scratch).as_posix(): path.read_bytes() for path in written}
    metrics = _metrics(instance, options, result, topology.num_ranks, wall_s, memory)
    return InstanceResult(instance, files, metrics)


def _metrics(
    instance: Instance,
    options: BuildOptions,
    result: SynthesisResult,
    num_ranks: int,
    wall_s: float,
    memory: TreeMemory,
) -> dict[str, Any]:
    """Return the figures of one build (what ``scripts/bench_synthesis.py`` tabulates)."""
    rss_MB = max(resource.getrusage(who).ru_maxrss / 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return {
        "topology": instance.machine,
        "nodes": instance.nodes,
        "collective": instance.collective,
        "num_ranks": num_ranks,
        "wall_s": wall_s,
        "peak_rss_MB": rss_MB,
        # The process's own figure misses its forkserver workers; the sampled tree does not.
        "peak_tree_MB": max(memory.peak_total_MB, rss_MB),
        "peak_process_MB": max(memory.peak_process_MB, rss_MB),
        "timed_out": result.timed_out,
        "budget_bound": None if result.budget_bound is None else result.budget_bound.value,
        "greedy_bands": _greedy_bands(result),
        "greedy_stall_bands": _greedy_bands(result, ("heuristic",)),
        "jobs": options.jobs,
        "candidates": list(result.candidates),
        "bands": [
            {
                "min_bytes": band.min_bytes,
                "max_bytes": band.max_bytes,
                "chosen": "native"
                if band.algorithm is None
                else dict(band.algorithm.metadata).get("source_algorithm", band.algorithm.name),
            }
            for band in result.library.bands
        ],
        "rows": [
            {
                "size_bytes": choice.size_bytes,
                "chosen": choice.chosen.name,
                "chosen_us": choice.chosen_result.time_us,
                "synthesized_us": None if choice.synthesized is None else choice.synthesized.time_us,
                "baseline": choice.baseline_name,
                "baseline_us": None if choice.baseline is None else choice.baseline.time_us,
                "bound_us": choice.chosen_result.bound_time_us,
            }
            for choice in result.choices
        ],
    }


def _greedy_bands(result: SynthesisResult, statuses: tuple[str, ...] = ("heuristic", ALTERNATIVE_STATUS)) -> int:
    """Return how many sizes chose a synthesized algorithm with greedy routes of one of ``statuses``.

    ``heuristic``: the routing MILP found nothing better than its greedy start within its budget;
    ``ALTERNATIVE_STATUS``: a greedy routing ordered faster than the MILP's.
    """
    return sum(
        any(status in dict(choice.chosen.metadata).get("routing", "") for status in statuses)
        for choice in result.choices
    )


def _inject_fault(instance: Instance) -> None:
    """Fail this attempt when ``TACCL_BUILD_FAULTS`` asks for it (see ``FAULTS_ENV``); else do nothing."""
    plan_path = os.environ.get(FAULTS_ENV)
    if not plan_path:
        return
    key = instance.library_file.removesuffix(".library.json")
    fault = json.loads(Path(plan_path).read_text(encoding="utf-8")).get(key)
    if fault is None:
        return
    marker = Path(f"{plan_path}.{key.replace('/', '_')}")
    attempt = len(marker.read_text(encoding="utf-8")) if marker.exists() else 0
    if attempt >= fault["fail"]:
        return
    with marker.open("a", encoding="utf-8") as handle:
        handle.write("x")
    if fault.get("how") == "exit":
        os._exit(_CRASH_STATUS)
    if fault.get("how") == "hang":
        time.sleep(_HANG_S)
    raise RuntimeError(f"{instance.label}: injected failure {attempt + 1} of {fault['fail']} ({FAULTS_ENV})")
