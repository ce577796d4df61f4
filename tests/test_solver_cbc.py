"""CBC found where it is (cbcbox, pulp 3.3's bundled binary, PATH), fed MPS we write, read back (issue 28)."""

from __future__ import annotations

import stat

import pulp
import pytest

import taccl_py.solvers as solver_module
import taccl_py.solvers.cbc as cbc_module
from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.solvers import SolverOptions, SolveStatus, describe_solver, solve_model
from taccl_py.solvers.cbc import CbcBinary, find_cbc, generate_mps
from taccl_py.solvers.matrix import BranchStop, linear_sum, milp_matrix

from helpers import one_error_line

pytestmark = pytest.mark.smoke


@pytest.fixture
def cbc() -> CbcBinary:
    binary = find_cbc()
    if binary is None:
        pytest.skip("no CBC program here (pip install 'taccl-py[cbc]', or pulp 3.3's bundled one)")
    return binary


@pytest.fixture
def no_cbc(monkeypatch):
    for locate in ("_cbcbox_path", "_pulp_bundled_path"):
        monkeypatch.setattr(cbc_module, locate, lambda: None)
    monkeypatch.setattr(cbc_module.shutil, "which", lambda name: None)


def _mixed_model(sense: int = pulp.LpMaximize) -> pulp.LpProblem:
    """Return 3x + 2y + z (maximised by default) with x an integer in [0, 4], y in [1, 3], z in [-2, 2]."""
    prob = pulp.LpProblem("mixed", sense)
    x = prob.add_variable("x", lowBound=0, upBound=4, cat=pulp.LpInteger)
    y = prob.add_variable("y", lowBound=1, upBound=3)
    z = prob.add_variable("z", lowBound=-2, upBound=2)
    prob += linear_sum([(x, 3.0), (y, 2.0), (z, 1.0)])
    prob += x + y <= 5.5, "capacity"
    prob += x - z >= 1, "gap"
    prob += y + z == 2, "balance"
    return prob


def test_mps_marks_integers_and_writes_every_bound():
    text = generate_mps(milp_matrix(_mixed_model()))
    lines = text.splitlines()
    assert lines[:3] == ["NAME mixed", "ROWS", " N OBJ"] and lines[-1] == "ENDATA"
    assert [line.split()[0] for line in lines[3:6]] == ["L", "G", "E"]
    assert " MARKER 'MARKER' 'INTORG'" in lines and " MARKER 'MARKER' 'INTEND'" in lines
    assert " C0 OBJ -3.000000000000e+00" in lines, "a maximised objective is negated"
    assert " LO BND C2 -2.000000000000e+00" in lines and " UP BND C0 4.000000000000e+00" in lines


@pytest.mark.parametrize("sense", [pulp.LpMaximize, pulp.LpMinimize], ids=["max", "min"])
def test_cbc_and_highs_find_the_same_optimum(cbc, sense):
    by_solver = {}
    for name in ("highs", "cbc"):
        prob = _mixed_model(sense)
        outcome = solve_model(prob, SolverOptions(name))
        assert outcome.status is SolveStatus.OPTIMAL, name
        by_solver[name] = (round(outcome.objective, 6), {var.name: round(var.value(), 6) for var in prob.variables()})
    assert by_solver["cbc"] == by_solver["highs"]


def test_an_infeasible_model_is_reported_infeasible(cbc):
    prob = pulp.LpProblem("impossible", pulp.LpMinimize)
    x = prob.add_variable("x", lowBound=0, upBound=1, cat=pulp.LpInteger)
    prob += x
    prob += x >= 2, "too_much"
    outcome = solve_model(prob, SolverOptions("cbc"))
    assert outcome.status is SolveStatus.INFEASIBLE and x.value() is None


@pytest.mark.parametrize(
    ("first_line", "stop", "has_values"),
    [
        ("Optimal - objective value 12.40000000", BranchStop.OPTIMAL, True),
        ("Stopped on nodes - objective value 12.4", BranchStop.NODE_LIMIT, True),
        ("Stopped on iterations - objective value 12.4", BranchStop.NODE_LIMIT, True),
        ("Stopped on time - objective value 3", BranchStop.TIME_LIMIT, True),
        ("Stopped on time (no integer solution - continuous used) - objective value 2", BranchStop.TIME_LIMIT, False),
        ("Infeasible - objective value 0.00000000", BranchStop.INFEASIBLE, False),
        ("Integer infeasible - objective value 0.00000000", BranchStop.INFEASIBLE, False),
        ("Unbounded - objective value 0", BranchStop.OTHER, False),
        ("", BranchStop.OTHER, False),
    ],
)
def test_the_solution_file_says_how_cbc_stopped(first_line, stop, has_values):
    body = "      0 R0  1  0\n      0 C0  2.5  0\n**    1 C1  -1  0\n"
    found = cbc_module._read_solution(f"{first_line}\n{body}", 2)
    assert found[0] is stop
    assert (found[2].tolist() if found[2] is not None else None) == ([2.5, -1.0] if has_values else None)


def test_cbcbox_is_preferred_so_both_pulps_run_one_binary(monkeypatch, tmp_path):
    programs = {}
    for origin in ("cbcbox", "pulp", "path"):
        program = tmp_path / origin / "cbc"
        program.parent.mkdir()
        program.write_text("#!/bin/sh\n")
        program.chmod(program.stat().st_mode | stat.S_IXUSR)
        programs[origin] = str(program)
    monkeypatch.setattr(cbc_module, "_cbcbox_path", lambda: programs["cbcbox"])
    monkeypatch.setattr(cbc_module, "_pulp_bundled_path", lambda: programs["pulp"])
    monkeypatch.setattr(cbc_module.shutil, "which", lambda name: programs["path"])
    assert find_cbc().path == programs["cbcbox"] and find_cbc().origin.startswith("cbcbox")
    monkeypatch.setattr(cbc_module, "_cbcbox_path", lambda: None)
    assert find_cbc().path == programs["pulp"] and find_cbc().origin.startswith("bundled with pulp")
    monkeypatch.setattr(cbc_module, "_pulp_bundled_path", lambda: str(tmp_path / "missing"))
    assert find_cbc() == CbcBinary(programs["path"], "on PATH")


def test_without_cbc_the_solver_is_refused_with_how_to_get_it(no_cbc):
    with pytest.raises(
        ArgumentError, match=r"solver: cbc: no CBC program found; expected pip install 'taccl-py\[cbc\]'"
    ):
        SolverOptions("cbc")
    assert describe_solver(SolverOptions("highs")).startswith("highs (highspy ")


def test_cli_without_cbc_is_one_error_line(no_cbc, tmp_path, capsys):
    out = tmp_path / "ag.json"
    status = main(["synthesize", "-t", "ndv2", "-c", "allgather", "--size", "1MB", "--solver", "cbc", "-o", str(out)])
    assert status == 2 and not out.exists()
    assert one_error_line(capsys).startswith("error: --solver: cbc: no CBC program found; expected pip")


def test_a_cbc_that_fails_leaves_the_caller_its_start(monkeypatch, tmp_path, caplog):
    broken = tmp_path / "cbc"
    broken.write_text("#!/bin/sh\necho 'cbc: out of licences' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(solver_module, "find_cbc", lambda: CbcBinary(str(broken), "on PATH"))
    prob = _mixed_model()
    outcome = solve_model(prob, SolverOptions("cbc"))
    assert outcome.status is SolveStatus.NO_SOLUTION and not outcome.has_solution
    assert any("CBC exited with status 3 (cbc: out of licences)" in r.getMessage() for r in caplog.records)
