"""``taccl build`` and ``taccl_py.build``: every engine writes the bytes of a serial build; failures are retried.

Two of the cheapest instances (DGX-H100 and 8-GPU PCIe AllGather at 1 KB and 1 MB, one and two
bands) are built in this process as the reference, then through the CLI on the local engine and on a
local Ray. Failures are injected through ``TACCL_BUILD_FAULTS``, which the workers themselves read:
a raised exception, a worker process that exits, one that never finishes (stopped by the engine's cap),
and on Ray a worker that dies mid-task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taccl_py.build import FAULTS_ENV, BuildOptions, build_instance, instance_command, list_instances, make_engine
from taccl_py.build.driver import run_instances
from taccl_py.build.local import LocalEngine
from taccl_py.cli import main
from taccl_py.ir.library import read_library

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SIZES = "1KB,1MB"
INSTANCES = list_instances(["dgx-h100", "pcie-8gpu"], [1], ["allgather"])
BUILD = ["build", "--topologies", "dgx-h100,pcie-8gpu", "--nodes", "1", "--collectives", "allgather"]
BUILD += ["--sizes", SIZES]


@pytest.fixture(scope="module")
def serial() -> dict[str, bytes]:
    """Return the files of both instances built one after the other in this process, by relative path."""
    options = BuildOptions(sizes=SIZES, source_commit=COMMIT)
    files: dict[str, bytes] = {}
    for instance in INSTANCES:
        files.update(build_instance(instance, options).files)
    return files


@pytest.fixture(autouse=True)
def _fixed_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkout's commit (and whether other work leaves it dirty) may change while the tests run.
    monkeypatch.setattr("taccl_py.cli.build.source_commit", lambda: COMMIT)


def _tree(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def _faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: dict[str, dict]) -> None:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    monkeypatch.setenv(FAULTS_ENV, str(path))


def test_the_serial_build_is_laid_out_as_algorithms(serial: dict[str, bytes], tmp_path: Path) -> None:
    assert sorted(serial) == [
        "dgx-h100/n1/allgather-0.json.xz",
        "dgx-h100/n1/allgather.library.json",
        "pcie-8gpu/n1/allgather-0.json.xz",
        "pcie-8gpu/n1/allgather-1.json.xz",
        "pcie-8gpu/n1/allgather.library.json",
    ]
    for name, data in serial.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    library = read_library(tmp_path / "pcie-8gpu/n1/allgather.library.json")
    assert [band.algorithm_file for band in library.bands] == ["allgather-0.json.xz", "allgather-1.json.xz"]
    assert library.provenance.command == instance_command(INSTANCES[1], BuildOptions(sizes=SIZES))
    assert library.provenance.source_commit == COMMIT


@pytest.mark.parametrize(("time_limit_s", "timeout_s"), [(None, 3600.0), (600.0, 3600.0), (7200.0, 14400.0)])
def test_a_local_instance_is_stopped_only_past_twice_its_time_limit(
    time_limit_s: float | None, timeout_s: float
) -> None:
    """A synthesis capped at 2 h still verifies and writes after the cap: the instance's own cap sits above it."""
    engine = make_engine("local", BuildOptions(sizes=SIZES, time_limit_s=time_limit_s))
    assert engine.timeout_s == timeout_s


def test_a_local_instance_past_its_cap_is_stopped_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _faults(tmp_path, monkeypatch, {"pcie-8gpu/n1/allgather": {"fail": 1, "how": "hang"}})
    engine = LocalEngine(BuildOptions(sizes=SIZES, source_commit=COMMIT), timeout_s=1.0)
    report = run_instances(engine, INSTANCES[1:], tmp_path / "out", retries=0)
    assert [outcome.errors for outcome in report.outcomes] == [("timed out after 1 s",)]
    assert not (tmp_path / "out" / INSTANCES[1].library_file).exists()
    assert not engine._tasks  # the worker was ended and its folder removed


