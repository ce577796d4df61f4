"""HiGHS for the synthesizer: pulp's HiGHS with starts and work budgets, quiet ``highspy.Highs``, progress.

HiGHS 1.16 writes its banner ("Running HiGHS ... Copyright ...") to stdout once per process, from
the first ``highspy.Highs()``: its constructor registers highspy's callback, which logs the banner
before any option can be set (pulp's ``msg=False`` comes too late). ``taccl synthesize > out`` and
JSON output got it. HiGHS marks the banner written process-wide, so ``consume_highs_banner`` has it
written first by a bare core instance whose log goes nowhere (``log_to_console`` off; ERGO-Code/HiGHS
issues 1702, 1932). Solver logs go to this module's logger at DEBUG, never to the console, and
``watch_highs`` turns HiGHS's callbacks into progress lines while a solve runs.
"""

from __future__ import annotations

import logging

import pulp

from taccl_py.synth.progress import ProgressTicker

__all__ = ["BudgetedHiGHS", "consume_highs_banner", "new_highs", "watch_highs"]

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


class BudgetedHiGHS(pulp.HiGHS):
    """pulp's HiGHS with a starting solution handed to HiGHS, the node-limit status read, and no console output.

    ``ticker`` gets a line every few seconds while HiGHS works (``watch_highs``).
    """

    def __init__(self, start: dict[str, float], ticker: ProgressTicker | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.start = start
        self.ticker = ticker

    def createAndConfigureSolver(self, lp: pulp.LpProblem) -> None:
        consume_highs_banner()  # pulp's highspy.Highs() would print it before msg=False applies
        super().createAndConfigureSolver(lp)
        watch_highs(lp.solverModel, lp.name, self.ticker)

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self.start:
            import numpy as np

            pairs = [(var.index, self.start[var.name]) for var in lp.variables() if var.name in self.start]
            if pairs:
                index = np.array([p[0] for p in pairs], dtype=np.int32)
                value = np.array([p[1] for p in pairs], dtype=np.float64)
                lp.solverModel.setSolution(len(pairs), index, value)
        super().callSolver(lp)

    def findSolutionValues(self, lp: pulp.LpProblem) -> tuple[int, int]:
        import highspy

        if lp.solverModel.getModelStatus() != highspy.HighsModelStatus.kSolutionLimit:
            return super().findSolutionValues(lp)
        if lp.solverModel.getInfo().primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
            return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound
        values = lp.solverModel.getSolution().col_value
        for var in lp.variables():
            var.varValue = values[var.index]
        return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible
