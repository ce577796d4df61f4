"""scripts/mscclpp_executor/run_plans.py on CPU: the sizes, data and buffer layout it gives MSCCL++'s executor.

The run itself needs a GPU and a build of MSCCL++ (``build.sh``); what is checked here is what
MSCCL++ would refuse before running anything (``ExecutionPlan::Impl::checkMessageSize``) and that
the expected outputs are the collectives' definitions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from taccl_py.cli.algo import libraries_to_export
from taccl_py.mscclpp.files import generate_library_plans

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


@pytest.fixture(scope="module")
def ndv2_plans() -> list[dict]:
    plans = []
    for library in libraries_to_export("ndv2", None):
        if library.collective.value != "alltoall":
            plans += [json.loads(text) for _, text in generate_library_plans(library).files]
    return plans


def test_every_shipped_ndv2_plan_gets_a_size_the_executor_accepts(ndv2_plans: list[dict]) -> None:
    assert len(ndv2_plans) >= 20
    for plan in ndv2_plans:
        ranks, size = len(plan["gpus"]), run_plans.message_bytes(plan)
        inputs, expected = run_plans.collective_data(plan["collective"], ranks, size)
        assert len(inputs) == len(expected) == ranks
        assert passes_check_message_size(plan, inputs[0].nbytes, expected[0].nbytes), plan["name"]


def test_a_band_with_no_whole_size_is_refused() -> None:
    gpu = {"input_chunks": 3, "output_chunks": 3}
    plan = {"name": "odd", "collective": "allreduce", "gpus": [gpu, gpu], "min_message_size": 100}
    plan["max_message_size"] = 150  # whole sizes are multiples of 16 * lcm(3, 3, 2) = 96 bytes
    with pytest.raises(ValueError, match="no multiple of 96 bytes"):
        run_plans.message_bytes(plan)


def test_the_expected_outputs_are_the_collectives() -> None:
    inputs, expected = run_plans.collective_data("reducescatter", 4, 4 * 4 * 8)
    assert np.array_equal(expected[2], sum(inputs)[16:24])
    assert any(np.any(x != 0) for x in inputs)  # random data, not zeros
    inputs, expected = run_plans.collective_data("allgather", 4, 4 * 4 * 8)
    assert np.array_equal(expected[3], np.concatenate(inputs)) and inputs[0].size == 8


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
    gpu = {"input_chunks": 1, "output_chunks": 2}
    plan = {"name": "ag", "collective": "allgather", "inplace": False, "gpus": [gpu, gpu], "buffer_alignment": 16}
    path = tmp_path / "ag.json"
    path.write_text(json.dumps(plan))
    assert run_plans.run_plan_file(tmp_path, path) is (last == "right")
    line = capsys.readouterr().out
    assert ("EXACT" in line) is (last == "right") and ("WRONG on ranks [0, 1]" in line) is (last == "stale")
