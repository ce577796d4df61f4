"""CP-SAT as the MILP solver: right values, statuses by budget, the hint, determinism, whole syntheses."""

from __future__ import annotations

import sys
from unittest import mock

import pulp
import pytest

import taccl_py.stages.routing as routing_module
from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.solvers import (
    BudgetBound,
    SolveOutcome,
    SolverOptions,
    SolveStatus,
    describe_solver,
    solve_model,
    solver_settings,
)
from taccl_py.solvers.matrix import milp_matrix
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth import synthesize
from taccl_py.topology import load_topology

from helpers import assert_valid_algorithm

MB = 1_000_000
_MODEL_BUILDER = "ortools.linear_solver.python.model_builder"


@pytest.fixture
def cpsat() -> SolverOptions:
    """Return CP-SAT's default options, skipping the test without ortools."""
    pytest.importorskip(_MODEL_BUILDER, reason="ortools is not installed (pip install 'taccl-py[cpsat]')")
    return SolverOptions(solver="cpsat")


def _small_milp() -> tuple[pulp.LpProblem, pulp.LpVariable, pulp.LpVariable]:
    """Return max x + 2y subject to x + y <= 7.3, x >= 1.5, x integer in [0, 10], y in [0, 10.5]: x = 2, y = 5.3."""
    prob = pulp.LpProblem("small", pulp.LpMaximize)
    x = prob.add_variable("x", lowBound=0, upBound=10, cat=pulp.LpInteger)
    y = prob.add_variable("y", lowBound=0, upBound=10.5)
    prob += x + 2 * y
    prob += x + y <= 7.3, "capacity"
    prob += x >= 1.5, "least_x"
    return prob, x, y


def _knapsack(items: int = 60) -> tuple[pulp.LpProblem, dict[int, pulp.LpVariable]]:
    """Return a 0-1 knapsack with deterministic pseudo-random weights and values (too hard for a tiny budget)."""
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    take = prob.add_variable_dicts("take", range(items), cat=pulp.LpBinary)
    weight = {i: 37 + (i * 7919) % 101 for i in range(items)}
    value = {i: 41 + (i * 104729) % 97 for i in range(items)}
    prob += pulp.lpSum(value[i] * take[i] for i in range(items))
    prob += pulp.lpSum(weight[i] * take[i] for i in range(items)) <= sum(weight.values()) // 3, "capacity"
    return prob, take


@pytest.mark.smoke
def test_a_small_milp_is_solved_to_its_optimum(cpsat):
    prob, x, y = _small_milp()
    outcome = solve_model(prob, cpsat)
    assert outcome.status is SolveStatus.OPTIMAL and outcome.bound is None
    assert x.value() == 2 and y.value() == pytest.approx(5.3, abs=1e-6)
    assert outcome.objective == pytest.approx(12.6, abs=1e-6)


@pytest.mark.smoke
def test_an_infeasible_milp_is_reported_infeasible(cpsat):
    prob, x, _ = _small_milp()
    prob += x <= 1, "most_x"
    outcome = solve_model(prob, cpsat)
    assert outcome.status is SolveStatus.INFEASIBLE and not outcome.has_solution


def _routing_model() -> tuple[pulp.LpProblem, dict[str, float], float]:
    """Return the routing MILP of a 64 MB AllGather on two NDv2 (618 columns), its greedy start and objective (µs)."""
    topology = load_topology("ndv2", nodes=2)
    graph = build_logical_graph(topology, auto_sketch(topology))
    chunk_bytes = 64 * MB / graph.num_ranks
    kept = []

    def keep(prob, options, time_limit_s=None, start=None, progress=None):
        kept.append((prob, dict(start)))
        return SolveOutcome(SolveStatus.NO_SOLUTION, None, 0.0)

    with mock.patch.object(routing_module, "solve_model", keep):
        greedy = routing_module.route_chunks(graph, 1, chunk_bytes, chunk_bytes / 2, SolverOptions())
    return kept[0][0], kept[0][1], greedy.objective_us


def test_the_hint_is_where_the_search_starts(cpsat):
    # The start sets the routes, not the load and path columns, so it reaches CP-SAT only as a hint.
    prob, start, start_us = _routing_model()
    assert len(start) < milp_matrix(prob).num_columns
    options = SolverOptions(solver="cpsat", deterministic_time_s=0.02)
    hinted = solve_model(prob, options, start=start)
    assert hinted.has_solution and hinted.objective <= start_us + 1e-6
    unhinted = solve_model(prob, options)
    assert unhinted.objective is None or unhinted.objective > hinted.objective + 1e-6, "the hint made no difference"


