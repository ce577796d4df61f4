"""Exports leave to NCCL the sizes where NCCL's own algorithm is modelled faster (issue 45, points 3 and 6)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from taccl_py.baselines.nccl import NcclChoice, nccl_best_times
from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.msccl import generate_library_xml, parse_msccl_xml, write_library_xml
from taccl_py.msccl.selection import MscclCall, exported_fallback, power_of_two_sizes, select_file
from taccl_py.simulate import simulate
from taccl_py.simulate.leave_to_nccl import (
    KEEP_RATIO,
    SizeRange,
    compare_with_nccl,
    library_probe_sizes,
    probe_sizes,
)
from taccl_py.simulate.protocol import PROTOCOL_COST_TABLES
from taccl_py.topology import load_topology

from helpers import FIXTURES

MiB, GiB = 2**20, 2**30
DONE_SIZES = power_of_two_sizes(MiB, GiB)
DONE_COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)


# NDv2's AllGather library as shipped before its bands left NCCL's 6-ring sizes to NCCL (issue 47): its
# bands 2 and 3 lose to that ring, which is what the export's own comparison must find.
NDV2_ALLGATHER = FIXTURES / "libraries" / "ndv2-n1-allgather-before-native" / "allgather.library.json"


def _ndv2_allgather():
    return read_library(NDV2_ALLGATHER)


def test_probe_sizes_are_the_powers_of_two_inside_a_band_or_its_middle():
    assert probe_sizes(128_000, 8_192_000) == tuple(2**k for k in range(17, 23))
    assert probe_sizes(0, 4096) == (1024, 2048)  # from 1 KiB: smaller sizes follow its verdict
    assert probe_sizes(5000, 6000) == (math.isqrt(5000 * 6000),)
    assert probe_sizes(2**31 + 1, None) == (2**32,)
    assert library_probe_sizes([(0, 4096), (4096, 9000)]) == (1024, 2048, 4096, 8192)
    with pytest.raises(ArgumentError):
        probe_sizes(10, 10)


def test_runs_are_cut_at_the_geometric_mean_of_probes_with_different_verdicts():
    library = _ndv2_allgather()
    band = library.bands[2]  # 128 KB - 8192 KB: probes 128 KiB .. 4 MiB
    topology = load_topology("ndv2")
    sizes = probe_sizes(band.min_bytes, band.max_bytes)
    ours = {size: simulate(band.algorithm, topology, size).time_us for size in sizes}
    # NCCL 2% faster at 512 KiB and 1 MiB, 0.5% faster (kept: within 1%) elsewhere
    slower = {512 * 1024, MiB}
    times = {s: NcclChoice(s, "fake", ours[s] * (0.98 if s in slower else 0.995)) for s in sizes}
    verdict = compare_with_nccl(band.algorithm, band.min_bytes, band.max_bytes, topology, times)
    assert [probe.kept for probe in verdict.probes] == [s not in slower for s in sizes]
    assert verdict.kept == (
        SizeRange(128_000, math.isqrt(256 * 1024 * 512 * 1024)),
        SizeRange(math.isqrt(MiB * 2 * MiB), 8_192_000),
    )
    (left,) = verdict.left
    assert left.sizes == SizeRange(math.isqrt(256 * 1024 * 512 * 1024), math.isqrt(MiB * 2 * MiB))
    assert left.reason == "nccl fake modelled 1.02x faster at 512KiB-1MiB"
    assert all(abs(p.speed_ratio - times[p.size_bytes].time_us / ours[p.size_bytes]) < 1e-12 for p in verdict.probes)
    with pytest.raises(ArgumentError, match="no NCCL time at 128KiB"):
        compare_with_nccl(band.algorithm, band.min_bytes, band.max_bytes, topology, {})


def test_ndv2_export_leaves_the_six_ring_sizes_to_nccl_with_reasons_in_both_placements():
    export = generate_library_xml(_ndv2_allgather(), leave_to_nccl=nccl_best_times)
    names = [name for name, _text in export.files]
    assert not [name for name in names if name.startswith("ndv2-n1-allgather-3")], "NCCL's rings win the last band"
    assert [index for index, _line in export.to_nccl] == [2, 3]
    assert "ring-6ch-1p" in export.to_nccl[1][1] and "8192KB and up left to NCCL" in export.to_nccl[1][1]
    by_name = {key.name: key for key in export.keys}
    assert by_name["ndv2-n1-allgather-2"].max_bytes == by_name["ndv2-n1-allgather-2-inplace"].max_bytes
    assert by_name["ndv2-n1-allgather-2"].max_bytes < 8_192_000 - 1
    call = MscclCall(Collective.ALLGATHER, 8, 16 * MiB, 2, inplace=True)
    assert select_file(export.keys, call).chosen is None
    assert "ring-6ch-1p" in exported_fallback(export.fallbacks, call).reason
    # without the comparison every band keeps every size
    whole = generate_library_xml(_ndv2_allgather())
    assert "ndv2-n1-allgather-3.xml" in dict(whole.files) and not whole.fallbacks


def test_a_band_split_in_two_gets_part_files_that_a_later_export_replaces(tmp_path, monkeypatch):
    import taccl_py.msccl.library as msccl_library
    from taccl_py.simulate.leave_to_nccl import LeftToNccl, NcclVerdict

    def split(algorithm, min_bytes, max_bytes, *_args, **_kwargs):
        if max_bytes is not None:
            return NcclVerdict((), (SizeRange(min_bytes, max_bytes),), ())
        middle = SizeRange(64 * MiB, 256 * MiB)
        return NcclVerdict(
            (),
            (SizeRange(min_bytes, middle.min_bytes), SizeRange(middle.max_bytes, None)),
            (LeftToNccl(middle, "why"),),
        )

    monkeypatch.setattr(msccl_library, "compare_with_nccl", split)
    export = write_library_xml(_ndv2_allgather(), tmp_path, replace_earlier=True, leave_to_nccl=nccl_best_times)
    written = sorted(path.name for path in tmp_path.iterdir())
    assert "ndv2-n1-allgather-3-part2.xml" in written and "ndv2-n1-allgather-3-part2-inplace.xml" in written
    texts = dict(export.files)
    for name in ("ndv2-n1-allgather-3-part2.xml", "ndv2-n1-allgather-3-part2-inplace.xml"):
        algorithm = parse_msccl_xml(texts[name], name)
        assert (algorithm.min_bytes, algorithm.max_bytes) == (256 * MiB, None)
        assert algorithm.name == name.removesuffix(".xml")
    first = parse_msccl_xml(texts["ndv2-n1-allgather-3.xml"], "x")
    assert (first.min_bytes, first.max_bytes) == (8_192_000, 64 * MiB)
    assert export.fallbacks[-1].reason == "why"
    monkeypatch.undo()
    again = write_library_xml(_ndv2_allgather(), tmp_path, replace_earlier=True)
    assert "ndv2-n1-allgather-3-part2.xml" in again.removed
    assert not [path for path in tmp_path.iterdir() if "-part" in path.name]


def test_check_selection_names_the_reason_the_export_left_a_size_to_nccl(tmp_path, capsys):
    out = tmp_path / "xml"
    source = str(NDV2_ALLGATHER)
    assert main(["export-msccl", source, "-o", str(out), "--check-selection", "1MiB-64MiB"]) == 0
    captured = capsys.readouterr()
    assert "ndv2-n1-allgather-3: sizes 8192KB and up left to NCCL: nccl ring-6ch-1p modelled" in captured.err
    rows = [" ".join(line.split()) for line in captured.out.splitlines() if line.startswith("allgather")]
    assert rows[-1].startswith("allgather 8 out of place fp32 8MiB-64MiB NCCL (left to NCCL: nccl ring-6ch-1p modelled")
    assert "allgather 8 out of place fp32 1MiB ndv2-n1-allgather-2.xml" in rows


def test_check_selection_keeps_the_reason_of_other_fallbacks():
    from taccl_py.cli.algo import format_selection
    from taccl_py.msccl.selection import ExportedFallback

    export = generate_library_xml(_ndv2_allgather())
    keys = [key for key in export.keys if not key.name.startswith("ndv2-n1-allgather-3")]
    fallback = ExportedFallback(Collective.ALLGATHER, 8, 32 * MiB, None, "because")
    text = format_selection(keys, power_of_two_sizes(16 * MiB, 64 * MiB), [fallback])
    rows = [" ".join(line.split()) for line in text.splitlines() if line.startswith("allgather")]
    assert [row for row in rows if "fp32" in row and "out of place" in row] == [
        "allgather 8 out of place fp32 16MiB NCCL (no file's size range covers it)",
        "allgather 8 out of place fp32 32MiB-64MiB NCCL (left to NCCL: because)",
    ]


def _done_when(machine: str, nodes: int) -> None:
    """Issue 45 "Done when" 2: the file MSCCL picks (out of place) at 1 MiB-1 GiB is >= 0.99x NCCL's best, or none."""
    topology = load_topology(machine, nodes)
    for path in shipped_library_paths(machine, nodes):
        library = read_library(path)
        if library.collective not in DONE_COLLECTIVES:
            continue
        export = generate_library_xml(library, leave_to_nccl=nccl_best_times)
        nccl = {c.size_bytes: c for c in nccl_best_times(topology, library.collective, DONE_SIZES)}
        texts = dict(export.files)
        costs = PROTOCOL_COST_TABLES["rccl"]  # the portable runtime's table (Simple costs as in every table)
        picked = {
            (chosen, size)
            for dtype_size in (2, 4)
            for size in DONE_SIZES
            if (
                chosen := select_file(
                    export.keys, MscclCall(library.collective, library.num_ranks, size, dtype_size, False)
                ).chosen
            )
        }
        for chosen, size in sorted(picked):
            algorithm = parse_msccl_xml(texts[chosen + ".xml"], chosen)
            ours = simulate(algorithm, topology, size, protocol_costs=costs).time_us
            ratio = nccl[size].time_us / ours
            assert ratio >= KEEP_RATIO, f"{chosen} at {size}: {ratio:.3f}x of {nccl[size].name}"


def test_done_when_ndv2_picked_files_are_never_slower_than_nccl():
    _done_when("ndv2", 1)


@pytest.mark.slow
@pytest.mark.parametrize(("machine", "nodes"), [("ndv2", 2), ("dgx1", 1), ("dgx-h100", 1), ("dgx-a100", 2)])
def test_done_when_picked_files_are_never_slower_than_nccl(machine, nodes):
    _done_when(machine, nodes)


def test_a_library_of_no_built_in_machine_keeps_its_bands_with_a_note():
    library = _ndv2_allgather()
    export = generate_library_xml(replace(library, topology="toy"), leave_to_nccl=nccl_best_times)
    assert "'toy' is not a built-in machine" in export.unchecked
    assert not export.fallbacks and len(export.keys) == len(generate_library_xml(library).keys)
