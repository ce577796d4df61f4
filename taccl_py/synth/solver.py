"""MILP solving for the synthesizer: solver choice, work budgets, warm starts, and what came back.

HiGHS (through highspy) is the default; pulp's bundled CBC binary, driven through ``COIN_CMD``,
is the fallback; OR-Tools CP-SAT (``taccl_py.synth.solver_cpsat``, the optional ``cpsat`` extra)
is the third choice. Budgets are work, not seconds, so the same input gives the same algorithm on
a busy or an idle machine: every model gets a branch-and-bound node limit (by its size, see
``default_node_limit``; for CP-SAT a deterministic-time budget, ``default_deterministic_time_s``),
one thread and a fixed random seed. A wall-clock cap is only a safety net; when it binds, the
result may differ from run to run and ``SolveStatus.WALL_CLOCK_CAP`` says so.

pulp 3.3's HiGHS interface has no entry for HiGHS's node-limit status (``kSolutionLimit``:
``findSolutionValues`` raises KeyError, pulp/apis/highs_api.py), so ``BudgetedHiGHS``
(``taccl_py.synth.solver_highs``) reads that case itself; the status of every solve comes from
HiGHS's own model status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from enum import Enum
from importlib.metadata import PackageNotFoundError, version

import pulp

from taccl_py.errors import ArgumentError
from taccl_py.synth.progress import ProgressTicker, heartbeat, no_progress
from taccl_py.synth.solver_cpsat import (
    CpsatStop,
    cpsat_importable,
    default_deterministic_time_s,
    deterministic_time_rule,
    solve_with_cpsat,
)
from taccl_py.synth.solver_highs import BudgetedHiGHS, new_highs

__all__ = [
    "SOLVERS",
    "DEFAULT_TIME_CAP_S",
    "NODE_LIMITS_BY_COLUMNS",
    "MAX_MILP_COLUMNS",
    "BudgetBound",
    "SolverOptions",
    "SolveStatus",
    "SolveOutcome",
    "budget_of_status",
    "default_node_limit",
    "first_budget_bound",
    "describe_solver",
    "prepare_highs_threads",
    "solve_model",
    "solver_settings",
]

logger = logging.getLogger(__name__)

SOLVERS = ("highs", "cbc", "cpsat")
_CPSAT_INSTALL = "pip install 'taccl-py[cpsat]'"
DEFAULT_GAP_REL = 1e-3  # stop within 0.1 % of the bound: finer gaps cost time for nothing measurable
# One thread: HiGHS sizes its thread pool once per process and refuses another count later
# (Highs::run returns kError), tree_packing's MIP runs on one, and one thread keeps branch and
# bound reproducible under load.
DEFAULT_THREADS = 1
DEFAULT_RANDOM_SEED = 0
# Wall-clock safety cap (s) on the MILPs of a whole synthesis; the work budgets bind long before.
DEFAULT_TIME_CAP_S = 1800.0
# Branch-and-bound nodes per model by its column count (columns <= bound: nodes). Measured with
# HiGHS 1.16 on one thread on the 64 MB AllGather routing models of ndv2 x2 (618-1234 columns),
# dgx2 x2 (1026-2050), dgx-a100 x4 (274-546) and dgx2 x4 (2114-4226): every improvement on the
# warm start came within 100 nodes (none from 100 to 2000 nodes on ndv2 x2, to 500 on dgx2 x2
# and dgx-a100 x4, from 50 to 200 on dgx2 x4), while the root costs 0.1-8 s and each further node
# 1-7 ms. Whole syntheses on two shared cores (load 1.5-3), one job: ndv2 x2 16 s, dgx2 x2 25 s,
# dgx-a100 x4 11 s, dgx2 x4 79 s.
NODE_LIMITS_BY_COLUMNS = ((1_500, 100), (3_000, 50), (6_000, 20))
NODE_LIMIT_LARGE = 10
# Beyond this many columns even the root LP takes minutes on two cores: the model is not solved
# and the caller keeps its greedy start (a work budget of zero, so still the same every run).
MAX_MILP_COLUMNS = 20_000
_CAP_TOLERANCE = 0.98  # a CBC or CP-SAT solve that used this share of its cap stopped on the cap, not on work


class SolveStatus(str, Enum):
    """What a solve produced, and which budget stopped it."""

    OPTIMAL = "optimal"
    NODE_LIMIT = "node limit"  # an incumbent at the work budget (CP-SAT: deterministic time): reproducible
    WALL_CLOCK_CAP = "wall-clock cap"  # an incumbent at the safety cap: may differ from run to run
    NO_SOLUTION = "no solution"
    INFEASIBLE = "infeasible"
    TOO_LARGE = "too large"  # over MAX_MILP_COLUMNS: not solved, a work budget of zero (reproducible)


class BudgetBound(str, Enum):
    """Which budget stopped a solve before it proved its gap."""

    NODE_LIMIT = "node limit"
    WALL_CLOCK_CAP = "wall-clock cap"


# The statuses of a solve that a work budget (not the wall clock) stopped early.
_WORK_BUDGET_STATUSES = frozenset({SolveStatus.NODE_LIMIT.value, SolveStatus.TOO_LARGE.value})


def first_budget_bound(bounds: Iterable[BudgetBound | None]) -> BudgetBound | None:
    """Return the budget to report over several solves: the wall-clock cap if it bound any, else the node limit."""
    seen = set(bounds)
    for bound in (BudgetBound.WALL_CLOCK_CAP, BudgetBound.NODE_LIMIT):
        if bound in seen:
            return bound
    return None


def budget_of_status(status: str | None) -> BudgetBound | None:
    """Return the budget that a solve ending in ``status`` (a ``SolveStatus`` value) ran into, if any."""
    if status == SolveStatus.WALL_CLOCK_CAP.value:
        return BudgetBound.WALL_CLOCK_CAP
    return BudgetBound.NODE_LIMIT if status in _WORK_BUDGET_STATUSES else None


@dataclass(frozen=True)
class SolverOptions:
    """Which MILP solver to run and its budgets.

    ``time_limit_s`` is the wall-clock safety cap (s) on the MILPs of a whole synthesis; each
    model gets what is left of it. ``node_limit`` is the branch-and-bound node budget of every
    model (None: ``default_node_limit`` of the model's column count; HiGHS and CBC).
    ``deterministic_time_s`` is CP-SAT's work budget per model, in its deterministic seconds
    (None: ``default_deterministic_time_s`` of the column count); CP-SAT runs one worker.
    """

    solver: str = "highs"
    time_limit_s: float = DEFAULT_TIME_CAP_S
    gap_rel: float = DEFAULT_GAP_REL
    threads: int = DEFAULT_THREADS
    node_limit: int | None = None
    random_seed: int = DEFAULT_RANDOM_SEED
    deterministic_time_s: float | None = None

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ArgumentError(None, "solver", f"unknown solver {self.solver!r}", "one of " + ", ".join(SOLVERS))
        if self.solver == "cpsat":
            self._check_cpsat()
        elif self.deterministic_time_s is not None:
            raise ArgumentError(None, "deterministic_time", f"set for {self.solver}", "it only with solver cpsat")
        if not self.time_limit_s > 0:
            raise ArgumentError(None, "time_limit", f"{self.time_limit_s} s", "a positive number of seconds")
        if self.node_limit is not None and (isinstance(self.node_limit, bool) or self.node_limit < 1):
            raise ArgumentError(None, "node_limit", f"{self.node_limit} nodes", "a positive number of nodes")
        if self.threads < 1:
            raise ArgumentError(None, "threads", f"{self.threads} threads", "at least 1")

    def _check_cpsat(self) -> None:
        if not cpsat_importable():
            raise ArgumentError(None, "solver", "cpsat needs ortools, which is not installed", _CPSAT_INSTALL)
        if self.node_limit is not None:
            raise ArgumentError(
                None, "node_limit", f"{self.node_limit} nodes with cpsat", "none: CP-SAT's budget is deterministic time"
            )
        if self.threads != 1:
            # More CP-SAT workers race one another: the answer would change from run to run.
            raise ArgumentError(None, "threads", f"{self.threads} threads with cpsat", "1 (one reproducible worker)")
        if self.deterministic_time_s is not None and not self.deterministic_time_s > 0:
            raise ArgumentError(
                None, "deterministic_time", f"{self.deterministic_time_s} s", "a positive number of work seconds"
            )


def default_node_limit(num_columns: int) -> int:
    """Return the branch-and-bound node budget of a model with ``num_columns`` columns.

    >>> default_node_limit(600), default_node_limit(5_000)
    (100, 20)
    """
    for columns, nodes in NODE_LIMITS_BY_COLUMNS:
        if num_columns <= columns:
            return nodes
    return NODE_LIMIT_LARGE


def prepare_highs_threads(threads: int) -> None:
    """Size HiGHS's process-wide thread pool to ``threads`` (no-op without highspy).

    HiGHS sizes one pool per process at its first run, from the machine when a solve leaves
    ``threads`` unset (tree_packing does), and refuses other counts later; results depend on the
    count (HiGHS 1.16: other node counts and optima with 2 threads than with 1). So the pool is
    reset and sized by a run of an empty model before a candidate and before every MILP.
    """
    try:
        import highspy
    except ImportError:
        return
    highspy.Highs.resetGlobalScheduler(True)
    empty = new_highs()
    empty.setOptionValue("threads", threads)
    empty.run()


def describe_solver(options: SolverOptions) -> str:
    """Return the solver and the versions of the packages that run it, e.g. ``highs (highspy 1.7.2, pulp 3.3.0)``."""
    packages = {"highs": ("highspy", "pulp"), "cpsat": ("ortools", "pulp")}.get(options.solver, ("pulp",))
    found = []
    for package in packages:
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} (version unknown)")
    return f"{options.solver} ({', '.join(found)})"


def _node_rule() -> str:
    steps = ", ".join(f"<= {columns} columns: {nodes}" for columns, nodes in NODE_LIMITS_BY_COLUMNS)
    return f"by model size ({steps}, larger: {NODE_LIMIT_LARGE})"


def solver_settings(options: SolverOptions) -> tuple[tuple[str, float | int | str], ...]:
    """Return the options that shape a solve, as (name, value) pairs for provenance records.

    ``node_limit`` (HiGHS, CBC) or ``deterministic_time_s`` (CP-SAT) is the number, or the rule by
    model size when it is left to the default; the other budget does not apply and is left out.
    """
    settings = {name: value for name, value in asdict(options).items() if name != "solver"}
    if options.solver == "cpsat":
        del settings["node_limit"]
        if settings["deterministic_time_s"] is None:
            settings["deterministic_time_s"] = deterministic_time_rule()
    else:
        del settings["deterministic_time_s"]
        if settings["node_limit"] is None:
            settings["node_limit"] = _node_rule()
    return tuple(sorted(settings.items()))


@dataclass(frozen=True)
class SolveOutcome:
    """The status of a solve, its objective (None without a solution), its wall time (s) and nodes."""

    status: SolveStatus
    objective: float | None
    wall_s: float
    bound: BudgetBound | None = None
    node_limit: int | None = None

    @property
    def has_solution(self) -> bool:
        """Return True when variable values are available."""
        return self.status in (SolveStatus.OPTIMAL, SolveStatus.NODE_LIMIT, SolveStatus.WALL_CLOCK_CAP)


class _BudgetedCBC(pulp.COIN_CMD):
    """pulp's COIN_CMD remembering why CBC stopped (``stopped_on``: ``time``, ``nodes``, ...)."""

    stopped_on: str | None = None

    def get_status(self, filename: str) -> tuple[int, int]:
        with open(filename) as solution:
            words = solution.readline().split()
        self.stopped_on = words[2] if len(words) > 2 and words[0] == "Stopped" else None
        return super().get_status(filename)


def _make_solver(
    options: SolverOptions,
    time_limit_s: float,
    node_limit: int,
    start: dict[str, float],
    ticker: ProgressTicker | None = None,
) -> pulp.LpSolver:
    if options.solver == "highs":
        highs = BudgetedHiGHS(
            start,
            ticker,
            msg=False,
            timeLimit=time_limit_s,
            gapRel=options.gap_rel,
            threads=options.threads,
            mip_max_nodes=node_limit,
            random_seed=options.random_seed,
        )
        if highs.available():
            return highs
        logger.warning("HiGHS (highspy) is not available; falling back to pulp's bundled CBC")
    # The bundled CBC binary through COIN_CMD: PULP_CBC_CMD itself is deprecated in pulp 3.3.
    return _BudgetedCBC(
        path=pulp.PULP_CBC_CMD.pulp_cbc_path,
        msg=False,
        timeLimit=time_limit_s,
        gapRel=options.gap_rel,
        threads=options.threads,
        maxNodes=node_limit,
        options=[f"randomCbcSeed {options.random_seed}"],
    )


def _stop_reason(prob: pulp.LpProblem, solver: pulp.LpSolver, wall_s: float, cap_s: float) -> BudgetBound | None:
    """Return which budget stopped an unfinished solve (None: it finished)."""
    if prob.sol_status == pulp.LpSolutionOptimal or prob.status == pulp.LpStatusInfeasible:
        return None
    if isinstance(solver, BudgetedHiGHS):
        import highspy

        status = prob.solverModel.getModelStatus()
        if status == highspy.HighsModelStatus.kSolutionLimit:
            return BudgetBound.NODE_LIMIT
        return BudgetBound.WALL_CLOCK_CAP if status == highspy.HighsModelStatus.kTimeLimit else None
    if solver.stopped_on == "time" or wall_s >= _CAP_TOLERANCE * cap_s:
        return BudgetBound.WALL_CLOCK_CAP
    return BudgetBound.NODE_LIMIT if solver.stopped_on is not None else None


def solve_model(
    prob: pulp.LpProblem,
    options: SolverOptions,
    time_limit_s: float | None = None,
    start: dict[str, float] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> SolveOutcome:
    """Solve ``prob`` in place within its work budget and return how it went.

    ``start`` maps variable names to a feasible solution's values (HiGHS uses it as the first
    incumbent, CP-SAT as a hint; CBC ignores it). ``time_limit_s`` is what is left of the
    wall-clock safety cap (s; default ``options.time_limit_s``). ``progress`` gets a line with
    the model's size and work budget before the solve, one every few seconds while HiGHS works
    (``watch_highs``), and one with how the solve ended.
    """
    cap = max(0.05, time_limit_s if time_limit_s is not None else options.time_limit_s)
    columns = prob.numVariables()
    say = progress if progress is not None else no_progress
    if columns > MAX_MILP_COLUMNS:
        logger.info(
            "%s: %d columns, over %d: not solved (the caller keeps its start)", prob.name, columns, MAX_MILP_COLUMNS
        )
        say(f"{prob.name}: {columns} columns, over {MAX_MILP_COLUMNS}: not solved")
        return SolveOutcome(SolveStatus.TOO_LARGE, None, 0.0, BudgetBound.NODE_LIMIT, 0)
    say(f"{prob.name}: MILP of {columns} columns, {prob.numConstraints()} rows; {_budget_words(options, columns)}")
    if options.solver == "cpsat":
        with heartbeat(progress, prob.name):
            outcome = _solve_with_cpsat(prob, options, cap, start or {})
    else:
        outcome = _solve_with_pulp(prob, options, cap, columns, start or {}, progress)
    say(f"{prob.name}: {outcome.status.value} in {outcome.wall_s:.1f} s")
    return outcome


def _budget_words(options: SolverOptions, columns: int) -> str:
    """Return the work budget of a model with ``columns`` columns, in words."""
    if options.solver == "cpsat":
        budget_s = options.deterministic_time_s
        budget_s = default_deterministic_time_s(columns) if budget_s is None else budget_s
        return f"work budget {budget_s:g} deterministic s (cpsat)"
    nodes = options.node_limit if options.node_limit is not None else default_node_limit(columns)
    return f"work budget {nodes} nodes ({options.solver})"


def _solve_with_pulp(
    prob: pulp.LpProblem,
    options: SolverOptions,
    cap: float,
    columns: int,
    start: dict[str, float],
    progress: Callable[[str], None] | None,
) -> SolveOutcome:
    """Solve ``prob`` with HiGHS (CBC without highspy) within its node budget and ``cap`` seconds."""
    nodes = options.node_limit if options.node_limit is not None else default_node_limit(columns)
    ticker = None if progress is None else ProgressTicker(progress)
    solver = _make_solver(options, cap, nodes, start, ticker)
    if isinstance(solver, BudgetedHiGHS):
        prepare_highs_threads(options.threads)
    began = time.perf_counter()
    # HiGHS reports through its callbacks (watch_highs), though not while it solves the root LP;
    # CBC runs in a subprocess and says nothing. The heartbeat fills the silences.
    with heartbeat(progress, prob.name, ticker=ticker):
        prob.solve(solver)
    wall = time.perf_counter() - began
    bound = _stop_reason(prob, solver, wall, cap)
    if prob.status == pulp.LpStatusInfeasible:
        status = SolveStatus.INFEASIBLE
    elif prob.sol_status == pulp.LpSolutionOptimal:
        status = SolveStatus.OPTIMAL
    elif prob.sol_status == pulp.LpSolutionIntegerFeasible:
        status = SolveStatus.WALL_CLOCK_CAP if bound is BudgetBound.WALL_CLOCK_CAP else SolveStatus.NODE_LIMIT
    else:
        status = SolveStatus.NO_SOLUTION
    if bound is BudgetBound.WALL_CLOCK_CAP:
        logger.warning(
            "%s: stopped at the wall-clock cap (%.1f s); the result may differ from run to run", prob.name, cap
        )
    elif status is SolveStatus.NO_SOLUTION and bound is None:
        logger.warning("%s: the solver returned no solution (pulp status %s)", prob.name, pulp.LpStatus[prob.status])
    objective = pulp.value(prob.objective) if status not in (SolveStatus.NO_SOLUTION, SolveStatus.INFEASIBLE) else None
    logger.debug("%s: %s in %.2f s, %d nodes allowed (objective %s)", prob.name, status.value, wall, nodes, objective)
    return SolveOutcome(status, None if objective is None else float(objective), wall, bound, nodes)


def _solve_with_cpsat(
    prob: pulp.LpProblem, options: SolverOptions, cap_s: float, start: dict[str, float]
) -> SolveOutcome:
    """Solve ``prob`` with CP-SAT within its deterministic-time budget; the node limit reads as that work budget."""
    budget_s = options.deterministic_time_s
    if budget_s is None:
        budget_s = default_deterministic_time_s(prob.numVariables())
    result = solve_with_cpsat(prob, cap_s, budget_s, options.gap_rel, options.random_seed, start)
    bound = None
    if result.stop in (CpsatStop.FEASIBLE, CpsatStop.NOT_SOLVED):
        bound = BudgetBound.WALL_CLOCK_CAP if result.wall_s >= _CAP_TOLERANCE * cap_s else BudgetBound.NODE_LIMIT
    incumbent = SolveStatus.WALL_CLOCK_CAP if bound is BudgetBound.WALL_CLOCK_CAP else SolveStatus.NODE_LIMIT
    status = {
        CpsatStop.OPTIMAL: SolveStatus.OPTIMAL,
        CpsatStop.INFEASIBLE: SolveStatus.INFEASIBLE,
        CpsatStop.FEASIBLE: incumbent,
    }.get(result.stop, SolveStatus.NO_SOLUTION)
    if bound is BudgetBound.WALL_CLOCK_CAP:
        logger.warning(
            "%s: stopped at the wall-clock cap (%.1f s); the result may differ from run to run", prob.name, cap_s
        )
    logger.debug(
        "%s: cpsat %s in %.2f s, %g deterministic s allowed (objective %s%s)",
        prob.name,
        status.value,
        result.wall_s,
        budget_s,
        result.objective,
        ", the start kept" if result.kept_start else "",
    )
    return SolveOutcome(status, result.objective, result.wall_s, bound)