def test_a_tiny_work_budget_stops_early_and_keeps_the_start(cpsat):
    prob, take = _knapsack()
    start = {var.name: float(i < 5) for i, var in take.items()}  # feasible, far from optimal
    outcome = solve_model(prob, SolverOptions(solver="cpsat", deterministic_time_s=1e-9), start=start)
    assert outcome.status is SolveStatus.NODE_LIMIT and outcome.bound is BudgetBound.NODE_LIMIT
    assert outcome.has_solution and outcome.objective >= sum(41 + (i * 104729) % 97 for i in range(5)) - 1e-9
    assert all(var.value() in (0.0, 1.0) for var in take.values())


def test_the_same_model_twice_gives_the_same_values(cpsat):
    options = SolverOptions(solver="cpsat", deterministic_time_s=0.05)
    answers = []
    for _ in range(2):
        prob, start, _ = _routing_model()
        outcome = solve_model(prob, options, start=start)
        assert outcome.status is SolveStatus.NODE_LIMIT, "the work budget should stop this solve"
        answers.append((outcome.objective, [(var.name, var.value()) for var in prob.variables()]))
    assert answers[0] == answers[1]


def test_cpsat_writes_no_log(cpsat, capfd):
    solve_model(_knapsack()[0], SolverOptions(solver="cpsat", deterministic_time_s=0.01))
    assert capfd.readouterr() == ("", ""), "CP-SAT's log reached stdout or stderr"


# 1 MB (the middle regime's 3 candidates) in the default run; 64 MB (the 10 of the bandwidth regime, 12 s
# on 2 cores) with --runslow.
@pytest.mark.parametrize("size", [MB, pytest.param(64 * MB, marks=pytest.mark.slow)], ids=["1MB", "64MB"])
def test_a_synthesis_with_cpsat_verifies_and_repeats_byte_for_byte(cpsat, size):
    outputs = []
    for _ in range(2):
        result = synthesize(load_topology("ndv2"), "allgather", size_bytes=size, solver="cpsat", jobs=1)
        assert len(result.candidates) >= 3
        assert_valid_algorithm(result.algorithm)
        outputs.append(generate_algorithm_json(result.algorithm))
    assert outputs[0] == outputs[1]


def test_provenance_names_ortools_and_the_deterministic_time_rule(cpsat):
    assert describe_solver(cpsat).startswith("cpsat (ortools ")
    settings = dict(solver_settings(cpsat))
    assert "node_limit" not in settings and "by model size" in settings["deterministic_time_s"]
    assert settings["threads"] == 1 and settings["random_seed"] == 0
    assert "deterministic_time_s" not in dict(solver_settings(SolverOptions()))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"node_limit": 5}, r"node_limit: 5 nodes with cpsat; expected none"),
        ({"threads": 2}, r"threads: 2 threads with cpsat; expected 1"),
        ({"deterministic_time_s": 0.0}, r"deterministic_time: 0.0 s; expected a positive"),
    ],
    ids=["node-limit", "threads", "no-work"],
)
def test_options_cpsat_cannot_honour_are_refused(cpsat, kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        SolverOptions(solver="cpsat", **kwargs)


def test_a_deterministic_time_for_highs_is_refused():
    with pytest.raises(ArgumentError, match=r"deterministic_time: set for highs; expected it only with solver cpsat"):
        SolverOptions(deterministic_time_s=1.0)


def test_cpsat_without_ortools_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, _MODEL_BUILDER, None)  # makes importing it fail
    expected = r"solver: cpsat needs ortools, which is not installed; expected pip install 'taccl-py\[cpsat\]'"
    with pytest.raises(ArgumentError, match=expected):
        SolverOptions(solver="cpsat")
    out = tmp_path / "ag.json"
    argv = ["synthesize", "-t", "ndv2", "-c", "allgather", "--size", "1MB", "--solver", "cpsat", "-o", str(out)]
    assert main(argv) == 2
    assert "pip install 'taccl-py[cpsat]'" in capsys.readouterr().err and not out.exists()


def test_a_tiny_wall_clock_cap_is_reported_as_the_cap(cpsat):
    prob, start, _ = _routing_model()
    options = SolverOptions(solver="cpsat", deterministic_time_s=1e6)  # work that the cap cuts short
    outcome = solve_model(prob, options, time_limit_s=0.05, start=start)
    assert outcome.bound is BudgetBound.WALL_CLOCK_CAP
    assert outcome.status in (SolveStatus.WALL_CLOCK_CAP, SolveStatus.NO_SOLUTION)
