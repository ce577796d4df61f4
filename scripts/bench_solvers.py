"""Compare HiGHS with CBC, SCIP and OR-Tools CP-SAT on the synthesizer's own MILPs; write the ``solvers`` section.

The models are built by the synthesizer's code paths, unchanged: ``route_chunks`` (greedy routes -> horizon
-> routing MILP -> warm start) and ``compose._schedule_phase`` (routing solved by HiGHS, ordering, then the
contiguity MILP of ``schedule_sends``), with the solve call replaced by one that keeps the model and its
start. Each model goes to MPS (``LpProblem.writeMPS``) and every solver reads that file with 1 thread, the
same wall-clock cap and relative gap 1e-3, starting from the synthesizer's greedy start completed by an LP
(``milp_model.complete_start``). Every answer is re-evaluated on the model (objective, worst violation).

    python scripts/bench_solvers.py                      # the full set, writes BENCHMARKS.md and the CSV
    python scripts/bench_solvers.py --quick --no-write   # one small model, every solver, 10 s cap
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from bench_harness import (
    DATA_DIR,
    add_no_write_argument,
    argument_parser,
    csv_records,
    format_or_dash,
    log,
    print_table,
    read_csv,
    update_benchmarks_section,
    write_csv,
)
from milp_model import MpsModel, check_solution, complete_start, read_mps
from milp_solvers import SOLVERS, SolveLimits, SolveRecord, run_solver, solver_availability, solver_versions
from solvers_report import GAP_REL, SUMMARY_HEADER, instance_rows, load_text, render_section, summary_rows

import taccl_py.stages.routing as routing_module
import taccl_py.stages.scheduling as scheduling_module
from taccl_py.bounds import lower_bounds
from taccl_py.ir.collectives import Collective
from taccl_py.solvers import SolveOutcome, SolverOptions, SolveStatus
from taccl_py.stages.logical import LogicalGraph, build_logical_graph
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth.candidates import candidate_chunkings
from taccl_py.synth.compose import Chunking, _schedule_phase
from taccl_py.topology import load_topology
from taccl_py.units import format_size

COMMAND = "python scripts/bench_solvers.py"
CSV_PATH = DATA_DIR / "solvers.csv"
MACHINES = (("ndv2", 2), ("dgx2", 2), ("dgx-a100", 4), ("dgx2", 4))
DESIGN_BYTES = (64_000_000, 1_000_000_000)
CHUNKUPS = (1, 2)
# Contiguity models: the MILP is built only up to scheduling.MAX_MILP_SENDS sends, which of the machines
# above only the 16-GPU NDv2 pair stays under with one chunk per rank.
CONTIGUITY = (("ndv2", 2, 1, 64_000_000), ("ndv2", 2, 1, 1_000_000_000))
QUICK = (("dgx-a100", 4, 1, 64_000_000, "routing"),)
TIME_LIMIT_S = 30.0  # per solve: between the synthesizer's 32-GPU budget (40 s for all models) and its 16-GPU one
QUICK_TIME_LIMIT_S = 10.0
# HiGHS time for the routing MILP that precedes a contiguity model (s, as ROUTING_TIME_SHARE of this budget).
CONTIGUITY_PHASE_BUDGET_S = 20.0
HEADER = (
    "topology",
    "nodes",
    "gpus",
    "model",
    "chunkup",
    "pieces",
    "design_bytes",
    "cols",
    "int_cols",
    "rows",
    "solver",
    "status",
    "start",
    "start_objective",
    "objective",
    "bound",
    "gap",
    "first_s",
    "best_s",
    "stop_s",
    "ratio_to_highs",
    "violation",
    "load1",
    "note",
)


@dataclass(frozen=True)
class Instance:
    """One model: a machine, a chunking of an AllGather tuned for ``design_bytes``, and which MILP."""

    topology: str
    nodes: int
    chunkup: int
    design_bytes: int
    model: str  # "routing" or "contiguity"

    @property
    def label(self) -> str:
        """Return a short name such as ``dgx2x2 c1 64MB routing``."""
        return f"{self.topology}x{self.nodes} c{self.chunkup} {format_size(self.design_bytes)} {self.model}"


@dataclass(frozen=True)
class BuiltModel:
    """A model written to MPS, with the synthesizer's start completed to every column (None: no start)."""

    instance: Instance
    gpus: int
    pieces: int
    mps: MpsModel
    start: dict[str, float] | None
    start_objective: float | None


