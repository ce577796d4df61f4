"""scripts/gpu_check.py: its case tables and report on CPU, the check itself on gloo ranks, and on a GPU where present.

The tables come from the library (``block_layout`` shapes, band sizes), so the unit tests read
them for ndv2's shipped 8-rank library, whose AlltoAll once crashed the script. ``--device cpu``
runs the correctness parts on gloo: two local ranks on the ring library (rings and the direct
alltoall) in a few seconds, ndv2 on eight ranks with ``--runslow``. The GPU run needs CUDA.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator.selection import collect_algorithms
from taccl_py.runtime.executor.native import divide_for_avg

from mp_utils import run_ranks

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "gpu_check.py"
if str(SCRIPTS) not in sys.path:  # the script's modules import each other by name, as when run
    sys.path.insert(0, str(SCRIPTS))

import gpu_check  # noqa: E402
import gpu_check_cases as cases  # noqa: E402
import gpu_check_report as tables  # noqa: E402

ALL_DTYPES = {"float32", "float16", "bfloat16", "float64", "int32", "int64"}
REDUCE_OPS = {"sum", "avg", "max", "min"}


@pytest.fixture(scope="module")
def ndv2() -> Any:
    return collect_algorithms("ndv2", 8)


# -- tables, without processes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("collective", "input_numel", "output_numel"),
    [
        (Collective.ALLGATHER, 1001, 8008),
        (Collective.REDUCESCATTER, 8008, 1001),
        (Collective.ALLREDUCE, 1001, 1001),
        (Collective.ALLTOALL, 8008, 8008),  # one block per peer: 1001 elements crashed the executor
    ],
    ids=lambda value: getattr(value, "value", None),
)
def test_shapes_come_from_block_layout(collective: Collective, input_numel: int, output_numel: int) -> None:
    shape = cases.shape_of(collective, 8, 1001, chunks_per_loop=16)
    assert (shape.input_numel, shape.output_numel) == (input_numel, output_numel)


def test_every_band_of_ndv2_gets_a_size_inside_it(ndv2: Any) -> None:
    for band in ndv2.candidates:
        for dtype in cases.DTYPES:
            numel = cases.band_numel(band, dtype)
            assert numel is not None, f"{band.name} {dtype}"
            size = cases.shape_of(band.collective, 8, numel).size_bytes(dtype)
            assert band.covers(size), f"{band.name} {dtype}: {numel} elements are {size} B"
            assert ndv2.select(band.collective, size) == band, f"{band.name} {dtype}"


def test_ndv2_backend_cases_cover_every_collective_entry_dtype_and_op(ndv2: Any) -> None:
    table = cases.backend_cases(ndv2)
    collectives = {case.collective for case in table if case.collective is not None}
    assert collectives == set(Collective)
    entries = {case.entry for case in table}
    expected_entries = {
        *cases.TENSOR_ENTRIES.values(),
        *cases.LIST_ENTRIES.values(),
        *cases.COALESCED_ENTRIES.values(),
        cases.MIX_ENTRY,
    }
    assert entries == expected_entries
    for collective in Collective:
        mine = [case for case in table if case.collective is collective]
        assert {cases.dtype_name(case.dtype) for case in mine} == ALL_DTYPES, collective
        ops = {case.op for case in mine}
        want = REDUCE_OPS | ({"prod"} if collective is Collective.ALLREDUCE else set()) if collective.reduces else {"-"}
        assert ops == want, collective
    for case in table:
        if case.op == "prod":
            assert (case.routed, case.delegated) == ((), (("allreduce", 1),)), case
        elif case.entry in cases.COALESCED_ENTRIES.values():
            assert case.routed == ((case.collective.value, 2),) and case.delegated == (), case
        elif case.collective is not None:
            assert case.routed == ((case.collective.value, 1),) and case.delegated == (), case
        else:  # the mix: four routed collectives, the PRODUCT all-reduce delegated
            assert dict(case.routed) == {c.value: 1 for c in Collective}, case
            assert case.delegated == (("allreduce", 1),), case
    # the single-tensor calls reach every band, in every dtype
    reached = {
        (
            ndv2.select(case.collective, cases.shape_of(case.collective, 8, case.numel).size_bytes(case.dtype)),
            case.dtype,
        )
        for case in table
        if case.entry in cases.TENSOR_ENTRIES.values()
    }
    # every band of ours; a native band (NCCL's 6 rings from 2 MiB, issue 47) runs NCCL's own collective
    routed = [band for band in ndv2.candidates if band.algorithm is not None]
    assert len(routed) < len(ndv2.candidates)
    assert reached == {(band, dtype) for band in routed for dtype in cases.DTYPES}


def test_executor_cases_cover_every_dtype_and_op_and_side_streams_only_on_cuda() -> None:
    on_cpu = cases.executor_cases(Collective.REDUCESCATTER, cuda=False)
    first = {(cases.dtype_name(c.dtype), c.op) for c in on_cpu if c.numel == cases.NUMELS[0]}
    assert first == {(d, op) for d in ALL_DTYPES for op in REDUCE_OPS}
    assert not any(c.side_stream for c in on_cpu)
    on_gpu = cases.executor_cases(Collective.ALLTOALL, cuda=True)
    assert {c.op for c in on_gpu} == {"-"}
    assert {c.numel for c in on_gpu if c.side_stream} == set(cases.NUMELS)


def test_integer_data_stays_exact_for_every_op() -> None:
    data = cases.integer_data(4096, torch.bfloat16, 3, "cpu")
    assert data.abs().max() <= 4 and (data != 0).any()
    factors = cases.integer_data(4096, torch.float16, 3, "cpu", op="prod")
    assert set(factors.tolist()) <= {-2.0, -1.0, 1.0, 2.0}
    assert torch.equal(divide_for_avg(torch.tensor([-7, 7]), 2), torch.tensor([-3, 3]))  # the reference's avg


def _outcome(dtype: str, failure: str | None = None, transport: str = "torch-gloo") -> Any:
    return tables.Outcome("alltoall", dtype, "-", "Communicator.all_to_all", transport, "direct-1p numel=1001", failure)


def test_report_rows_name_the_differing_dtype_and_the_verdict_fails() -> None:
    exact = tables.summarize([_outcome(d) for d in sorted(ALL_DTYPES)])
    assert tables.all_exact(exact)
    assert (
        tables.report_lines(exact)[2] == "| alltoall | all 6 | - | Communicator.all_to_all | torch-gloo | 6 | exact |"
    )
    per_rank = [
        [_outcome("float32"), _outcome("int64")],
        [_outcome("float32"), _outcome("int64", "3 of 8008 elements differ")],
    ]
    merged = tables.merge_ranks(per_rank)
    assert merged[1].failure == "rank 1: 3 of 8008 elements differ" and merged[0].failure is None
    rows = tables.summarize(merged)
    assert not tables.all_exact(rows)
    line = tables.report_lines(rows)[2]
    assert line.startswith("| alltoall | float32, int64 | - |")
    assert "DIFFER 1/2: int64 direct-1p numel=1001: rank 1: 3 of 8008 elements differ" in line


def test_routing_table_fails_a_routed_call_that_fell_back() -> None:
    exact = (Counter(allgather=2), Counter(allgather=2), Counter(), Counter())
    fell_back = (Counter(allgather=2), Counter(allgather=2), Counter(allgather=1), Counter())
    lines, ok = tables.routing_lines([exact, exact])
    assert ok and lines[2] == "| allgather | 2 | 2 | 0 | 0 | as expected |"
    lines, ok = tables.routing_lines([exact, fell_back])
    assert not ok and lines[2].endswith("| NOT AS EXPECTED on ranks [1] |")


def test_the_overlap_check_picks_the_largest_routed_size_and_fails_a_serialized_rank(ndv2: Any) -> None:
    import gpu_check_overlap as overlap

    # NDv2 leaves AllReduce from 2 MiB to NCCL's 6 rings (issue 47): 4-64 MiB are not routed
    assert overlap.overlap_size_bytes(ndv2, [1048576]) == 1048576
    assert overlap.overlap_size_bytes(ndv2, [2**21 - 4, 2**21]) == 2**21 - 4
    found = dict(size_bytes=2**26, all_reduce_ms=9.0, compute_ms=9.0, serialized_ms=18.0, routed=True)
    fine = overlap.OverlapTimes(0, overlapped_ms=9.5, compute_start_ms=0.1, all_reduce_end_ms=9.0, **found)
    late = overlap.OverlapTimes(1, overlapped_ms=18.0, compute_start_ms=9.0, all_reduce_end_ms=9.0, **found)
    lines, ok = overlap.overlap_lines([fine], 2)
    assert ok and lines[2].endswith("| overlaps |") and "ended at 9.00 ms" in lines[-1] and "overlaps" in lines[-1]
    lines, ok = overlap.overlap_lines([fine, late], 2)
    assert not ok and lines[3].endswith("| SERIAL |") and "(worst rank 1): DOES NOT OVERLAP" in lines[-1]
    unrouted = overlap.OverlapTimes(
        0, overlapped_ms=9.5, compute_start_ms=0.1, all_reduce_end_ms=9.0, **found | {"routed": False}
    )
    lines, ok = overlap.overlap_lines([unrouted], 2)
    assert not ok and lines[2].endswith("| NOT ROUTED |")


def test_help_says_what_the_check_covers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        gpu_check.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for word in ("alltoall", "avg", "float64", "int64", "_coalescing_manager", "--device", "--share-gpu", "routed"):
        assert word in text, word


def test_outside_torchrun_the_check_says_how_to_run_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(SystemExit) as done:
        gpu_check.main(["--device", "cpu"])
    assert done.value.code == 2
    assert "torchrun" in capsys.readouterr().err
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # the GPUs are hidden in a rank, not in its caller


# -- the check on gloo ranks ----------------------------------------------------------------------------


def _run_check(rank: int, world_size: int, argv: list[str], bad_avg: bool = False) -> tuple[int, str]:
    """Worker: run the check's main with ``argv``; return its exit status and what it printed."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import gpu_check
    import gpu_check_cases

    if bad_avg:  # a reference one off for float64 averages: the check must notice and fail
        native = gpu_check_cases.native_collective

        def one_off(collective: Collective, output: Any, input: Any, op: str, group: Any) -> None:
            native(collective, output, input, op, group)
            if op == "avg" and output.dtype == torch.float64:
                output.add_(1)

        gpu_check_cases.native_collective = one_off
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = gpu_check.main(argv)
    return status, printed.getvalue()


