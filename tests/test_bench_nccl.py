"""scripts/bench_nccl.py and the NCCL line of scripts/bench_summary.py: rows, summary, targets, the switch-mix limit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from taccl_py.cli import main as taccl_main
from taccl_py.topology import load_topology
from taccl_py.units import format_size

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:  # the scripts import the harness by name, as when run
    sys.path.insert(0, str(SCRIPTS))

import bench_nccl  # noqa: E402
import bench_summary  # noqa: E402
from bench_harness import csv_records, read_csv  # noqa: E402

TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"


def _record(machine: str, nodes: int, collective: str, size: int, vs: float, **extra: object) -> dict:
    row = {
        "machine": machine,
        "nodes": nodes,
        "collective": collective,
        "size": format_size(size),
        "size_bytes": size,
        "band": 0,
        "algorithm": "a",
        "native": "false",
        "time_us": 10.0,
        "bound_us": 9.5,
        "of_bound": 0.95,
        "nccl_algorithm": "nccl-nvls",
        "nccl_us": 10.0 * vs,
        "vs_nccl": vs,
    }
    row.update(extra)
    return row


def test_switch_mix_limit_matches_a_scan_over_the_share_from_the_topology_file() -> None:
    spec = json.loads((TOPOLOGIES / "dgx-h100.json").read_text(encoding="utf-8"))
    (switch,) = [v for v in spec["vertices"] if v.get("reduce_bandwidth_GBps")]
    port = next(link for link in spec["links"] if link["src"] == "gpu0" and link["dst"] == switch["name"])
    rate, carried = switch["reduce_bandwidth_GBps"], port["bandwidth_GBps"]
    # any share s through the switch: the switch's rate binds its part, the port's all of it
    best = min(
        max(1.125 * s / rate, (1.125 * s + 1.75 * (1 - s)) / carried) for s in (i / 100000 for i in range(100001))
    )
    found_rate, found_port, share, mixed, fraction = bench_nccl.switch_mix_limit(load_topology("dgx-h100"))
    assert (found_rate, found_port) == (rate, carried) == (308.6, 370.8)
    assert 1 / mixed == pytest.approx(best, rel=1e-6)
    assert mixed == pytest.approx(309.8, abs=0.1) and fraction == pytest.approx(0.836, abs=5e-4)
    assert 1.125 * share / rate == pytest.approx((1.125 * share + 1.75 * (1 - share)) / carried)


def test_summary_lists_sizes_below_one_natives_and_the_large_size_fraction() -> None:
    records = [
        _record("dgx-h100", 2, "allreduce", 2**16, 0.98),
        _record("dgx-h100", 2, "allreduce", 2**20, 1.0, native="true"),
        _record("dgx-h100", 2, "allreduce", 2**26, 1.3, of_bound=0.7),
        _record("dgx-h100", 2, "allreduce", 2**30, 1.2, of_bound=0.8),
    ]
    (row,) = bench_nccl.summary_rows(records)
    assert row == ("dgx-h100", 2, "allreduce", "0.98x", "64KiB (0.980x)", "1 of 4", "0.700")


def test_missed_targets_name_each_miss_and_the_one_machine_limit() -> None:
    records = [
        _record("dgx-h100", 1, "allreduce", 2**26, 1.2, of_bound=0.82),
        _record("dgx-h100", 1, "allgather", 2**16, 0.97, nccl_algorithm="nccl-nvls", band=2),
        _record("dgx-h100", 1, "reducescatter", 2**16, 1.05),
    ]
    text = bench_nccl.missed_targets(records)
    assert "Met: dgx-h100 x1 reducescatter." in text
    assert "dgx-h100 x1 allgather is below NCCL's best at 64KiB (0.970x against nccl-nvls, band 2 a)" in text
    assert "reaches 0.820 of the in-network bound at 64MiB" in text
    assert "M/309.9 GB/s: 0.836 of the in-network bound M/370.8" in text


def test_rows_are_what_taccl_simulate_prints_for_the_shipped_library(capsys: pytest.CaptureFixture[str]) -> None:
    sizes = (2**16, 2**24, 2**30)
    rows = bench_nccl.case_rows("dgx-h100", 1, "allgather", sizes)
    records = csv_records(bench_nccl.CSV_HEADER, rows)
    argv = ["simulate", "dgx-h100", "--collective", "allgather", "--sizes", "64KiB,16MiB,1GiB", "--json"]
    assert taccl_main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in records] == [p["size_bytes"] for p in printed] == list(sizes)
    for record, shown in zip(records, printed):
        assert record["time_us"] == pytest.approx(shown["time_us"], rel=1e-4)
        assert record["nccl_us"] == pytest.approx(shown["nccl_best"]["time_us"], rel=1e-4)
        assert record["vs_nccl"] == pytest.approx(shown["vs_nccl"], rel=1e-4)
        assert record["of_bound"] == pytest.approx(shown["fraction_of_bound"], rel=1e-4)
        assert record["nccl_algorithm"] == shown["nccl_best"]["algorithm"]
        assert (record["native"] == "true") == shown["native"]


def test_summary_line_gives_each_span_and_where_nccl_turns_to_the_switch() -> None:
    records = [
        _record("dgx-h100", 1, "allreduce", 2**16, 2.85, nccl_algorithm="ring-8ch-1p"),
        _record("dgx-h100", 1, "allreduce", 2**22, 1.12, nccl_algorithm="nccl-nvls"),
        _record("dgx-h100", 1, "allreduce", 2**30, 1.2, nccl_algorithm="nccl-nvls"),
        _record("dgx-h100", 1, "allgather", 2**30, 0.5, nccl_algorithm="nccl-nvls"),
        _record("dgx-h100", 2, "allreduce", 2**16, 1.0, nccl_algorithm="nccl-nvls-tree"),
    ]
    line = bench_summary.nccl_line(records)
    assert "DGX-H100 x1 1.12-2.85x (NVLS from 4MiB); DGX-H100 x2 1.00x (" in line
    assert "on NVSwitch machines, 64KiB-1GiB," in line


def test_a_multi_machine_miss_names_the_nic_cut_and_the_sizes_left_to_nvls_tree() -> None:
    records = [
        _record("dgx-h100", 2, "allreduce", 2**26, 1.1, of_bound=0.8),
        _record("dgx-h100", 2, "allreduce", 2**30, 1.0, of_bound=0.68, native="true", nccl_algorithm="nccl-nvls-tree"),
    ]
    text = bench_nccl.missed_targets(records)
    # DGX-H100's eight 50 GB/s NICs (topologies/dgx-h100.json) are below a GPU's 370.8 + 50 GB/s out
    assert "reaches 0.680 of the in-network bound at 1GiB (target 0.90): the NICs set it there" in text
    assert "(node 0 (8 GPUs): 400 GB/s out)" in text
    assert "1 of these 2 sizes from 64 MiB are native bands, left to NCCL's nccl-nvls-tree" in text
    assert "dgx-h100 x2 allreduce 1 of 2 (nccl-nvls-tree)" in text


def test_a_band_running_below_its_crossover_with_nccl_is_named_with_where_it_wins() -> None:
    records = [
        _record("dgx-h100", 8, "allreduce", 2**26, 1.0, native="true", band=0, nccl_algorithm="nccl-nvls-tree"),
        _record("dgx-h100", 8, "allreduce", 2**27, 0.988, band=1, nccl_algorithm="nccl-nvls-tree"),
        _record("dgx-h100", 8, "allreduce", 2**28, 1.028, band=1, nccl_algorithm="nccl-nvls-tree"),
    ]
    text = bench_nccl.missed_targets(records)
    assert "below NCCL's best at 128MiB (0.988x against nccl-nvls-tree): band 1 (a) runs 128MiB" in text
    assert "beats NCCL only at 256MiB" in text and "as the library does at 64MiB, would make them 1.00x" in text


def test_band_rows_give_schedule_spans_their_least_and_median_ratio_and_native_spans() -> None:
    records = [
        _record("ndv2", 8, "allreduce", 2**20, 1.0, native="true"),
        _record("ndv2", 8, "allreduce", 2**22, 1.4),
        _record("ndv2", 8, "allreduce", 2**21, 1.2),
        _record("ndv2", 8, "allreduce", 2**23, 1.0, native="true"),
        _record("ndv2", 8, "allreduce", 2**24, 0.9),
    ]
    (row,) = bench_nccl.band_rows(records)
    # sizes are put in order first; of three ratios the median is the middle one
    assert row == ("ndv2", 8, "allreduce", "2MiB-4MiB, 16MiB", "0.900 / 1.200", "1MiB, 8MiB")


def test_algorithms_option_reads_a_built_library_as_taccl_simulate_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = tmp_path / "libs"
    build = ["build", "--designs-only", "--topologies", "ndv2", "--nodes", "2", "--collectives", "allgather"]
    assert taccl_main([*build, "--sizes", "1MiB,64MiB", "-o", str(built)]) == 0
    library = built / "ndv2" / "n2" / "allgather.library.json"
    capsys.readouterr()
    rows = tmp_path / "rows.csv"
    assert bench_nccl.main(["--algorithms", str(built), "--sizes", "1MiB-64MiB", "--csv", str(rows)]) == 0
    printed = capsys.readouterr().out
    records = read_csv(rows)
    # a range doubles: every power of two, across the band edge at 8 MiB (between the built sizes)
    assert [(r["machine"], r["nodes"], r["size_bytes"]) for r in records] == [("ndv2", 2, 2**k) for k in range(20, 27)]
    sizes = ",".join(r["size"] for r in records)
    argv = ["simulate", str(library), "--topology", "ndv2", "--nodes", "2", "--sizes", sizes, "--json"]
    assert taccl_main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [s["size_bytes"] for s in shown] == [r["size_bytes"] for r in records]
    for record, size in zip(records, shown):
        assert record["time_us"] == pytest.approx(size["time_us"], rel=1e-4)
        assert record["vs_nccl"] == pytest.approx(size["vs_nccl"], rel=1e-4)
        assert (record["native"] == "true") == size["native"]
    (row,) = bench_nccl.band_rows(records)
    assert "| ndv2 | 2 | allgather | " + " | ".join(row[3:]) + " |" in printed


def test_algorithms_option_refuses_a_missing_folder_and_csv_without_it(tmp_path: Path) -> None:
    for argv in (["--algorithms", str(tmp_path / "none")], ["--csv", str(tmp_path / "rows.csv"), "--no-write"]):
        with pytest.raises(SystemExit) as raised:
            bench_nccl.main(argv)
        assert raised.value.code == 2
    assert not (tmp_path / "rows.csv").exists()
