"""HiGHS for the synthesizer: a ``MilpMatrix`` solved by ``highspy`` with a start and work budgets, quietly.

pulp only builds the model: the model goes to HiGHS as arrays (``solve_with_highs``), so neither
pulp 3's nor pulp 4's HiGHS interface stands between the two, and HiGHS's node-limit status
(``kSolutionLimit``, which pulp 3.3's interface does not know) is read here like any other.

HiGHS 1.16 writes its banner ("Running HiGHS ... Copyright ...") to stdout once per process, from
the first ``highspy.Highs()``: its constructor registers highspy's callback, which logs the banner
before any option can be set (``output_flag`` off comes too late). ``taccl synthesize > out`` and
JSON output got it. HiGHS marks the banner written process-wide, so ``consume_highs_banner`` has it
written first by a bare core instance whose log goes nowhere (``log_to_console`` off; ERGO-Code/HiGHS
issues 1702, 1932). Solver logs go to this module's logger at DEBUG, never to the console, and
``watch_highs`` turns HiGHS's callbacks into progress lines while a solve runs.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from taccl_py.progress import ProgressTicker
from taccl_py.solvers.matrix import BranchResult, BranchStop, MilpMatrix, NodeBudget, start_vector

__all__ = ["consume_highs_banner", "new_highs", "solve_with_highs", "watch_highs"]

logger = logging.getLogger(__name__)

_NO_VALUE = 1e30  # HiGHS reports a bound it does not have yet as +-inf (kHighsInf)


def consume_highs_banner() -> None:
    """Have HiGHS's once-per-process banner written where nothing shows it (no-op without highspy)."""
    try:
        from highspy._core import _Highs
    except ImportError:
        return
    bare = _Highs()
    bare.setOptionValue("log_to_console", False)
    bare.setCallback(None, None)  # any call that logs writes the banner; this one does nothing else


def new_highs() -> object:
    """Return a ``highspy.Highs`` that writes nothing to the console (``output_flag`` off)."""
    import highspy

    consume_highs_banner()
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    return highs


class _SolveReporter:
    """A HiGHS callback that passes a solve's log to DEBUG and its MIP state to a ticker every few seconds."""

    __slots__ = ("name", "ticker")

    def __init__(self, name: str, ticker: ProgressTicker) -> None:
        self.name = name
        self.ticker = ticker

    def log(self, event: object) -> None:
        logger.debug("%s: HiGHS: %s", self.name, event.message.rstrip())

    def mip(self, event: object) -> None:
        self.ticker.tick(lambda: self._describe(event.data_out))

    def lp(self, event: object) -> None:
        self.ticker.tick(lambda: f"{self.name}: root LP, {event.data_out.simplex_iteration_count} simplex iterations")

    def _describe(self, out: object) -> str:
        if abs(out.mip_primal_bound) < _NO_VALUE:
            found = f"best {out.mip_primal_bound:.6g}, bound {out.mip_dual_bound:.6g}, gap {100 * out.mip_gap:.2f} %"
        else:
            found = f"no solution yet, bound {out.mip_dual_bound:.6g}"
        return f"{self.name}: {out.mip_node_count} nodes, {found}, {out.running_time:.1f} s"


def watch_highs(highs: object, name: str, ticker: ProgressTicker | None) -> None:
    """Subscribe ``highs`` (a ``highspy.Highs`` before its run) to report to ``ticker`` and log at DEBUG.

    Progress comes from HiGHS's interrupt callbacks, which never interrupt: a line when the
    ticker is due (wall time picks the moment, not the work done). With DEBUG on, HiGHS logs
    (``output_flag`` on, ``log_to_console`` off) and every log line goes to the logger.
    """
    reporter = _SolveReporter(name, ticker if ticker is not None else ProgressTicker(None))
    if ticker is not None:
        highs.cbMipInterrupt.subscribe(reporter.mip)
        highs.cbSimplexInterrupt.subscribe(reporter.lp)
    if logger.isEnabledFor(logging.DEBUG):
        highs.setOptionValue("output_flag", True)
        highs.setOptionValue("log_to_console", False)
        highs.cbLogging.subscribe(reporter.log)


def _stop_of(status: object) -> BranchStop:
    import highspy

    kinds = highspy.HighsModelStatus
    return {
        kinds.kOptimal: BranchStop.OPTIMAL,
        kinds.kSolutionLimit: BranchStop.NODE_LIMIT,  # mip_max_nodes reached
        kinds.kIterationLimit: BranchStop.NODE_LIMIT,
        kinds.kTimeLimit: BranchStop.TIME_LIMIT,
        kinds.kInfeasible: BranchStop.INFEASIBLE,
        kinds.kUnboundedOrInfeasible: BranchStop.INFEASIBLE,
    }.get(status, BranchStop.OTHER)


def _load_matrix(highs: object, matrix: MilpMatrix) -> None:
    """Hand ``matrix`` to ``highs`` as a minimisation (a maximised objective negated).

    The columns come first, without entries, then the rows fill them: the model pulp 3.3's HiGHS
    interface built, so HiGHS answers the synthesizer's models as it did before (the same bytes).
    """
    import highspy

    sign = -1.0 if matrix.maximize else 1.0
    n = matrix.num_columns
    starts, no_index, no_value = np.zeros(n, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0)
    highs.addCols(n, sign * matrix.objective, matrix.col_lower, matrix.col_upper, 0, starts, no_index, no_value)
    integer = np.flatnonzero(matrix.integer).astype(np.int32)
    if integer.size:
        kind = np.full(integer.size, int(highspy.HighsVarType.kInteger), dtype=np.uint8)
        highs.changeColsIntegrality(integer.size, integer, kind)
    highs.addRows(
        matrix.num_rows,
        matrix.row_lower,
        matrix.row_upper,
        matrix.row_columns.size,
        matrix.row_starts[:-1],
        matrix.row_columns,
        matrix.row_values,
    )


def solve_with_highs(
    matrix: MilpMatrix, budget: NodeBudget, start: dict[str, float], ticker: ProgressTicker | None = None
) -> BranchResult:
    """Solve ``matrix`` with HiGHS within ``budget``; return how it ended (``detail``: HiGHS's model status).

    ``start`` maps variable names to a feasible solution's values, handed to HiGHS as its first
    incumbent (names that are not columns are ignored). ``ticker`` gets a line every few seconds
    while HiGHS works (``watch_highs``). The values are those of HiGHS's best solution, whatever
    stopped it; None when it has none.
    """
    import highspy

    highs = new_highs()
    for option, value in (
        ("mip_rel_gap", budget.gap_rel),
        ("threads", budget.threads),
        ("time_limit", float(budget.time_limit_s)),
        ("mip_max_nodes", budget.node_limit),
        ("random_seed", budget.random_seed),
    ):
        highs.setOptionValue(option, value)
    watch_highs(highs, matrix.name, ticker)
    _load_matrix(highs, matrix)
    columns, values = start_vector(matrix, start)
    if columns.size:
        highs.setSolution(columns.size, columns, values)
    began = time.perf_counter()
    highs.run()
    wall = time.perf_counter() - began
    status = highs.getModelStatus()
    feasible = highs.getInfo().primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    found = np.array(highs.getSolution().col_value, dtype=np.float64) if feasible else None
    return BranchResult(_stop_of(status), highs.modelStatusToString(status), found, wall)
