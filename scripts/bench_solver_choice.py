"""Benchmark the MILP solver choice in whole syntheses: CP-SAT against HiGHS, and CP-SAT's work budgets.

Every instance (built-in machine x nodes, collective, one size) is synthesized twice in this
process with ``taccl_py.synth.synthesize``, once with ``--solver highs`` and once with ``cpsat``,
each with its default work budgets. A row gives the best synthesized algorithm's simulated time
under each, its fraction of the lower bound, the ratio cpsat/highs (< 1: CP-SAT's is faster), the
wall time of each synthesis, which budget stopped a MILP, and how many candidates kept greedy or
packed routes (the MILP found nothing better). ``--ladder`` also solves the routing MILPs of the
64 MB AllGather syntheses of ``--ladder-instances`` alone with CP-SAT at several deterministic-time
budgets and tables the objective at each: the measurement behind
``solver_cpsat.DETERMINISTIC_TIME_BY_COLUMNS``. ``--ladder-only`` prints that table alone.

    python scripts/bench_solver_choice.py --jobs 2 --ladder --date 2026-11-24
    python scripts/bench_solver_choice.py --ladder-only --ladder-instances dgx2:4
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from unittest import mock

from bench_harness import (
    add_collectives_argument,
    add_instances_argument,
    add_jobs_argument,
    add_no_write_argument,
    argument_parser,
    command_line,
    log,
    markdown_table,
    parse_instances,
    split_names,
    update_benchmarks_section,
)
from bench_scaling import target_s

import taccl_py.stages.routing as routing_module
from taccl_py.solvers import SolveOutcome, SolverOptions, SolveStatus, describe_solver, solve_model
from taccl_py.solvers.matrix import milp_matrix
from taccl_py.synth import synthesize
from taccl_py.topology import load_topology
from taccl_py.units import format_size, parse_size

DEFAULT_INSTANCES = "ndv2:2,dgx2:2,dgx-a100:4,dgx1:2,dgx2:4"
DEFAULT_COLLECTIVES = "allgather,allreduce"
LADDER_INSTANCES = "ndv2:2,dgx-a100:4,dgx2:2,dgx2:4"
LADDER_BUDGETS_S = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
# A switch of the default must buy at least 1% in simulated time (geometric mean over the rows).
SWITCH_GEO_MEAN = 0.99
# Routing statuses that mean the MILP's routes were not kept (route_chunks keeps its start's status):
# greedy, packed trees (tree_packing), hierarchical (hierarchy.HIERARCHICAL_STATUS).
_KEPT_START = ("heuristic", "tree packing", "hierarchical")
HEADERS = (
    "instance",
    "GPUs",
    "highs µs",
    "cpsat µs",
    "highs of bound",
    "cpsat of bound",
    "cpsat/highs",
    "highs wall s",
    "cpsat wall s",
    "target s",
    "highs budget",
    "cpsat budget",
    "highs greedy/packed",
    "cpsat greedy/packed",
)


def _kept_starts(candidates: tuple[str, ...]) -> str:
    """Return how many phase routings kept a greedy, packed or hierarchical start, of all (e.g. ``1/10``)."""
    phases = [phase for candidate in candidates for phase in candidate.rsplit(":", 1)[-1].split("+")]
    return f"{sum(phase.startswith(_KEPT_START) for phase in phases)}/{len(phases)}"


def run_one(name: str, nodes: int, collective: str, size_bytes: int, solver: str, jobs: int) -> dict:
    """Return the metrics of one synthesis: simulated time (µs), fraction of the bound, wall (s), budgets."""
    result = synthesize(load_topology(name, nodes=nodes), collective, size_bytes=size_bytes, solver=solver, jobs=jobs)
    best = result.choices[0].synthesized
    return {
        "time_us": best.time_us,
        "of_bound": best.fraction_of_bound,
        "wall_s": result.wall_s,
        "budget": "none" if result.budget_bound is None else result.budget_bound.value,
        "kept": _kept_starts(result.candidates),
        "statuses": dict(Counter(candidate.rsplit(":", 1)[-1] for candidate in result.candidates)),
        "num_ranks": result.algorithm.num_ranks,
    }


def compare_row(label: str, highs: dict, cpsat: dict) -> tuple:
    """Return the table row of one instance from its two syntheses' metrics."""
    return (
        label,
        highs["num_ranks"],
        f"{highs['time_us']:.1f}",
        f"{cpsat['time_us']:.1f}",
        f"{highs['of_bound']:.3f}",
        f"{cpsat['of_bound']:.3f}",
        f"{cpsat['time_us'] / highs['time_us']:.4f}",
        f"{highs['wall_s']:.1f}",
        f"{cpsat['wall_s']:.1f}",
        f"{target_s(highs['num_ranks']):.0f}",
        highs["budget"],
        cpsat["budget"],
        highs["kept"],
        cpsat["kept"],
    )


