"""pulp models read into solver arrays: the same model under pulp 3.3 and pulp 4 (issue 28)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from unittest import mock

import numpy as np
import pulp
import pytest

import taccl_py.stages.routing as routing_module
import taccl_py.stages.scheduling as scheduling_module
import taccl_py.synth.alltoall.routing as alltoall_routing_module
from taccl_py.solvers.matrix import MilpMatrix, assign_values, linear_sum, milp_matrix
from taccl_py.synth import synthesize
from taccl_py.topology import load_topology

from helpers import FIXTURES

pytestmark = pytest.mark.smoke

DIGESTS = FIXTURES / "milp_model_digests.json"
RECORD_ENV = "TACCL_RECORD_MILP_DIGESTS"  # set to 1 to rewrite DIGESTS after a deliberate model change
# (machine, nodes, collective, bytes): syntheses whose every MILP and LP is digested
DIGESTED_SYNTHESES = (("ndv2", 1, "allgather", 1_000_000), ("dgx-a100", 2, "reducescatter", 16_000_000))
MODEL_MODULES = (routing_module, scheduling_module, alltoall_routing_module)


def _small_model() -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable]]:
    prob = pulp.LpProblem("small", pulp.LpMinimize)
    made = {name: prob.add_variable(name, lowBound=0, upBound=4) for name in ("b", "a", "c")}
    made["k"] = prob.add_variable("k", lowBound=0, upBound=3, cat=pulp.LpInteger)
    made["unused"] = prob.add_variable("unused", lowBound=0)
    prob += made["c"] + 2 * made["b"] + 5
    prob += linear_sum([(made["c"], 1.0), (made["a"], 2.0), (made["k"], 0.0)]) >= 1, "first"
    prob += made["b"] - made["k"] == 0.5, "second"
    prob += made["a"] + made["b"] <= 3, "third"
    return prob, made


def test_columns_are_the_used_variables_sorted_by_name_and_rows_keep_their_order():
    matrix = milp_matrix(_small_model()[0])
    assert matrix.column_names == ("a", "b", "c", "k"), "the unused variable is no column"
    assert matrix.row_names == ("first", "second", "third")
    assert matrix.num_constrained_columns == 4 and matrix.num_rows == 3
    rows = [
        [(matrix.column_names[j], v) for j, v in zip(matrix.row_columns[lo:hi], matrix.row_values[lo:hi])]
        for lo, hi in zip(matrix.row_starts[:-1], matrix.row_starts[1:])
    ]
    assert rows == [[("c", 1.0), ("a", 2.0)], [("b", 1.0), ("k", -1.0)], [("a", 1.0), ("b", 1.0)]], "zeros dropped"
    assert matrix.row_lower.tolist() == [1.0, 0.5, -math.inf] and matrix.row_upper.tolist() == [math.inf, 0.5, 3.0]
    assert matrix.integer.tolist() == [False, False, False, True]
    assert matrix.objective.tolist() == [0.0, 2.0, 1.0, 0.0] and matrix.objective_offset == 5.0


def test_a_variable_named_twice_in_a_sum_counts_twice():
    prob = pulp.LpProblem("twice", pulp.LpMinimize)
    x = prob.add_variable("x", lowBound=0)
    prob += linear_sum([(x, 1.5), (x, 2.0)]) <= 7, "row"
    assert milp_matrix(prob).row_values.tolist() == [3.5]


def test_satisfies_checks_bounds_rows_and_integrality():
    matrix = milp_matrix(_small_model()[0])
    assert matrix.satisfies([0.0, 1.5, 1.0, 1.0], 1e-9)
    assert not matrix.satisfies([0.0, 1.5, 0.0, 1.0], 1e-9), "row 'first' needs c + 2a >= 1"
    assert not matrix.satisfies([0.0, 1.7, 1.0, 1.2], 1e-9), "k is an integer"
    assert not matrix.satisfies([0.0, 1.5, 5.0, 1.0], 1e-9), "c <= 4"
    assert not matrix.satisfies([0.0, 1.5, 1.0], 1e-9), "one value per column"


def test_values_go_back_into_the_variables_integers_rounded():
    prob, made = _small_model()
    matrix = milp_matrix(prob)
    assign_values(matrix, [0.25, 1.5, 1.0, 0.9999999])
    assert (made["a"].value(), made["k"].value(), made["unused"].value()) == (0.25, 1.0, None)


def test_zero_has_one_sign_whichever_pulp_wrote_the_row():
    prob, made = _small_model()
    prob += made["a"] <= made["c"], "fourth"  # pulp 4 gives this row an upper bound of -0.0
    assert np.signbit(milp_matrix(prob).row_upper).tolist() == [False] * 4


def _digest(matrix: MilpMatrix) -> str:
    """Return a hash of everything a solver sees of ``matrix``: names, bounds, kinds, objective and rows."""
    digest = hashlib.sha256()
    digest.update(json.dumps([matrix.column_names, matrix.row_names, matrix.maximize]).encode())
    for array in (matrix.col_lower, matrix.col_upper, matrix.objective, matrix.row_lower, matrix.row_upper):
        digest.update(np.asarray(array, dtype="<f8").tobytes())
    digest.update(matrix.integer.astype("u1").tobytes())
    for array in (matrix.row_starts, matrix.row_columns):
        digest.update(np.asarray(array, dtype="<i4").tobytes())
    digest.update(np.asarray(matrix.row_values, dtype="<f8").tobytes())
    return digest.hexdigest()


def _model_digests() -> dict[str, list[str]]:
    """Return, per digested synthesis, the digests of the models it hands the solver, in order."""
    found: dict[str, list[str]] = {}
    for name, nodes, collective, size_bytes in DIGESTED_SYNTHESES:
        key = f"{name} x{nodes} {collective} {size_bytes}"
        digests = found.setdefault(key, [])
        patches = []
        for module in MODEL_MODULES:

            def record(prob, *args, _solve=module.solve_model, **kwargs):
                digests.append(f"{prob.name} {_digest(milp_matrix(prob))}")
                return _solve(prob, *args, **kwargs)

            patches.append(mock.patch.object(module, "solve_model", record))
        with patches[0], patches[1], patches[2]:
            synthesize(load_topology(name, nodes=nodes), collective, size_bytes=size_bytes, jobs=1)
    return found


def test_the_models_handed_to_the_solver_are_the_recorded_ones():
    """The same input builds the same models under every pulp (3.3 and 4 are CI legs), so HiGHS answers alike.

    The digests cover syntheses with routing and contiguity MILPs; a deliberate change of a model
    is recorded with TACCL_RECORD_MILP_DIGESTS=1.
    """
    found = _model_digests()
    if os.environ.get(RECORD_ENV) == "1":
        DIGESTS.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
        pytest.skip(f"recorded {DIGESTS.name}")
    recorded = json.loads(DIGESTS.read_text(encoding="utf-8"))
    assert all(found.values()), "every digested synthesis solves at least one model"
    assert found == recorded, (
        f"pulp {pulp.__version__} builds other models than those recorded in {DIGESTS.name}; "
        f"a deliberate model change is recorded with {RECORD_ENV}=1"
    )