def test_local_engine_writes_the_serial_bytes(
    serial: dict[str, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    stale = out / "pcie-8gpu/n1/allgather-7.json.xz"  # a band of an earlier build the new library does not name
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    assert main([*BUILD, "-o", str(out), "--jobs", "2"]) == 0
    assert _tree(out) == serial
    captured = capsys.readouterr()
    assert "build: started dgx-h100 n1 allgather, pcie-8gpu n1 allgather; 0 of 2 instances done, 2 running" in (
        captured.err
    )
    assert "2 of 2 instances done, 0 running" in captured.err
    assert "pcie-8gpu n1 allgather   built         1" in captured.out


def test_ray_engine_writes_the_local_bytes_after_a_worker_died(
    serial: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'taccl-py[ray]')")
    _faults(tmp_path, monkeypatch, {"pcie-8gpu/n1/allgather": {"fail": 1, "how": "exit"}})
    out = tmp_path / "out"
    assert main([*BUILD, "-o", str(out), "--engine", "ray", "--jobs", "2"]) == 0
    assert _tree(out) == serial
    err = capsys.readouterr().err
    assert "pcie-8gpu n1 allgather failed (attempt 1 of 3), retrying: WorkerCrashedError" in err
    assert "build: pcie-8gpu n1 allgather built after 1 failed attempt" in err


def test_a_ray_task_past_its_cap_is_cancelled_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a task that never finishes, and no retry: nothing has to build within the short cap.
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'taccl-py[ray]')")
    from taccl_py.build.ray_engine import RayEngine

    _faults(tmp_path, monkeypatch, {"pcie-8gpu/n1/allgather": {"fail": 1, "how": "hang"}})
    engine = RayEngine(BuildOptions(sizes=SIZES, source_commit=COMMIT), slots=1, timeout_s=5.0)
    report = run_instances(engine, INSTANCES[1:], tmp_path / "out", retries=0)
    assert [outcome.errors for outcome in report.outcomes] == [("timed out after 5 s",)]
    assert not (tmp_path / "out" / INSTANCES[1].library_file).exists()


def test_failures_are_retried_and_one_that_never_builds_is_reported(
    serial: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _faults(
        tmp_path,
        monkeypatch,
        {"dgx-h100/n1/allgather": {"fail": 1, "how": "raise"}, "pcie-8gpu/n1/allgather": {"fail": 9, "how": "exit"}},
    )
    out = tmp_path / "out"
    assert main([*BUILD, "-o", str(out), "--jobs", "2", "--retries", "1"]) == 1
    assert _tree(out) == {name: data for name, data in serial.items() if name.startswith("dgx-h100/")}
    captured = capsys.readouterr()
    assert "dgx-h100 n1 allgather failed (attempt 1 of 2), retrying: worker exit status 1: RuntimeError" in (
        captured.err
    )
    assert "build: dgx-h100 n1 allgather built after 1 failed attempt" in captured.err
    assert "error: pcie-8gpu n1 allgather: failed 2 times: worker exit status 70" in captured.err
    assert "pcie-8gpu n1 allgather  failed         2" in captured.out


def test_ray_engine_without_ray_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    out = tmp_path / "out"
    assert main([*BUILD, "-o", str(out), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: --engine: ray needs Ray, which is not installed; expected pip install 'taccl-py[ray]' "
        "(from a clone: pip install -e '.[ray]')"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value", "line"),
    [
        ("--topologies", "ndv2,ndv9", "error: --topologies: unknown machine 'ndv9'; expected built-in machines: "),
        ("--collectives", "allgather,bcast", "error: --collectives: unknown collective 'bcast'; expected allgather, "),
        ("--nodes", "1,x", "error: --nodes: 'x'; expected machine counts separated by commas, e.g. 1,2"),
        ("--retries", "-1", "error: --retries: -1 retries; expected a whole number from 0"),
        ("--address", "127.0.0.1:6379", "error: --address: only Ray joins a cluster; expected --engine ray"),
    ],
    ids=["topologies", "collectives", "nodes", "retries", "address-local"],
)
def test_bad_arguments_are_one_error_line_before_any_work(
    option: str, value: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["build", option, value, "--sizes", SIZES, "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
    assert not out.exists()


def test_taccl_py_and_the_build_command_import_without_ray() -> None:
    probe = (
        "import sys, taccl_py, taccl_py.build, taccl_py.cli.build\n"
        "from taccl_py.cli import build_parser\n"
        "build_parser('build').format_help()\n"
        "print('ray' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
