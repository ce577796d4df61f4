"""Benchmark one-size synthesis from 16 to 512 GPUs: wall time, peak memory, quality, budgets, determinism.

Each instance (built-in machine x nodes, one collective, one size) runs in its own process through
``build_algorithms.py --one`` with ``--jobs`` workers, so its wall time and peak memory are its
own. The table gives the wall time against the issue's target for its GPU count, the chosen
algorithm's fraction of the lower bound and its speed-up over the best baseline measured in the
same run, which budget stopped a MILP (``node limit``: the work budget, reproducible), and how
many bands used greedy routes (in brackets: those where the routing MILP found nothing better
than its greedy start; the rest are greedy routings that ordered faster than the MILP's).
``--repeat`` runs the first instance again and reports whether the chosen algorithms and their
simulated times are identical (the budgets are work, not seconds;
``tests/test_solver_budgets.py`` compares the bytes).

    python scripts/bench_scaling.py --repeat                         # the default sweep, 16-128 GPUs
    python scripts/bench_scaling.py --instances dgx-a100:2,dgx2:2 --collectives allreduce --no-write
    python scripts/bench_scaling.py --instances dgx-h100:32,dgx-h100:64 --sizes 16MB,64MB,1GB --jobs 2

With ``--sizes`` each instance is one synthesis of all the sizes (a library), and the table gives per
size the fraction of the bound and the ratio to the best baseline (NCCL's modelled algorithms among them).
"""

from __future__ import annotations

import argparse
import json
import sys

from bench_harness import (
    add_collectives_argument,
    add_instances_argument,
    add_jobs_argument,
    add_no_write_argument,
    add_sizes_argument,
    argument_parser,
    command_line,
    format_or_dash,
    log,
    markdown_table,
    parse_instances,
    speedup,
    split_names,
    update_benchmarks_section,
)
from build_algorithms import run_instance

from taccl_py.units import format_size, parse_size

DEFAULT_INSTANCES = (
    "ndv2:2,dgx-a100:2,dgx2:2,dgx-a100:4,dgx-h100:4,dgx2:4,dgx-a100:8,dgx-h100:8,ndv2:8,"
    "dgx-a100:16,dgx-h100:16,ndv2:16,dgx2:8"
)
#: The issue's one-size targets on 2 cores (s) by GPU count.
TARGET_S = ((16, 10.0), (32, 60.0), (64, 180.0), (128, 900.0), (512, 900.0))
HEADERS = (
    "instance",
    "GPUs",
    "wall (s)",
    "target (s)",
    "peak MB (all)",
    "peak MB (one)",
    "of bound",
    "vs best baseline",
    "chosen",
    "budget",
    "greedy bands (MILP stalled)",
)


PEAK_NOTE = (
    "\n\nPeak MB, sampled from /proc every 0.25 s over the synthesis and every process it starts (the "
    "forkserver workers of --jobs included): (all) the largest total resident set at one moment, "
    "(one) the largest single process's high-water mark.\n"
)


def target_s(num_ranks: int) -> float:
    """Return the wall-time target (s) of a one-size synthesis over ``num_ranks`` GPUs."""
    for ranks, target in TARGET_S:
        if num_ranks <= ranks:
            return target
    return TARGET_S[-1][1]


def instance_row(metrics: dict) -> tuple:
    """Return the table row of one instance's metrics (``build_algorithms.build_instance``)."""
    row = metrics["rows"][-1]
    return (
        f"{metrics['topology']} x{metrics['nodes']} {metrics['collective']}",
        metrics["num_ranks"],
        f"{metrics['wall_s']:.0f}",
        f"{target_s(metrics['num_ranks']):.0f}",
        f"{metrics['peak_tree_MB']:.0f}",
        f"{metrics['peak_process_MB']:.0f}",
        f"{row['bound_us'] / row['chosen_us']:.3f}",
        format_or_dash(speedup(row["baseline_us"], row["chosen_us"]), ".2f", "x"),
        row["chosen"].replace(f"-{metrics['collective']}-", "-", 1),
        metrics["budget_bound"] or "none",
        f"{metrics['greedy_bands']} ({metrics.get('greedy_stall_bands', '-')})",
    )


def sizes_row(metrics: dict) -> tuple:
    """Return the table row of one instance synthesized at several sizes: per size, of bound and vs best baseline."""
    cells = [
        f"{metrics['topology']} x{metrics['nodes']} {metrics['collective']}",
        metrics["num_ranks"],
        f"{metrics['wall_s']:.0f}",
        f"{metrics['peak_tree_MB']:.0f}",
    ]
    for row in metrics["rows"]:
        cells.append(
            f"{row['bound_us'] / row['chosen_us']:.2f}, "
            + format_or_dash(speedup(row["baseline_us"], row["chosen_us"]), ".2f", "x")
        )
    cells.append(metrics["rows"][-1]["chosen"].replace(f"-{metrics['collective']}-", "-", 1))
    return tuple(cells)


def sizes_headers(sizes: list[str]) -> tuple[str, ...]:
    """Return the headers of ``sizes_row`` for ``sizes`` (as given)."""
    per_size = tuple(f"{size}: of bound, vs best" for size in sizes)
    return ("instance", "GPUs", "wall (s, all sizes)", "peak MB (all)", *per_size, "chosen at the largest")


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_instances_argument(parser, DEFAULT_INSTANCES)
    add_collectives_argument(parser, "allgather,allreduce")
    parser.add_argument("--size", default="64MB")
    add_sizes_argument(parser, "", what="several sizes (16MB,64MB,1GB): one synthesis of all, a column per size")
    add_jobs_argument(parser)
    parser.add_argument("--repeat", action="store_true", help="run the first instance twice and compare the bytes")
    add_no_write_argument(parser, "BENCHMARKS.md")
    args = parser.parse_args(argv)
    many = split_names(args.sizes) if args.sizes else None
    size = ",".join(many) if many else format_size(parse_size(args.size))
    run_args = argparse.Namespace(sizes=size, time_limit=None, jobs=args.jobs, no_write=True)
    collectives = split_names(args.collectives)
    rows, first = [], None
    for collective in collectives:
        for name, nodes in parse_instances(args.instances):
            log(f"== {name} x{nodes} {collective} {size}")
            metrics = run_instance(name, nodes, collective, run_args)
            if metrics is None:
                width = len(sizes_headers(many)) if many else len(HEADERS)
                rows.append((f"{name} x{nodes} {collective}", "-", "failed", *("-",) * (width - 3)))
                continue
            first = first or (name, nodes, collective, metrics)
            rows.append(sizes_row(metrics) if many else instance_row(metrics))
            log("   " + " | ".join(str(cell) for cell in rows[-1]))
    body = markdown_table(sizes_headers(many) if many else HEADERS, rows) + PEAK_NOTE
    if args.repeat and first is not None:
        name, nodes, collective, metrics = first
        again = run_instance(name, nodes, collective, run_args)
        same = again is not None and json.dumps(again["rows"]) == json.dumps(metrics["rows"])
        body += (
            f"\n\nRun twice, {name} x{nodes} {collective}: chosen algorithms and simulated times "
            f"{'identical' if same else 'DIFFERENT'} (budgets are work: node limits, one thread, seed 0).\n"
        )
    print(body)
    if not args.no_write:
        update_benchmarks_section(
            "scaling-sizes" if many else "scaling",
            f"{'Synthesis of several sizes' if many else 'One-size synthesis'} at scale "
            f"({', '.join(collectives)}, {size}, --jobs {args.jobs})",
            command_line(__file__, argv),
            body,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