def _assert_covers_everything(report: str) -> None:
    for collective in Collective:
        assert f"| {collective.value} | all 6 |" in report, collective
    for entry in (
        "Executor.run",
        "Communicator.all_to_all",
        "dist.all_to_all_single",
        "dist.all_gather (list)",
        "dist.reduce_scatter (list)",
        "dist.all_to_all (list)",
        "coalesced all_gather_single x2",
        "coalesced reduce_scatter_single x2",
        cases.MIX_ENTRY,
    ):
        assert f"| {entry} |" in report, entry
    assert "| allreduce | all 6 | prod | dist.all_reduce |" in report
    assert "DIFFER" not in report and "NOT AS EXPECTED" not in report, report
    assert "result: everything agrees" in report


@pytest.mark.multiprocess
def test_cpu_check_on_two_gloo_ranks_is_exact_and_routes_every_collective() -> None:
    argv = ["--device", "cpu", "--sizes", "65536", "--iters", "1"]
    results = run_ranks(_run_check, 2, argv, backend=None)
    assert [status for status, _ in results] == [0, 0], results[0][1]
    report = results[0][1]
    _assert_covers_everything(report)
    for collective in Collective:  # routed, and nothing routed fell back to gloo inside
        assert f"| {collective.value} | " in report.split("calls routed")[1], collective
    assert "| alltoall | 65536 | direct-1p |" in report
    assert "- skipped: side streams, CUDA graphs, the CuPy transport and training: they need CUDA" in report
    assert "- algorithms checked (4): " in report


