"""Summaries of ``bench_solvers.py``'s rows (per solver, per model, the conclusion) for the terminal and BENCHMARKS.md.

Rows are dictionaries as ``bench_harness.read_csv`` returns them (columns of ``bench_solvers.HEADER``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from bench_harness import csv_pointer, format_or_dash, markdown_table
from milp_solvers import CPSAT_VAR_SCALING

from taccl_py.solvers import DEFAULT_GAP_REL as GAP_REL
from taccl_py.units import format_size

__all__ = ["SUMMARY_HEADER", "GAP_REL", "instance_rows", "load_text", "render_section", "summary_rows", "verdict"]

SAME_OBJECTIVE = 1e-3  # objectives within this relative distance count as equal (the gap limit)
MODEL_KINDS = ("routing", "contiguity")


def _closed(row: dict) -> bool:
    """Return True when the solver proved its objective within the gap limit (our gap: (obj - bound) / obj)."""
    return row["gap"] is not None and row["gap"] <= GAP_REL * (1 + 1e-6)


def _feasible(row: dict) -> bool:
    """Return True when the row has an objective from a solution that passed the check (or had no values)."""
    return row["objective"] is not None and (row["violation"] is None or row["violation"] <= 0)


def _is_best(row: dict, best: dict[tuple, float]) -> bool:
    """Return True when the row's objective is within ``SAME_OBJECTIVE`` of the best any solver found."""
    return _feasible(row) and row["objective"] <= best[_model_key(row)] * (1 + SAME_OBJECTIVE)


def _best_objectives(rows: Sequence[dict]) -> dict[tuple, float]:
    """Return the lowest objective any solver found, per model (key: topology, nodes, model, chunkup, size)."""
    best: dict[tuple, float] = {}
    for row in rows:
        if _feasible(row):
            key = _model_key(row)
            best[key] = min(best.get(key, math.inf), row["objective"])
    return best


def _model_key(row: dict) -> tuple:
    return (row["topology"], row["nodes"], row["model"], row["chunkup"], row["design_bytes"])


def summary_rows(rows: Sequence[dict], solvers: Sequence[str]) -> list[tuple]:
    """Return one row per model kind and solver: gap closed, best found, ratio to HiGHS, time, starts taken."""
    out = []
    for kind in MODEL_KINDS:
        for solver in solvers:
            v = solver_stats(rows, kind, solver)
            if v is None:
                continue
            n = v["models"]
            out.append(
                (
                    kind,
                    solver,
                    f"{v['closed']}/{n}",
                    f"{v['best']}/{n}",
                    f"{v['beat_start']}/{n}",
                    f"{v['has_incumbent']}/{n}",
                    "-" if math.isinf(v["ratio"]) else f"{v['ratio']:.4f}",
                    "-" if math.isinf(v["worst_ratio"]) else f"{v['worst_ratio']:.4f}",
                    f"{v['median_s']:.1f}",
                    f"{v['total_s']:.0f}",
                    f"{v['start_taken']}/{n}",
                )
            )
    return out


SUMMARY_HEADER = (
    "model",
    "solver",
    "gap closed",
    "best found",
    "beat start",
    "has incumbent",
    "geo-mean obj/HiGHS",
    "worst obj/HiGHS",
    "median stop s",
    "total s",
    "start taken",
)


def instance_rows(rows: Sequence[dict], solvers: Sequence[str]) -> list[tuple]:
    """Return one row per model: size, start and HiGHS's objective, then each solver's ratio to it and stop time."""
    by_model: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        by_model.setdefault(_model_key(row), {})[row["solver"]] = row
    out = []
    for key, per_solver in by_model.items():
        first = next(iter(per_solver.values()))
        label = f"{first['topology']}x{first['nodes']} c{first['chunkup']}p{first['pieces']} "
        label += f"{format_size(first['design_bytes'])} {first['model']}"
        cells = [
            label,
            f"{first['cols']}/{first['int_cols']}/{first['rows']}",
            format_or_dash(first["start_objective"], ".7g"),
        ]
        for solver in solvers:
            row = per_solver.get(solver)
            if row is None:
                cells.append("-")
            elif solver == "highs":
                cells.append(f"{format_or_dash(row['objective'], '.7g')} ({_gap_text(row)}, {row['stop_s']:.1f} s)")
            else:
                ratio = "none" if row["ratio_to_highs"] is None else f"{row['ratio_to_highs']:.4f}"
                cells.append(f"{ratio} ({_gap_text(row)}, {row['stop_s']:.1f} s)")
        out.append(tuple(cells))
    return out