def default_instances() -> tuple[Instance, ...]:
    """Return the routing models of every machine, chunkup and design size, then the contiguity models."""
    routing = tuple(
        Instance(name, nodes, k, size, "routing") for name, nodes in MACHINES for size in DESIGN_BYTES for k in CHUNKUPS
    )
    return routing + tuple(Instance(name, nodes, k, size, "contiguity") for name, nodes, k, size in CONTIGUITY)


def _chunking(graph: LogicalGraph, topology, instance: Instance, sketch_chunkup: int | None) -> Chunking:
    """Return the first chunking the synthesizer tries at this size with the instance's chunkup."""
    bound = lower_bounds(topology, Collective.ALLGATHER, [instance.design_bytes])[0]
    for chunking in candidate_chunkings(graph, Collective.ALLGATHER, bound, sketch_chunkup):
        if chunking.chunkup == instance.chunkup:
            return chunking
    raise ValueError(f"{instance.label}: the synthesizer tries no chunking with chunkup {instance.chunkup}")


def _captured_model(instance: Instance, solver_options: SolverOptions):
    """Return (gpus, pieces, the pulp model, its start) as the synthesizer would hand them to ``solve_model``."""
    topology = load_topology(instance.topology, instance.nodes)
    sketch = auto_sketch(topology)
    graph = build_logical_graph(topology, sketch)
    chunking = _chunking(graph, topology, instance, sketch.chunkup)
    kept = []

    def keep(prob, options, time_limit_s=None, start=None, *, progress=None):
        kept.append((prob, dict(start or {})))
        return SolveOutcome(SolveStatus.NO_SOLUTION, None, 0.0)

    if instance.model == "routing":
        chunk_bytes = chunking.design_bytes / (graph.num_ranks * chunking.chunkup)
        with mock.patch.object(routing_module, "solve_model", keep):
            routing_module.route_chunks(
                graph, chunking.chunkup, chunk_bytes, chunk_bytes / chunking.pieces, solver_options
            )
    else:
        with mock.patch.object(scheduling_module, "solve_model", keep):
            _schedule_phase(graph, chunking, solver_options, CONTIGUITY_PHASE_BUDGET_S)
    if not kept:
        raise ValueError(f"{instance.label}: the synthesizer built no MILP here")
    return graph.num_ranks, chunking.pieces, kept[0][0], kept[0][1]


def build_model(instance: Instance, folder: Path) -> BuiltModel:
    """Return the instance's model written to MPS in ``folder``, with its completed start."""
    # One HiGHS thread for the routing MILP a contiguity model needs: HiGHS's thread pool is sized once per process.
    gpus, pieces, prob, partial = _captured_model(instance, SolverOptions(threads=1))
    path = folder / (instance.label.replace(" ", "_") + ".mps")
    _, names, _, _ = prob.writeMPS(str(path), rename=True)
    mps = read_mps(path)
    start = complete_start(mps, {names[name]: value for name, value in partial.items()}) if partial else None
    start_objective = check_solution(mps, start)[0] if start is not None else None
    return BuiltModel(instance, gpus, pieces, mps, start, start_objective)


def _objective(record: SolveRecord, built: BuiltModel) -> tuple[float | None, float | None]:
    """Return (objective recomputed from the solution, worst violation), or the reported objective without values."""
    if record.values is None:
        return record.objective, None
    objective, violation = check_solution(built.mps, record.values)
    return objective, violation


def _gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None:
        return None
    return max(0.0, objective - bound) / max(abs(objective), 1e-9)


