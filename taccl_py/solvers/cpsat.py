"""CP-SAT (OR-Tools, optional) as the MILP solver: a ``MilpMatrix`` rebuilt in ``model_builder``, solved by work.

Built from the matrix's columns, rows and objective (no file between); CP-SAT scales continuous columns
to integers (``mip_var_scaling``). One worker, a fixed seed and a *deterministic time* budget
(CP-SAT's count of work, in its own seconds) give the same values on a busy or an idle machine; the
wall-clock limit is a safety net. ``taccl_py.solvers`` maps the result to its statuses; this
module imports nothing from it (no import cycle) and ortools only inside functions.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

from taccl_py.solvers.matrix import MilpMatrix, assign_values

__all__ = [
    "CPSAT_VAR_SCALING",
    "DETERMINISTIC_TIME_BY_COLUMNS",
    "DETERMINISTIC_TIME_LARGE_S",
    "CpsatStop",
    "CpsatResult",
    "cpsat_importable",
    "default_deterministic_time_s",
    "deterministic_time_rule",
    "solve_with_cpsat",
]

logger = logging.getLogger(__name__)

# Continuous columns are multiplied by this before CP-SAT rounds them to integers: 1 ns on the
# synthesizer's µs times (scripts/milp_solvers.py measured it on the routing MILPs).
CPSAT_VAR_SCALING = 1000.0
# Deterministic-time budget (CP-SAT work seconds) per model by its column count (columns <= bound:
# budget). Measured with ortools 9.15 on one worker, budgets 0.02-1.6 and 16, on the 40 routing
# models of 64 MB AllGather syntheses of ndv2 x2 (282-1234 columns), dgx-a100 x4 (58-546), dgx2 x2
# (482-2050) and dgx2 x4 (482-4226), greedy start as hint: the last improvement came by 0.2 up to
# 1234 columns (none from 0.2 to 16), the first and only solution at 0.2 at 2114 columns and at 0.8
# at 4226 (none better by 16); each budget is about twice that. One work second took 1.0-2.4 wall
# seconds on two shared cores (load 1.3-2.8). Beyond 6000 columns: not measured, scaled up.
DETERMINISTIC_TIME_BY_COLUMNS = ((1_500, 0.4), (3_000, 0.5), (6_000, 1.6))
DETERMINISTIC_TIME_LARGE_S = 3.0
_MODEL_BUILDER = "ortools.linear_solver.python.model_builder"
# A start is kept when every row and bound holds within this (absolute; pulp's LpProblem.valid).
_START_TOLERANCE = 1e-6


class CpsatStop(str, Enum):
    """How a CP-SAT solve ended."""

    OPTIMAL = "optimal"  # proved within the relative gap
    FEASIBLE = "feasible"  # a solution, stopped by a budget (work or wall clock)
    INFEASIBLE = "infeasible"
    NOT_SOLVED = "not solved"  # stopped by a budget before any solution
    FAILED = "failed"  # CP-SAT refused the model or its parameters


# model_builder's SolveStatus names are these members' names; any other (MODEL_INVALID, ...) is a failure.
_STOPS = MappingProxyType({stop.name: stop for stop in CpsatStop if stop is not CpsatStop.FAILED})


@dataclass(frozen=True)
class CpsatResult:
    """How a solve ended, its objective (None without a solution), its wall time (s) and whether the start won."""

    stop: CpsatStop
    objective: float | None
    wall_s: float
    kept_start: bool = False


def cpsat_importable() -> bool:
    """Return True when ortools' ``model_builder`` (CP-SAT's MILP entry) can be imported."""
    try:
        importlib.import_module(_MODEL_BUILDER)
    except ImportError:
        return False
    return True


def default_deterministic_time_s(num_columns: int) -> float:
    """Return the deterministic-time budget (CP-SAT work seconds) of a model with ``num_columns`` columns.

    >>> default_deterministic_time_s(600) > 0
    True
    """
    for columns, budget_s in DETERMINISTIC_TIME_BY_COLUMNS:
        if num_columns <= columns:
            return budget_s
    return DETERMINISTIC_TIME_LARGE_S


def deterministic_time_rule() -> str:
    """Return the rule of ``default_deterministic_time_s`` in words, for provenance records."""
    steps = ", ".join(f"<= {columns} columns: {budget_s:g}" for columns, budget_s in DETERMINISTIC_TIME_BY_COLUMNS)
    return f"by model size ({steps}, larger: {DETERMINISTIC_TIME_LARGE_S:g})"


def _build_model(matrix: MilpMatrix) -> tuple[Any, list[Any]]:
    """Return ``matrix`` as a ``model_builder.Model`` and its columns in the matrix's order."""
    from ortools.linear_solver.python import model_builder

    model = model_builder.Model()
    columns = [
        model.new_var(float(lower), float(upper), bool(integer), name)
        for name, lower, upper, integer in zip(matrix.column_names, matrix.col_lower, matrix.col_upper, matrix.integer)
    ]
    for i, name in enumerate(matrix.row_names):
        terms = range(matrix.row_starts[i], matrix.row_starts[i + 1])
        model.add_linear_constraint(
            model_builder.LinearExpr.weighted_sum(
                [columns[matrix.row_columns[k]] for k in terms], [float(matrix.row_values[k]) for k in terms]
            ),
            float(matrix.row_lower[i]),
            float(matrix.row_upper[i]),
            name,
        )
    expression = model_builder.LinearExpr.weighted_sum(
        columns, matrix.objective.tolist(), constant=matrix.objective_offset
    )
    if matrix.maximize:
        model.maximize(expression)
    else:
        model.minimize(expression)
    return model, columns


