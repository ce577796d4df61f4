"""Rebuild the shipped algorithm libraries in algorithms/<topology>/n<nodes>/<collective>.library.json.

Every built-in topology at 1, 2 and 4 nodes, for allgather, reducescatter, allreduce and alltoall, over
sizes 1KB..1GB: ``synthesize`` keeps, per size band, the fastest of the synthesized candidates
and the baselines under the simulator, and ``write_library`` writes the library with one
xz-compressed algorithm JSON per band (MSCCL XML is derived on demand: ``taccl export-msccl``).
Each library records its provenance: taccl_py version, solver and options, sketch, sizes, and
the source commit and command that built it. Each instance runs in its own process (``--one``),
so its wall time and peak memory are its own; they are printed as one JSON line per instance
and, with ``--metrics FILE``, collected for ``bench_synthesis.py``.

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
import resource
import subprocess
import sys
import time
from dataclasses import replace
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
from process_memory import TreeMemory

from taccl_py.stages.routing import ALTERNATIVE_STATUS
from taccl_py.synth import SynthesisResult, synthesize, write_library
from taccl_py.synth.designs_only import choose_designs
from taccl_py.topology import load_topology
from taccl_py.units import parse_sizes

DEFAULT_SIZES = "1KB-1GB"
DEFAULT_NODES = "1,2,4"
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
# Wall-clock cap per instance (s), over the synthesizer's own safety cap (30 min at 64+ GPUs).
INSTANCE_TIMEOUT_S = 3600
REPO = Path(__file__).resolve().parents[1]
ALGORITHMS_DIR = REPO / "algorithms"


def library_path(topology: str, nodes: int, collective: str) -> Path:
    """Return where the shipped library of one instance lives in the source tree."""
    return ALGORITHMS_DIR / topology / f"n{nodes}" / f"{collective}.library.json"


def source_commit() -> str | None:
    """Return the checkout's commit, with ``-dirty`` when its source (not algorithms/) has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        # Libraries a running rebuild has already written are its outputs, not a change to its source.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)algorithms"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty.strip() else "")


def instance_command(
    topology: str, nodes: int, collective: str, sizes: str, time_limit_s: float | None, designs_only: bool = False
) -> str:
    """Return the command that rebuilds one instance's library."""
    command = (
        f"python scripts/build_algorithms.py --topologies {topology} --nodes {nodes} "
        f"--collectives {collective} --sizes {sizes}"
    )
    command += f" --time-limit {time_limit_s:g}" if time_limit_s is not None else ""
    return command + (" --designs-only" if designs_only else "")


def _greedy_bands(result: SynthesisResult, statuses: tuple[str, ...] = ("heuristic", ALTERNATIVE_STATUS)) -> int:
    """Return how many sizes chose a synthesized algorithm with greedy routes of one of ``statuses``.

    ``heuristic``: the routing MILP found nothing better than its greedy start within its budget;
    ``ALTERNATIVE_STATUS``: a greedy routing ordered faster than the MILP's.
    """
    return sum(
        any(status in dict(choice.chosen.metadata).get("routing", "") for status in statuses)
        for choice in result.choices
    )


