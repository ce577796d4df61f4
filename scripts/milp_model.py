"""An MPS model as HiGHS reads it, the check of a solution against it, and the completion of a partial start.

Used by ``bench_solvers.py`` and ``milp_solvers.py``: every solver's answer is re-evaluated here, on the same
columns, rows and bounds, so objectives and violations compare across solvers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["FEASIBILITY_TOL", "MpsModel", "check_solution", "complete_start", "quiet_highs", "read_mps"]

# A row, bound or integrality counts as violated beyond this (absolute, plus the same relative to the bound):
# the solvers' own default feasibility tolerances are 1e-6 on their scaled models.
FEASIBILITY_TOL = 1e-6
INTEGRALITY_TOL = 1e-5


@dataclass(frozen=True)
class MpsModel:
    """A MILP as HiGHS reads it from MPS: column names and bounds, costs, rows (CSC matrix) and integer columns."""

    path: Path
    col_names: tuple[str, ...]
    col_lower: np.ndarray
    col_upper: np.ndarray
    cost: np.ndarray
    offset: float
    integer: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    matrix: tuple[np.ndarray, np.ndarray, np.ndarray]  # CSC start, index, value

    @property
    def num_cols(self) -> int:
        """Return the number of columns."""
        return len(self.col_names)

    @property
    def num_rows(self) -> int:
        """Return the number of rows."""
        return len(self.row_lower)

    @property
    def num_integer(self) -> int:
        """Return the number of integer (here: binary) columns."""
        return int(self.integer.sum())


def quiet_highs(threads: int = 1):
    """Return a silent HiGHS with ``threads`` threads (its pool is global: resized here when it differs)."""
    import highspy

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    if highs.setOptionValue("threads", threads) != highspy.HighsStatus.kOk:
        raise RuntimeError(f"HiGHS refuses threads={threads}")
    highs.resetGlobalScheduler(True)
    return highs


def read_mps(path: Path) -> MpsModel:
    """Return the model in ``path`` as HiGHS reads it."""
    import highspy

    highs = quiet_highs()
    if highs.readModel(str(path)) != highspy.HighsStatus.kOk:
        raise RuntimeError(f"{path}: HiGHS cannot read the MPS file")
    lp = highs.getLp()
    integrality = np.array([int(v) for v in lp.integrality_], dtype=int) if len(lp.integrality_) else None
    integer = integrality == int(highspy.HighsVarType.kInteger) if integrality is not None else None
    return MpsModel(
        path,
        tuple(lp.col_names_),
        np.array(lp.col_lower_),
        np.array(lp.col_upper_),
        np.array(lp.col_cost_),
        float(lp.offset_),
        integer if integer is not None else np.zeros(lp.num_col_, dtype=bool),
        np.array(lp.row_lower_),
        np.array(lp.row_upper_),
        (np.array(lp.a_matrix_.start_), np.array(lp.a_matrix_.index_), np.array(lp.a_matrix_.value_)),
    )


def _row_activity(model: MpsModel, x: np.ndarray) -> np.ndarray:
    start, index, value = model.matrix
    activity = np.zeros(model.num_rows)
    for col in range(model.num_cols):
        rows = slice(start[col], start[col + 1])
        activity[index[rows]] += value[rows] * x[col]
    return activity


def _excess(value: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Return how far each value lies outside [lower, upper], less the tolerance (<= 0: within)."""
    with np.errstate(invalid="ignore"):
        below = np.where(np.isfinite(lower), lower - value, -np.inf)
        above = np.where(np.isfinite(upper), value - upper, -np.inf)
    bound = np.maximum(np.where(np.isfinite(lower), np.abs(lower), 0), np.where(np.isfinite(upper), np.abs(upper), 0))
    return np.maximum(below, above) - FEASIBILITY_TOL * (1 + bound)


def check_solution(model: MpsModel, values: Mapping[str, float]) -> tuple[float, float]:
    """Return (objective, worst violation beyond tolerance; <= 0 when feasible) of ``values`` on ``model``.

    A column missing from ``values`` is taken as 0 (CBC lists only non-zero columns).
    """
    x = np.array([values.get(name, 0.0) for name in model.col_names])
    worst = max(
        float(np.max(_excess(_row_activity(model, x), model.row_lower, model.row_upper), initial=-np.inf)),
        float(np.max(_excess(x, model.col_lower, model.col_upper), initial=-np.inf)),
        float(np.max(np.abs(x - np.round(x))[model.integer], initial=0.0)) - INTEGRALITY_TOL,
    )
    return float(model.cost @ x + model.offset), worst


def complete_start(model: MpsModel, partial: Mapping[str, float]) -> dict[str, float] | None:
    """Return a full solution: integer columns fixed as in ``partial``, the others from an LP (None: infeasible).

    The synthesizer hands HiGHS the greedy routes' binaries and arrival times only; every solver here gets
    the same completed vector, so none has to complete it on its own clock.
    """
    import highspy

    highs = quiet_highs()
    highs.readModel(str(model.path))
    for col in np.flatnonzero(model.integer):
        value = float(round(partial.get(model.col_names[col], 0.0)))
        highs.changeColBounds(int(col), value, value)
    highs.changeColsIntegrality(
        model.num_cols, np.arange(model.num_cols, dtype=np.int32), np.zeros(model.num_cols, dtype=np.uint8)
    )
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return dict(zip(model.col_names, highs.getSolution().col_value))
