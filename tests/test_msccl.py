"""Tests of taccl_py.msccl (XML export/import) and taccl_py.files."""

from __future__ import annotations

import io
import re
from dataclasses import replace

import pytest

from taccl_py.errors import ArgumentError, FormatError, VerificationError
from taccl_py.files import read_any_algorithm, write_any_algorithm
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.msccl import (
    MAX_CHANNELS,
    MAX_STEPS_PER_THREADBLOCK,
    MAX_THREADBLOCKS_PER_GPU,
    Dialect,
    check_msccl_limits,
    generate_msccl_xml,
    parse_msccl_xml,
    read_msccl_xml,
    write_msccl_xml,
)
from taccl_py.msccl.limits import Runtime, runtime_limits
from taccl_py.verify import verify_algorithm

from helpers import (
    BROKEN_MSCCL_FIXTURES,
    FIXTURES,
    assert_valid_algorithm,
    msccl_fixture_paths,
    ring_algorithm,
    too_many_steps_allgather,
)

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
FIXTURE_IDS = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731


def _steps(text: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in text.splitlines() if "<step " in line]


# -- import of the reference files ------------------------------------------------------------------


@pytest.mark.parametrize("path", msccl_fixture_paths(), ids=FIXTURE_IDS)
def test_reference_files_import_and_round_trip(path) -> None:
    algorithm = read_msccl_xml(str(path))
    assert algorithm.num_ranks == len(algorithm.ranks)
    for dialect in Dialect:
        text = generate_msccl_xml(algorithm, dialect)
        again = parse_msccl_xml(text, "exported")
        assert generate_msccl_xml(again, dialect) == text
        assert verify_algorithm(again).ok == (path.name not in BROKEN_MSCCL_FIXTURES)


def test_reference_step_and_buffer_counts_survive(tmp_path) -> None:
    path = FIXTURES / "msccl/microsoft/allreduce_allpairs_4gpu_1inst_ll.xml"
    original = path.read_text()
    algorithm = read_msccl_xml(str(path))
    assert (algorithm.protocol, algorithm.chunks_per_loop, algorithm.inplace) == ("LL", 16, True)
    assert (algorithm.ranks[0].input_chunks, algorithm.ranks[0].output_chunks, algorithm.ranks[0].scratch_chunks) == (
        16,
        0,
        12,
    )
    exported = generate_msccl_xml(algorithm, "old")
    # same steps, types, counts and published flags as msccl-tools wrote, and the same dependencies
    # (nops order them by threadblock; unused buffer slots may differ)
    keep = ("s", "type", "cnt", "hasdep")
    assert [{k: s[k] for k in keep} for s in _steps(exported)] == [{k: s[k] for k in keep} for s in _steps(original)]
    deps = lambda text: sorted((s["depid"], s["deps"]) for s in _steps(text))  # noqa: E731
    assert deps(exported) == deps(original)


@pytest.mark.parametrize(
    "name, collective, inputs, outputs",
    [
        ("microsoft/allgather_ring_4gpu_1ch_simple.xml", Collective.ALLGATHER, 0, 4),
        ("azure/allreduce_ring_4gpu_simple.xml", Collective.ALLREDUCE, 4, 0),
        ("azure/reducescatter_allpairs_4gpu_ll.xml", Collective.REDUCESCATTER, 16, 0),
    ],
)
def test_inplace_files_map_to_aliased_buffers(name, collective, inputs, outputs) -> None:
    algorithm = read_msccl_xml(str(FIXTURES / "msccl" / name))
    assert algorithm.inplace and algorithm.collective is collective
    assert (algorithm.ranks[1].input_chunks, algorithm.ranks[1].output_chunks) == (inputs, outputs)


