"""MILP and LP solving for the stages: solver choice, work budgets, warm starts, and what came back.

pulp builds the models; each solve reads the model into a ``MilpMatrix`` (``matrix``) and
drives its solver directly, so pulp 3.3 and pulp 4 hand a solver the same model and none of
pulp's solver interfaces is involved. HiGHS (through highspy, ``highs``) is the default;
CBC (``cbc``: the ``cbcbox`` wheel of ``pulp[cbc]``, pulp 3.3's bundled binary, or ``cbc``
on PATH) is the second choice; OR-Tools CP-SAT (``cpsat``, the optional ``cpsat`` extra)
is the third. Budgets are work, not seconds, so the same input gives the same algorithm on
a busy or an idle machine: every model gets a branch-and-bound node limit (by its size, see
``default_node_limit``; for CP-SAT a deterministic-time budget, ``default_deterministic_time_s``),
one thread and a fixed random seed. A wall-clock cap is only a safety net; when it binds, the
result may differ from run to run and ``SolveStatus.WALL_CLOCK_CAP`` says so. The status of
every solve comes from the solver's own report (HiGHS's model status, CBC's solution file,
CP-SAT's status), and the values go back into the pulp variables (``assign_values``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from enum import Enum
from importlib.metadata import PackageNotFoundError, version

import pulp

from taccl_py.errors import ArgumentError, install_hint
from taccl_py.progress import ProgressTicker, heartbeat, no_progress
from taccl_py.solvers.cbc import CBC_INSTALL_HINT, cbc_version, find_cbc, solve_with_cbc
from taccl_py.solvers.cpsat import (
    CpsatStop,
    cpsat_importable,
    default_deterministic_time_s,
    deterministic_time_rule,
    solve_with_cpsat,
)
from taccl_py.solvers.highs import new_highs, solve_with_highs
from taccl_py.solvers.matrix import BranchStop, MilpMatrix, NodeBudget, assign_values, milp_matrix

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
_CPSAT_INSTALL = install_hint("cpsat")
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
# A CP-SAT solve that ended this close to its cap stopped on the cap, not on work: within 2% of it,
# or 10 ms, since CP-SAT may stop a few ms short of a tiny cap (measured: 47.9 ms of 50 on a busy machine).
_CAP_TOLERANCE = 0.98
_CAP_SLACK_S = 0.010


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
        elif self.solver == "cbc" and find_cbc() is None:
            raise ArgumentError(None, "solver", "cbc: no CBC program found", CBC_INSTALL_HINT)
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
    """Return the solver and the version of what runs it, e.g. ``highs (highspy 1.16.0)``.

    CBC names its version and where it was found: ``cbc (CBC 2.10.3, bundled with pulp 3.3.2)``,
    ``cbcbox 2.929`` or ``on PATH``. pulp's version is not named otherwise: it only builds the
    model, which is the same under pulp 3 and 4.
    """
    if options.solver == "cbc":
        binary = find_cbc()
        return "cbc (not found)" if binary is None else f"cbc (CBC {cbc_version(binary)}, {binary.origin})"
    package = {"highs": "highspy", "cpsat": "ortools"}[options.solver]
    try:
        found = f"{package} {version(package)}"
    except PackageNotFoundError:
        found = f"{package} (version unknown)"
    return f"{options.solver} ({found})"


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


def solve_model(
    prob: pulp.LpProblem,
    options: SolverOptions,
    time_limit_s: float | None = None,
    start: dict[str, float] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> SolveOutcome:
    """Solve ``prob`` within its work budget, set its variables' values, and return how it went.

    ``start`` maps variable names to a feasible solution's values (HiGHS uses it as the first
    incumbent, CP-SAT as a hint; CBC ignores it). ``time_limit_s`` is what is left of the
    wall-clock safety cap (s; default ``options.time_limit_s``). ``progress`` gets a line with
    the model's size and work budget before the solve, one every few seconds while HiGHS works
    (``watch_highs``), and one with how the solve ended. Without a solution the variables keep
    the values they had (None on a model not solved before).
    """
    cap = max(0.05, time_limit_s if time_limit_s is not None else options.time_limit_s)
    matrix = milp_matrix(prob)
    columns = matrix.num_constrained_columns
    say = progress if progress is not None else no_progress
    if columns > MAX_MILP_COLUMNS:
        logger.info(
            "%s: %d columns, over %d: not solved (the caller keeps its start)", prob.name, columns, MAX_MILP_COLUMNS
        )
        say(f"{prob.name}: {columns} columns, over {MAX_MILP_COLUMNS}: not solved")
        return SolveOutcome(SolveStatus.TOO_LARGE, None, 0.0, BudgetBound.NODE_LIMIT, 0)
    say(f"{prob.name}: MILP of {columns} columns, {matrix.num_rows} rows; {_budget_words(options, columns)}")
    if options.solver == "cpsat":
        with heartbeat(progress, prob.name):
            outcome = _solve_with_cpsat(matrix, options, cap, start or {})
    else:
        outcome = _solve_with_nodes(matrix, options, cap, start or {}, progress)
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


def _highs_importable() -> bool:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


def _status_of(stop: BranchStop, has_solution: bool) -> tuple[SolveStatus, BudgetBound | None]:
    """Return the status of a branch-and-bound solve that ended by ``stop`` and the budget that stopped it."""
    if stop is BranchStop.INFEASIBLE:
        return SolveStatus.INFEASIBLE, None
    if stop is BranchStop.OPTIMAL:
        return (SolveStatus.OPTIMAL if has_solution else SolveStatus.NO_SOLUTION), None
    bound = {BranchStop.NODE_LIMIT: BudgetBound.NODE_LIMIT, BranchStop.TIME_LIMIT: BudgetBound.WALL_CLOCK_CAP}.get(stop)
    if not has_solution:
        return SolveStatus.NO_SOLUTION, bound
    # an incumbent: at the wall-clock cap it may differ from run to run; any other stop is work
    return (SolveStatus.WALL_CLOCK_CAP if bound is BudgetBound.WALL_CLOCK_CAP else SolveStatus.NODE_LIMIT), bound


def _solve_with_nodes(
    matrix: MilpMatrix,
    options: SolverOptions,
    cap: float,
    start: dict[str, float],
    progress: Callable[[str], None] | None,
) -> SolveOutcome:
    """Solve ``matrix`` with HiGHS (CBC when asked, or without highspy) within its node budget and ``cap`` s."""
    nodes = options.node_limit if options.node_limit is not None else default_node_limit(matrix.num_constrained_columns)
    budget = NodeBudget(nodes, cap, options.gap_rel, options.threads, options.random_seed)
    use_highs = options.solver == "highs" and _highs_importable()
    if options.solver == "highs" and not use_highs:
        if find_cbc() is None:
            raise ArgumentError(
                None, "solver", "highs: highspy is not installed and no CBC program was found", "pip install highspy"
            )
        logger.warning("HiGHS (highspy) is not available; falling back to CBC")
    # HiGHS reports through its callbacks (watch_highs), though not while it solves the root LP;
    # CBC runs in a subprocess and says nothing. The heartbeat fills the silences.
    if use_highs:
        prepare_highs_threads(options.threads)
        ticker = None if progress is None else ProgressTicker(progress)
        with heartbeat(progress, matrix.name, ticker=ticker):
            result = solve_with_highs(matrix, budget, start, ticker)
    else:
        with heartbeat(progress, matrix.name):
            result = solve_with_cbc(find_cbc(), matrix, budget)
    status, bound = _status_of(result.stop, result.values is not None)
    values = result.values if status is not SolveStatus.INFEASIBLE else None
    if values is not None:
        assign_values(matrix, values)
    if bound is BudgetBound.WALL_CLOCK_CAP:
        logger.warning(
            "%s: stopped at the wall-clock cap (%.1f s); the result may differ from run to run", matrix.name, cap
        )
    elif status is SolveStatus.NO_SOLUTION and bound is None:
        logger.warning("%s: the solver returned no solution (%s)", matrix.name, result.detail)
    objective = None if values is None else matrix.objective_value(values)
    logger.debug(
        "%s: %s in %.2f s, %d nodes allowed (objective %s)", matrix.name, status.value, result.wall_s, nodes, objective
    )
    return SolveOutcome(status, objective, result.wall_s, bound, nodes)


def _solve_with_cpsat(
    matrix: MilpMatrix, options: SolverOptions, cap_s: float, start: dict[str, float]
) -> SolveOutcome:
    """Solve ``matrix`` with CP-SAT within its deterministic-time budget; the node limit reads as that work budget."""
    budget_s = options.deterministic_time_s
    if budget_s is None:
        budget_s = default_deterministic_time_s(matrix.num_constrained_columns)
    result = solve_with_cpsat(matrix, cap_s, budget_s, options.gap_rel, options.random_seed, start)
    bound = None
    if result.stop in (CpsatStop.FEASIBLE, CpsatStop.NOT_SOLVED):
        at_cap = result.wall_s >= min(_CAP_TOLERANCE * cap_s, cap_s - _CAP_SLACK_S)
        bound = BudgetBound.WALL_CLOCK_CAP if at_cap else BudgetBound.NODE_LIMIT
    incumbent = SolveStatus.WALL_CLOCK_CAP if bound is BudgetBound.WALL_CLOCK_CAP else SolveStatus.NODE_LIMIT
    status = {
        CpsatStop.OPTIMAL: SolveStatus.OPTIMAL,
        CpsatStop.INFEASIBLE: SolveStatus.INFEASIBLE,
        CpsatStop.FEASIBLE: incumbent,
    }.get(result.stop, SolveStatus.NO_SOLUTION)
    if bound is BudgetBound.WALL_CLOCK_CAP:
        logger.warning(
            "%s: stopped at the wall-clock cap (%.1f s); the result may differ from run to run", matrix.name, cap_s
        )
    logger.debug(
        "%s: cpsat %s in %.2f s, %g deterministic s allowed (objective %s%s)",
        matrix.name,
        status.value,
        result.wall_s,
        budget_s,
        result.objective,
        ", the start kept" if result.kept_start else "",
    )
    return SolveOutcome(status, result.objective, result.wall_s, bound)