def build_instance(
    topology_name: str,
    nodes: int,
    collective: str,
    sizes: str,
    time_limit_s: float | None,
    write: bool,
    jobs: int | None = None,
    designs_only: bool = False,
) -> dict:
    """Synthesize one instance (in this process), optionally write its library; return its metrics."""
    topology = load_topology(topology_name, nodes=nodes)
    began = time.perf_counter()
    if designs_only:
        result = choose_designs(topology, collective, parse_sizes(sizes), progress=log)
    else:
        result = synthesize(
            topology, collective, sizes=parse_sizes(sizes), time_limit_s=time_limit_s, progress=log, jobs=jobs
        )
    wall = time.perf_counter() - began
    provenance = replace(
        result.library.provenance,
        source_commit=source_commit(),
        command=instance_command(topology_name, nodes, collective, sizes, time_limit_s, designs_only),
    )
    library = replace(result.library, topology=topology_name, provenance=provenance)
    if write:
        path = library_path(topology_name, nodes, collective)
        path.parent.mkdir(parents=True, exist_ok=True)  # a machine or node count shipped for the first time
        for old in path.parent.glob(f"{collective}-*"):
            old.unlink()
        write_library(library, path, compress=True)
    rows = []
    for choice in result.choices:
        syn, base = choice.synthesized, choice.baseline
        rows.append(
            {
                "size_bytes": choice.size_bytes,
                "chosen": choice.chosen.name,
                "chosen_us": choice.chosen_result.time_us,
                "synthesized_us": None if syn is None else syn.time_us,
                "baseline": choice.baseline_name,
                "baseline_us": None if base is None else base.time_us,
                "bound_us": choice.chosen_result.bound_time_us,
            }
        )
    return {
        "topology": topology_name,
        "nodes": nodes,
        "collective": collective,
        "num_ranks": topology.num_ranks,
        "wall_s": wall,
        "peak_rss_MB": max(
            resource.getrusage(who).ru_maxrss / 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        ),
        "timed_out": result.timed_out,
        "budget_bound": None if result.budget_bound is None else result.budget_bound.value,
        "greedy_bands": _greedy_bands(result),
        "greedy_stall_bands": _greedy_bands(result, ("heuristic",)),
        "jobs": jobs,
        "candidates": list(result.candidates),
        "rows": rows,
    }


def run_instance(topology: str, nodes: int, collective: str, args: argparse.Namespace) -> dict | None:
    """Run one instance in a fresh process; return its metrics, or None when it failed."""
    cmd = [sys.executable, __file__, "--one", topology, str(nodes), collective, "--sizes", args.sizes]
    if args.time_limit is not None:
        cmd += ["--time-limit", str(args.time_limit)]
    if args.jobs is not None:
        cmd += ["--jobs", str(args.jobs)]
    if args.designs_only:
        cmd.append("--designs-only")
    if not args.no_write:
        cmd.append("--write")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        memory = TreeMemory(child.pid).start()
        try:
            stdout, stderr = child.communicate(timeout=INSTANCE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            log(f"{topology} n{nodes} {collective}: timed out after {INSTANCE_TIMEOUT_S} s")
            return None
        finally:
            memory.stop()
    if child.returncode != 0:
        log(f"{topology} n{nodes} {collective}: failed\n{stderr[-4000:]}")
        return None
    metrics = json.loads(stdout.strip().splitlines()[-1])
    # The instance's own figure misses its forkserver workers; the sampled tree does not.
    metrics["peak_tree_MB"] = max(memory.peak_total_MB, metrics["peak_rss_MB"])
    metrics["peak_process_MB"] = max(memory.peak_process_MB, metrics["peak_rss_MB"])
    return metrics


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


def sweep_instances(
    args: argparse.Namespace, run_args: argparse.Namespace, skip_existing: bool = False
) -> tuple[list[dict], int]:
    """Run every (topology, nodes, collective) instance ``args`` names; return the metrics and the failure count."""
    metrics: list[dict] = []
    failures = 0
    for name in split_names(args.topologies):
        for nodes in (int(n) for n in split_names(args.nodes)):
            for collective in split_names(args.collectives):
                if skip_existing and library_path(name, nodes, collective).exists():
                    continue
                log(f"== {name} n{nodes} {collective}")
                found = run_instance(name, nodes, collective, run_args)
                if found is None:
                    failures += 1
                    continue
                log(f"   {found['wall_s']:.1f} s, {found['peak_tree_MB']:.0f} MB (all processes)")
                metrics.append(found)
                if args.metrics is not None:
                    with args.metrics.open("a", encoding="utf-8") as handle:
                        handle.write(json.dumps(found) + "\n")
    return metrics, failures


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_sweep_arguments(parser)
    parser.add_argument("--skip-existing", action="store_true", help="keep libraries already built")
    parser.add_argument("--no-write", action="store_true", help="synthesize and report, write no library")
    parser.add_argument("--one", nargs=3, metavar=("TOPOLOGY", "NODES", "COLLECTIVE"), help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        name, nodes, collective = args.one
        metrics = build_instance(
            name, int(nodes), collective, args.sizes, args.time_limit, args.write, args.jobs, args.designs_only
        )
        print(json.dumps(metrics))
        return 0
    _metrics, failures = sweep_instances(args, args, skip_existing=args.skip_existing)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