def test_both_collective_spellings_and_size_band() -> None:
    old = read_msccl_xml(str(FIXTURES / "msccl/microsoft/sccl_reducescatter_dgx1_steps2.xml"))
    rccl = read_msccl_xml(str(FIXTURES / "msccl/rccl/alltoall-8n-0-9kb.xml"))
    assert old.collective is Collective.REDUCESCATTER and (old.min_bytes, old.max_bytes) == (0, None)
    # maxBytes="9216" includes 9216; our max_bytes is the first size past the band
    assert (rccl.min_bytes, rccl.max_bytes, rccl.inplace) == (0, 9217, False)
    new_text, old_text = generate_msccl_xml(old, "new"), generate_msccl_xml(old, Dialect.OLD)
    assert 'coll="reducescatter"' in new_text and 'outofplace="1" minBytes="0" maxBytes="0"' in new_text
    assert 'coll="reduce_scatter"' in old_text and "outofplace" not in old_text and "minBytes" not in old_text
    assert 'maxBytes="9216"' in generate_msccl_xml(rccl)


# -- export of lowered algorithms --------------------------------------------------------------------


@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.value)
def test_lowered_rings_round_trip(collective) -> None:
    algorithm = ring_algorithm(collective, 5)
    text = generate_msccl_xml(algorithm)
    imported = parse_msccl_xml(text)
    assert_valid_algorithm(imported)
    assert generate_msccl_xml(imported) == text
    assert imported.ranks == algorithm.ranks  # rings need no nops and no splitting: the IR is unchanged


def _fan_in() -> Algorithm:
    """Rank 0 receives from three peers on three threadblocks, then copies all three with one step."""
    tbs = [Threadblock(t, (Step(OpType.RECV, dst_buffer=O, dst_offset=t + 1),), recv_peer=t + 1) for t in range(3)]
    tbs.append(
        Threadblock(
            3,
            (
                Step(OpType.COPY, I, 0, O, 0),
                Step(OpType.COPY, O, 0, S, 0, count=4, depends=((2, 0), (0, 0), (1, 0), (0, 0))),
            ),
        )
    )
    tbs.append(Threadblock(4, (Step(OpType.NOP, depends=((3, 1),)), Step(OpType.COPY, S, 0, S, 4, count=4))))
    programs = [RankProgram(0, tuple(tbs), 1, 4, 8)]
    for r in (1, 2, 3):
        programs.append(RankProgram(r, (Threadblock(0, (Step(OpType.SEND, I, 0),), send_peer=0),), 1, 4, 0))
    return Algorithm("fanin", Collective.ALLGATHER, 4, 4, tuple(programs))


def test_extra_dependencies_become_nops_and_references_are_remapped() -> None:
    algorithm = _fan_in()
    text = generate_msccl_xml(algorithm)
    gpu0 = text.split('<gpu id="1"')[0]
    tb3 = _steps(gpu0.split('<tb id="3"')[1].split("</tb>")[0])
    assert [(s["type"], s["depid"], s["deps"]) for s in tb3] == [
        ("cpy", "-1", "-1"),
        ("nop", "0", "0"),
        ("nop", "1", "0"),
        ("cpy", "2", "0"),
    ]
    assert [s["hasdep"] for s in tb3] == ["0", "0", "0", "1"]
    tb4 = _steps(gpu0.split('<tb id="4"')[1].split("</tb>")[0])
    assert [(s["type"], s["depid"], s["deps"]) for s in tb4] == [("cpy", "3", "3")]  # the nop folded, index 1 -> 3
    assert all(s["hasdep"] == "1" for s in _steps(gpu0.split('<tb id="3"')[0]))
    imported = parse_msccl_xml(text)
    assert generate_msccl_xml(imported) == text
    report = verify_algorithm(imported)
    assert report.rounds == verify_algorithm(algorithm).rounds


def test_large_counts_are_split_below_the_runtime_limit() -> None:
    n, per_rank = 2, 150
    plan = [Transfer(r, 1 - r, (I, 0), (O, r * per_rank), count=per_rank) for r in range(n)]
    plan += [LocalCopy(r, (I, 0), (O, r * per_rank), count=per_rank) for r in range(n)]
    algorithm = lower_plan("big", Collective.ALLGATHER, n, n * per_rank, plan)
    text = generate_msccl_xml(algorithm)
    counts = [int(s["cnt"]) for s in _steps(text)]
    assert max(counts) < 72 and counts.count(50) == len(counts)
    assert_valid_algorithm(parse_msccl_xml(text))