@pytest.mark.multiprocess
def test_a_difference_fails_the_check_on_every_rank() -> None:
    results = run_ranks(_run_check, 2, ["--device", "cpu", "--parts", "communicator"], True, backend=None)
    assert [status for status, _ in results] == [1, 1]
    report = results[0][1]
    assert "| allreduce | all 6 | avg | Communicator.all_reduce | torch-gloo | 6 | DIFFER 1/6: float64" in report
    assert "| allreduce | all 6 | sum | Communicator.all_reduce | torch-gloo | 6 | exact |" in report
    assert "result: MISMATCH" in report


@pytest.mark.slow
@pytest.mark.multiprocess
def test_cpu_check_of_ndv2_on_eight_gloo_ranks() -> None:
    argv = ["--device", "cpu", "--library", "ndv2", "--parts", "executor,communicator,backend"]
    results = run_ranks(_run_check, 8, argv, backend=None, timeout_s=900)
    assert [status for status, _ in results] == [0] * 8, results[0][1]
    _assert_covers_everything(results[0][1])


# -- on a GPU -------------------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_gpu_check_agrees_with_nccl_on_a_shared_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: the GPU check needs a GPU")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(SCRIPT), "--share-gpu", "--iters", "1", "--sizes", "1048576"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    _assert_covers_everything(done.stdout)
    assert "Executor.run, CUDA graph" in done.stdout and "## training" in done.stdout
    assert "## overlap" in done.stdout and "ms serialized (worst rank" in done.stdout
