"""Solve one MPS file with HiGHS, CBC, SCIP or OR-Tools CP-SAT under the same limits.

Used by ``bench_solvers.py``. Every runner reads the same MPS file, gets the same wall-clock cap, relative
gap and thread count, and, where the solver takes one, the same complete starting solution. It returns a
``SolveRecord``: status, objective and bound as the solver reports them, the wall times (s) to its first and
to its final incumbent and to its stop, and the variable values, which ``milp_model.check_solution``
re-evaluates on the model as HiGHS reads it (so every solver's objective is computed the same way).

Only HiGHS (highspy) and CBC (taccl_py.solvers.cbc.find_cbc) are dependencies of the package; pyscipopt and ortools
are optional here: ``solver_availability`` names the reason a runner cannot run.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from milp_model import MpsModel, quiet_highs

__all__ = [
    "CPSAT_VAR_SCALING",
    "SOLVERS",
    "SolveLimits",
    "SolveRecord",
    "run_solver",
    "solver_availability",
    "solver_versions",
]

SOLVERS = ("highs", "cbc", "scip", "cpsat")
# A solver that ignores its cap is killed this long after it (s); only CBC runs as a child process.
KILL_AFTER_S = 30.0
# CP-SAT solves a MILP by multiplying every continuous column by ``mip_var_scaling`` and making it integer
# (sat_parameters.proto, "MIP -> CP-SAT" parameters). Our continuous columns are times in µs: the default 1
# rounds them to whole µs (the routing optimum 299.133 µs of dgx-a100 x4 becomes 300), 1000 keeps 1 ns.
CPSAT_VAR_SCALING = 1000.0
_CBC_SOLUTION = re.compile(r"Integer solution of\s+(\S+)\s+found.*?\(([\d.]+) seconds\)")
_CPSAT_SOLUTION = re.compile(r"^\s*#(\d+)\s+([\d.]+)s\s+best:(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class SolveLimits:
    """The limits every solver gets: wall-clock cap (s), relative gap and threads."""

    time_limit_s: float
    gap_rel: float
    threads: int = 1


@dataclass(frozen=True)
class SolveRecord:
    """What one solver returned on one model; times are wall seconds from the start of its solve call."""

    solver: str
    status: str
    objective: float | None
    bound: float | None
    first_s: float | None
    best_s: float | None
    stop_s: float
    values: Mapping[str, float] | None
    start: str
    note: str = ""


# -- HiGHS --------------------------------------------------------------------------------------


def _solve_highs(model: MpsModel, start: Mapping[str, float] | None, limits: SolveLimits) -> SolveRecord:
    import highspy

    highs = quiet_highs(limits.threads)
    highs.setOptionValue("time_limit", float(limits.time_limit_s))
    highs.setOptionValue("mip_rel_gap", float(limits.gap_rel))
    highs.readModel(str(model.path))
    found: list[tuple[float, float]] = []
    highs.cbMipImprovingSolution.subscribe(
        lambda event: found.append((event.data_out.running_time, event.data_out.mip_primal_bound))
    )
    start_state = "none"
    if start is not None:
        values = np.array([start[name] for name in model.col_names], dtype=np.float64)
        ok = highs.setSolution(model.num_cols, np.arange(model.num_cols, dtype=np.int32), values)
        start_state = "given" if ok == highspy.HighsStatus.kOk else "rejected"
    began = time.perf_counter()
    clock0 = highs.getRunTime()
    highs.run()
    stop = time.perf_counter() - began
    info = highs.getInfo()
    has_solution = info.primal_solution_status == int(highspy.SolutionStatus.kSolutionStatusFeasible)
    values = dict(zip(model.col_names, highs.getSolution().col_value)) if has_solution else None
    times = [t - clock0 for t, _ in found]
    return SolveRecord(
        "highs",
        highs.modelStatusToString(highs.getModelStatus()),
        info.objective_function_value if has_solution else None,
        info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None,
        times[0] if times else None,
        times[-1] if times else None,
        stop,
        values,
        start_state,
    )


# -- CBC (the program find_cbc finds) ----------------------------------------------------------------


def _cbc_path() -> Path:
    from taccl_py.solvers.cbc import CBC_INSTALL_HINT, find_cbc

    binary = find_cbc()
    if binary is None:
        raise SystemExit(f"no CBC program found: {CBC_INSTALL_HINT}")
    return Path(binary.path)


def _write_cbc_start(path: Path, model: MpsModel, start: Mapping[str, float]) -> None:
    """Write ``start`` in the solution-file layout CBC's ``-mips`` reads (index, name, value, reduced cost)."""
    lines = ["Stopped on time - objective value 0"]
    lines += [f"{i:>7} {name} {start[name]:>23.15g} 0" for i, name in enumerate(model.col_names)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _read_cbc_solution(path: Path) -> dict[str, float] | None:
    if not path.exists():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].startswith(("Infeasible", "Integer infeasible")) or "objective value" not in lines[0]:
        return None
    values = {}
    for line in lines[1:]:
        fields = line.replace("**", " ").split()
        if len(fields) >= 3:
            values[fields[1]] = float(fields[2])
    return values