# check_msccl_limits is what synthesis asks of every routing: it must refuse exactly what the export does
@pytest.mark.parametrize("export", [generate_msccl_xml, check_msccl_limits], ids=["generate", "check"])
def test_limits_raise_naming_rank_and_threadblock(export) -> None:
    many_steps = (Step(OpType.COPY, I, 0, S, 0),) * (MAX_STEPS_PER_THREADBLOCK + 1)
    long_tb = Algorithm("long", Collective.ALLREDUCE, 1, 1, (RankProgram(0, (Threadblock(0, many_steps),), 1, 1, 1),))
    with pytest.raises(ArgumentError, match=r"long: rank 0 tb 0: 65 steps .*expected at most 64 steps per threadblock"):
        export(long_tb)
    tbs = tuple(Threadblock(t, (Step(OpType.COPY, I, 0, O, 0),)) for t in range(MAX_THREADBLOCKS_PER_GPU + 1))
    wide = replace(long_tb, name="wide", ranks=(RankProgram(0, tbs, 1, 1),))
    with pytest.raises(ArgumentError, match=r"wide: rank 0: 65 threadblocks; expected at most 64"):
        export(wide)
    far = replace(long_tb, name="far", ranks=(RankProgram(0, (Threadblock(0, (), channel=MAX_CHANNELS),), 1, 1),))
    with pytest.raises(ArgumentError, match=r"far: rank 0 tb 0: channel 32; expected a channel in 0..31"):
        export(far)
    with pytest.raises(ArgumentError, match="dialect"):
        generate_msccl_xml(ring_algorithm(Collective.ALLGATHER, 2), "newest")
    with pytest.raises(ArgumentError, match="protocol"):
        export(replace(ring_algorithm(Collective.ALLGATHER, 2), protocol="LL64"))
    export(ring_algorithm(Collective.ALLGATHER, 2))  # and passes what the runtimes load


def test_metadata_and_inplace_outofplace_survive() -> None:
    algorithm = ring_algorithm(Collective.ALLGATHER, 3).with_metadata(topology="ndv2--x", note='a "b" <c>')
    text = generate_msccl_xml(algorithm)
    assert text.startswith("<!-- taccl-metadata ") and "--x" not in text.split("-->")[0][4:]
    assert parse_msccl_xml(text).metadata == algorithm.metadata
    both = (
        (FIXTURES / "msccl/azure/allreduce_ring_4gpu_simple.xml")
        .read_text()
        .replace('outofplace="0"', 'outofplace="1"')
    )
    imported = parse_msccl_xml(both)
    assert imported.inplace  # o_chunks=0: only the in-place reading makes sense
    assert 'inplace="1" outofplace="1"' in generate_msccl_xml(imported)


def test_dependency_released_by_a_later_published_step() -> None:
    text = generate_msccl_xml(_fan_in())
    # make tb 0 publish only at a later nop-free step: add a second step to tb 0 carrying hasdep
    moved = text.replace(
        '<step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>',
        '<step s="0" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>\n'
        '      <step s="1" type="cpy" srcbuf="i" srcoff="0" dstbuf="s" dstoff="7" cnt="1" depid="-1" deps="-1" '
        'hasdep="1"/>',
        1,
    )
    assert moved != text
    tb3 = parse_msccl_xml(moved).ranks[0].threadblocks[3]
    assert tb3.steps[1].depends == ((0, 1),)


# -- malformed files: one fixture per class --------------------------------------------------------

