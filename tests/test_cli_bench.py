"""``taccl bench``: the table against torch's own collective, and its argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taccl_py.cli import main
from taccl_py.ir.algorithm_json import write_algorithm
from taccl_py.ir.collectives import Collective

from helpers import error_line, ring_algorithm

FIXTURES = Path(__file__).parent / "fixtures" / "msccl"


def assert_one_error_line(capsys: pytest.CaptureFixture[str], status: int, pattern: str) -> None:
    captured = capsys.readouterr()
    assert status == 2
    assert pattern in error_line(captured.err)
    assert captured.out == ""


@pytest.mark.multiprocess
def test_bench_prints_a_row_per_size_against_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ring.json"
    write_algorithm(ring_algorithm(Collective.ALLREDUCE, 2, inplace=True), str(path))
    status = main(
        ["bench", "--algorithm", str(path), "--nproc", "2", "--sizes", "4KB,40KB", "--iters", "2", "--warmup", "1"]
    )
    out = capsys.readouterr().out
    assert status == 0
    lines = out.strip().splitlines()
    assert lines[0].split() == [
        "collective",
        "size",
        "algorithm",
        "ours_us",
        "torch_us",
        "ours_GBps",
        "torch_GBps",
        "speedup",
    ]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["allreduce", "4KB", "ring_allreduce_2"],
        ["allreduce", "40KB", "ring_allreduce_2"],
    ]


@pytest.mark.multiprocess
def test_bench_calibration_is_measured_written_then_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from taccl_py.runtime.communicator.calibration import read_calibration

    path, calibration = tmp_path / "ring.json", tmp_path / "cal.json"
    write_algorithm(ring_algorithm(Collective.ALLREDUCE, 2, inplace=True), str(path))
    argv = ["bench", "--algorithm", str(path), "--nproc", "2", "--sizes", "4KB,40KB", "--iters", "2", "--json"]
    assert main([*argv, "--calibration", str(calibration)]) == 0
    measured = read_calibration(calibration)
    assert [(p.size_bytes, p.algorithm) for p in measured.points] == [
        (4000, "ring_allreduce_2"),
        (40000, "ring_allreduce_2"),
    ]
    chosen = {p.size_bytes: "torch" if p.prefers_native(measured.margin) else p.algorithm for p in measured.points}
    rows = json.loads(capsys.readouterr().out)
    assert {row["size_bytes"]: row["algorithm"] for row in rows} == chosen  # the bench times the calibrated choice
    before = calibration.stat().st_mtime_ns
    assert main([*argv, "--calibration", str(calibration)]) == 0
    assert calibration.stat().st_mtime_ns == before and read_calibration(calibration) == measured
    capsys.readouterr()
    calibration.write_text("{")
    assert_one_error_line(
        capsys, main([*argv, "--calibration", str(calibration)]), f"{calibration}: line 1: invalid JSON"
    )


@pytest.mark.multiprocess
def test_bench_writes_the_library_with_native_bands_where_gloo_won(tmp_path: Path) -> None:
    from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library
    from taccl_py.runtime.communicator.calibration import calibrated_library, read_calibration
    from taccl_py.synth.bands import write_library

    source = tmp_path / "ar.library.json"
    ring = ring_algorithm(Collective.ALLREDUCE, 2, inplace=True)
    write_library(AlgorithmLibrary("toy", 1, Collective.ALLREDUCE, 2, (SizeBand(0, None, ring, "x.json"),)), source)
    calibration, out = tmp_path / "cal.json", tmp_path / "out"
    argv = ["bench", "--library", str(source), "--nproc", "2", "--sizes", "4KB,400KB", "--iters", "2"]
    assert main([*argv, "--calibration", str(calibration), "--write-library", str(out)]) == 0
    written = read_library(out / "ar.library.json")
    expected = calibrated_library(read_library(source), read_calibration(calibration))
    assert [(b.min_bytes, b.max_bytes, b.native) for b in written.bands] == [
        (b.min_bytes, b.max_bytes, b.native) for b in expected.bands
    ]
    assert all(band.native or band.algorithm.ranks == ring.ranks for band in written.bands)


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--write-library", "out"], "--write-library: given without --calibration"),
        (["--write-library", "/no/such/dir/out", "--calibration", "c.json"], "its folder /no/such/dir does not exist"),
    ],
)
def test_bench_refuses_a_library_it_cannot_write_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], pattern: str
) -> None:
    from taccl_py.ir.library import AlgorithmLibrary, SizeBand
    from taccl_py.synth.bands import write_library

    source = tmp_path / "ar.library.json"
    ring = ring_algorithm(Collective.ALLREDUCE, 2, inplace=True)
    write_library(AlgorithmLibrary("toy", 1, Collective.ALLREDUCE, 2, (SizeBand(0, None, ring, "x.json"),)), source)
    argv = ["bench", "--library", str(source), "--nproc", "2", *extra]
    assert_one_error_line(capsys, main(argv), pattern)
    path = tmp_path / "ring.json"
    write_algorithm(ring, str(path))
    status = main(["bench", "--algorithm", str(path), "--nproc", "2", "--write-library", "o", "--calibration", "c"])
    assert_one_error_line(capsys, status, "--write-library: not a *.library.json")


@pytest.mark.multiprocess
def test_bench_json_rows_fall_back_to_torch_where_the_library_has_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    xml = FIXTURES / "microsoft" / "allgather_ring_4gpu_1ch_simple.xml"
    status = main(
        [
            "bench",
            "--library",
            str(xml),
            "--collective",
            "allgather",
            "--collective",
            "allreduce",
            "--nproc",
            "4",
            "--sizes",
            "8KB",
            "--iters",
            "1",
            "--json",
        ]
    )
    rows = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [(r["collective"], r["size_bytes"], r["algorithm"]) for r in rows] == [
        ("allgather", 8000, "allgather_ring_1channelsperring"),
        ("allreduce", 8000, "torch"),
    ]
    assert all(r["ours_time_us"] > 0 and r["torch_time_us"] > 0 for r in rows)


@pytest.mark.multiprocess
def test_bench_times_alltoall_against_all_to_all_single(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "alltoall.json"
    write_algorithm(ring_algorithm(Collective.ALLTOALL, 2), str(path))
    argv = ["bench", "--algorithm", str(path), "--nproc", "2", "--sizes", "8KB,64KB", "--iters", "1", "--json"]
    status = main(argv)
    rows = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [(r["collective"], r["size_bytes"], r["algorithm"]) for r in rows] == [
        ("alltoall", 8000, "ring_alltoall_2"),
        ("alltoall", 64000, "ring_alltoall_2"),
    ]
    assert all(r["ours_time_us"] > 0 and r["torch_time_us"] > 0 for r in rows)


def test_bench_unknown_library(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--library", "no-such-machine", "--nproc", "2"])
    assert_one_error_line(capsys, status, "no-such-machine: library: neither a file nor a built-in topology")


def test_bench_algorithm_for_another_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    xml = FIXTURES / "microsoft" / "allgather_ring_4gpu_1ch_simple.xml"
    status = main(["bench", "--algorithm", str(xml), "--nproc", "2"])
    assert_one_error_line(capsys, status, "runs on 4 ranks, the group has 2")


def test_bench_outside_torchrun_needs_nproc(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    status = main(["bench", "--library", "ndv2"])
    assert_one_error_line(
        capsys, status, "launch: not started by torchrun and no --nproc; expected torchrun --nproc-per-node N"
    )


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["--nproc", "1"], "--nproc: 1; expected 2 or more local ranks"),
        (["--nproc", "2", "--iters", "0"], "--iters/--warmup: 0/2"),
        (["--nproc", "2", "--sizes", "64XB"], "sizes: cannot read size '64XB'"),
    ],
)
def test_bench_bad_arguments(argv: list[str], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--library", "ndv2", *argv])
    assert_one_error_line(capsys, status, pattern)


def _measured_topology(tmp_path: Path, ranks: int) -> Path:
    from taccl_py.topology.measured import HostProfile, ProfileProvenance, fit_alpha_beta, host_topology
    from taccl_py.topology.schema import write_topology

    sizes = (64_000, 4_000_000)
    provenance = ProfileProvenance("0", "gloo", ranks, "cpu", sizes, 1, 0, 1, "2026-11-26")
    pair = fit_alpha_beta(sizes, [100 + s / 2e3 for s in sizes])  # 100 µs, 2 GB/s
    path = tmp_path / f"measured{ranks}.json"
    write_topology(host_topology(HostProfile(provenance, pair, pair, ranks)), path)
    return path


@pytest.mark.multiprocess
def test_bench_with_a_topology_prints_predictions_and_the_model_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = _measured_topology(tmp_path, 2)
    argv = ["bench", "--ring", "--nproc", "2", "--sizes", "64KB,1MB", "--iters", "2", "--warmup", "1"]
    assert main([*argv, "--topology", str(topology)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[-4:] == ["ours_pred_us", "ours_meas/pred", "torch_pred_us", "torch_meas/pred"]
    rows = [line.split() for line in lines[2:-1]]
    assert [row[:3] for row in rows] == [
        [collective, size, f"ring-{collective}-2x1"]
        for collective in ("allgather", "reducescatter", "allreduce")
        for size in ("64KB", "1MB")
    ]
    for row in rows:  # measured / predicted, as printed, is the ratio of the printed times
        assert float(row[9].rstrip("x")) == pytest.approx(float(row[3]) / float(row[8]), rel=0.02, abs=0.01)
    assert lines[-1].startswith("model error: median ") and "over 12 times" in lines[-1]
    assert main([*argv, "--collective", "allgather", "--topology", str(topology), "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert all(r["ours_predicted_us"] > 0 and r["torch_predicted_us"] > 0 for r in rows)
    assert captured.err.startswith("model error: median ")
    with pytest.raises(SystemExit):  # --ring and --library exclude each other
        main([*argv, "--library", "ndv2"])


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--topology", "ndv2"], "ndv2: --topology: 8 GPUs for 2 ranks; expected one GPU per rank (2)"),
        (["--topology", "missing.json"], "missing.json: no such built-in topology or file"),
        (["--write-library", "out", "--calibration", "c.json"], "--write-library: given with --ring"),
    ],
)
def test_bench_with_rings_refuses_bad_input_before_starting_ranks(
    extra: list[str], pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_error_line(capsys, main(["bench", "--ring", "--nproc", "2", *extra]), pattern)


def test_default_sizes_print_whole():
    from taccl_py.cli.bench import DEFAULT_SIZES
    from taccl_py.units import format_size, parse_sizes

    printed = [format_size(size) for size in parse_sizes(DEFAULT_SIZES, "--sizes")]
    assert printed == ["64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB"]
