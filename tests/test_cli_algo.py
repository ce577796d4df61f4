"""Tests of ``taccl verify``, ``taccl convert`` and ``taccl export-msccl``, in-process through taccl_py.cli.main."""

from __future__ import annotations

import gzip
import io
import json

import pytest

from taccl_py.cli import main
from taccl_py.files import write_any_algorithm
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.algorithm_json import generate_algorithm_json, read_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library, shipped_library_paths
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.msccl import read_msccl_xml
from taccl_py.synth.bands import write_library

from helpers import FIXTURES, ring_algorithm, too_many_steps_allgather

GOOD_XML = FIXTURES / "msccl/microsoft/allgather_ring_4gpu_1ch_simple.xml"
BROKEN_XML = FIXTURES / "msccl/microsoft/sccl_allreduce_dgx1_composed.xml"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def test_verify_ok(capsys) -> None:
    assert main(["verify", str(GOOD_XML)]) == 0
    assert capsys.readouterr().out.strip() == "ok: allgather_ring_1channelsperring: allgather, 4 ranks, 3 rounds"


def test_verify_json_file_from_stdin(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(generate_algorithm_json(ring_algorithm(Collective.ALLREDUCE, 3))))
    assert main(["verify", "-"]) == 0
    assert capsys.readouterr().out.startswith("ok: ring_allreduce_3: allreduce, 3 ranks, ")


def test_verify_incorrect_lists_first_violations(capsys) -> None:
    assert main(["verify", str(BROKEN_XML)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "FAILED: Allreduce(n=8)-DGX1-steps=4: allreduce, 8 ranks: 46 violations"
    assert (
        lines[1] == "  uninitialized read (rank 0, tb 5, step 0, chunk 1): send reads s[1], which nothing wrote before"
    )
    assert len(lines) == 7 and lines[-1] == "  ... and 41 more (--all shows every one)"
    assert main(["verify", "--all", str(BROKEN_XML)]) == 1
    assert len(capsys.readouterr().out.strip().splitlines()) == 47


def test_verify_json_report(capsys) -> None:
    assert main(["verify", "--json", str(BROKEN_XML)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["num_ranks"] == 8
    assert report["violations"][0] == {
        "kind": "uninitialized read",
        "message": "send reads s[1], which nothing wrote before",
        "rank": 0,
        "threadblock": 5,
        "step": 0,
        "chunk": 1,
    }


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("bad_xml/non_integer.xml", "step[1]@cnt (line 5): 'one' is not an integer"),
        ("bad_xml/truncated.xml", "line 6, column 7: malformed XML"),
        ("does/not/exist.xml", "cannot read"),
    ],
)
def test_verify_malformed_exits_2(capsys, name, fragment) -> None:
    assert main(["verify", str(FIXTURES / name)]) == 2
    assert fragment in _error_line(capsys)


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("garbage.xml", "garbage\n", "garbage.xml: line 1, column 1: malformed XML: syntax error"),
        ("empty.xml", "", "empty.xml: line 1, column 1: malformed XML: no element found"),
        ("json_inside.xml", '{"schema": "taccl-algorithm/1"}', "json_inside.xml: line 1, column 1: malformed XML"),
        ("markup_inside.json", "<algo/>", "markup_inside.json: line 1: invalid JSON"),
        ("garbage.xml.gz", "garbage", "garbage.xml.gz: line 1, column 1: malformed XML"),
    ],
)
def test_verify_reads_the_format_the_extension_names(tmp_path, capsys, name, text, fragment) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    assert main(["verify", str(path)]) == 2
    assert fragment in _error_line(capsys)


def test_convert_xml_json_xml(tmp_path, capsys) -> None:
    as_json, as_xml = tmp_path / "ring.json", tmp_path / "ring.xml"
    assert main(["convert", str(GOOD_XML), "-o", str(as_json)]) == 0
    assert main(["convert", str(as_json), "-o", str(as_xml), "--dialect", "old"]) == 0
    assert "wrote" in capsys.readouterr().err
    assert read_algorithm(str(as_json)) == read_msccl_xml(str(GOOD_XML))
    text = as_xml.read_text()
    assert 'inplace="1">' in text and "outofplace" not in text
    assert read_msccl_xml(str(as_xml)).ranks == read_msccl_xml(str(GOOD_XML)).ranks