MALFORMED = dict(
    [
        ("truncated.xml", r"truncated.xml: line 6, column 7: malformed XML: unclosed token"),
        ("missing_attribute.xml", r"algo/gpu\[0\]/tb\[0\]/step\[1\]@cnt \(line 5\): missing attribute; expected cnt="),
        ("unknown_step_type.xml", r"step\[2\]@type \(line 6\): unknown value 'xchg'; expected one of 's', 'r'"),
        ("unknown_buffer.xml", r"step\[3\]@dstbuf \(line 7\): unknown value 'q'; expected one of 'i', 'o', 's'"),
        ("non_integer.xml", r"step\[1\]@cnt \(line 5\): 'one' is not an integer; expected a decimal integer"),
        ("unknown_collective.xml", r"algo@coll \(line 1\): unknown value 'broadcast'"),
        ("self_peer.xml", r"algo/gpu\[1\]/tb\[0\]@recv \(line 11\): peer 1 is the GPU itself"),
        ("misnumbered_steps.xml", r"step index 4 at position 3"),
        ("missing_gpu.xml", r"algo@ngpus \(line 1\): <gpu> ids \[0, 1, 2\] for 4 GPUs"),
        ("unexpected_element.xml", r"unexpected element <threadblock>; expected <tb> inside <gpu>"),
        ("dangling_dependency.xml", r"@depid \(line 7\): depends on tb 4 step 0, which does not exist"),
        ("unpublished_dependency.xml", r"has hasdep=\"1\", so the runtime would wait forever"),
        ("indivisible_chunks.xml", r"algo@nchunksperloop \(line 1\): 6 chunks do not split over 4 ranks"),
        ("wrong_root.xml", r"root element <algorithm>; expected <algo>"),
    ]
)


@pytest.mark.parametrize("name, message", sorted(MALFORMED.items()))
def test_malformed_xml_names_element_and_line(name, message) -> None:
    with pytest.raises(FormatError, match=message):
        read_msccl_xml(str(FIXTURES / "bad_xml" / name))


def test_huge_gpu_count_is_refused_without_exhausting_memory() -> None:
    text = (FIXTURES / "msccl/microsoft/allgather_ring_4gpu_1ch_simple.xml").read_text()
    text = text.replace('nchunksperloop="4" ngpus="4"', 'nchunksperloop="1000000000000" ngpus="1000000000000"')
    with pytest.raises(FormatError, match=r"<gpu> ids \[0, 1, 2, 3\] for 1000000000000 GPUs"):
        parse_msccl_xml(text, "huge.xml")


def test_every_bad_fixture_is_tested() -> None:
    assert {p.name for p in (FIXTURES / "bad_xml").iterdir()} == set(MALFORMED)


# -- algorithm_io -------------------------------------------------------------------------------------


def test_read_any_algorithm_by_content(tmp_path, monkeypatch) -> None:
    algorithm = ring_algorithm(Collective.REDUCESCATTER, 3)
    (tmp_path / "a.json").write_text(generate_algorithm_json(algorithm))
    (tmp_path / "a.txt").write_text(generate_msccl_xml(algorithm))
    assert read_any_algorithm(tmp_path / "a.json") == algorithm
    assert read_any_algorithm(str(tmp_path / "a.txt")).ranks == algorithm.ranks
    monkeypatch.setattr("sys.stdin", io.StringIO(generate_msccl_xml(algorithm)))
    assert read_any_algorithm("-").name == algorithm.name
    (tmp_path / "bad").write_text("hello")
    with pytest.raises(FormatError, match="invalid JSON"):
        read_any_algorithm(tmp_path / "bad")


def test_write_any_algorithm_picks_format_and_refuses_incorrect(tmp_path) -> None:
    algorithm = ring_algorithm(Collective.ALLREDUCE, 3)
    write_any_algorithm(algorithm, tmp_path / "a.xml", "old")
    write_any_algorithm(algorithm, tmp_path / "a.json")
    assert 'coll="allreduce"' in (tmp_path / "a.xml").read_text()
    assert read_any_algorithm(tmp_path / "a.json") == algorithm
    with pytest.raises(ArgumentError, match="extension"):
        write_any_algorithm(algorithm, tmp_path / "a.yaml")
    with pytest.raises(ArgumentError, match="dialect"):
        write_any_algorithm(algorithm, tmp_path / "b.json", "new")
    broken = read_msccl_xml(str(FIXTURES / "msccl/microsoft/sccl_allreduce_dgx1_composed.xml"))
    with pytest.raises(VerificationError, match="uninitialized read"):
        write_any_algorithm(broken, tmp_path / "broken.xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.xml"]


