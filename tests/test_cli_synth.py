"""``taccl synthesize``: TACCL sketches and profiles unchanged, size bands, and clear failures."""

from __future__ import annotations

import itertools
import json

import pytest

from taccl_py import __version__
from taccl_py.cli import main
from taccl_py.ir.algorithm_json import parse_algorithm_provenance, read_algorithm
from taccl_py.ir.library import read_library
from taccl_py.msccl import read_msccl_xml

from helpers import FIXTURES, assert_valid_algorithm, requires_cbc

SKETCHES = FIXTURES / "taccl_sketch"
NDV2_PROFILES = ("topo-ndv2-1KB.json", "topo-ndv2-1MB.json", "topo-ndv2-32KB.json")
DGX2_PROFILES = ("topo-dgx2-1KB.json", "topo-dgx2-1MB.json")


def _pairs() -> list[tuple[str, str]]:
    """Every sketch with every profile of its machine (sk*-dgx2-* with topo-dgx2-*, *ndv2* with topo-ndv2-*)."""
    pairs = []
    for sketch in sorted(p.name for p in SKETCHES.glob("sk*.json")):
        profiles = DGX2_PROFILES if "dgx2" in sketch else NDV2_PROFILES
        pairs.extend((sketch, profile) for profile in profiles)
    return pairs


# Sketches whose one-profile run is --runslow only: sk2-ndv2-n4 is sk2-ndv2-n2's fully-connected relay
# on 4 machines (7 s on 2 cores); the default run keeps sk2-ndv2-n2 and ndv2's 1MB profile elsewhere.
SLOW_SKETCHES = frozenset({"sk2-ndv2-n4.json"})


def _one_profile_each() -> list:
    """Every sketch once, the profiles of its machine taken in turn (each profile at least once)."""
    turns = {"dgx2": itertools.cycle(DGX2_PROFILES), "ndv2": itertools.cycle(NDV2_PROFILES)}
    pairs = [
        (s, next(turns["dgx2" if "dgx2" in s else "ndv2"])) for s in sorted(p.name for p in SKETCHES.glob("sk*.json"))
    ]
    return [pytest.param(*pair, marks=pytest.mark.slow) if pair[0] in SLOW_SKETCHES else pair for pair in pairs]


# Most syntheses here run with --jobs 1: on a 2-core runner the workers only add their start-up (the result
# is the same for every N: tests/test_solver_budgets.py). test_builtin_topology_with_xml keeps the
# default, workers on every core.
def _run(sketch: str, profile: str, tmp_path, collective: str = "allgather") -> None:
    out = tmp_path / "algo.json"
    status = main(
        [
            "synthesize",
            "-t",
            str(SKETCHES / profile),
            "--sketch",
            str(SKETCHES / sketch),
            "-c",
            collective,
            "--size",
            "64KB",
            "--time-limit",
            "0.5",
            "--jobs",
            "1",
            "-o",
            str(out),
        ]
    )
    assert status == 0
    algorithm = read_algorithm(str(out))
    assert_valid_algorithm(algorithm)
    nodes = json.loads((SKETCHES / sketch).read_text())["nnodes"]
    per_node = json.loads((SKETCHES / profile).read_text())["gpus_per_node"]
    assert algorithm.num_ranks == nodes * per_node


@pytest.mark.parametrize("sketch, profile", _one_profile_each())
def test_taccl_sketch_with_its_profile(sketch, profile, tmp_path, capsys):
    _run(sketch, profile, tmp_path)
    out = capsys.readouterr().out
    assert "of bound" in out and "best baseline" in out


@pytest.mark.slow
@pytest.mark.parametrize("sketch, profile", _pairs())
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_every_taccl_sketch_with_every_profile(sketch, profile, collective, tmp_path):
    _run(sketch, profile, tmp_path, collective)


