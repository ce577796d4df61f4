"""MILP solving for the synthesizer: solver choice, limits, warm starts, and what came back.

HiGHS (through highspy) is the default; pulp's bundled CBC binary, driven through ``COIN_CMD``,
is the fallback. pulp's HiGHS interface reports a time-limited incumbent as status Optimal with
``sol_status == LpSolutionIntegerFeasible`` (pulp/apis/highs_api.py, kTimeLimit), which is how
``solve_model`` tells a proven optimum from the best solution found in time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from enum import Enum
from importlib.metadata import PackageNotFoundError, version

import pulp

from taccl_py.errors import ArgumentError

__all__ = [
    "SOLVERS",
    "SolverOptions",
    "SolveStatus",
    "SolveOutcome",
    "describe_solver",
    "solve_model",
    "solver_settings",
]

logger = logging.getLogger(__name__)

SOLVERS = ("highs", "cbc")
DEFAULT_GAP_REL = 1e-3  # stop within 0.1 % of the bound: finer gaps cost time for nothing measurable
DEFAULT_THREADS = 2  # the reference machines have 2 cores


class SolveStatus(str, Enum):
    """What a solve produced."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time-limit incumbent"
    NO_SOLUTION = "no solution in time"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True)
class SolverOptions:
    """Which MILP solver to run and how long (seconds, per model)."""

    solver: str = "highs"
    time_limit_s: float = 10.0
    gap_rel: float = DEFAULT_GAP_REL
    threads: int = DEFAULT_THREADS

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ArgumentError(None, "solver", f"unknown solver {self.solver!r}", "one of " + ", ".join(SOLVERS))
        if not self.time_limit_s > 0:
            raise ArgumentError(None, "time_limit", f"{self.time_limit_s} s", "a positive number of seconds")


def describe_solver(options: SolverOptions) -> str:
    """Return the solver and the versions of the packages that run it, e.g. ``highs (highspy 1.7.2, pulp 3.3.0)``."""
    packages = ("highspy", "pulp") if options.solver == "highs" else ("pulp",)
    found = []
    for package in packages:
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} (version unknown)")
    return f"{options.solver} ({', '.join(found)})"


def solver_settings(options: SolverOptions) -> tuple[tuple[str, float | int], ...]:
    """Return the options that shape a solve, as (name, value) pairs for provenance records."""
    return tuple(sorted((name, value) for name, value in asdict(options).items() if name != "solver"))


@dataclass(frozen=True)
class SolveOutcome:
    """The status of a solve, its objective (None without a solution) and its wall time (s)."""

    status: SolveStatus
    objective: float | None
    wall_s: float

    @property
    def has_solution(self) -> bool:
        """Return True when variable values are available."""
        return self.status in (SolveStatus.OPTIMAL, SolveStatus.TIME_LIMIT)


class _WarmHiGHS(pulp.HiGHS):
    """pulp's HiGHS, handing the variables' initial values to HiGHS as a starting solution."""

    def __init__(self, start: dict[str, float], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.start = start

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self.start:
            import numpy as np

            pairs = [(var.index, self.start[var.name]) for var in lp.variables() if var.name in self.start]
            if pairs:
                index = np.array([p[0] for p in pairs], dtype=np.int32)
                value = np.array([p[1] for p in pairs], dtype=np.float64)
                lp.solverModel.setSolution(len(pairs), index, value)
        super().callSolver(lp)


def _make_solver(options: SolverOptions, time_limit_s: float, start: dict[str, float]) -> pulp.LpSolver:
    if options.solver == "highs":
        highs = _WarmHiGHS(start, msg=False, timeLimit=time_limit_s, gapRel=options.gap_rel, threads=options.threads)
        if highs.available():
            return highs
        logger.warning("HiGHS (highspy) is not available; falling back to pulp's bundled CBC")
    # The bundled CBC binary through COIN_CMD: PULP_CBC_CMD itself is deprecated in pulp 3.3.
    return pulp.COIN_CMD(
        path=pulp.PULP_CBC_CMD.pulp_cbc_path,
        msg=False,
        timeLimit=time_limit_s,
        gapRel=options.gap_rel,
        threads=options.threads,
    )


def solve_model(
    prob: pulp.LpProblem,
    options: SolverOptions,
    time_limit_s: float | None = None,
    start: dict[str, float] | None = None,
) -> SolveOutcome:
    """Solve ``prob`` in place and return how it went.

    ``start`` maps variable names to a feasible solution's values (HiGHS uses it as the first
    incumbent; CBC ignores it). ``time_limit_s`` overrides ``options.time_limit_s``.
    """
    limit = max(0.05, time_limit_s if time_limit_s is not None else options.time_limit_s)
    began = time.perf_counter()
    prob.solve(_make_solver(options, limit, start or {}))
    wall = time.perf_counter() - began
    if prob.status == pulp.LpStatusInfeasible:
        status = SolveStatus.INFEASIBLE
    elif prob.sol_status == pulp.LpSolutionOptimal:
        status = SolveStatus.OPTIMAL
    elif prob.sol_status == pulp.LpSolutionIntegerFeasible:
        status = SolveStatus.TIME_LIMIT
    else:
        status = SolveStatus.NO_SOLUTION
    objective = pulp.value(prob.objective) if status in (SolveStatus.OPTIMAL, SolveStatus.TIME_LIMIT) else None
    logger.debug("%s: %s in %.2f s (objective %s)", prob.name, status.value, wall, objective)
    return SolveOutcome(status, None if objective is None else float(objective), wall)
