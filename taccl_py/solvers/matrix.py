"""A pulp model as the arrays a solver takes (columns, rows in compressed-row form, objective), and the budget.

``NodeBudget`` is what a branch-and-bound solver (HiGHS, CBC) may spend on a matrix and
``BranchResult`` what it gives back, the same for both drivers.

pulp is the modelling layer only; the solvers (HiGHS through highspy, the CBC binary, CP-SAT) are
driven from a ``MilpMatrix`` read through the part of pulp's API that pulp 3.3 and pulp 4 share
(``LpProblem.objective``, ``sense``, ``constraints()``; ``items()``, ``getLb()``, ``getUb()`` of a
row; ``name``, ``lowBound``, ``upBound``, ``cat`` and ``varValue`` of a variable). The order is
fixed here, not by pulp: columns are the variables that appear in the objective or a row, sorted
by name, and rows keep the order they were added in, each with its terms in the order they were
written. That is the model pulp 3.3's own HiGHS interface handed HiGHS (``LpProblem.variables()``
sorts by name there; pulp 4 keeps creation order and also lists variables no row uses), so the
same input reaches the solver as the same model under either pulp.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pulp

__all__ = [
    "BranchResult",
    "BranchStop",
    "MilpMatrix",
    "NodeBudget",
    "assign_values",
    "linear_sum",
    "milp_matrix",
    "start_vector",
]


@dataclass(frozen=True)
class MilpMatrix:
    """A MILP as arrays: minimise (or maximise) ``objective @ x + objective_offset`` subject to the rows.

    Column ``j`` is ``variables[j]``, named ``column_names[j]``, with bounds ``col_lower[j]..col_upper[j]`` (±inf when
    unbounded), integer when ``integer[j]``. Row ``i`` is ``row_lower[i] <= sum(row_values[k] *
    x[row_columns[k]] for k in row_starts[i]..row_starts[i + 1]) <= row_upper[i]``; zero
    coefficients are left out. ``objective`` holds the coefficients as written, whatever the sense.
    Numbers are as pulp gives them but for the sign of zero (pulp 4 writes ``x <= y`` with an
    upper bound of -0.0, pulp 3.3 with 0.0): every -0.0 is 0.0, so both give the same arrays.
    The names are read when the matrix is made: pulp 4's variables die with their problem.
    """

    name: str
    column_names: tuple[str, ...]
    variables: tuple[pulp.LpVariable, ...]
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray
    objective: np.ndarray
    objective_offset: float
    maximize: bool
    row_names: tuple[str, ...]
    row_lower: np.ndarray
    row_upper: np.ndarray
    row_starts: np.ndarray
    row_columns: np.ndarray
    row_values: np.ndarray

    @property
    def num_columns(self) -> int:
        """Return the number of columns (variables)."""
        return len(self.variables)

    @property
    def num_rows(self) -> int:
        """Return the number of rows (constraints)."""
        return len(self.row_names)

    @property
    def num_constrained_columns(self) -> int:
        """Return the number of columns some row uses: the model's size for work budgets.

        A column only the objective names sits at one of its bounds and costs the search nothing;
        this is also the count pulp 3.3's ``numVariables()`` gave before a solve.
        """
        return int(np.unique(self.row_columns).size)

    def objective_value(self, values: Sequence[float]) -> float:
        """Return the objective at ``values`` (one per column), offset included."""
        return float(self.objective_offset + np.dot(self.objective, np.asarray(values, dtype=np.float64)))

    def satisfies(self, values: Sequence[float], tolerance: float) -> bool:
        """Return True when ``values`` keep every bound, row and integrality within ``tolerance`` (absolute)."""
        x = np.asarray(values, dtype=np.float64)
        if x.shape != (self.num_columns,) or not np.all(np.isfinite(x)):
            return False
        if np.any(x < self.col_lower - tolerance) or np.any(x > self.col_upper + tolerance):
            return False
        if np.any(np.abs(x[self.integer] - np.round(x[self.integer])) > tolerance):
            return False
        rows_of_terms = np.repeat(np.arange(self.num_rows), np.diff(self.row_starts))
        activity = np.zeros(self.num_rows)
        np.add.at(activity, rows_of_terms, self.row_values * x[self.row_columns])
        return bool(np.all(activity >= self.row_lower - tolerance) and np.all(activity <= self.row_upper + tolerance))


@dataclass(frozen=True)
class NodeBudget:
    """What a branch-and-bound solver (HiGHS, CBC) may spend on a matrix: nodes, one seed, a wall-clock cap (s)."""

    node_limit: int
    time_limit_s: float
    gap_rel: float
    threads: int
    random_seed: int


class BranchStop(str, Enum):
    """Why a branch-and-bound solver stopped."""

    OPTIMAL = "optimal"  # proved within the relative gap
    NODE_LIMIT = "node limit"  # the node budget, or another count of work
    TIME_LIMIT = "time limit"  # the wall-clock cap
    INFEASIBLE = "infeasible"
    OTHER = "other"  # unbounded, interrupted, crashed: ``BranchResult.detail`` says


@dataclass(frozen=True)
class BranchResult:
    """How a solve ended, the solver's own words for it, the column values (None without a solution), wall s."""

    stop: BranchStop
    detail: str
    values: np.ndarray | None
    wall_s: float


