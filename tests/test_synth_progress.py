"""Progress from inside a synthesis candidate's stages, not only at their boundaries (issue 14)."""

from __future__ import annotations

import contextlib
import time

import pulp
import pytest

from taccl_py import progress as progress_module
from taccl_py import solvers as solver_module
from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.progress import ProgressTicker, heartbeat
from taccl_py.solvers import SolverOptions, solve_model
from taccl_py.synth import synthesize
from taccl_py.topology import load_topology

from helpers import requires_cbc

MB = 1_000_000


@pytest.fixture(scope="module")
def quiet_run():
    """ndv2 AllGather at 1 MB without progress: what every run with progress must equal."""
    return synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, jobs=1)


def test_a_candidate_reports_from_inside_its_milps_ordering_verification_and_simulation(monkeypatch, quiet_run):
    """With the interval at zero every periodic report fires: each long stage must have one."""
    monkeypatch.setattr(progress_module, "REPORT_INTERVAL_S", 0.0)
    lines: list[str] = []
    result = synthesize(load_topology("ndv2"), "allgather", size_bytes=MB, jobs=1, progress=lines.append)
    assert any(line.startswith("tree packing: ") and " rounds, " in line for line in lines), lines
    inside = [line for line in lines if line.startswith("[1/")]
    assert any("routing: MILP of" in line and "columns" in line and "work budget" in line for line in inside), lines
    assert any("routing: " in line and (" in " in line and line.endswith(" s")) for line in inside), lines
    assert any("routing: " in line and " nodes, " in line for line in inside), "HiGHS's callback reports mid-solve"
    assert any("ordering: " in line and "sends placed" in line for line in inside), lines
    assert any("verifying" in line for line in inside), lines
    assert any("simulating" in line and "sizes done" in line for line in inside), lines
    # Wall time decides only when a line is written, never what is computed.
    assert generate_algorithm_json(result.algorithm) == generate_algorithm_json(quiet_run.algorithm)


def test_ticker_waits_its_interval_and_says_at_once():
    lines: list[str] = []
    ticker = ProgressTicker(lines.append, interval_s=3600.0)
    ticker.tick(lambda: "not yet")
    ticker.say("now")
    assert lines == ["now"]
    ProgressTicker(None, interval_s=0.0).tick(lambda: pytest.fail("describe is not called without a callback"))


def test_heartbeat_speaks_while_its_block_runs_and_stops_after():
    lines: list[str] = []
    with heartbeat(lines.append, "routing", interval_s=0.01):
        time.sleep(0.2)
    count = len(lines)
    time.sleep(0.05)
    assert count >= 1 and len(lines) == count, lines
    assert lines[0].startswith("routing: still running, ")


def test_heartbeat_keeps_quiet_while_the_shared_ticker_is_not_due():
    """A solver's own reports reset the shared ticker: the heartbeat speaks only into silences."""
    lines: list[str] = []
    ticker = ProgressTicker(lines.append, interval_s=0.2)
    with heartbeat(lines.append, "routing", ticker=ticker):
        for _ in range(30):
            ticker.say("routing: 10 nodes")
            time.sleep(0.01)
    assert lines == ["routing: 10 nodes"] * 30


@pytest.mark.parametrize(
    ("options", "budget"),
    [
        (SolverOptions(node_limit=5), "work budget 5 nodes (highs)"),
        pytest.param("cbc", "work budget 5 nodes (cbc)", marks=requires_cbc),
        ("cpsat", "work budget 0.05 deterministic s (cpsat)"),
    ],
    ids=["highs", "cbc", "cpsat"],
)
def test_a_solve_reports_size_budget_and_outcome_with_a_heartbeat_between(monkeypatch, options, budget):
    """Lines come before and after a solve, and a heartbeat runs meanwhile for the silences of any solver.

    (HiGHS says nothing while it solves its root LP; CBC, a subprocess, and CP-SAT give no callbacks here.)
    """
    if options == "cpsat":
        pytest.importorskip("ortools.linear_solver.python.model_builder", reason="ortools is not installed")
        options = SolverOptions("cpsat", deterministic_time_s=0.05)
    elif options == "cbc":
        options = SolverOptions("cbc", node_limit=5)
    beats: list[str] = []

    @contextlib.contextmanager
    def recorded(progress, what, interval_s=None, *, ticker=None):
        beats.append(what if progress is not None else "none")
        yield

    monkeypatch.setattr(solver_module, "heartbeat", recorded)
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    take = prob.add_variable_dicts("take", range(30), cat=pulp.LpBinary)
    prob += pulp.lpSum((41 + (i * 104729) % 97) * take[i] for i in range(30))
    prob += pulp.lpSum((37 + (i * 7919) % 101) * take[i] for i in range(30)) <= 700, "capacity"
    lines: list[str] = []
    outcome = solve_model(prob, options, progress=lines.append)
    assert lines[0] == f"knapsack: MILP of 30 columns, 1 rows; {budget}", lines
    assert lines[-1] == f"knapsack: {outcome.status.value} in {outcome.wall_s:.1f} s", lines
    assert beats == ["knapsack"]
