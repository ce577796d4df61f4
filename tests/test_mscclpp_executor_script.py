"""scripts/mscclpp_executor/run_plans.py on CPU: the sizes, data and buffer layout it gives MSCCL++'s executor.

The run itself needs a GPU and a build of MSCCL++ (not in the repository); what is checked here is what
MSCCL++ would refuse before running anything (``ExecutionPlan::Impl::checkMessageSize``) and that
the expected outputs are the collectives' definitions.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from taccl_py.baselines import ring_algorithm
from taccl_py.cli.algo import libraries_to_export
from taccl_py.ir.collectives import Collective
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import generate_library_plans
from taccl_py.topology import load_topology

from helpers import ring_algorithm as toy_ring

SCRIPT_DIR = Path(__file__).resolve().parents[1] / "scripts" / "mscclpp_executor"
if str(SCRIPT_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPT_DIR))

import run_plans  # noqa: E402


def passes_check_message_size(plan: dict, input_bytes: int, output_bytes: int) -> bool:
    """MSCCL++'s rule: aligned buffers in whole chunks, and the selecting size inside the plan's band."""
    gpu, alignment = plan["gpus"][0], plan["buffer_alignment"]
    whole = all(
        size % alignment == 0 and (size // alignment) % chunks == 0
        for size, chunks in ((input_bytes, gpu["input_chunks"]), (output_bytes, gpu["output_chunks"]))
    )
    size = output_bytes if plan["collective"] == "allgather" else input_bytes
    return whole and plan["min_message_size"] <= size <= plan["max_message_size"]


def _ndv2_plans(collective: str) -> list[str]:
    (library,) = (library for library in libraries_to_export("ndv2", None) if library.collective.value == collective)
    return [text for _, text in generate_library_plans(library).files]


# The AllReduce library (10 plans, 1800 steps in the largest) runs with --runslow; the default run
# makes AllReduce's data in test_the_expected_outputs_are_the_collectives.
@pytest.mark.parametrize(
    "collective", ["allgather", "reducescatter", pytest.param("allreduce", marks=pytest.mark.slow)]
)
def test_every_shipped_ndv2_plan_runs_at_powers_of_two_the_executor_accepts(collective: str) -> None:
    ndv2_plans = _ndv2_plans(collective)
    assert len(ndv2_plans) >= 4  # two bands of ours, both placements; from 2 MiB NCCL's 6 rings run (issue 47)
    # (collective, ranks, size) -> each rank's input and expected output bytes; the data is made once
    # a call (up to 8 x 64 MiB), which most plans share
    buffer_bytes = {}
    for text in ndv2_plans:
        plan = json.loads(text)
        sizes = run_plans.message_sizes(text, plan["name"])
        assert sizes and all(size & (size - 1) == 0 for size in sizes), (plan["name"], sizes)  # NDv2 bands: no MiB
        assert sizes[0] >= plan["min_message_size"] and sizes[-1] <= min(plan["max_message_size"], 64 << 20)
        for size in sizes:
            call = (plan["collective"], len(plan["gpus"]), size)
            if call not in buffer_bytes:
                inputs, expected = run_plans.collective_data(*call)
                assert len(inputs) == len(expected) == call[1]
                buffer_bytes[call] = (inputs[0].nbytes, expected[0].nbytes)
            assert passes_check_message_size(plan, *buffer_bytes[call]), (plan["name"], size)


def test_a_plan_refusing_powers_of_two_is_not_run() -> None:
    # six rings on NDv2: 6 chunks per rank, so an AllGather takes multiples of 16 * 6 * 8 bytes only
    plan = generate_mscclpp_plan(ring_algorithm(load_topology("ndv2"), Collective.ALLGATHER))
    with pytest.raises(
        ValueError, match=r"refuses \d+ sizes frameworks pass \(1, 2, 4, 8, \.\.\.\): multiples of 768 B"
    ):
        run_plans.message_sizes(json.dumps(plan), "six-rings.json")


def test_a_range_holding_no_framework_size_is_refused() -> None:
    plan = generate_mscclpp_plan(toy_ring(Collective.ALLREDUCE, 2))
    plan["min_message_size"], plan["max_message_size"] = 1100, 2000  # no power of two between
    with pytest.raises(ValueError, match=r"odd.json: no size frameworks pass in \[1100, 2000\]"):
        run_plans.message_sizes(json.dumps(plan), "odd.json")
    plan["max_message_size"] = 2048
    assert run_plans.message_sizes(json.dumps(plan), "odd.json") == (2048,)


def test_the_expected_outputs_are_the_collectives() -> None:
    inputs, expected = run_plans.collective_data("reducescatter", 4, 4 * 4 * 8)
    assert np.array_equal(expected[2], sum(inputs)[16:24])
    assert any(np.any(x != 0) for x in inputs)  # random data, not zeros
    inputs, expected = run_plans.collective_data("allgather", 4, 4 * 4 * 8)
    assert np.array_equal(expected[3], np.concatenate(inputs)) and inputs[0].size == 8
    inputs, expected = run_plans.collective_data("allreduce", 4, 4 * 4 * 8)
    assert all(np.array_equal(out, sum(inputs)) for out in expected) and inputs[0].size == 32


def test_in_place_calls_alias_the_buffer_as_nccl_does() -> None:
    assert run_plans.buffer_offsets("allgather", True, 3, 100, 400) == (300, 0)
    assert run_plans.buffer_offsets("reducescatter", True, 3, 400, 100) == (0, 300)
    assert run_plans.buffer_offsets("allreduce", True, 3, 400, 400) == (0, 0)
    assert run_plans.buffer_offsets("allreduce", False, 3, 400, 400) == (-1, -1)


FAKE_RUN_PLAN = """#!{python}
# Stands in for run_plan on CPU: an AllGather of every rank's input file, the later call's output {last}.
import sys
from pathlib import Path