def summary(pairs: list[dict[str, dict]]) -> str:
    """Return the summary paragraph, with the rule's verdict, from every instance's metrics by solver."""
    ratios = [m["cpsat"]["time_us"] / m["highs"]["time_us"] for m in pairs]
    better = sum(r < 1 - 1e-3 for r in ratios)
    worse = sum(r > 1 + 1e-3 for r in ratios)
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    over = {s: sum(m[s]["wall_s"] > target_s(m[s]["num_ranks"]) for m in pairs) for s in ("highs", "cpsat")}
    walls = sum(m["cpsat"]["wall_s"] for m in pairs) / sum(m["highs"]["wall_s"] for m in pairs)
    switch = geo <= SWITCH_GEO_MEAN and worse == 0 and over["cpsat"] <= over["highs"]
    return (
        f"Over {len(pairs)} syntheses, CP-SAT's algorithm is faster on {better}, slower on {worse} and within "
        f"0.1% on {len(pairs) - better - worse}; geometric-mean time ratio cpsat/highs {geo:.4f}, worst "
        f"{max(ratios):.4f}, best {min(ratios):.4f}. Total wall time cpsat/highs {walls:.2f}; syntheses over "
        f"their wall-time target: highs {over['highs']}, cpsat {over['cpsat']}. Rule: make cpsat the default only "
        f"if its geometric-mean ratio is at most {SWITCH_GEO_MEAN} with no slower row and no more targets missed: "
        f"{'switch' if switch else 'cpsat stays optional'}."
    )


def run_comparison(args: argparse.Namespace) -> str:
    """Run every instance with both solvers and return the markdown body of the section."""
    size = parse_size(args.size)
    rows, pairs = [], []
    for name, nodes in parse_instances(args.instances):
        for collective in split_names(args.collectives):
            label = f"{name} x{nodes} {collective}"
            metrics = {}
            for solver in ("highs", "cpsat"):
                log(f"== {label} {format_size(size)} {solver}")
                metrics[solver] = run_one(name, nodes, collective, size, solver, args.jobs)
                log(f"   {metrics[solver]}")
            pairs.append(metrics)
            rows.append(compare_row(label, metrics["highs"], metrics["cpsat"]))
            log("   " + " | ".join(str(cell) for cell in rows[-1]))
    solvers = ", ".join(describe_solver(SolverOptions(solver=s)) for s in ("highs", "cpsat"))
    return (
        f"Solvers: {solvers}; each with its default work budget (HiGHS: nodes by model size; CP-SAT: "
        f"deterministic time by model size), one thread, seed 0. Size {format_size(size)}, --jobs {args.jobs}.\n\n"
        + markdown_table(HEADERS, rows)
        + "\n\n"
        + summary(pairs)
        + "\n"
    )


def _captured_routing_models(name: str, nodes: int, collective: str, size_bytes: int) -> list:
    """Return (model, start) of every routing MILP a synthesis builds (the MILPs themselves not solved)."""
    kept = []

    def keep(prob, options, time_limit_s=None, start=None, *, progress=None):
        kept.append((prob, dict(start or {})))
        return SolveOutcome(SolveStatus.NO_SOLUTION, None, 0.0)

    with mock.patch.object(routing_module, "solve_model", keep):
        synthesize(load_topology(name, nodes=nodes), collective, size_bytes=size_bytes, jobs=1)
    return kept


def run_ladder(args: argparse.Namespace) -> str:
    """Solve each instance's routing MILPs at ``LADDER_BUDGETS_S`` and return the table (objective per budget)."""
    size_bytes = parse_size(args.size)
    rows = []
    for name, nodes in parse_instances(args.ladder_instances):
        log(f"== ladder {name} x{nodes}")
        for index, (prob, start) in enumerate(_captured_routing_models(name, nodes, "allgather", size_bytes)):
            cells = []
            for budget_s in LADDER_BUDGETS_S:
                outcome = solve_model(prob, SolverOptions(solver="cpsat", deterministic_time_s=budget_s), start=start)
                objective = "-" if outcome.objective is None else f"{outcome.objective:.2f}"
                cells.append(f"{objective} ({outcome.status.value}, {outcome.wall_s:.2f} s)")
            rows.append((f"{name} x{nodes} #{index}", milp_matrix(prob).num_constrained_columns, *cells))
            log("   " + " | ".join(str(cell) for cell in rows[-1]))
    headers = ("routing model", "columns", *(f"{budget_s:g} work s" for budget_s in LADDER_BUDGETS_S))
    return (
        f"CP-SAT's routing objective (µs; status, wall s) by deterministic-time budget, on the routing MILPs of "
        f"{format_size(size_bytes)} AllGather syntheses, greedy start as hint, "
        f"{describe_solver(SolverOptions(solver='cpsat'))}:\n\n" + markdown_table(headers, rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_instances_argument(parser, DEFAULT_INSTANCES)
    add_collectives_argument(parser, DEFAULT_COLLECTIVES)
    parser.add_argument("--size", default="64MB")
    add_jobs_argument(parser)
    parser.add_argument("--ladder", action="store_true", help="also table CP-SAT's routing objectives by budget")
    parser.add_argument("--ladder-only", action="store_true", help="print that table alone; no write")
    parser.add_argument("--ladder-instances", default=LADDER_INSTANCES, help="topology:nodes, comma-separated")
    parser.add_argument("--date", default=None, help="the date written in BENCHMARKS.md (default today)")
    add_no_write_argument(parser, "BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.ladder_only:
        print(run_ladder(args))
        return 0
    body = run_comparison(args)
    if args.ladder:
        body += "\n" + run_ladder(args)
    print(body)
    if not args.no_write:
        update_benchmarks_section(
            "solver-choice", "Whole syntheses: CP-SAT against HiGHS", command_line(__file__, argv), body, date=args.date
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
