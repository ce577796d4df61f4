"""``taccl simulate LIBRARY``: a library file, or a built-in machine's shipped library, per size against NCCL's best."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from taccl_py.baselines import nccl_best_times
from taccl_py.bounds import lower_bounds
from taccl_py.bounds.reduction import in_network_reduction_bounds
from taccl_py.cli import main
from taccl_py.ir.library import read_library, shipped_library_dir
from taccl_py.simulate import simulate
from taccl_py.topology import load_topology
from taccl_py.units import format_size

# Sizes across the bands of dgx-a100 n1 allgather (when written: 0-32KB, 32KB-512KB, 512KB-8.192MB, above).
SIZES = (1000, 100_000, 1_000_000, 100_000_000)
SIZES_ARG = ",".join(format_size(size) for size in SIZES)


def _shipped(machine: str, nodes: int, collective: str) -> Path:
    return Path(str(shipped_library_dir() / machine / f"n{nodes}" / f"{collective}.library.json"))


def _band_of(library, size: int) -> int:
    """Return the index of the band whose algorithm ``library.select`` returns (by identity)."""
    chosen = library.select(size)
    (index,) = [i for i, band in enumerate(library.bands) if band.algorithm is chosen and band.covers(size)]
    return index


def _run_json(capsys, argv: list[str]) -> list[dict]:
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_shipped_library_prints_the_band_its_time_bound_and_nccl_per_size(capsys):
    argv = ["simulate", "dgx-a100", "--nodes", "1", "--collective", "allgather", "--sizes", SIZES_ARG]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    library = read_library(_shipped("dgx-a100", 1, "allgather"))
    assert (
        lines[0] == f"dgx-a100 n1 allgather library: {len(library.bands)} bands, 8 ranks on dgx-a100 (msccl-net model)"
    )
    assert lines[1].split() == [
        "size",
        "band",
        "time",
        "(us)",
        "of",
        "bound",
        "nccl",
        "best",
        "nccl",
        "(us)",
        "vs",
        "nccl",
    ]
    rows = [line.split() for line in lines[3:]]
    assert len(rows) == len(SIZES) and len(lines) == 3 + len(SIZES)  # no note: nothing native, no AllReduce

    topology = load_topology("dgx-a100")
    bounds = lower_bounds(topology, "allgather", SIZES)
    nccl = nccl_best_times(topology, "allgather", SIZES)
    assert len({_band_of(library, size) for size in SIZES}) > 1  # the sizes span several bands
    for row, size, bound, best in zip(rows, SIZES, bounds, nccl):
        band = _band_of(library, size)
        ours_us = simulate(library.bands[band].algorithm, topology, size).time_us
        assert row[0] == format_size(size) and row[1] == str(band)
        assert float(row[2]) == pytest.approx(ours_us, abs=0.005)
        assert float(row[3]) == pytest.approx(bound.time_us / ours_us, abs=0.0005)
        assert row[4] == best.name and float(row[5]) == pytest.approx(best.time_us, abs=0.005)
        assert row[6].endswith("x") and float(row[6][:-1]) == pytest.approx(best.time_us / ours_us, abs=0.005)

    records = _run_json(capsys, argv)
    for record, size, bound, best in zip(records, SIZES, bounds, nccl):
        band = _band_of(library, size)
        ours_us = simulate(library.bands[band].algorithm, topology, size).time_us
        assert (record["size_bytes"], record["band"], record["native"]) == (size, band, False)
        assert record["band_algorithm"] == library.bands[band].algorithm_file
        assert record["time_us"] == pytest.approx(ours_us, rel=1e-12)
        assert record["fraction_of_bound"] == pytest.approx(bound.time_us / ours_us, rel=1e-12)
        assert record["nccl_best"] == {"algorithm": best.name, "time_us": pytest.approx(best.time_us, rel=1e-12)}
        assert record["vs_nccl"] == pytest.approx(best.time_us / ours_us, rel=1e-12)


def test_a_library_file_prints_what_its_machine_name_prints(capsys):
    by_name = _run_json(capsys, ["simulate", "dgx-a100", "-c", "allgather", "--sizes", SIZES_ARG])
    by_file = _run_json(capsys, ["simulate", str(_shipped("dgx-a100", 1, "allgather")), "--sizes", SIZES_ARG])
    assert by_file == by_name and len(by_file) == len(SIZES)


def test_allreduce_on_a_reducing_switch_is_measured_against_the_in_network_bound(capsys):
    sizes = (64 * 2**10, 64 * 2**20)
    argv = ["simulate", "dgx-h100", "-c", "allreduce", "--sizes", "64KiB,64MiB"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "of in-network bound" in lines[1] and lines[1].endswith("vs nccl")
    assert lines[-1].startswith("note: allreduce: the in-network reduction bound")
    records = _run_json(capsys, argv)
    topology = load_topology("dgx-h100")
    library = read_library(_shipped("dgx-h100", 1, "allreduce"))
    for record, size, bound in zip(records, sizes, in_network_reduction_bounds(topology, sizes)):
        ours_us = simulate(library.bands[_band_of(library, size)].algorithm, topology, size).time_us
        assert record["fraction_of_bound"] == pytest.approx(bound.time_us / ours_us, rel=1e-12)
        assert record["bound_time_us"] == pytest.approx(bound.time_us)  # below the RS+AG class bound
        assert record["bound_time_us"] < lower_bounds(topology, "allreduce", [size])[0].time_us


def test_a_native_band_runs_nccl_and_reads_one_times_nccl(tmp_path, capsys):
    shipped = _shipped("dgx-a100", 1, "allgather")
    document = json.loads(shipped.read_text())
    document["bands"][0]["algorithm"] = "native"
    for band in document["bands"][1:]:
        shutil.copy(shipped.parent / band["algorithm"], tmp_path / band["algorithm"])
    path = tmp_path / "ag.library.json"
    path.write_text(json.dumps(document))
    assert main(["simulate", str(path), "--sizes", "1KB,1GB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    native, ours = lines[3].split(), lines[4].split()
    (best,) = nccl_best_times(load_topology("dgx-a100"), "allgather", [1000])
    assert native[1:3] == ["0", "native"] and float(native[3]) == pytest.approx(best.time_us, abs=0.005)
    assert native[-1] == "1.00x" and ours[1] == str(len(document["bands"]) - 1)  # the last band: 1GB
    assert lines[-1].startswith("note: native: the backend's own collective (NCCL) runs there")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["dgx-a100", "--nodes", "3", "-c", "allgather"],
            "dgx-a100: --nodes: no shipped library at 3 nodes; expected one of 1, 2, 4, 8 nodes",
        ),
        (["dgx-a100"], "dgx-a100: --collective: not given with a machine name"),
        (["dgx-a100", "-c", "allgather", "-t", "ndv2"], "--topology: given with a machine name"),
        (["dgx-a100", "-c", "allgather", "--plot", "t.png"], "--plot: given with a library"),
    ],
)
def test_a_machine_without_that_library_exits_2_with_one_line(capsys, argv, message):
    assert main(["simulate", *argv, "--sizes", "1MB"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0] and captured.out == ""


def test_a_library_file_refuses_another_collective_and_an_algorithm_file_refuses_collective(tmp_path, capsys):
    library = str(_shipped("dgx-a100", 1, "allgather"))
    assert main(["simulate", library, "-c", "allreduce", "--sizes", "1MB"]) == 2
    assert "--collective: allreduce for a library of allgather" in capsys.readouterr().err
    band = str(_shipped("dgx-a100", 1, "allgather").parent / "allgather-0.json.xz")
    assert main(["simulate", band, "-t", "dgx-a100", "-c", "allgather", "--sizes", "1MB"]) == 2
    assert "--collective: given with an algorithm file" in capsys.readouterr().err


def test_a_library_file_runs_on_the_topology_given_and_refuses_another_rank_count(capsys):
    library_path = str(_shipped("dgx-a100", 1, "allgather"))
    (record,) = _run_json(capsys, ["simulate", library_path, "-t", "dgx-h100", "--sizes", "1MB", "--no-baselines"])
    library = read_library(library_path)
    band = library.bands[_band_of(library, 1_000_000)]
    ours_us = simulate(band.algorithm, load_topology("dgx-h100"), 1_000_000).time_us
    assert record["time_us"] == pytest.approx(ours_us, rel=1e-12) and record["nccl_best"] is None
    assert main(["simulate", library_path, "-t", "ndv2", "--nodes", "2", "--sizes", "1MB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_ranks: 8 ranks but topology ndv2x2 has 16 GPUs" in err[0]
