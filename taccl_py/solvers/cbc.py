"""CBC for the synthesizer: found where it is, fed a ``MilpMatrix`` as MPS, read back from its solution file.

CBC is a program, not a library: pulp 3.3 bundles a binary (CBC 2.10), pulp 4 moved it to the
``cbcbox`` wheel (``pip install 'taccl-py[cbc]'`` or ``'pulp[cbc]'``), and a system may have ``cbc``
on PATH. ``find_cbc`` prefers them in the order cbcbox, pulp's, PATH: cbcbox first, so pulp 3 and
pulp 4 beside the same wheel run the same binary. The model goes to CBC as free MPS written here
(columns ``C<j>``, rows ``R<i>``, so no pulp name needs quoting), with the same work budget as
HiGHS: a node limit, one thread, a fixed seed; the wall-clock cap is a safety net. CBC is given
no start (it would need a solution file of its own format); different CBC builds may find
different optima, so provenance names the binary's version and origin.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import pulp

from taccl_py.errors import install_hint
from taccl_py.solvers.matrix import BranchResult, BranchStop, MilpMatrix, NodeBudget

__all__ = [
    "CBC_INSTALL_HINT",
    "CbcBinary",
    "cbc_version",
    "find_cbc",
    "generate_mps",
    "solve_with_cbc",
]

logger = logging.getLogger(__name__)

#: What to tell a user who asked for CBC on a machine without it.
CBC_INSTALL_HINT = f"{install_hint('cbc')} (the cbcbox wheel; pulp 3.3 bundles CBC), or a cbc program on PATH"
# Seconds CBC may run past its own -sec cap (reading the model, writing the solution) before it is killed.
_CAP_GRACE_S = 60.0
_VERSION_TIMEOUT_S = 10.0
_VERSION_RE = re.compile(r"^Version:\s*(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class CbcBinary:
    """A CBC program: its path and where it was found (``cbcbox 2.929``, ``bundled with pulp 3.3.2``, ``on PATH``)."""

    path: str
    origin: str


def _executable(path: str | None) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def _cbcbox_path() -> str | None:
    try:
        import cbcbox
    except ImportError:
        return None
    try:
        return str(cbcbox.cbc_bin_path())
    except (OSError, RuntimeError, FileNotFoundError):
        return None


def _pulp_bundled_path() -> str | None:
    # pulp 3.3's bundled binary: PULP_CBC_CMD.pulp_cbc_path (tests/test_private_apis.py checks it exists there)
    command = getattr(pulp, "PULP_CBC_CMD", None)
    return getattr(command, "pulp_cbc_path", None)


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "(version unknown)"


def find_cbc() -> CbcBinary | None:
    """Return the CBC program to run: cbcbox's, pulp's bundled one, or ``cbc`` on PATH; None when there is none."""
    candidates = (
        (_cbcbox_path, lambda: f"cbcbox {_package_version('cbcbox')}"),
        (_pulp_bundled_path, lambda: f"bundled with pulp {_package_version('pulp')}"),
        (lambda: shutil.which("cbc"), lambda: "on PATH"),
    )
    for locate, origin in candidates:
        path = locate()
        if _executable(path):
            return CbcBinary(os.path.normpath(path), origin())
    return None


def cbc_version(binary: CbcBinary) -> str:
    """Return the version CBC prints in its banner (e.g. ``2.10.3``), or ``version unknown``."""
    try:
        done = subprocess.run(
            [binary.path, "-quit"], capture_output=True, text=True, timeout=_VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    found = _VERSION_RE.search(done.stdout)
    return found.group(1) if found else "version unknown"


# MPS numbers carry 13 significant digits: CBC 2.10 takes a different, slower path on some routing
# models written with all 17 (it stops on iterations where it proves the optimum otherwise).
def _number(value: float) -> str:
    return f"{float(value):.12e}"


def _row_kind(lower: float, upper: float) -> tuple[str, float, float | None]:
    """Return a row's MPS type, right-hand side and range (None: no range) for ``lower <= row <= upper``."""
    if lower == upper:
        return "E", lower, None
    if math.isinf(lower):
        return "L", upper, None
    if math.isinf(upper):
        return "G", lower, None
    return "G", lower, upper - lower


def _bound_lines(name: str, lower: float, upper: float) -> list[str]:
    if lower == upper:
        return [f" FX BND {name} {_number(lower)}"]
    if math.isinf(lower) and math.isinf(upper):
        return [f" FR BND {name}"]
    lines = [f" MI BND {name}"] if math.isinf(lower) else [f" LO BND {name} {_number(lower)}"]
    lines.append(f" PL BND {name}" if math.isinf(upper) else f" UP BND {name} {_number(upper)}")
    return lines


