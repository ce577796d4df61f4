"""``taccl build``: synthesize libraries for machines × node counts × collectives, laid out as ``algorithms/``.

A package rather than a module of ``taccl_py/cli/`` only because that folder holds its fifteen
modules (tests/test_layout.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from taccl_py.build import (
    DEFAULT_RETRIES,
    DEFAULT_SIZES,
    ENGINES,
    BuildOptions,
    BuildReport,
    InstanceResult,
    build_libraries,
    library_path,
    list_instances,
    source_commit,
)
from taccl_py.cli._output import format_table, progress_to_stderr
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.topology import builtin_topology_names
from taccl_py.topology.compose import checked_node_count
from taccl_py.units import SIZE_SUFFIXES_HELP

__all__ = ["EXIT_BUILD_FAILED", "register"]

#: Exit status when one or more instances failed every attempt (their errors are on stderr).
EXIT_BUILD_FAILED = 1
_DEFAULT_NODES = "1,2,4"
_HEADERS = ("instance", "status", "attempts", "wall (s)", "peak MB", "bands")


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _node_counts(text: str) -> list[int]:
    """Return the machine counts of ``--nodes``; raise ArgumentError naming the option for a bad one."""
    counts = []
    for part in _names(text) or [text]:
        try:
            counts.append(checked_node_count(int(part), field="--nodes"))
        except ValueError:
            raise ArgumentError(None, "--nodes", f"{part!r}", "machine counts separated by commas, e.g. 1,2") from None
    return counts


def _instance_jobs(value: int) -> int:
    if value < 1:
        raise ArgumentError(None, "--instance-jobs", f"{value} jobs", "a positive number of worker processes")
    return value


def _build(args: argparse.Namespace) -> int:
    instances = list_instances(_names(args.topologies), _node_counts(args.node_counts), _names(args.collectives))
    options = BuildOptions(
        sizes=args.sizes,
        time_limit_s=args.time_limit,
        jobs=_instance_jobs(args.instance_jobs),
        designs_only=args.designs_only,
        source_commit=source_commit(),
    )
    if args.skip_existing:
        instances = tuple(i for i in instances if not library_path(args.output, i).exists())
    report = build_libraries(
        instances,
        options,
        args.output,
        engine=args.engine,
        address=args.address,
        jobs=args.jobs,
        retries=args.retries,
        progress=progress_to_stderr("build: "),
        on_result=None if args.metrics is None else _MetricsFile(args.metrics),
    )
    print(format_table(_HEADERS, _summary_rows(report)))
    for outcome in report.retried:
        failures = len(outcome.errors)
        attempts = "attempt" if failures == 1 else "attempts"
        print(f"build: {outcome.instance.label} built after {failures} failed {attempts}", file=sys.stderr)
    for outcome in report.failed:
        print(
            f"error: {outcome.instance.label}: failed {outcome.attempts} times: {outcome.errors[-1]}", file=sys.stderr
        )
    return EXIT_BUILD_FAILED if report.failed else 0


class _MetricsFile:
    """Append each built instance's metrics to a file as one JSON line (``scripts/bench_synthesis.py`` reads them)."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, result: InstanceResult) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(result.metrics) + "\n")


def _summary_rows(report: BuildReport) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for outcome in report.outcomes:
        if outcome.result is None:
            rows.append((outcome.instance.label, "failed", outcome.attempts, "-", "-", "-"))
            continue
        metrics = outcome.result.metrics
        wall, peak = f"{metrics['wall_s']:.1f}", f"{metrics['peak_tree_MB']:.0f}"
        rows.append((outcome.instance.label, "built", outcome.attempts, wall, peak, len(metrics["bands"])))
    return rows


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``build`` to ``subparsers``."""
    parser = subparsers.add_parser(
        "build",
        description="Synthesize a library for every machine x node count x collective and write each as "
        "DIR/<machine>/n<nodes>/<collective>.library.json with its band files, as algorithms/ holds them. "
        "Instances run in local worker processes or as Ray tasks; a failed or lost one is retried, and only a "
        "finished one is written. The files do not depend on the engine or on --jobs.",
    )
    parser.add_argument(
        "--topologies",
        default=",".join(builtin_topology_names()),
        help="built-in machines, comma-separated (default: all)",
    )
    parser.add_argument(
        "--nodes",
        dest="node_counts",
        default=_DEFAULT_NODES,
        metavar="N,N",
        help=f"machine counts (default {_DEFAULT_NODES})",
    )
    collectives = ",".join(collective.value for collective in Collective)
    parser.add_argument("--collectives", default=collectives, help=f"comma-separated (default {collectives})")
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"sizes to choose bands over, a list or a range (default {DEFAULT_SIZES}; {SIZE_SUFFIXES_HELP})",
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="the folder the libraries go under (created if missing)"
    )
    parser.add_argument("--engine", choices=ENGINES, default="local", help="where instances run (default local)")
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="with --engine ray: join this running Ray cluster (default: start a local Ray)",
    )
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help="instances built at once (default: 1 locally; with Ray, as many as its CPUs take)",
    )
    parser.add_argument(
        "--instance-jobs",
        type=int,
        default=1,
        metavar="N",
        help="worker processes for one instance's candidates (default 1; same result); a Ray task asks for N CPUs",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help=f"attempts after the first for a failed or lost instance (default {DEFAULT_RETRIES})",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="S",
        help="wall-clock safety cap per synthesis, seconds (default by GPU count); either engine stops an "
        "instance after the larger of an hour and twice this",
    )
    parser.add_argument(
        "--designs-only", action="store_true", help="no routing MILPs: choose among switch designs and baselines"
    )
    parser.add_argument(
        "--skip-existing", action="store_true", help="leave out instances whose library DIR already holds"
    )
    parser.add_argument(
        "--metrics", type=Path, metavar="FILE", help="append each built instance's metrics (JSON lines) to FILE"
    )
    parser.set_defaults(func=_build, output_folders=("output",))