def test_write_msccl_xml_is_atomic_on_limit_errors(tmp_path) -> None:
    target = tmp_path / "out.xml"
    write_msccl_xml(ring_algorithm(Collective.ALLGATHER, 2), str(target))
    before = target.read_text()
    far = replace(
        ring_algorithm(Collective.ALLGATHER, 2), ranks=(RankProgram(0, (Threadblock(0, (), channel=40),), 1, 2),) * 2
    )
    with pytest.raises(ArgumentError):
        write_msccl_xml(far, str(target))
    assert target.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["out.xml"]


def test_per_channel_and_peer_limits() -> None:
    from taccl_py.msccl.limits import check_gpu_limits

    with pytest.raises(
        ArgumentError, match=r"x: rank 0 channel 0: 33 sending threadblocks; expected at most 32 per channel"
    ):
        check_gpu_limits("x", 0, [(t, t + 1, None, 0, 1) for t in range(33)])
    check_gpu_limits("x", 0, [(t, t + 1, None, t % 2, 1) for t in range(33)])  # spread over two channels: fine
    with pytest.raises(ArgumentError, match=r"x: rank 2 tb 1: peer 2 is the GPU itself"):
        check_gpu_limits("x", 2, [(0, 1, None, 0, 1), (1, None, 2, 0, 1)])


@pytest.mark.parametrize(
    ("runtime", "limit"),
    [
        ("portable", "every MSCCL runtime \\(runtime portable\\)"),
        ("rccl", "runtime rccl"),
        ("msccl-executor-nccl", "runtime msccl-executor-nccl"),
    ],
)
def test_each_runtime_refuses_what_it_cannot_load_and_names_itself(runtime, limit) -> None:
    long = too_many_steps_allgather()  # 80 steps on one threadblock: only microsoft/msccl (256) takes it
    with pytest.raises(ArgumentError, match=f"80 steps .*expected at most 64 steps per threadblock for {limit}"):
        generate_msccl_xml(long, runtime=runtime)
    assert 'coll="allgather"' in generate_msccl_xml(long, "old", runtime="msccl")


def test_threadblocks_per_gpu_differ_by_runtime() -> None:
    tbs = tuple(Threadblock(t, (Step(OpType.COPY, I, 0, O, 0),)) for t in range(MAX_THREADBLOCKS_PER_GPU + 1))
    wide = Algorithm("wide", Collective.ALLREDUCE, 1, 1, (RankProgram(0, tbs, 1, 1),))
    for runtime in ("portable", "rccl"):
        with pytest.raises(
            ArgumentError, match=f"65 threadblocks; expected at most 64 threadblocks per GPU for .*{runtime}"
        ):
            generate_msccl_xml(wide, runtime=runtime)
    for runtime in ("msccl-executor-nccl", "msccl"):  # 1024 (32 per channel x 32 channels) and 216 (2 per A100 SM)
        assert generate_msccl_xml(wide, runtime=runtime).count("<tb ") == 65


def test_runtime_limits_table() -> None:
    table = {r: runtime_limits(r) for r in Runtime}
    assert {r.value: (t.max_steps_per_threadblock, t.max_threadblocks_per_gpu) for r, t in table.items()} == {
        "portable": (64, 64),
        "msccl-executor-nccl": (64, 1024),
        "msccl": (256, 216),
        "rccl": (64, 64),
    }
    assert table[Runtime.MSCCL].dialect is Dialect.OLD and table[Runtime.RCCL].dialect is Dialect.NEW
    for field in ("max_steps_per_threadblock", "max_threadblocks_per_gpu", "max_threadblocks_per_channel"):
        assert getattr(table[Runtime.PORTABLE], field) == min(getattr(t, field) for t in table.values())
    with pytest.raises(ArgumentError, match="runtime: 'nccl'; expected one of portable, msccl-executor-nccl"):
        runtime_limits("nccl")