def test_builtin_topology_with_xml(tmp_path, capsys):
    out, xml = tmp_path / "ar.json", tmp_path / "ar.xml"
    assert (
        main(
            [
                "synthesize",
                "-t",
                "ndv2",
                "-c",
                "allreduce",
                "--size",
                "1MB",
                "--time-limit",
                "1",
                "--progress",
                "-o",
                str(out),
                "--xml",
                str(xml),
            ]
        )
        == 0
    )
    assert_valid_algorithm(read_algorithm(str(out)))
    assert read_msccl_xml(str(xml)).num_ranks == 8
    provenance = parse_algorithm_provenance(out.read_text())
    assert (
        provenance.command
        == f"taccl synthesize -t ndv2 -c allreduce --size 1MB --time-limit 1 --progress -o {out} --xml {xml}"
    )
    assert provenance.sizes == (1000000,) and dict(provenance.solver_options)["time_limit_s"] == 1.0
    assert provenance.sketch == "auto-ndv2" and provenance.solver.startswith("highs (highspy ")
    assert provenance.execution_model == "msccl-net" and provenance.taccl_py == __version__
    assert provenance.budget_bound in (None, "node limit", "wall-clock cap")
    captured = capsys.readouterr()
    assert "synthesize: wrote" in captured.err and "[1/" in captured.err, "progress per stage on stderr"
    assert "allreduce on ndv2 (8 GPUs)" in captured.out
    *_, header, _, line, note = captured.out.splitlines()
    assert "of RS+AG bound  vs baseline" in header and "nvls" not in header  # NDv2 has no NVLink SHARP
    assert note.startswith("note: allreduce: the ReduceScatter+AllGather class bound")
    row = line.split()
    # vs baseline compares the chosen algorithm: 1.00x for the baseline itself, else the synthesis's ratio
    assert row[4] == ("1.00x" if row[1] == row[7] else row[6])