def linear_sum(terms: Iterable[tuple[pulp.LpVariable, float]]) -> pulp.LpAffineExpression:
    """Return the expression ``sum(coefficient * variable)``, a variable named twice counting twice.

    pulp 3.3 builds ``LpAffineExpression([(v, c), ...])`` as a dict (a repeated variable keeps its
    last coefficient) and pulp 4 has ``LpAffineExpression.from_list`` instead (it adds them up);
    summing here first gives one meaning under both.
    """
    summed: dict[str, tuple[pulp.LpVariable, float]] = {}
    for var, coefficient in terms:
        before = summed.get(var.name)
        summed[var.name] = (var, coefficient + (before[1] if before else 0.0))
    pairs = list(summed.values())
    from_list = getattr(pulp.LpAffineExpression, "from_list", None)
    return from_list(pairs) if from_list is not None else pulp.LpAffineExpression(pairs)


def _finite_or(value: float | None, infinity: float) -> float:
    return infinity if value is None else float(value)


def _floats(values: Iterable[float]) -> np.ndarray:
    """Return ``values`` as float64, each -0.0 turned into 0.0 (adding 0.0 does that)."""
    return np.array(list(values), dtype=np.float64) + 0.0


def milp_matrix(prob: pulp.LpProblem) -> MilpMatrix:
    """Return ``prob`` as a ``MilpMatrix``: its used variables sorted by name, its rows in the order added.

    >>> prob = pulp.LpProblem("tiny", pulp.LpMaximize)
    >>> x = prob.add_variable("x", lowBound=0, upBound=3, cat=pulp.LpInteger)
    >>> y = prob.add_variable("y", lowBound=0)
    >>> prob += x + 2 * y
    >>> prob += x + y <= 4, "capacity"
    >>> matrix = milp_matrix(prob)
    >>> matrix.column_names, matrix.row_upper.tolist(), matrix.objective.tolist(), matrix.maximize
    (('x', 'y'), [4.0], [1.0, 2.0], True)
    """
    objective = prob.objective if prob.objective is not None else linear_sum(())
    rows = list(prob.constraints())
    by_name: dict[str, pulp.LpVariable] = {}
    for expression in (objective, *rows):
        for var, _ in expression.items():
            by_name.setdefault(var.name, var)
    variables = tuple(by_name[name] for name in sorted(by_name))
    position = {var.name: j for j, var in enumerate(variables)}
    costs = np.zeros(len(variables))
    for var, coefficient in objective.items():
        costs[position[var.name]] += float(coefficient)
    starts, columns, values = [0], [], []
    for row in rows:
        for var, coefficient in row.items():
            if coefficient != 0:
                columns.append(position[var.name])
                values.append(float(coefficient))
        starts.append(len(columns))
    return MilpMatrix(
        name=prob.name,
        column_names=tuple(var.name for var in variables),
        variables=variables,
        col_lower=_floats(_finite_or(var.lowBound, -math.inf) for var in variables),
        col_upper=_floats(_finite_or(var.upBound, math.inf) for var in variables),
        integer=np.array([var.cat == pulp.LpInteger for var in variables], dtype=bool),
        objective=costs + 0.0,
        objective_offset=float(objective.constant) + 0.0,
        maximize=prob.sense == pulp.LpMaximize,
        row_names=tuple(str(row.name) for row in rows),
        row_lower=_floats(_finite_or(row.getLb(), -math.inf) for row in rows),
        row_upper=_floats(_finite_or(row.getUb(), math.inf) for row in rows),
        row_starts=np.array(starts, dtype=np.int32),
        row_columns=np.array(columns, dtype=np.int32),
        row_values=_floats(values),
    )


def assign_values(matrix: MilpMatrix, values: Sequence[float]) -> None:
    """Set every column variable's ``varValue`` from ``values`` (one per column), as pulp's solvers do.

    Integer columns are rounded to the nearest integer, so ``var.value() > 0.5`` and equality
    tests read a binary as the solver meant it. A solve without a solution calls nothing: pulp 4
    cannot set a value back to None, so the variables keep what they had.
    """
    for var, value, integer in zip(matrix.variables, values, matrix.integer):
        var.varValue = float(round(value)) if integer else float(value)


def start_vector(matrix: MilpMatrix, start: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Return the (columns, values) of ``start`` (values by variable name) that name a column of ``matrix``."""
    pairs = [(j, float(start[name])) for j, name in enumerate(matrix.column_names) if name in start]
    return np.array([j for j, _ in pairs], dtype=np.int32), np.array([v for _, v in pairs], dtype=np.float64)