def _gap_text(row: dict) -> str:
    return "no bound" if row["gap"] is None else f"gap {100 * row['gap']:.2f}%"


def load_text(rows: Sequence[dict]) -> str:
    loads = [r["load1"] for r in rows]
    spread = f"{min(loads):.2f}-{max(loads):.2f}"
    return f"1-minute load average at the solves: {spread} (median {statistics.median(loads):.2f}) on 2 cores"


def _models_text(records: Sequence[dict]) -> str:
    """Return which machines, chunkups and sizes the rows cover, per model kind."""
    parts = []
    for kind in MODEL_KINDS:
        mine = [r for r in records if r["model"] == kind]
        if not mine:
            continue
        machines = ", ".join(dict.fromkeys(f"{r['topology']} x{r['nodes']}" for r in mine))
        chunkups = ", ".join(str(k) for k in sorted({r["chunkup"] for r in mine}))
        sizes = ", ".join(format_size(b) for b in sorted({r["design_bytes"] for r in mine}))
        models = len({_model_key(r) for r in mine})
        parts.append(f"{models} AllGather {kind} MILPs ({machines}; chunkup {chunkups}; designed for {sizes})")
    return " and ".join(parts)


def render_section(
    records: Sequence[dict], solvers: Sequence[str], versions: dict[str, str], cap_s: float, csv_path: Path
) -> str:
    """Return the BENCHMARKS.md body: set-up, the two summary tables, the pointer to the CSV and the conclusion."""
    names = ", ".join(versions.get(s, s) for s in solvers)
    instance_header = ("model", "cols/int/rows", "start") + tuple(
        "HiGHS objective" if s == "highs" else f"{s} obj/HiGHS" for s in solvers
    )
    return (
        f"Models: {_models_text(records)}, built by the synthesizer's own code (`route_chunks`; "
        "`schedule_sends` after a HiGHS routing, only machines under `MAX_MILP_SENDS` get one), with its first "
        "piece count for the size, written with `LpProblem.writeMPS` and read from that file by every solver.\n\n"
        f"Solvers: {names}. Every solve: 1 thread, {cap_s:g} s wall-clock cap, relative gap {GAP_REL:g}, the "
        "synthesizer's greedy start (completed by an LP over the continuous columns) given to each: HiGHS "
        "`setSolution`, CBC `-mips`, SCIP `addSol`, CP-SAT a solution hint. CP-SAT takes a MILP by scaling "
        f"continuous columns to integers (`mip_var_scaling` {CPSAT_VAR_SCALING:g}: 1 ns on µs times; its bound is "
        "that of the scaled model). Each answer is re-checked on the model (`violation` in the CSV: <= 0 is "
        "feasible) and its objective recomputed; times are wall seconds from the solve call.\n\n"
        f"{load_text(records)}.\n\n"
        "Per solver (gap closed: proved within the gap; best found: objective within 0.1% of the best any "
        "solver found; beat start: more than 0.1% below the greedy start):\n\n"
        + markdown_table(SUMMARY_HEADER, summary_rows(records, solvers))
        + "\n\nPer model (HiGHS's objective in µs with its gap and stop time; others: objective / HiGHS's):\n\n"
        + markdown_table(instance_header, instance_rows(records, solvers))
        + "\n\n"
        + csv_pointer(csv_path, len(records), "Every solve (status, bound, times to first and final incumbent)")
        + "\n\n"
        + verdict(records, solvers)
    )


# A solver "wins clearly" on a model kind, and the synthesizer should switch to it, when it finds better
# objectives (geometric mean of objective / HiGHS's at most CLEAR_RATIO, and the best objective on more
# models), or when it proves the gap on more models than HiGHS in at most half HiGHS's median time.
CLEAR_RATIO = 0.99