def solve_all(built: BuiltModel, solvers: Sequence[str], limits: SolveLimits, progress: str) -> list[tuple]:
    """Return one CSV row per solver on ``built`` (ratios to HiGHS's objective in this run)."""
    inst, records = built.instance, []
    for solver in solvers:
        load1 = os.getloadavg()[0]
        try:
            record = run_solver(solver, built.mps, built.start, limits)
        except Exception as error:  # a solver's failure is a result of the comparison, not the end of it
            record = SolveRecord(solver, "error", None, None, None, None, 0.0, None, "none", f"{error}")
        objective, violation = _objective(record, built)
        records.append((record, objective, violation, load1))
        log(
            f"{progress} {inst.label}: {solver} {record.status}, objective {format_or_dash(objective, '.6g')}, "
            f"bound {format_or_dash(record.bound, '.6g')}, {record.stop_s:.1f} s (load {load1:.2f})"
        )
    highs = next((obj for rec, obj, _, _ in records if rec.solver == "highs"), None)
    rows = []
    for record, objective, violation, load1 in records:
        ratio = objective / highs if objective is not None and highs else None
        rows.append(
            (
                inst.topology,
                inst.nodes,
                built.gpus,
                inst.model,
                inst.chunkup,
                built.pieces,
                inst.design_bytes,
                built.mps.num_cols,
                built.mps.num_integer,
                built.mps.num_rows,
                record.solver,
                record.status,
                record.start,
                built.start_objective,
                objective,
                record.bound,
                _gap(objective, record.bound),
                record.first_s,
                record.best_s,
                record.stop_s,
                ratio,
                violation,
                load1,
                record.note,
            )
        )
    return rows


def run_benchmark(instances: Sequence[Instance], solvers: Sequence[str], limits: SolveLimits) -> list[tuple]:
    """Return the CSV rows of every instance and solver, building each model in a temporary folder."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_solvers_") as folder:
        for index, instance in enumerate(instances, 1):
            progress = f"[{index}/{len(instances)}]"
            began = time.perf_counter()
            built = build_model(instance, Path(folder))
            log(
                f"{progress} {instance.label}: {built.mps.num_cols} columns ({built.mps.num_integer} binary), "
                f"{built.mps.num_rows} rows, start objective {format_or_dash(built.start_objective, '.6g')}, "
                f"built in {time.perf_counter() - began:.1f} s"
            )
            rows += solve_all(built, solvers, limits, progress)
    return rows


def _write_outputs(rows: list[tuple], records: list[dict], solvers: Sequence[str], args: argparse.Namespace) -> None:
    """Write the CSV and the ``solvers`` section of BENCHMARKS.md."""
    if rows:
        records = write_csv(CSV_PATH, HEADER, rows)
    body = render_section(records, solvers, solver_versions(), args.time_limit, CSV_PATH)
    update_benchmarks_section("solvers", "MILP solvers", COMMAND, body)


def _chosen_solvers(wanted: Sequence[str]) -> list[str]:
    """Return the wanted solvers that can run here, printing why each of the others is skipped."""
    available = solver_availability()
    chosen = []
    for solver in wanted:
        if available[solver] is None:
            chosen.append(solver)
        else:
            log(f"skipping {solver}: {available[solver]}")
    return chosen


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="one small routing model, 10 s cap, writes nothing")
    add_no_write_argument(parser)
    parser.add_argument("--time-limit", type=float, default=None, help=f"cap per solve, s (default {TIME_LIMIT_S:g})")
    parser.add_argument("--solvers", default=",".join(SOLVERS), help="comma-separated subset of " + ",".join(SOLVERS))
    parser.add_argument(
        "--from-csv", type=Path, help="re-render the BENCHMARKS.md section from this CSV (solves nothing)"
    )
    args = parser.parse_args(argv)
    if args.time_limit is None:
        args.time_limit = QUICK_TIME_LIMIT_S if args.quick else TIME_LIMIT_S
    unknown = sorted(set(args.solvers.split(",")) - set(SOLVERS))
    if unknown:
        parser.error(f"unknown solvers {unknown}; expected some of {', '.join(SOLVERS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Solve every model with every available solver, print the tables; unless told not to, write them."""
    args = _parse_args(argv)
    solvers = _chosen_solvers(args.solvers.split(","))
    if args.from_csv is not None:
        records = read_csv(args.from_csv)
        rows: list[tuple] = []
    else:
        instances = tuple(Instance(*q) for q in QUICK) if args.quick else default_instances()
        began = time.perf_counter()
        rows = run_benchmark(instances, solvers, SolveLimits(args.time_limit, GAP_REL))
        log(f"{len(rows)} solves in {time.perf_counter() - began:.0f} s")
        records = csv_records(HEADER, rows)
    print_table(SUMMARY_HEADER, summary_rows(records, solvers))
    print()
    instance_header = ("model", "cols/int/rows", "start") + tuple(solvers)
    print_table(instance_header, instance_rows(records, solvers))
    print(load_text(records))
    if not (args.quick or args.no_write):
        _write_outputs(rows, records, solvers, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