def _cbc_summary(log: str) -> tuple[str, float | None, float | None]:
    """Return (result line, objective, lower bound) from CBC's closing lines."""
    result = re.search(r"^Result - (.+)$", log, re.MULTILINE)
    objective = re.search(r"^Objective value:\s+(\S+)", log, re.MULTILINE)
    bound = re.search(r"^Lower bound:\s+(\S+)", log, re.MULTILINE)
    status = result.group(1).strip() if result else "no result line"
    obj = float(objective.group(1)) if objective else None
    # CBC prints no "Lower bound" line when it proves optimality: the bound is then the objective.
    low = float(bound.group(1)) if bound else (obj if status.startswith("Optimal") else None)
    return status, obj, low


def _solve_cbc(model: MpsModel, start: Mapping[str, float] | None, limits: SolveLimits) -> SolveRecord:
    with tempfile.TemporaryDirectory(prefix="bench_cbc_") as folder:
        solution = Path(folder) / "solution.txt"
        args = [str(_cbc_path()), str(model.path), "-threads", str(limits.threads), "-timeMode", "elapsed"]
        args += ["-sec", f"{limits.time_limit_s:g}", "-ratioGap", f"{limits.gap_rel:g}"]
        if start is not None:
            mst = Path(folder) / "start.mst"
            _write_cbc_start(mst, model, start)
            args += ["-mips", str(mst)]
        args += ["-solve", "-solution", str(solution)]
        began = time.perf_counter()
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=limits.time_limit_s + KILL_AFTER_S, check=False
        )
        stop = time.perf_counter() - began
        values = _read_cbc_solution(solution)
    log = done.stdout + done.stderr
    found = [float(t) for _, t in _CBC_SOLUTION.findall(log)]
    status, objective, bound = _cbc_summary(log)
    start_state = "none"
    if start is not None:
        start_state = "given" if "MIPStart values read" in log else "rejected"
    return SolveRecord(
        "cbc",
        status,
        objective if values is not None else None,
        bound,
        found[0] if found else None,
        found[-1] if found else None,
        stop,
        values,
        start_state,
        "" if done.returncode == 0 else f"exit status {done.returncode}",
    )


# -- SCIP (pyscipopt) ---------------------------------------------------------------------------


def _solve_scip(model: MpsModel, start: Mapping[str, float] | None, limits: SolveLimits) -> SolveRecord:
    import pyscipopt

    scip = pyscipopt.Model()
    scip.hideOutput()
    scip.readProblem(str(model.path))
    scip.setParam("limits/time", float(limits.time_limit_s))
    scip.setParam("limits/gap", float(limits.gap_rel))
    scip.setParam("lp/threads", limits.threads)
    start_state = "none"
    if start is not None:
        sol = scip.createSol()
        for var in scip.getVars():
            scip.setSolVal(sol, var, start[var.name])
        start_state = "given" if scip.addSol(sol) else "rejected"
    began = time.perf_counter()
    scip.optimize()
    stop = time.perf_counter() - began
    sols = scip.getSols()
    best = scip.getBestSol() if sols else None
    values = {var.name: scip.getSolVal(best, var) for var in scip.getVars()} if best is not None else None
    bound = scip.getDualbound()
    return SolveRecord(
        "scip",
        scip.getStatus(),
        scip.getSolObjVal(best) if best is not None else None,
        bound if math.isfinite(bound) and abs(bound) < 1e20 else None,
        min(scip.getSolTime(s) for s in sols) if sols else None,
        scip.getSolTime(best) if best is not None else None,
        stop,
        values,
        start_state,
    )


# -- OR-Tools CP-SAT ----------------------------------------------------------------------------


@contextlib.contextmanager
def _stdout_to(path: Path) -> Iterator[None]:
    """Send file descriptor 1 (CP-SAT's C++ log) to ``path`` while the block runs."""
    saved = os.dup(1)
    with open(path, "w", encoding="utf-8") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _cpsat_note(log: str) -> str:
    """Return what the MIP-to-CP-SAT conversion did to the continuous columns (its log's own words)."""
    notes = []
    for pattern in (r"Num integers: (\d+/\d+)", r"Maximum constraint coefficient relative error: (\S+)"):
        match = re.search(pattern, log)
        if match:
            notes.append(match.group(0))
    invalid = re.search(r"^(.*(?:INVALID|invalid|cannot|Cannot).*)$", log, re.MULTILINE)
    if invalid:
        notes.append(invalid.group(1).strip())
    return "; ".join(notes)