def solver_stats(records: Sequence[dict], kind: str, solver: str) -> dict[str, float] | None:
    """Return one solver's counts and times over the models of one kind (None: it ran on none)."""
    mine = [r for r in records if r["model"] == kind and r["solver"] == solver]
    if not mine:
        return None
    best = _best_objectives(records)
    ratios = [r["ratio_to_highs"] for r in mine if r["ratio_to_highs"] is not None]
    return {
        "models": len(mine),
        "closed": sum(map(_closed, mine)),
        "best": sum(_is_best(r, best) for r in mine),
        "beat_start": sum(_feasible(r) and r["objective"] < r["start_objective"] * (1 - SAME_OBJECTIVE) for r in mine),
        "has_incumbent": sum(r["objective"] is not None for r in mine),
        "ratio": math.exp(statistics.fmean(map(math.log, ratios))) if ratios else math.inf,
        "worst_ratio": max(ratios, default=math.inf),
        "median_s": statistics.median(r["stop_s"] for r in mine),
        "total_s": sum(r["stop_s"] for r in mine),
        "start_taken": sum(r["start"].startswith("given") for r in mine),
    }


def _wins_clearly(stats: dict[str, float], highs: dict[str, float]) -> bool:
    better = stats["ratio"] <= CLEAR_RATIO and stats["best"] > highs["best"]
    faster = stats["closed"] > highs["closed"] and stats["median_s"] <= 0.5 * highs["median_s"]
    return better or faster


def _kind_verdict(records: Sequence[dict], kind: str, solvers: Sequence[str]) -> tuple[str, list[str]]:
    """Return the sentence on one model kind and the solvers that win clearly on it."""
    stats = {s: v for s in solvers if (v := solver_stats(records, kind, s)) is not None}
    if "highs" not in stats:
        return "", []
    parts = [
        f"{s} finds the best objective on {v['best']}/{v['models']} and proves the gap on {v['closed']}/{v['models']} "
        f"(median stop {v['median_s']:.1f} s, objective/HiGHS {v['ratio']:.4f})"
        for s, v in stats.items()
    ]
    winners = [s for s, v in stats.items() if s != "highs" and _wins_clearly(v, stats["highs"])]
    if winners:
        outcome = f"{' and '.join(winners)} {'wins' if len(winners) == 1 else 'win'} clearly over HiGHS"
        for s in winners:
            v = stats[s]
            outcome += (
                f" ({s} returned no solution at all on {v['models'] - v['has_incumbent']}/{v['models']} "
                f"and took the start on {v['start_taken']}/{v['models']})"
            )
    else:
        outcome = "no solver wins clearly over HiGHS"
    return f"{kind.capitalize()} models: " + "; ".join(parts) + f". So {outcome}.", winners


def verdict(records: Sequence[dict], solvers: Sequence[str]) -> str:
    """Return the conclusion computed from the rows: per model kind, how each solver did and who wins clearly."""
    sentences, winners = [], {}
    for kind in MODEL_KINDS:
        sentence, kind_winners = _kind_verdict(records, kind, solvers)
        if sentence:
            sentences.append(sentence)
        if kind_winners:
            winners[kind] = kind_winners
    rule = (
        f"Rule (computed from the rows in `solvers_report.verdict`): a solver wins clearly when its geometric-mean "
        f"objective is at most {CLEAR_RATIO} of HiGHS's and it finds the best objective on more models, or when it "
        "proves the gap on more models in at most half HiGHS's median time; the project keeps HiGHS otherwise."
    )
    if winners:
        named = "; ".join(f"{' and '.join(w)} on the {kind} MILP" for kind, w in winners.items())
        advice = (
            f"Switch: worth it for {named}, as an optional solver beside HiGHS (it is not a dependency of the "
            "package), with the greedy routes kept as the fallback where it returns nothing; HiGHS stays the "
            "default until the switch is measured in whole syntheses (2 threads, the synthesizer's budgets)."
        )
    else:
        advice = "Switch: no; HiGHS stays."
    return "**Conclusion.** " + " ".join(sentences) + "\n\n" + rule + " " + advice
