"""``taccl simulate`` and ``taccl baseline`` run in-process through ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_simulate import ALPHA_US, BYTES_PER_US, full_mesh

from taccl_py.cli import main
from taccl_py.files import read_any_algorithm
from taccl_py.topology import write_topology

from helpers import assert_valid_algorithm

FIXTURES = Path(__file__).parent / "fixtures"
RING_XML = FIXTURES / "msccl" / "microsoft" / "allgather_ring_4gpu_1ch_simple.xml"


@pytest.fixture
def mesh4(tmp_path):
    path = tmp_path / "mesh4.json"
    write_topology(full_mesh(4), path)
    return path


def test_baseline_writes_a_verified_json_and_xml(tmp_path, capsys):
    out_json, out_xml = tmp_path / "ring.json", tmp_path / "tree.xml"
    assert (
        main(
            ["baseline", "ring", "--topology", "ndv2", "--nodes", "2", "--collective", "allgather", "-o", str(out_json)]
        )
        == 0
    )
    assert (
        main(
            [
                "baseline",
                "tree",
                "-t",
                "ndv2",
                "-c",
                "allreduce",
                "--channels",
                "2",
                "--chunks",
                "3",
                "-o",
                str(out_xml),
            ]
        )
        == 0
    )
    ring, tree = read_any_algorithm(out_json), read_any_algorithm(out_xml)
    assert_valid_algorithm(ring)
    assert_valid_algorithm(tree)
    assert (ring.num_ranks, ring.meta("baseline")) == (16, "ring")
    assert (tree.chunks_per_loop, tree.num_channels) == (6, 2)
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["baseline", "tree", "-t", "ndv2", "-c", "allgather"], "no tree baseline for allgather"),
        (["baseline", "ring", "-t", "ndv2", "-c", "allgather", "--channels", "40"], "40 channels; expected 1..32"),
        (["baseline", "ring", "-t", "no-such-machine", "-c", "allgather"], "no-such-machine"),
    ],
)
def test_baseline_errors_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out.json"
    assert main(argv + ["-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not out.exists()


def test_baseline_bad_extension_exits_2(tmp_path, capsys):
    out = tmp_path / "out.txt"
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allgather", "-o", str(out)]) == 2
    assert "expected '.json' (taccl) or '.xml' (MSCCL-IR)" in capsys.readouterr().err
    assert not out.exists()


def test_simulate_msccl_xml_prints_a_row_per_size(mesh4, capsys):
    assert main(["simulate", str(RING_XML), "--topology", str(mesh4), "--sizes", "4MB,4GB"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("allgather_ring_1channelsperring: allgather, 4 ranks on mesh4")
    assert "best baseline" in out[1] and "speedup" in out[1]
    row = out[3].split()
    assert row[0] == "4MB"
    assert float(row[1]) == pytest.approx(3 * (ALPHA_US + 1e6 / BYTES_PER_US), abs=0.01)  # three ring steps
    assert row[5].startswith(("ring-", "trees-"))  # on a full mesh, packed trees send directly too
    assert "of bound  best baseline" in out[1] and "RS+AG" not in out[1] and "nvls" not in out[1]
    assert len(out) == 5


def test_simulate_json_carries_the_baseline(mesh4, capsys):
    assert main(["simulate", str(RING_XML), "-t", str(mesh4), "--sizes", "1MB", "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["size_bytes"] == 10**6 and record["num_ranks"] == 4
    assert record["fraction_of_bound"] == pytest.approx(record["bound_time_us"] / record["time_us"])
    baseline = record["best_baseline"]
    assert baseline["speedup"] == pytest.approx(baseline["time_us"] / record["time_us"])
    assert record["fraction_of_cut_only_bound"] == pytest.approx(record["cut_only_bound_time_us"] / record["time_us"])
    assert record["cut_only_bound_time_us"] < record["bound_time_us"] and record["nccl_nvls"] is None


def test_simulate_plot_and_no_baselines(mesh4, tmp_path, capsys):
    image = tmp_path / "timeline.png"
    assert (
        main(
            ["simulate", str(RING_XML), "-t", str(mesh4), "--sizes", "1KB-64KB", "--no-baselines", "--plot", str(image)]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert image.read_bytes()[:4] == b"\x89PNG"
    assert "timeline at 64KB" in captured.err
    assert " - " in captured.out.splitlines()[3]  # no baseline column values


def test_simulate_wrong_rank_count_exits_2(capsys, tmp_path):
    image = tmp_path / "t.png"
    assert main(["simulate", str(RING_XML), "--topology", "ndv2", "--plot", str(image)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_ranks: 4 ranks but topology ndv2 has 8 GPUs" in err[0]
    assert not image.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sizes", "1XB"], "cannot read size '1XB'"),
        (["--plot", "out.gif"], "expected '.png' or '.svg'"),
    ],
)
def test_simulate_bad_options_exit_2(mesh4, capsys, extra, message):
    assert main(["simulate", str(RING_XML), "-t", str(mesh4)] + extra) == 2
    assert message in capsys.readouterr().err


def test_simulate_unreadable_file_exits_2(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "missing.json"), "-t", "ndv2"]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("runtime", "chunks", "message"),
    [
        (
            None,
            1,
            "at least 126 steps per threadblock (64 ranks, 1 chunk per channel); expected at most 64 steps "
            "per threadblock for every MSCCL runtime (runtime portable)",
        ),
        (
            "rccl",
            1,
            "at least 126 steps per threadblock (64 ranks, 1 chunk per channel); expected at most 64 steps "
            "per threadblock for runtime rccl",
        ),
        ("msccl-executor-nccl", 1, "expected at most 64 steps per threadblock for runtime msccl-executor-nccl"),
        (
            "msccl",
            4,
            "at least 504 steps per threadblock (64 ranks, 4 chunks per channel); expected at most 256 steps "
            "per threadblock for runtime msccl",
        ),
    ],
)
def test_a_ring_beyond_the_runtime_step_limit_is_refused_before_it_is_built(
    tmp_path, capsys, monkeypatch, runtime, chunks, message
):
    # Issue 14: 8 DGX A100s, all-reduce: the refusal used to come after the ring was built (2 min 41 s with 4 chunks).
    monkeypatch.setattr("taccl_py.cli.baseline.build_baseline", lambda *a, **k: pytest.fail("the ring was built"))
    out = tmp_path / "ring.xml"
    argv = ["baseline", "ring", "-t", "dgx-a100", "--nodes", "8", "-c", "allreduce", "--chunks", str(chunks)]
    assert main(argv + ["-o", str(out)] + ([] if runtime is None else ["--runtime", runtime])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: dgx-a100x8: ring allreduce: ") and message in err[0]
    assert not out.exists()


def test_a_ring_within_the_runtime_limit_is_written_in_its_dialect(tmp_path, capsys):
    out = tmp_path / "ring.xml"
    argv = ["baseline", "ring", "-t", "dgx2", "-c", "reducescatter", "--chunks", "5", "--runtime", "msccl"]
    assert main(argv + ["-o", str(out)]) == 0  # 75 steps per threadblock: too many for all but microsoft/msccl
    assert 'coll="reduce_scatter"' in out.read_text()
    assert_valid_algorithm(read_any_algorithm(str(out)))
    assert main(argv[:-2] + ["-o", str(tmp_path / "portable.xml")]) == 2
    assert "75 steps" in capsys.readouterr().err


def test_a_runtime_for_a_json_output_is_refused(tmp_path, capsys):
    out = tmp_path / "ring.json"
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allgather", "--runtime", "rccl", "-o", str(out)]) == 2
    assert "--runtime: runtime rccl for a JSON output; expected --runtime only with .xml" in capsys.readouterr().err
    assert not out.exists()


def _ring_allreduce(machine: str, folder: Path) -> Path:
    """Write a ring AllReduce for ``machine`` (``taccl baseline``) and return its path."""
    path = folder / f"ring-{machine}.json"
    assert main(["baseline", "ring", "-t", machine, "-c", "allreduce", "-o", str(path)]) == 0
    return path


def test_simulate_allreduce_on_dgx_h100_names_the_class_bound_and_shows_nccls_nvls(tmp_path, capsys):
    ring = _ring_allreduce("dgx-h100", tmp_path)
    argv = ["simulate", str(ring), "-t", "dgx-h100", "--sizes", "1KB,1GB", "--no-baselines"]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[1]
    assert "of RS+AG bound  best baseline" in header
    assert header.split()[-5:] == ["nccl", "nvls", "(us)", "vs", "nvls"]
    small, large = out[3].split(), out[4].split()
    assert small[-2] == "4.06" and small[-1].endswith("x")  # NVLS's α alone at 1 KB, and its time over ours
    assert float(large[-2]) == pytest.approx(4.06 + 1e9 * 9 / 8 / 308.6e3, abs=0.01)
    assert float(large[-1].rstrip("x")) < 1  # a ring moves every byte twice: NVLS wins at 1 GB
    assert out[-1].startswith("note: allreduce: the ReduceScatter+AllGather class bound")
    assert main(argv + ["--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["nccl_nvls"]["algorithm"] for r in records] == ["nvls", "nvls"]
    nvls = records[1]["nccl_nvls"]
    assert nvls["speedup"] == pytest.approx(nvls["time_us"] / records[1]["time_us"])


def test_simulate_allreduce_without_nvls_has_no_nvls_column(tmp_path, capsys):
    ring = _ring_allreduce("dgx-a100", tmp_path)
    capsys.readouterr()
    assert main(["simulate", str(ring), "-t", "dgx-a100", "--sizes", "1MB", "--no-baselines"]) == 0
    out = capsys.readouterr().out
    assert "of RS+AG bound" in out and "nvls" not in out.splitlines()[1]