@contextlib.contextmanager
def _stderr_to_log(name: str) -> Iterator[None]:
    """Send file descriptor 2 to the debug log while the block runs.

    The MIP presolve behind CP-SAT writes absl warnings to stderr (``Propagation limit reached in
    the BoundPropagationPreprocessor``) whatever the log parameters say.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            written = sink.read().decode(errors="replace")
    for line in written.splitlines():
        logger.debug("%s: CP-SAT: %s", name, line)


def _parameters(deterministic_time_s: float, gap_rel: float, random_seed: int) -> str:
    """Return CP-SAT's parameters (SatParameters text): one worker, the seed, the work budget, no log."""
    return (
        f"num_workers: 1, random_seed: {random_seed}, max_deterministic_time: {deterministic_time_s:g}, "
        f"relative_gap_limit: {gap_rel:g}, mip_var_scaling: {CPSAT_VAR_SCALING:g}, "
        "log_search_progress: false, log_to_stdout: false"
    )


def _start_values(matrix: MilpMatrix, start: dict[str, float]) -> list[float] | None:
    """Return ``start`` in column order when it sets every column and satisfies every bound and row."""
    if not matrix.num_columns or any(name not in start for name in matrix.column_names):
        return None
    values = [float(start[name]) for name in matrix.column_names]
    return values if matrix.satisfies(values, _START_TOLERANCE) else None


def solve_with_cpsat(
    matrix: MilpMatrix,
    time_limit_s: float,
    deterministic_time_s: float,
    gap_rel: float,
    random_seed: int,
    start: dict[str, float] | None = None,
) -> CpsatResult:
    """Solve ``matrix`` with CP-SAT within ``deterministic_time_s`` (work s) and write the values into its variables.

    ``start`` maps variable names to values, given to CP-SAT as a hint; when it sets every
    variable, satisfies every row and beats what CP-SAT found (or CP-SAT found nothing), its
    values are the answer (``kept_start``). ``time_limit_s`` is the wall-clock safety cap (s).
    Without an answer the variables keep the values they had.
    """
    from ortools.linear_solver.python import model_builder

    model, columns = _build_model(matrix)
    position = {name: j for j, name in enumerate(matrix.column_names)}
    for name, value in (start or {}).items():
        if name in position:
            model.add_hint(columns[position[name]], value)
    solver = model_builder.Solver("sat")
    solver.enable_output(False)
    solver.set_time_limit_in_seconds(time_limit_s)
    solver.set_solver_specific_parameters(_parameters(deterministic_time_s, gap_rel, random_seed))
    began = time.perf_counter()
    with _stderr_to_log(matrix.name):
        status = solver.solve(model)
    wall = time.perf_counter() - began
    stop = _STOPS.get(status.name, CpsatStop.FAILED)
    has_solution = stop in (CpsatStop.OPTIMAL, CpsatStop.FEASIBLE)
    found = [float(solver.value(column)) for column in columns] if has_solution else None
    start_values = _start_values(matrix, start or {}) if stop is not CpsatStop.INFEASIBLE else None
    if stop is CpsatStop.FAILED:
        logger.warning("%s: CP-SAT stopped with %s (%s)", matrix.name, status.name, solver.status_string)
    sign = -1.0 if matrix.maximize else 1.0
    start_objective = None if start_values is None else matrix.objective_value(start_values)
    # CP-SAT's own objective (of its scaled model) decides, as it always has: ties keep CP-SAT's values.
    reported = float(solver.objective_value) if has_solution else None
    if start_objective is not None and (reported is None or sign * start_objective < sign * reported):
        logger.debug("%s: CP-SAT %s; the start (objective %s) is kept", matrix.name, stop.value, start_objective)
        assign_values(matrix, start_values)
        kept = CpsatStop.OPTIMAL if stop is CpsatStop.OPTIMAL else CpsatStop.FEASIBLE
        return CpsatResult(kept, start_objective, wall, kept_start=True)
    if found is not None:
        assign_values(matrix, found)
    return CpsatResult(stop, None if found is None else matrix.objective_value(found), wall)
