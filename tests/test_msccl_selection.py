"""Which exported file an MSCCL runtime selects, and the in-place forms export writes for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taccl_py.cli import main
from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.inplace import BOTH_PLACES_KEY, inplace_variant, serves_both_placements
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library, shipped_library_dir, shipped_library_paths
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.msccl import generate_library_xml, parse_msccl_xml
from taccl_py.msccl.selection import (
    MscclCall,
    SelectionKey,
    loop_divides_powers_of_two,
    power_of_two_sizes,
    select_file,
    selection_key,
    selection_report,
    selects,
    why_not_selected,
)
from taccl_py.verify import verify_algorithm

from helpers import ring_algorithm

MiB = 1 << 20


def _key(name="a", collective=Collective.ALLGATHER, ranks=8, loop=16, low=0, high=0, inplace=False, outofplace=True):
    return SelectionKey(name, collective, ranks, loop, low, high, inplace, outofplace)


def test_the_rule_divides_count_times_the_multiplier_by_the_loop():
    # allgather of 1 MiB in bf16 on 8 ranks: 65536 elements per rank, x8 = 524288, a multiple of 16, never of 48
    call = MscclCall(Collective.ALLGATHER, 8, MiB, 2, inplace=False)
    assert call.count == 65536
    assert selects(_key(loop=16), call) and not selects(_key(loop=48), call)
    assert not loop_divides_powers_of_two(Collective.ALLGATHER, 8, 48)
    assert loop_divides_powers_of_two(Collective.ALLGATHER, 6, 6 * 4), "the multiplier cancels the rank count"
    assert not loop_divides_powers_of_two(Collective.ALLREDUCE, 6, 6)


def test_the_rule_reads_placement_ranks_and_inclusive_edges():
    call = MscclCall(Collective.ALLREDUCE, 8, 4 * MiB, 4, inplace=True)
    assert not selects(_key(collective=Collective.ALLREDUCE, loop=8), call), "an out-of-place file"
    assert selects(_key(collective=Collective.ALLREDUCE, loop=8, inplace=True), call)
    assert not selects(_key(collective=Collective.ALLREDUCE, ranks=16, loop=8, inplace=True), call)
    both_ends = _key(collective=Collective.ALLREDUCE, loop=8, low=4 * MiB, high=4 * MiB, inplace=True)
    assert selects(both_ends, call), "minBytes and maxBytes both include the size"
    assert not selects(replace(both_ends, max_bytes=4 * MiB - 1), call)


def test_a_report_names_the_chosen_file_and_why_nccl_runs_elsewhere():
    keys = [_key("small", high=2 * MiB - 1), _key("large", low=2 * MiB, loop=48)]
    report = selection_report(keys, power_of_two_sizes(MiB, 4 * MiB), {Collective.ALLGATHER: (False, True)})
    chosen = {(s.call.inplace, s.call.dtype_size, s.call.size_bytes): s.chosen for s in report}
    assert chosen[(False, 2, MiB)] == "small" and chosen[(False, 2, 2 * MiB)] is None
    assert chosen[(True, 4, MiB)] is None
    missing = MscclCall(Collective.ALLGATHER, 8, 4 * MiB, 2, inplace=False)
    assert why_not_selected(keys, missing) == "nchunksperloop 48 does not divide the element count"
    assert why_not_selected(keys, replace(missing, inplace=True)) == "no in-place file"
    assert select_file(keys + [_key("copy", low=MiB, high=MiB)], MscclCall(*missing.__dict__.values())).chosen is None
    overlap = select_file([_key("b"), _key("a")], replace(missing, size_bytes=MiB))
    assert overlap.chosen == "a" and overlap.ambiguous


def test_power_of_two_sizes():
    assert power_of_two_sizes(1000, 5000) == (1024, 2048, 4096)
    assert power_of_two_sizes(MiB, MiB) == (MiB,)


def _library(*algorithms, edges=(0, 1000, None)) -> AlgorithmLibrary:
    bands = tuple(
        SizeBand(low, high, algorithm, f"{i}.json")
        for i, (algorithm, low, high) in enumerate(zip(algorithms, edges, edges[1:]))
    )
    return AlgorithmLibrary("toy", 1, algorithms[0].collective, algorithms[0].num_ranks, bands)


@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE])
def test_every_band_exports_an_in_place_form_that_verifies_and_reads_back(collective):
    ring = ring_algorithm(collective, 4)
    export = generate_library_xml(_library(ring, ring))
    for name, text in export.files:
        algorithm = parse_msccl_xml(text, name)
        assert verify_algorithm(algorithm).ok, name
    keys = {key.name: key for key in export.keys}
    # adjacent bands never both match: the first band's maxBytes stops a byte short of the second's minBytes
    assert keys["toy-n1-" + collective.value + "-0"].max_bytes == 999
    sizes = (1000,)
    both = selection_report(list(keys.values()), sizes, {collective: (True, False)}, dtype_sizes=(1,))
    assert all(selection.chosen is not None and not selection.ambiguous for selection in both)


def test_in_place_forms_alias_the_buffers_the_way_msccl_tools_writes_them():
    allgather = inplace_variant(ring_algorithm(Collective.ALLGATHER, 4))
    assert allgather.inplace and {prog.input_chunks for prog in allgather.ranks} == {0}
    steps = [step for prog in allgather.ranks for tb in prog.threadblocks for step in tb.steps]
    assert Buffer.INPUT not in {step.src_buffer for step in steps} | {step.dst_buffer for step in steps}
    allreduce = inplace_variant(ring_algorithm(Collective.ALLREDUCE, 4))
    assert {prog.output_chunks for prog in allreduce.ranks} == {0} and verify_algorithm(allreduce).ok
    assert not serves_both_placements(ring_algorithm(Collective.ALLGATHER, 4), allgather), "its own copy became a nop"


def _reads_its_input_after_writing_the_output() -> object:
    """Return a 2-rank allreduce, right out of place and wrong in place: it sends i[0] after o[0] holds the sum."""
    i0, o0 = (Buffer.INPUT, 0), (Buffer.OUTPUT, 0)
    plan = [
        Transfer(1, 0, i0, (Buffer.SCRATCH, 0)),
        LocalCopy(0, i0, o0),
        LocalCopy(0, (Buffer.SCRATCH, 0), o0, reduce=True),
        Transfer(0, 1, i0, (Buffer.SCRATCH, 0)),
        LocalCopy(1, i0, o0),
        LocalCopy(1, (Buffer.SCRATCH, 0), o0, reduce=True),
    ]
    return lower_plan("late-read", Collective.ALLREDUCE, 2, 1, plan)


def test_an_unsafe_schedule_gets_no_in_place_file_and_a_both_flags_file_of_it_fails_verify(tmp_path, capsys):
    algorithm = _reads_its_input_after_writing_the_output()
    assert verify_algorithm(algorithm).ok and not verify_algorithm(inplace_variant(algorithm)).ok
    export = generate_library_xml(_library(algorithm, edges=(0, None)))
    assert [name for name, _ in export.files] == ["toy-n1-allreduce-0.xml"]
    assert export.notes[0][1].startswith("no in-place file: its in-place form fails: ")
    both = verify_algorithm(algorithm.with_metadata(**{BOTH_PLACES_KEY: "1"}))
    assert not both.ok and both.first.message.startswith("in place: ")
    path = tmp_path / "both.xml"
    path.write_text(export.files[0][1].replace('inplace="0"', 'inplace="1"'))
    assert main(["verify", str(path)]) == 1
    assert "in place: " in capsys.readouterr().out


def test_selection_key_of_a_file_serving_both_placements():
    ring = ring_algorithm(Collective.REDUCESCATTER, 4)
    key = selection_key(replace(ring, min_bytes=8, max_bytes=None).with_metadata(**{BOTH_PLACES_KEY: "1"}))
    assert (key.inplace, key.outofplace, key.min_bytes, key.max_bytes) == (True, True, 8, 0)


def test_check_selection_prints_a_row_per_run_of_sizes_and_a_total(tmp_path, capsys):
    assert main(["export-msccl", "dgx-a100", "-o", str(tmp_path / "xml"), "--check-selection", "1MiB-1GiB"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["collective", "ranks", "placement", "dtype", "sizes", "selected"]
    assert out[-1].startswith("154 of 154 calls select a file (MSCCL's rule, powers of two 1MiB-1GiB)")
    in_place = [line for line in out if line.startswith("allreduce") and " in place " in line]
    assert in_place and all("inplace" in line.split()[-1] for line in in_place)


def test_a_band_msccl_never_selects_gets_no_file_and_one_line_naming_its_sizes(tmp_path, capsys):
    library = tmp_path / "ag.library.json"
    from taccl_py.synth import write_library

    ring = ring_algorithm(Collective.ALLGATHER, 2)
    three = lower_plan(
        "three",
        Collective.ALLGATHER,
        2,
        6,
        [LocalCopy(r, (Buffer.INPUT, i), (Buffer.OUTPUT, 3 * r + i)) for r in (0, 1) for i in range(3)]
        + [Transfer(r, 1 - r, (Buffer.INPUT, i), (Buffer.OUTPUT, 3 * r + i)) for r in (0, 1) for i in range(3)],
    )
    write_library(_library(ring, three, edges=(0, MiB, None)), library)
    assert main(["export-msccl", str(library), "-o", str(tmp_path / "xml"), "--check-selection", "1MiB"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (
        "toy-n1-allgather-1: 6 chunks per loop divide no power-of-two element count, so MSCCL never selects it; "
        "sizes 1MiB and up stay with NCCL"
    )
    assert sorted(path.name for path in (tmp_path / "xml").iterdir()) == [
        "toy-n1-allgather-0-inplace.xml",
        "toy-n1-allgather-0.xml",
    ], "no file for the band MSCCL never selects"
    # the check says why: the export left those sizes to NCCL (issue 45)
    assert "NCCL (left to NCCL: 6 chunks per loop divide no power-of-two element count)" in captured.out


def test_shipped_bands_of_one_machine_all_have_in_place_forms():
    for path in shipped_library_paths("dgx-h100", 1):
        library = read_library(path)
        export = generate_library_xml(library)
        assert not export.notes, export.notes
        if library.collective is not Collective.ALLTOALL:
            # a band with switch steps (NVLink SHARP) has no MSCCL-IR form: it is left to NCCL, and says so
            switched = [i for i, band in enumerate(library.bands) if band.algorithm and band.algorithm.uses_switch]
            assert [index for index, _line in export.to_nccl] == switched
            assert sum(key.inplace for key in export.keys) == len(library.bands) - len(switched)


def test_rccl_tries_ll128_only_on_a_named_gpu_and_writes_what_wins(tmp_path):
    from taccl_py.msccl.protocol import band_protocol_choices

    path = shipped_library_dir() / "mi300x" / "n1" / "allgather.library.json"  # band 0: chunks fit LL128
    library = read_library(path)
    any_gpu = band_protocol_choices(library, "rccl")[0]
    gfx942 = band_protocol_choices(library, "rccl", rccl_gpu_arch="gfx942")
    assert dict(any_gpu.refused)["LL128"].startswith("LL128 is not run by runtime rccl")
    assert gfx942[0].total_us("LL128") is not None and "LL128" not in dict(gfx942[0].refused)
    argv = ["export-msccl", str(path), "--runtime", "rccl", "--rccl-gpu-arch", "gfx942", "-o", str(tmp_path)]
    assert main(argv) == 0
    written = {p.read_text().split('proto="')[1].split('"')[0] for p in tmp_path.iterdir()}
    assert written == {choice.protocol for choice in gfx942 if choice is not None}


def test_a_wait_on_a_dropped_self_copy_keeps_what_the_copy_waited_for():
    from taccl_py.ir.algorithm import Algorithm, OpType, RankProgram, Step, Threadblock

    # rank 0: tb 0 waits for tb 1's receive, then copies its own chunk onto itself twice; tb 2 waits for the
    # second copy. In place both copies vanish, and tb 2 must still wait for the receive.
    copy = Step(OpType.COPY, Buffer.INPUT, 0, Buffer.OUTPUT, 0)
    programs = (
        RankProgram(
            0,
            (
                Threadblock(0, (replace(copy, depends=((1, 0),)), copy)),
                Threadblock(1, (Step(OpType.RECV, dst_buffer=Buffer.OUTPUT, dst_offset=1),), recv_peer=1),
                Threadblock(2, (Step(OpType.SEND, Buffer.OUTPUT, 1, depends=((0, 1),)),), send_peer=1),
            ),
            1,
            2,
        ),
    )
    algorithm = Algorithm("waits", Collective.ALLGATHER, 2, 2, programs)
    variant = inplace_variant(algorithm)
    (prog,) = variant.ranks
    assert [tb.id for tb in prog.threadblocks] == [1, 2]
    assert prog.threadblocks[1].steps[0].depends == ((1, 0),)


def test_export_into_an_earlier_export_removes_its_stale_bands_and_the_check_reads_the_whole_folder(tmp_path, capsys):
    from taccl_py.synth import write_library

    ring = ring_algorithm(Collective.ALLGATHER, 2)
    folder = tmp_path / "xml"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    write_library(_library(ring, ring, ring, edges=(0, 1000, MiB, None)), tmp_path / "old" / "ag.library.json")
    assert main(["export-msccl", str(tmp_path / "old" / "ag.library.json"), "-o", str(folder)]) == 0
    (folder / "mine.xml").write_text((folder / "toy-n1-allgather-2.xml").read_text())  # a user's own file
    (folder / "toy-n2-allgather-7.xml").write_text("another node count's file, never ours to remove")
    capsys.readouterr()
    write_library(_library(ring, ring, edges=(0, MiB, None)), tmp_path / "new" / "ag.library.json")
    argv = ["export-msccl", str(tmp_path / "new" / "ag.library.json"), "-o", str(folder), "--check-selection"]
    assert main([*argv, "1KiB-4MiB"]) == 0
    captured = capsys.readouterr()
    assert (
        f"removed 2 files of an earlier export from {folder}: toy-n1-allgather-2-inplace.xml, toy-n1-allgather-2.xml"
    ) in captured.err.splitlines()
    assert sorted(path.name for path in folder.iterdir()) == [
        "mine.xml",
        "toy-n1-allgather-0-inplace.xml",
        "toy-n1-allgather-0.xml",
        "toy-n1-allgather-1-inplace.xml",
        "toy-n1-allgather-1.xml",
        "toy-n2-allgather-7.xml",
    ]
    # the check reads every file MSCCL loads: the user's copy of the old open-ended band overlaps band 1
    assert "warning: toy-n2-allgather-7.xml: line 1, column 1: malformed XML" in captured.err
    assert "mine.xml (also toy-n1-allgather-1.xml)" in captured.out
    ambiguous = int(captured.out.splitlines()[-1].split("; ")[-1].split()[0])
    assert ambiguous == 2 * 3, "1-4 MiB out of place in bf16 and fp32"


def test_export_with_nothing_to_replace_removes_nothing(tmp_path, capsys):
    from taccl_py.synth import write_library

    ring = ring_algorithm(Collective.ALLGATHER, 2)
    write_library(_library(ring, ring), tmp_path / "ag.library.json")
    for _ in range(2):  # the second export overwrites every file of the first
        assert main(["export-msccl", str(tmp_path / "ag.library.json"), "-o", str(tmp_path / "xml")]) == 0
        assert "removed" not in capsys.readouterr().err
    assert len(list((tmp_path / "xml").iterdir())) == 4