def test_one_size_writes_the_baseline_when_it_is_faster(tmp_path, capsys):
    out, xml = tmp_path / "ag.json", tmp_path / "ag.xml"
    argv = ["synthesize", "-t", "pcie-8gpu", "-c", "allgather", "--size", "64MB", "-j", "1", "-o", str(out)]
    argv += ["--xml", str(xml)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    written = read_algorithm(str(out))
    assert_valid_algorithm(written)
    assert written.name == "ring-2ch-1p" and read_msccl_xml(str(xml)).name == "ring-2ch-1p"
    assert (
        "synthesize: note: the synthesized algorithm (2598.0 us) is slower than the baseline ring-2ch-1p "
        "(2368.3 us) at 64MB; writing ring-2ch-1p instead"
    ) in captured.err
    assert parse_algorithm_provenance(out.read_text()).note.endswith("; writing ring-2ch-1p instead")
    header, _, line = captured.out.splitlines()[-3:]
    assert "of bound  vs baseline  synth (us)  synth vs baseline  best baseline  baseline (us)" in header
    row = line.split()
    # the chosen baseline against itself, and the synthesis that lost to it
    assert row[1] == row[7] == "ring-2ch-1p" and row[4] == "1.00x" and row[6] == "0.91x"
    assert row[2] == row[8] and float(row[5]) > float(row[2])


def test_sizes_write_a_library(tmp_path):
    out = tmp_path / "ag.library.json"
    assert (
        main(
            [
                "synthesize",
                "-t",
                "dgx2",
                "-c",
                "allgather",
                "--sizes",
                "1KB,1MB",
                "--time-limit",
                "1",
                "-j",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    library = read_library(out)
    assert library.num_ranks == 16 and library.bands
    assert (
        library.provenance.command
        == f"taccl synthesize -t dgx2 -c allgather --sizes 1KB,1MB --time-limit 1 -j 1 -o {out}"
    )
    assert dict(library.provenance.solver_options)["time_limit_s"] == 1.0 and library.provenance.sizes == (
        1000,
        1000000,
    )
    assert library.provenance.sketch == "auto-dgx2" and library.provenance.solver.startswith("highs (highspy ")
    for band in library.bands:
        assert_valid_algorithm(band.algorithm)
    assert main(["export-msccl", str(out), "-o", str(tmp_path / "xml")]) == 0
    for index, band in enumerate(library.bands):
        xml = read_msccl_xml(str(tmp_path / "xml" / f"dgx2-n1-allgather-{index}.xml"))
        assert (xml.min_bytes, xml.max_bytes or 0) == (band.min_bytes, band.max_bytes or 0)


# two machines (3 s); one machine's cap and this line are test_solver_budgets' smoke test
@pytest.mark.slow
def test_time_limit_reached_says_so(tmp_path, capsys):
    out = tmp_path / "ag.json"
    assert (
        main(
            [
                "synthesize",
                "-t",
                "ndv2",
                "--nodes",
                "2",
                "-c",
                "allgather",
                "--size",
                "1MB",
                "--time-limit",
                "0.01",
                "--jobs",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "the wall-clock cap (0.01 s) stopped a MILP; the result is the best verified schedule" in err
    assert_valid_algorithm(read_algorithm(str(out)))


@requires_cbc
def test_cbc_solver(tmp_path):
    out = tmp_path / "ag.json"
    assert (
        main(
            [
                "synthesize",
                "-t",
                "ndv2",
                "-c",
                "allgather",
                "--size",
                "64KB",
                "--solver",
                "cbc",
                "--time-limit",
                "2",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert_valid_algorithm(read_algorithm(str(out)))


def _fails(argv: list[str], tmp_path, capsys, message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert not [p for p in tmp_path.iterdir() if p.name != "bad.json"], "nothing written on failure"


def test_sketch_for_the_wrong_gpu_count(tmp_path, capsys):
    out = tmp_path / "x.json"
    _fails(
        ["synthesize", "-t", "ndv2", "-c", "allgather", "--sketch", str(SKETCHES / "sk1-dgx2-n2.json"), "-o", str(out)],
        tmp_path,
        capsys,
        "out of range (the topology has 8 GPUs per node)",
    )


def test_sketch_for_the_wrong_node_count(tmp_path, capsys):
    out = tmp_path / "x.json"
    _fails(
        [
            "synthesize",
            "-t",
            "ndv2",
            "--nodes",
            "4",
            "-c",
            "allgather",
            "--sketch",
            str(SKETCHES / "sk1-ndv2-n2.json"),
            "-o",
            str(out),
        ],
        tmp_path,
        capsys,
        "sketch for 2 nodes but the topology has 4",
    )


def test_infeasible_sketch(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"nnodes": 2, "internode_sketch": {"strategy": "relay", "internode_conn": {"0": [1]}, '
        '"gpus_to_sender_rev_map": {"0": [0]}}}'
    )
    _fails(
        ["synthesize", "-t", "ndv2", "-c", "allgather", "--sketch", str(bad), "-o", str(tmp_path / "x.json")],
        tmp_path,
        capsys,
        "infeasible sketch: chunks of rank 1 cannot reach rank 8",
    )


def test_bad_output_extension(tmp_path, capsys):
    _fails(
        ["synthesize", "-t", "ndv2", "-c", "allgather", "-o", str(tmp_path / "x.txt")],
        tmp_path,
        capsys,
        "'.json' (taccl) or '.xml'",
    )


def test_xml_with_sizes(tmp_path, capsys):
    _fails(
        [
            "synthesize",
            "-t",
            "ndv2",
            "-c",
            "allgather",
            "--sizes",
            "1KB,1MB",
            "-o",
            str(tmp_path / "l.json"),
            "--xml",
            str(tmp_path / "l.xml"),
        ],
        tmp_path,
        capsys,
        "--xml with --sizes",
    )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--sizes", "1KB,1MB", "-o", "l.json", "--runtime", "rccl"], "--runtime with --sizes"),
        (["-o", "a.json", "--runtime", "rccl"], "runtime rccl for a JSON output; expected --runtime only with .xml"),
    ],
)
def test_a_runtime_without_xml_output_is_refused_before_any_work(tmp_path, capsys, monkeypatch, extra, fragment):
    monkeypatch.setattr("taccl_py.cli.synth.synthesize", lambda *a, **k: pytest.fail("synthesized"))
    argv = ["synthesize", "-t", "ndv2", "-c", "allgather"] + [str(tmp_path / a) if "." in a else a for a in extra]
    _fails(argv, tmp_path, capsys, fragment)


def test_allreduce_on_dgx_h100_is_ahead_of_nccls_nvls_and_measured_against_the_in_network_bound(tmp_path, capsys):
    """Issue 44: NVLS is among the baselines; the library beats every baseline at 1MB and 64MB."""
    out = tmp_path / "ar.library.json"
    argv = ["synthesize", "-t", "dgx-h100", "-c", "allreduce", "--sizes", "1MB,64MB", "--jobs", "1"]
    assert main([*argv, "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, note = next(line for line in lines if line.startswith("size")), lines[-1]
    assert "of in-network bound  vs baseline" in header
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["1MB"], ["64MB"])}
    nvls_us = 4.06 + 64e6 * 9 / 8 / 308.6e3  # NVLS's α and each GPU's M (1 + 1/8) at 308.6 GB/s
    assert rows["64MB"][7] == "nccl-nvls" and float(rows["64MB"][8]) == pytest.approx(nvls_us, abs=0.01)
    for size, row in rows.items():
        assert float(row[4].rstrip("x")) >= 1.00, size
        bound_us = 0.6 + {"1MB": 1e6, "64MB": 64e6}[size] / 370.8e3  # one port's 370.8 GB/s, α 0.6 µs
        assert float(row[3]) == pytest.approx(bound_us / float(row[2]), abs=1e-3)
    # vs baseline is the baseline's time over the chosen one's; every band is a written schedule, never NVLS
    chosen_us, baseline_us = float(rows["64MB"][2]), float(rows["64MB"][8])
    assert rows["64MB"][4] == f"{baseline_us / chosen_us:.2f}x"
    library = read_library(out)
    assert all(band.algorithm is not None for band in library.bands) and library.bands[-1].algorithm.uses_switch
    assert library.bands[-1].simulated_time_us == pytest.approx(chosen_us, abs=0.01)
    assert note.startswith("note: allreduce: the in-network reduction bound")
    # MSCCL++ runs the switch band: its plan has switch channels and verifies. The band's own plans at all its
    # sizes (rival baselines' plans and NCCL's sizes, 10 s more on 2 cores, are tests/test_cli_mscclpp.py's)
    plans = tmp_path / "plans"
    assert main(["export-mscclpp", str(out), "--no-baselines", "--all-sizes", "-o", str(plans)]) == 0
    switched = [p for p in sorted(plans.iterdir()) if '"channel_type": "switch"' in p.read_text()]
    assert switched and all(main(["verify", str(p)]) == 0 for p in switched)


# 1MB,4MB (3 candidates; the ring is faster at 4MB) in the default run; 1MB,64MB (10 candidates, 20 s on
# 2 cores) with --runslow.
@pytest.mark.parametrize("sizes", ["1MB,4MB", pytest.param("1MB,64MB", marks=pytest.mark.slow)])
def test_a_librarys_vs_baseline_is_what_simulate_prints_for_the_written_band(tmp_path, capsys, sizes):
    # NDv2 AllGather: NCCL's 6-channel ring (48 chunks per loop, which MSCCL never selects) is faster
    # than every band MSCCL can load. The library may not hold it, but its figures are against it.
    out = tmp_path / "ag.library.json"
    argv = ["synthesize", "-t", "ndv2", "-c", "allgather", "--sizes", sizes, "--jobs", "1"]
    assert main([*argv, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines() if line.split()[:1] in [[s] for s in sizes.split(",")]]
    library = read_library(out)
    assert len(rows) == 2 and any(float(row[4].rstrip("x")) < 1 for row in rows), "the ring is faster somewhere"
    for row in rows:
        size = {"1MB": 1_000_000, "4MB": 4_000_000, "64MB": 64_000_000}[row[0]]
        band = next(index for index, band in enumerate(library.bands) if band.covers(size))
        # Where NCCL's own ring beats every band MSCCL loads, the size is left to it (issue 47).
        assert library.bands[band].native == (float(row[4].rstrip("x")) < 1)
        if library.bands[band].native:  # and the note says so
            note = next(
                line for line in captured.err.splitlines() if f"note: at {row[0]} {row[7]} ({row[8]} us)" in line
            )
            assert note.endswith("does not load in the MSCCL runtimes; a library leaves this size to NCCL"), note
            continue
        assert main(["simulate", str(tmp_path / f"ag-{band}.json"), "-t", "ndv2", "--sizes", row[0]]) == 0
        simulated = capsys.readouterr().out.splitlines()[-1].split()
        # size, time, algbw, busbw, of bound, best baseline, baseline (us), speedup
        assert (row[2], row[3], row[7], row[8], row[4]) == (simulated[1], simulated[4], *simulated[5:8])
    assert [row[7] for row in rows] == ["ring-6ch-1p", "ring-6ch-1p"]


# 4 MB (the middle regime's 3 candidates) in the default run; 64 MB (8 candidates, 25 s on 2 cores) with --runslow.
@pytest.mark.parametrize("size", ["4MB", pytest.param("64MB", marks=pytest.mark.slow)])
def test_asking_for_xml_writes_the_fastest_point_to_point_schedule_where_a_switch_schedule_wins(tmp_path, capsys, size):
    """MSCCL XML cannot hold switch steps: the written file is the fastest schedule it can, and a note says why."""
    out, xml = tmp_path / "a.json", tmp_path / "a.xml"
    args = ["synthesize", "-t", "dgx-h100", "-c", "allreduce", "--size", size, "--jobs", "1", "-o", str(out)]
    assert main([*args, "--xml", str(xml)]) == 0
    err = capsys.readouterr().err
    written = read_algorithm(out)
    assert not written.uses_switch and "goes through the switch, which MSCCL XML cannot express" in err
    assert read_msccl_xml(xml).chunks_per_loop == written.chunks_per_loop
    assert main(args) == 0  # without --xml the switch schedule itself is written
    assert read_algorithm(out).uses_switch


def test_the_written_baseline_is_named_when_a_faster_one_cannot_be_written() -> None:
    # DGX-H100 x64 AllReduce at 64 MB: NCCL's NVLS-Tree (369.8 us, modelled) is the fastest baseline,
    # the doubling (405.5 us) the fastest writable one; the note named the first and wrote the second.
    from types import SimpleNamespace

    from taccl_py.cli.synth import choose_written_algorithm

    doubling = SimpleNamespace(name="doubling-2ch-2b-1l", uses_switch=False)
    choice = SimpleNamespace(
        baseline_chosen=True,
        synthesized=SimpleNamespace(time_us=674.24),
        chosen=doubling,
        chosen_result=SimpleNamespace(time_us=405.53),
        baseline_name="nccl-nvls-tree",
        size_bytes=64 * 10**6,
    )
    result = SimpleNamespace(choices=[choice], algorithm=SimpleNamespace(name="c1p2", uses_switch=False))
    written, note = choose_written_algorithm(result)
    assert written is doubling
    assert note == (
        "note: the synthesized algorithm (674.2 us) is slower than the baseline doubling-2ch-2b-1l (405.5 us) "
        "at 64MB; writing doubling-2ch-2b-1l instead"
    )