def _solve_cpsat(
    model: MpsModel, start: Mapping[str, float] | None, limits: SolveLimits, var_scaling: float = CPSAT_VAR_SCALING
) -> SolveRecord:
    from ortools.linear_solver.python import model_builder

    builder = model_builder.Model()
    if not builder.import_from_mps_file(str(model.path)):
        raise RuntimeError(f"{model.path}: OR-Tools cannot read the MPS file")
    variables = [builder.var_from_index(i) for i in range(builder.num_variables)]
    if start is not None:
        for var in variables:
            builder.add_hint(var, start[var.name])
    solver = model_builder.Solver("sat")
    solver.set_time_limit_in_seconds(float(limits.time_limit_s))
    solver.set_solver_specific_parameters(
        f"num_workers: {limits.threads}, relative_gap_limit: {limits.gap_rel:g}, mip_var_scaling: {var_scaling:g}, "
        "log_search_progress: true"
    )
    solver.enable_output(True)
    with tempfile.TemporaryDirectory(prefix="bench_cpsat_") as folder:
        log_path = Path(folder) / "cpsat.log"
        began = time.perf_counter()
        with _stdout_to(log_path):
            status = solver.solve(builder)
        stop = time.perf_counter() - began
        log = log_path.read_text(encoding="utf-8", errors="replace")
    found = [float(t) for _, t, _ in _CPSAT_SOLUTION.findall(log)]
    has_solution = status in (model_builder.SolveStatus.OPTIMAL, model_builder.SolveStatus.FEASIBLE)
    values = {var.name: float(solver.value(var)) for var in variables} if has_solution else None
    start_state = "none"
    if start is not None:
        start_state = "given (hint)" if "hint is complete and is feasible" in log else "hint not feasible"
    return SolveRecord(
        "cpsat",
        status.name,
        solver.objective_value if has_solution else None,
        solver.best_objective_bound if has_solution and math.isfinite(solver.best_objective_bound) else None,
        found[0] if found else None,
        found[-1] if found else None,
        stop,
        values,
        start_state,
        _cpsat_note(log),
    )


_RUNNERS: dict[str, Callable[[MpsModel, Mapping[str, float] | None, SolveLimits], SolveRecord]] = {
    "highs": _solve_highs,
    "cbc": _solve_cbc,
    "scip": _solve_scip,
    "cpsat": _solve_cpsat,
}
_MODULES = {"highs": "highspy", "scip": "pyscipopt", "cpsat": "ortools"}


def solver_availability() -> dict[str, str | None]:
    """Return, per solver, None when it can run here, else why not."""
    import importlib.util

    out: dict[str, str | None] = {}
    for solver in SOLVERS:
        if solver == "cbc":
            from taccl_py.solvers.cbc import CBC_INSTALL_HINT, find_cbc

            out[solver] = None if find_cbc() is not None else f"no CBC program found ({CBC_INSTALL_HINT})"
        else:
            module = _MODULES[solver]
            found = importlib.util.find_spec(module) is not None
            out[solver] = None if found else f"{module} is not installed (pip install {module})"
    return out


def solver_versions() -> dict[str, str]:
    """Return a version string per solver that can run here."""
    out = {}
    for solver, package in (("highs", "highspy"), ("scip", "pyscipopt"), ("cpsat", "ortools")):
        try:
            out[solver] = f"{package} {version(package)}"
        except PackageNotFoundError:
            continue
    if "scip" in out:
        import pyscipopt

        out["scip"] += f" (SCIP {pyscipopt.Model().version()})"
    cbc = subprocess.run([str(_cbc_path()), "-quit"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"Version:\s*(\S+)", cbc)
    out["cbc"] = f"CBC {match.group(1) if match else '?'} (pulp {version('pulp')} bundled)"
    return out


def run_solver(
    solver: str,
    model: MpsModel,
    start: Mapping[str, float] | None,
    limits: SolveLimits,
    cpsat_var_scaling: float = CPSAT_VAR_SCALING,
) -> SolveRecord:
    """Return what ``solver`` finds on ``model`` within ``limits``, starting from ``start`` where it takes one."""
    if solver == "cpsat":
        return _solve_cpsat(model, start, limits, cpsat_var_scaling)
    return _RUNNERS[solver](model, start, limits)
