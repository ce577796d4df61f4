"""Writing a size-band library with its provenance, and exporting it as MSCCL XML, band by band."""

from __future__ import annotations

import json
import re

import pytest

from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, Provenance, SizeBand, read_library
from taccl_py.msccl import generate_library_xml, read_msccl_xml, write_library_xml
from taccl_py.synth.bands import write_library

from helpers import ring_algorithm, too_many_steps_allgather


def _toy_library(provenance=None) -> AlgorithmLibrary:
    return AlgorithmLibrary(
        "toy",
        1,
        Collective.ALLGATHER,
        2,
        (
            SizeBand(0, 1000, ring_algorithm(Collective.ALLGATHER, 2), "x.json", 1.5),
            SizeBand(1000, None, too_many_steps_allgather(), "y.json", 2.5),
        ),
        provenance,
    )


PROVENANCE = Provenance(
    "0.1.0",
    "highs (highspy 1.7.2, pulp 3.3.0)",
    (("gap_rel", 0.001), ("threads", 2), ("time_limit_s", 4.0)),
    "auto-toy",
    (1000, 4000),
    timed_out=False,
    command="taccl synthesize -t toy",
)


def test_a_library_is_written_once_per_band_compressed_with_its_provenance(tmp_path):
    write_library(_toy_library(PROVENANCE), tmp_path / "ag.library.json", compress=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ag-0.json.xz", "ag-1.json.xz", "ag.library.json"]
    written = read_library(tmp_path / "ag.library.json")
    assert written.provenance == PROVENANCE
    assert [band.algorithm.name for band in written.bands] == ["ag-0", "ag-1"]
    assert [band.simulated_time_us for band in written.bands] == [1.5, 2.5]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        # each of these crashed the reader (OverflowError, AttributeError) or was read as something else
        (lambda d: d["bands"][0].update(min_bytes=float("inf")), r"bands\[0\]\.min_bytes: inf; expected an integer"),
        (lambda d: d["bands"][0].update(min_bytes="0"), r"bands\[0\]\.min_bytes: '0'; expected an integer"),
        (lambda d: d["bands"][0].update(max_bytes=0), r"bands\[0\]\.max_bytes: 0 out of range"),
        (lambda d: d["bands"][0].update(simulated_time_us="fast"), r"bands\[0\]\.simulated_time_us: 'fast'"),
        (lambda d: d["bands"][0].update(algorithm=3), r"bands\[0\]\.algorithm: 3; expected a file name"),
        (lambda d: d["bands"].__setitem__(1, []), r"bands\[1\]: \[\]; expected a band object"),
        (lambda d: d.update(nodes=True), r"nodes: True; expected an integer >= 1"),
        (lambda d: d.pop("topology"), r"topology: missing; expected a topology name"),
        (lambda d: d["provenance"].update(sizes=[1.5]), r"provenance\.sizes: \[1\.5\]"),
        (lambda d: d["provenance"].update(timed_out="no"), r"provenance\.timed_out: 'no'; expected true, false"),
        (lambda d: d["provenance"].update(solver_options=[]), r"provenance\.solver_options: \[\]"),
    ],
)
def test_a_malformed_library_names_its_field(tmp_path, edit, match):
    path = tmp_path / "ag.library.json"
    write_library(_toy_library(PROVENANCE), path)
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    with pytest.raises(FormatError, match="^" + re.escape(str(path)) + ": " + match):
        read_library(path)


def test_library_xml_fills_the_band_sizes_and_leaves_out_a_band_beyond_msccl_limits(tmp_path):
    library = _toy_library()
    export = write_library_xml(library, tmp_path / "xml")
    assert [name for name, _ in export.files] == ["toy-n1-allgather-0.xml", "toy-n1-allgather-0-inplace.xml"]
    assert [index for index, _ in export.skipped] == [1] and "at most 64 steps" in export.skipped[0][1]
    written = sorted(p.name for p in (tmp_path / "xml").iterdir())
    assert written == ["toy-n1-allgather-0-inplace.xml", "toy-n1-allgather-0.xml"]
    parsed = read_msccl_xml(str(tmp_path / "xml" / "toy-n1-allgather-0.xml"))
    assert (parsed.min_bytes, parsed.max_bytes) == (0, 1000)
    assert 'minBytes="0" maxBytes="999"' in export.files[0][1], "MSCCL's maxBytes is inclusive"
    assert parsed.ranks == library.bands[0].algorithm.ranks


def test_library_xml_in_the_old_dialect_and_a_bad_dialect(tmp_path):
    export = generate_library_xml(_toy_library(), "old")
    assert "minBytes" not in export.files[0][1]
    with pytest.raises(ArgumentError, match="dialect: 'newest'; expected 'new'"):
        generate_library_xml(_toy_library(), "newest")


def _with_native_band() -> AlgorithmLibrary:
    """Return a toy library whose middle band runs the backend's own collective."""
    ring = ring_algorithm(Collective.ALLGATHER, 2)
    bands = (
        SizeBand(0, 1000, ring, "x.json"),
        SizeBand(1000, 5000, None, "native"),
        SizeBand(5000, None, ring, "z.json"),
    )
    return AlgorithmLibrary("toy", 1, Collective.ALLGATHER, 2, bands)


def test_a_native_band_is_written_without_a_file_and_read_back(tmp_path):
    write_library(_with_native_band(), tmp_path / "ag.library.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ag-0.json", "ag-2.json", "ag.library.json"]
    written = read_library(tmp_path / "ag.library.json")
    assert [band.algorithm_file for band in written.bands] == ["ag-0.json", "native", "ag-2.json"]
    assert [band.native for band in written.bands] == [False, True, False]
    assert written.select(999).name == "ag-0" and written.select(1000) is None and written.select(5000).name == "ag-2"


def test_msccl_export_leaves_a_native_band_to_nccl_without_a_warning(tmp_path):
    export = write_library_xml(_with_native_band(), tmp_path / "xml")
    out_of_place = [name for name, _ in export.files if not name.endswith("-inplace.xml")]
    assert out_of_place == ["toy-n1-allgather-0.xml", "toy-n1-allgather-2.xml"]
    assert export.skipped == ()


@pytest.mark.parametrize(
    ("band_file", "fault"),
    [
        ("../../../../etc/passwd", "leaves the library's folder"),
        ("/etc/passwd", "leaves the library's folder"),
        ("sub/../../ag-0.json", "leaves the library's folder"),
        ("C:\\Windows\\win.ini", "leaves the library's folder"),
        ("outside.json", "is a link out of the library's folder"),
        ("gone.json", "no such file in"),
    ],
)
def test_a_band_file_outside_the_library_folder_or_missing_names_the_library(tmp_path, band_file, fault):
    library_dir = tmp_path / "lib"
    path = library_dir / "ag.library.json"
    library_dir.mkdir()
    write_library(_toy_library(PROVENANCE), path)
    (tmp_path / "ag-0.json").write_text((library_dir / "ag-0.json").read_text())  # a readable file one level up
    (library_dir / "outside.json").symlink_to(tmp_path / "ag-0.json")
    document = json.loads(path.read_text())
    document["bands"][0]["algorithm"] = band_file
    path.write_text(json.dumps(document))
    expected = re.escape(f"{path}: bands[0].algorithm: {band_file!r}") + ".*" + re.escape(fault)
    with pytest.raises(FormatError, match="^" + expected):
        read_library(path)
