"""Rebuild the shipped algorithm libraries in algorithms/<topology>/n<nodes>/<collective>.library.json.

Every built-in topology at 1, 2 and 4 nodes, for allgather, reducescatter, allreduce and alltoall, over
sizes 1KB..1GB: ``synthesize`` keeps, per size band, the fastest of the synthesized candidates
and the baselines under the simulator, and ``write_library`` writes the library with one
xz-compressed algorithm JSON per band (MSCCL XML is derived on demand: ``taccl export-msccl``).
Each library records its provenance: taccl_py version, solver and options, sketch, sizes, and
the source commit and command that built it. Each instance runs in its own process (the local
engine of ``taccl_py.build``, what ``taccl build`` runs, which also runs instances at once or on
Ray), so its wall time and peak memory are its own; with ``--metrics FILE`` they are collected,
one JSON line per instance, for ``bench_synthesis.py``.

The MILP budgets are work (node limits, one thread, a fixed seed), so a rebuild writes the same
libraries on a busy or an idle machine; ``--time-limit`` is only the wall-clock safety cap and a
library records when it bound. ``--jobs`` runs an instance's candidates in worker processes (same
result). Peak memory is given three ways: the instance process's own (``peak_rss_MB``), and, sampled
from /proc every 0.25 s, the whole process tree's largest total (``peak_tree_MB``, forkserver
workers included) and its largest single process (``peak_process_MB``).

    python scripts/build_algorithms.py                           # 1, 2, 4 nodes: about 40 min on 2 cores
    python scripts/build_algorithms.py --topologies ndv2 --nodes 1,2 --skip-existing
    python scripts/build_algorithms.py --topologies gb200-nvl72 --nodes 1,2 --designs-only \
        --collectives allgather,reducescatter,allreduce

``--designs-only`` skips the routing MILPs (``taccl_py.synth.designs_only``): the library is chosen
among the switch designs and the baselines, for machines of one NVLink domain too large to route
(GB200 NVL72: 72 GPUs, every pair a logical link).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_harness import (
    add_collectives_argument,
    add_jobs_argument,
    add_nodes_argument,
    add_sizes_argument,
    add_topologies_argument,
    argument_parser,
    log,
    split_names,
)

from taccl_py.build import BuildOptions, InstanceResult, build_libraries, list_instances, source_commit
from taccl_py.synth.jobs import available_cores

__all__ = ["add_sweep_arguments", "library_path", "run_instance", "source_commit", "sweep_instances"]

DEFAULT_SIZES = "1KB-1GB"
DEFAULT_NODES = "1,2,4"
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
REPO = Path(__file__).resolve().parents[1]
ALGORITHMS_DIR = REPO / "algorithms"


def library_path(topology: str, nodes: int, collective: str) -> Path:
    """Return where the shipped library of one instance lives in the source tree."""
    return ALGORITHMS_DIR / topology / f"n{nodes}" / f"{collective}.library.json"


def _options(run_args: argparse.Namespace) -> BuildOptions:
    """Return the build options ``run_args`` names (``jobs`` None: one worker per core, as synthesize takes it)."""
    return BuildOptions(
        sizes=run_args.sizes,
        time_limit_s=run_args.time_limit,
        jobs=available_cores() if run_args.jobs is None else run_args.jobs,
        designs_only=getattr(run_args, "designs_only", False),
        source_commit=source_commit(),
    )


def run_instance(topology: str, nodes: int, collective: str, args: argparse.Namespace) -> dict | None:
    """Run one instance in a fresh process, writing its library unless ``args.no_write``; return its metrics or None."""
    (instance,) = list_instances([topology], [nodes], [collective])
    report = build_libraries([instance], _options(args), None if args.no_write else ALGORITHMS_DIR, retries=0)
    outcome = report.outcomes[0]
    if outcome.result is None:
        log(f"{instance.label}: failed: {outcome.errors[-1]}")
        return None
    return outcome.result.metrics


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options naming which instances a sweep runs and where their metrics go."""
    add_topologies_argument(parser)
    add_nodes_argument(parser, DEFAULT_NODES)
    add_collectives_argument(parser, ",".join(COLLECTIVES))
    add_sizes_argument(parser, DEFAULT_SIZES)
    parser.add_argument(
        "--time-limit", type=float, default=None, help="wall-clock safety cap per instance (default by GPU count)"
    )
    add_jobs_argument(parser, None, per="instance")
    parser.add_argument("--metrics", type=Path, help="append each instance's metrics (JSON lines) to this file")
    parser.add_argument(
        "--designs-only", action="store_true", help="no routing MILPs: choose among switch designs and baselines"
    )


class _Recorder:
    """Log each built instance's wall time and memory, and append its metrics to ``path`` (None: nowhere)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def __call__(self, result: InstanceResult) -> None:
        metrics = result.metrics
        log(f"   {metrics['wall_s']:.1f} s, {metrics['peak_tree_MB']:.0f} MB (all processes)")
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(metrics) + "\n")


def sweep_instances(
    args: argparse.Namespace, run_args: argparse.Namespace, skip_existing: bool = False
) -> tuple[list[dict], int]:
    """Run every (topology, nodes, collective) instance ``args`` names, one at a time; return metrics and failures."""
    nodes = [int(count) for count in split_names(args.nodes)]
    instances = list_instances(split_names(args.topologies), nodes, split_names(args.collectives))
    if skip_existing:
        instances = tuple(i for i in instances if not library_path(i.machine, i.nodes, i.collective).exists())
    report = build_libraries(
        instances,
        _options(run_args),
        None if run_args.no_write else ALGORITHMS_DIR,
        retries=0,
        progress=log,
        on_result=_Recorder(args.metrics),
    )
    for outcome in report.failed:
        log(f"{outcome.instance.label}: failed: {outcome.errors[-1]}")
    return [outcome.result.metrics for outcome in report.outcomes if outcome.result is not None], len(report.failed)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_sweep_arguments(parser)
    parser.add_argument("--skip-existing", action="store_true", help="keep libraries already built")
    parser.add_argument("--no-write", action="store_true", help="synthesize and report, write no library")
    args = parser.parse_args(argv)
    _metrics, failures = sweep_instances(args, args, skip_existing=args.skip_existing)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