import numpy as np

plan, rank, world, _, inp, out = sys.argv[1:7]
parts = [np.fromfile(Path(inp).parent / f"in{{r}}", np.float32) for r in range(int(world))]
gathered = np.concatenate(parts)
gathered.tofile(out)
(gathered if "{last}" == "right" else np.zeros_like(gathered)).tofile(out + ".last")
print(f"rank {{rank}}: ok, 5 more calls, 1.0 us each")
"""


@pytest.mark.parametrize("last", ["right", "stale"])
def test_a_wrong_output_after_the_later_calls_fails_the_plan(tmp_path, capsys, last) -> None:
    runner = tmp_path / "run_plan"
    runner.write_text(FAKE_RUN_PLAN.format(python=sys.executable, last=last))
    runner.chmod(0o755)
    plan = generate_mscclpp_plan(toy_ring(Collective.ALLGATHER, 2))
    # 16-byte units, one per rank: from 32 bytes; run at the smallest, the nearest 1 MiB and the largest
    plan["min_message_size"], plan["max_message_size"] = 32, 8192
    path = tmp_path / "ag.json"
    path.write_text(json.dumps(plan))
    assert run_plans.run_plan_file(tmp_path, path) is (last == "right")
    lines = capsys.readouterr().out.splitlines()
    assert [re.search(r"(\d+) bytes: ", line)[1] for line in lines] == ["32", "8192"]
    assert all(("EXACT" in line) is (last == "right") for line in lines)
    assert all(("WRONG on ranks [0, 1]" in line) is (last == "stale") for line in lines)


def test_a_plan_refused_at_a_framework_size_fails_without_running(tmp_path, capsys) -> None:
    path = tmp_path / "ag.json"
    path.write_text(json.dumps(generate_mscclpp_plan(toy_ring(Collective.ALLGATHER, 2))))  # from 0 bytes
    assert run_plans.run_plan_file(tmp_path, path) is False  # no run_plan in tmp_path: nothing ran
    assert capsys.readouterr().out.startswith("ag.json: MSCCL++ refuses 5 sizes frameworks pass (1, 2, 4, 8, ...)")
