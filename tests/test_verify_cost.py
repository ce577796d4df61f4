"""What verifying and simulating a large baseline costs, counted in work done (never timed).

At 512 GPUs the doubling AllReduce has 2M steps: its dataflow must be built once for verifying and
simulating it, and the AllReduce postcondition must not rebuild an N-pair sum per rank and chunk.
"""

from __future__ import annotations

import taccl_py.ir.flow_cache as flow_cache
import taccl_py.verify.replay as replay
from taccl_py.baselines.doubling import doubling_algorithm
from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.simulate import prepare_simulation, simulate_plan
from taccl_py.topology import load_topology
from taccl_py.verify import verify_algorithm

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def _counting(monkeypatch, module, name: str) -> list[int]:
    """Wrap ``module.name`` so that each call appends 1 to the returned list."""
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_verified_doubling_is_simulated_on_the_dataflow_its_verification_built(monkeypatch):
    topology = load_topology("dgx-h100", nodes=2)
    built = _counting(monkeypatch, flow_cache, "build_dataflow")
    algorithm = doubling_algorithm(topology, "allreduce", piece_blocks=2)  # verified before it is returned
    assert len(built) == 1
    plan = prepare_simulation(algorithm, topology)
    assert len(built) == 1
    assert simulate_plan(plan, 1 << 20).time_us > 0
    other = doubling_algorithm(topology, "allgather")  # one entry: the AllReduce's dataflow is dropped
    assert len(built) == 2
    assert verify_algorithm(other).ok and len(built) == 2
    prepare_simulation(algorithm, topology)
    assert len(built) == 3


def test_allreduce_postcondition_builds_each_chunks_sum_once_for_all_ranks(monkeypatch):
    algorithm = doubling_algorithm(load_topology("dgx-h100", nodes=2), "allreduce", piece_blocks=2)
    expected = _counting(monkeypatch, replay, "expected_output")
    assert verify_algorithm(algorithm).ok
    # gathered copies share one sum: one comparison per chunk, not one per rank and chunk (32, not 512)
    assert len(expected) == algorithm.layout.output_chunks


def test_a_wrong_sum_on_a_later_rank_is_reported_after_a_right_one():
    plan = [
        Transfer(1, 0, (I, 0), (S, 0)),
        LocalCopy(0, (I, 0), (O, 0)),
        LocalCopy(0, (S, 0), (O, 0), reduce=True),
        LocalCopy(1, (I, 0), (O, 0)),  # rank 1 keeps its own input: not the sum
    ]
    report = verify_algorithm(lower_plan("half-sum", Collective.ALLREDUCE, 2, 1, plan))
    assert not report.ok
    assert [(v.kind, v.rank) for v in report.violations] == [("wrong result", 1)]