def generate_mps(matrix: MilpMatrix) -> str:
    """Return ``matrix`` as free-format MPS, minimising (a maximised objective is negated); every bound explicit.

    Rows with no bound on either side constrain nothing and are left out.
    """
    sign = -1.0 if matrix.maximize else 1.0
    bounds = zip(matrix.row_lower.tolist(), matrix.row_upper.tolist())
    kinds = {i: _row_kind(lo, up) for i, (lo, up) in enumerate(bounds) if not (math.isinf(lo) and math.isinf(up))}
    lines = [f"NAME {matrix.name or 'model'}", "ROWS", " N OBJ"]
    lines += [f" {kind} R{i}" for i, (kind, _, _) in kinds.items()]
    entries: list[list[tuple[int, float]]] = [[] for _ in range(matrix.num_columns)]
    for i in kinds:
        for k in range(matrix.row_starts[i], matrix.row_starts[i + 1]):
            entries[int(matrix.row_columns[k])].append((i, float(matrix.row_values[k])))
    lines.append("COLUMNS")
    in_integers = False
    for j in range(matrix.num_columns):
        if bool(matrix.integer[j]) != in_integers:
            in_integers = not in_integers
            lines.append(f" MARKER 'MARKER' '{'INTORG' if in_integers else 'INTEND'}'")
        lines.append(f" C{j} OBJ {_number(sign * matrix.objective[j])}")
        lines += [f" C{j} R{i} {_number(value)}" for i, value in entries[j]]
    if in_integers:
        lines.append(" MARKER 'MARKER' 'INTEND'")
    lines.append("RHS")
    lines += [f" RHS R{i} {_number(rhs)}" for i, (_, rhs, _) in kinds.items() if rhs != 0]
    ranges = [(i, span) for i, (_, _, span) in kinds.items() if span is not None]
    if ranges:
        lines.append("RANGES")
        lines += [f" RNG R{i} {_number(span)}" for i, span in ranges]
    lines.append("BOUNDS")
    for j in range(matrix.num_columns):
        lines += _bound_lines(f"C{j}", float(matrix.col_lower[j]), float(matrix.col_upper[j]))
    lines.append("ENDATA")
    return "\n".join(lines) + "\n"


def _read_solution(text: str, num_columns: int) -> tuple[BranchStop, str, np.ndarray | None]:
    """Return the stop, the status line and the column values of a CBC solution file's ``text``.

    A line CBC does not write (or an empty file) is ``OTHER``.
    """
    lines = text.splitlines()
    status_line = lines[0].strip() if lines else ""
    words = status_line.split()
    head = words[0] if words else ""
    has_solution = head == "Optimal" or (head == "Stopped" and words[3:5] == ["-", "objective"])
    if head in ("Infeasible", "Integer"):  # "Integer infeasible"
        return BranchStop.INFEASIBLE, status_line, None
    if head == "Optimal":
        stop = BranchStop.OPTIMAL
    elif head == "Stopped":
        stop = BranchStop.TIME_LIMIT if words[2:3] == ["time"] else BranchStop.NODE_LIMIT
    else:
        return BranchStop.OTHER, status_line, None
    if not has_solution:
        return stop, status_line, None
    values = np.zeros(num_columns)
    for line in lines[1:]:
        fields = line.split()
        if fields[:1] == ["**"]:  # CBC marks values outside their bounds; the value follows as usual
            fields = fields[1:]
        if len(fields) >= 3 and fields[1].startswith("C") and fields[1][1:].isdigit():
            values[int(fields[1][1:])] = float(fields[2])
    return stop, status_line, values


def solve_with_cbc(binary: CbcBinary, matrix: MilpMatrix, budget: NodeBudget) -> BranchResult:
    """Solve ``matrix`` with the CBC program ``binary`` within ``budget``; return how it ended.

    ``detail`` is the first line of CBC's solution file; a CBC that crashed is ``OTHER``, one that
    ran past its cap and was stopped ``TIME_LIMIT``, both without values.
    """
    with tempfile.TemporaryDirectory(prefix="taccl-cbc-") as folder:
        model, solution = Path(folder) / "model.mps", Path(folder) / "solution.txt"
        model.write_text(generate_mps(matrix), encoding="ascii")
        command = [
            binary.path,
            str(model),
            *("-sec", _number(budget.time_limit_s), "-timeMode", "elapsed", "-ratio", _number(budget.gap_rel)),
            *("-threads", str(budget.threads), "-maxNodes", str(budget.node_limit)),
            *("-randomCbcSeed", str(budget.random_seed)),
            *("-solve", "-printingOptions", "all", "-solution", str(solution)),
        ]
        began = time.perf_counter()
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=budget.time_limit_s + _CAP_GRACE_S, check=False
            )
        except subprocess.TimeoutExpired:
            logger.warning("%s: CBC ran %.0f s past its cap and was stopped", matrix.name, _CAP_GRACE_S)
            return BranchResult(BranchStop.TIME_LIMIT, "killed at the cap", None, time.perf_counter() - began)
        wall = time.perf_counter() - began
        for line in done.stdout.splitlines():
            logger.debug("%s: CBC: %s", matrix.name, line)
        if done.returncode != 0 or not solution.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            logger.warning("%s: CBC exited with status %d (%s)", matrix.name, done.returncode, tail[0])
            return BranchResult(BranchStop.OTHER, f"exit status {done.returncode}", None, wall)
        stop, status_line, values = _read_solution(solution.read_text(errors="replace"), matrix.num_columns)
    return BranchResult(stop, status_line, values, wall)