def test_convert_to_stdout(capsys) -> None:
    assert main(["convert", str(GOOD_XML), "-o", "-", "--dialect", "new"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('<algo name="allgather_ring_1channelsperring"') and 'outofplace="0"' in out


@pytest.mark.parametrize(
    "source, output, fragment",
    [
        (BROKEN_XML, "out.json", "incorrect: uninitialized read (rank 0, tb 5, step 0, chunk 1)"),
        (GOOD_XML, "out.yaml", "extension: '.yaml'"),
        (GOOD_XML, "out.json --dialect old", "dialect old given for a JSON file"),
        (FIXTURES / "bad_xml/unknown_step_type.xml", "out.xml", "unknown value 'xchg'"),
    ],
)
def test_convert_failures_write_nothing(tmp_path, capsys, source, output, fragment) -> None:
    out, *extra = output.split()
    assert main(["convert", str(source), "-o", str(tmp_path / out), *extra]) == 2
    assert fragment in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []


# The default run exports one NDv2's libraries (8 GPUs; some of its bands are left to NCCL whole and not
# written); two machines' (16 GPUs, 22 s on 2 cores; every band written) run with --runslow.
@pytest.mark.parametrize("nodes", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_export_msccl_writes_every_band_of_a_machines_shipped_libraries(tmp_path, capsys, nodes) -> None:
    out = tmp_path / "msccl"
    assert main(["export-msccl", "NDv2", "--nodes", str(nodes), "-o", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    libraries = {lib.collective.value: lib for lib in map(read_library, shipped_library_paths("ndv2", nodes))}
    names = {p.name for p in out.iterdir()}
    bands = {  # a native band has no file: NCCL's own algorithm runs there
        f"ndv2-n{nodes}-{c}-{i}.xml" for c, lib in libraries.items() for i, b in enumerate(lib.bands) if not b.native
    }
    left_to_nccl = {line.split(": ")[0] + ".xml" for line in err if " left to NCCL: " in line}
    out_of_place = bands & names
    assert bands - names <= left_to_nccl, "a band is written unless NCCL is left its sizes"
    assert all(name.endswith("-inplace.xml") for name in names - out_of_place)
    for name in out_of_place - {name for name in out_of_place if "alltoall" in name}:
        in_place = name.replace(".xml", "-inplace.xml")
        assert in_place in names or 'inplace="1" outofplace="1"' in (out / name).read_text(), name
    band = libraries["allreduce"].bands[1]
    parsed = read_msccl_xml(str(out / f"ndv2-n{nodes}-allreduce-1.xml"))
    assert (parsed.collective, parsed.num_ranks, parsed.min_bytes, parsed.max_bytes) == (
        Collective.ALLREDUCE,
        8 * nodes,
        band.min_bytes,
        band.max_bytes,
    )
    assert read_msccl_xml(str(out / f"ndv2-n{nodes}-allreduce-1-inplace.xml")).inplace
    assert err[-1] == f"wrote {len(names)} MSCCL XML files to {out}"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["nosuch"],
            "error: nosuch: no such library file or built-in machine; expected a *.library.json file or one of "
            "dgx-a100",
        ),
        (
            ["ndv2", "--nodes", "3"],
            "error: ndv2: --nodes: no shipped libraries at 3 nodes; expected one of 1, 2, 4 nodes",
        ),
        (
            ["ndv2", "--dialect", "old", "-o", "/no/such/dir/x"],
            "error: /no/such/dir/x: -o: its folder /no/such/dir does not exist",
        ),
    ],
)
def test_export_msccl_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, fragment) -> None:
    argv = ["export-msccl", *args] + ([] if "-o" in args else ["-o", str(tmp_path / "out")])
    assert main(argv) == 2
    assert _error_line(capsys).startswith(fragment)
    assert not (tmp_path / "out").exists()


def _write_toy_library_beyond_msccl_limits(path) -> None:
    """Write a 2-rank allgather library whose second band takes 80 steps per threadblock."""
    bands = (
        SizeBand(0, 1000, ring_algorithm(Collective.ALLGATHER, 2), "x.json"),
        SizeBand(1000, None, too_many_steps_allgather(), "y.json"),
    )
    write_library(AlgorithmLibrary("toy", 1, Collective.ALLGATHER, 2, bands), path)


def test_export_msccl_reports_a_band_beyond_the_msccl_limits_once(tmp_path, capsys) -> None:
    _write_toy_library_beyond_msccl_limits(tmp_path / "ag.library.json")
    assert main(["export-msccl", str(tmp_path / "ag.library.json"), "-o", str(tmp_path / "xml")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1] == f"wrote 2 MSCCL XML files to {tmp_path / 'xml'}"
    assert err[0].startswith(
        "warning: toy n1 allgather band 1 (1KB and up) has no MSCCL XML: toy-n1-allgather-1: rank 0 tb 0: 80 steps"
    )
    written = sorted(p.name for p in (tmp_path / "xml").iterdir())
    assert written == ["toy-n1-allgather-0-inplace.xml", "toy-n1-allgather-0.xml"]


def _long_selectable_allgather() -> Algorithm:
    """Return a correct 2-rank allgather of 128 one-chunk sends per threadblock; its 256-chunk loop MSCCL selects."""
    plan = [Transfer(0, 1, (Buffer.INPUT, i), (Buffer.OUTPUT, i)) for i in range(128)]
    plan += [Transfer(1, 0, (Buffer.INPUT, i), (Buffer.OUTPUT, 128 + i)) for i in range(128)]
    return lower_plan("long", Collective.ALLGATHER, 2, 256, plan)


def test_export_msccl_for_a_runtime_keeps_the_bands_it_can_load_and_says_why_none_is_in_place(tmp_path, capsys) -> None:
    bands = (
        SizeBand(0, 1000, ring_algorithm(Collective.ALLGATHER, 2), "x.json"),
        SizeBand(1000, None, _long_selectable_allgather(), "y.json"),
    )
    write_library(AlgorithmLibrary("toy", 1, Collective.ALLGATHER, 2, bands), tmp_path / "ag.library.json")
    argv = ["export-msccl", str(tmp_path / "ag.library.json"), "-o", str(tmp_path / "xml"), "--runtime", "msccl"]
    assert main(argv) == 0  # 128 steps per threadblock fit microsoft/msccl's 256
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"wrote 2 MSCCL XML files to {tmp_path / 'xml'}",
        "note: no in-place files: the old dialect (microsoft/msccl) names no placement (no outofplace attribute), "
        "so each band gets its out-of-place file only",
    ], "the old dialect names no placement: one file per band, and a line saying so"
    assert read_msccl_xml(str(tmp_path / "xml" / "toy-n1-allgather-1.xml")).num_ranks == 2
    assert "inplace" in (tmp_path / "xml" / "toy-n1-allgather-1.xml").read_text()
    assert "outofplace" not in (tmp_path / "xml" / "toy-n1-allgather-1.xml").read_text(), "msccl reads the old dialect"
    assert main(argv[:-2] + ["--runtime", "rccl", "-o", str(tmp_path / "rccl")]) == 0
    err = capsys.readouterr().err
    assert "included); expected at most 64 steps per threadblock for runtime rccl" in err
    assert "note: no in-place files" not in err, "the new dialect writes in-place files"


def _long_correct_allgather() -> Algorithm:
    """Return a verified 2-rank allgather with 80 one-chunk sends on each rank's sending threadblock."""
    plan = [LocalCopy(r, (Buffer.INPUT, i), (Buffer.OUTPUT, 80 * r + i)) for r in (0, 1) for i in range(80)]
    plan += [Transfer(r, 1 - r, (Buffer.INPUT, i), (Buffer.OUTPUT, 80 * r + i)) for r in (0, 1) for i in range(80)]
    return lower_plan("long", Collective.ALLGATHER, 2, 160, plan)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            ["--runtime", "msccl", "--dialect", "new"],
            "--dialect: dialect new for runtime msccl; expected --dialect old",
        ),
        (["--runtime", "rccl"], "tb 0: 80 steps (dependency nops and split counts included); expected at most 64"),
    ],
)
def test_convert_for_a_runtime_refuses_what_it_cannot_load(tmp_path, capsys, extra, fragment) -> None:
    source = tmp_path / "long.json"
    write_any_algorithm(_long_correct_allgather(), source)
    out = tmp_path / "long.xml"
    assert main(["convert", str(source), "-o", str(out), *extra]) == 2
    assert fragment in _error_line(capsys)
    assert not out.exists()
    assert main(["convert", str(source), "-o", str(out), "--runtime", "msccl"]) == 0
    assert read_msccl_xml(str(out)).num_ranks == 2
