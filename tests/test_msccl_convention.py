"""Tests of the send/recv convention of exported MSCCL XML and of taccl_py.msccl.convention (``taccl verify``)."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict

import pytest

from taccl_py.cli import main
from taccl_py.errors import FormatError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.msccl import generate_library_xml, generate_msccl_xml, parse_msccl_xml, read_msccl_xml
from taccl_py.msccl.convention import VIOLATION_KIND, check_send_recv_fields
from taccl_py.verify import verify_algorithm

from helpers import FIXTURES, msccl_fixture_paths, ring_algorithm

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
OLDER_EXPORT = FIXTURES / "msccl_taccl_older/alltoall_direct_4.xml"
SENDS, RECEIVES = {"s", "rcs", "rrs", "rrcs"}, {"r", "rcs", "rrs", "rrc", "rrcs"}
FIELDS = ("srcbuf", "srcoff", "dstbuf", "dstoff")
FIXTURE_IDS = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731


def _steps_by_tb(text: str) -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """Return the non-nop steps of each (gpu, tb) as (type, srcbuf, srcoff, dstbuf, dstoff, cnt), read independently."""
    steps: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for gpu in ET.fromstring(text):
        for tb in gpu:
            steps[(gpu.get("id"), tb.get("id"))] = [
                (step.get("type"), *(step.get(f) for f in FIELDS), step.get("cnt"))
                for step in tb
                if step.get("type") != "nop"
            ]
    return steps


def _pairs(text: str) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Return (send step, receive step) attribute pairs: the k-th on (rank, peer, channel) meets the k-th there."""
    sends, receives = defaultdict(list), defaultdict(list)
    for gpu in ET.fromstring(text):
        for tb in gpu:
            for step in tb:
                if step.get("type") in SENDS:
                    sends[(gpu.get("id"), tb.get("send"), tb.get("chan"))].append(step.attrib)
                if step.get("type") in RECEIVES:
                    receives[(tb.get("recv"), gpu.get("id"), tb.get("chan"))].append(step.attrib)
    assert {k: len(v) for k, v in sends.items()} == {k: len(v) for k, v in receives.items()}
    return [pair for link, keys in sends.items() for pair in zip(keys, receives[link])]


def _four(step: dict[str, str]) -> tuple[str, ...]:
    return tuple(step[f] for f in FIELDS)


def _step_line(text: str, rank: int, tb: int, step: int) -> int:
    """Return the index of the line of ``<step s=step>`` in ``<tb id=tb>`` of ``<gpu id=rank>``."""
    lines = text.splitlines()
    gpu = lines.index(next(line for line in lines if f'<gpu id="{rank}"' in line))
    block = gpu + next(i for i, line in enumerate(lines[gpu:]) if f'<tb id="{tb}"' in line)
    return block + 1 + step


# -- files written by msccl-tools and RCCL ------------------------------------------------------------


@pytest.mark.parametrize("path", msccl_fixture_paths(), ids=FIXTURE_IDS)
def test_reference_files_follow_the_convention(path) -> None:
    assert check_send_recv_fields(path.read_text(), str(path)) == ()


@pytest.mark.parametrize("path", msccl_fixture_paths(), ids=FIXTURE_IDS)
def test_reexport_names_the_slots_msccl_tools_and_rccl_wrote(path) -> None:
    # The import keeps only the local operands; the export must rebuild the peer side exactly as written.
    original = path.read_text()
    dialect = "old" if path.parent.name == "microsoft" else "new"
    assert _steps_by_tb(generate_msccl_xml(read_msccl_xml(str(path)), dialect)) == _steps_by_tb(original)


def test_lowered_plan_names_the_slots_an_msccl_tools_file_of_its_shape_does() -> None:
    # msccl-tools' out-of-place SCCL ring: sends go from i[0] or o[k] to the peer's o[j]. Its send steps
    # list the transfers; lowered by us, each link must carry the same (src, dst) on both sides.
    fixture = (FIXTURES / "msccl/microsoft/sccl_allgather_ring4_steps3.xml").read_text()
    transfers = [
        Transfer(
            int(gpu.get("id")),
            int(tb.get("send")),
            (Buffer(s.get("srcbuf")), int(s.get("srcoff"))),
            (Buffer(s.get("dstbuf")), int(s.get("dstoff"))),
        )
        for gpu in ET.fromstring(fixture)
        for tb in gpu
        for s in tb
        if s.get("type") == "s"
    ]
    plan: list = [LocalCopy(r, (I, 0), (O, r)) for r in range(4)]
    while transfers:  # causal order: a forward after the transfer that brings its chunk
        held = {(t.dst_rank, t.dst) for t in plan if isinstance(t, Transfer)}
        ready = [t for t in transfers if t.src[0] is I or (t.src_rank, t.src) in held]
        assert ready, transfers
        plan += ready
        transfers = [t for t in transfers if t not in ready]
    ours = generate_msccl_xml(lower_plan("ring4", Collective.ALLGATHER, 4, 4, plan))
    assert verify_algorithm(parse_msccl_xml(ours)).ok

    def by_link(text):
        links = defaultdict(list)
        for send, recv in _pairs(text):
            links[(send["type"], recv["type"])].append((_four(send), _four(recv)))
        return {key: sorted(value) for key, value in links.items()}

    assert by_link(ours) == by_link(fixture)
    assert all(sent == received for pairs in by_link(ours).values() for sent, received in pairs)


# -- what we export -------------------------------------------------------------------------------------

SHIPPED = [
    (machine, nodes, collective)
    for machine, nodes in (("ndv2", 1), ("ndv2", 2), ("dgx-a100", 1), ("dgx-h100", 2))
    for collective in ("allgather", "alltoall")
]


@pytest.mark.parametrize("machine, nodes, collective", SHIPPED, ids=["-".join(map(str, s)) for s in SHIPPED])
def test_shipped_bands_name_the_peer_side(machine, nodes, collective) -> None:
    (path,) = [p for p in shipped_library_paths(machine, nodes) if p.name == f"{collective}.library.json"]
    export = generate_library_xml(read_library(path))
    assert export.files and not export.skipped
    for name, text in export.files:
        assert check_send_recv_fields(text, name) == (), name
        pairs = _pairs(text)
        assert pairs and {(s["type"], r["type"]) for s, r in pairs} == {("s", "r")}, name
        # an msccl-tools send/recv pair carries the same four slots on both sides, and the same count
        assert all(_four(s) == _four(r) and s["cnt"] == r["cnt"] for s, r in pairs), name


def test_export_names_the_receivers_destination_and_the_senders_source() -> None:
    text = generate_msccl_xml(ring_algorithm(Collective.ALLTOALL, 3))
    steps = _steps_by_tb(text)
    # rank 0 sends its i[1] into rank 1's o[0]; rank 1 receives rank 0's i[1] into its o[0]
    assert ("s", "i", "1", "o", "0", "1") in steps[("0", "1")]
    assert ("r", "i", "1", "o", "0", "1") in [s for (gpu, _), tb in steps.items() if gpu == "1" for s in tb]
    assert generate_msccl_xml(ring_algorithm(Collective.ALLTOALL, 3)) == text  # deterministic


def _chain(*programs: tuple[Threadblock, ...], chunks: int = 4) -> Algorithm:
    """Return an allreduce-shaped algorithm with the given threadblocks per rank (not a correct schedule)."""
    ranks = tuple(RankProgram(rank, tbs, chunks, chunks, chunks) for rank, tbs in enumerate(programs))
    return Algorithm("chain", Collective.ALLREDUCE, len(programs), chunks, ranks)


def _written(text: str) -> dict[tuple[int, int, int], tuple[str, str, str, str, str]]:
    return {
        (int(gpu.get("id")), int(tb.get("id")), int(step.get("s"))): (step.get("type"), *(step.get(f) for f in FIELDS))
        for gpu in ET.fromstring(text)
        for tb in gpu
        for step in tb
    }


def test_forwarding_steps_name_what_they_forward() -> None:
    # 0 --s i[0]--> 1 (rcs into s[2]) --> 2 (r into o[1]): offsets differ at every hop
    algorithm = _chain(
        (Threadblock(0, (Step(OpType.SEND, I, 0),), send_peer=1),),
        (Threadblock(0, (Step(OpType.RECV_COPY_SEND, dst_buffer=S, dst_offset=2),), send_peer=2, recv_peer=0),),
        (Threadblock(0, (Step(OpType.RECV, dst_buffer=O, dst_offset=1),), recv_peer=1),),
    )
    text = generate_msccl_xml(algorithm)
    assert _written(text) == {
        (0, 0, 0): ("s", "i", "0", "s", "2"),
        (1, 0, 0): ("rcs", "i", "0", "s", "2"),
        (2, 0, 0): ("r", "s", "2", "o", "1"),
    }
    assert check_send_recv_fields(text) == ()
    assert generate_msccl_xml(parse_msccl_xml(text)) == text


def test_a_reduction_chain_names_where_the_sum_lands() -> None:
    # 0 --s i[0]--> 1 (rrs with i[1]) --> 2 (rrs with i[2]) --> 3 (rrcs i[3] into o[2]) --> 0 (r into o[3])
    algorithm = _chain(
        (
            Threadblock(0, (Step(OpType.SEND, I, 0),), send_peer=1),
            Threadblock(1, (Step(OpType.RECV, dst_buffer=O, dst_offset=3),), recv_peer=3),
        ),
        (Threadblock(0, (Step(OpType.RECV_REDUCE_SEND, I, 1),), send_peer=2, recv_peer=0),),
        (Threadblock(0, (Step(OpType.RECV_REDUCE_SEND, I, 2),), send_peer=3, recv_peer=1),),
        (Threadblock(0, (Step(OpType.RECV_REDUCE_COPY_SEND, I, 3, O, 2),), send_peer=0, recv_peer=2),),
    )
    text = generate_msccl_xml(algorithm)
    assert _written(text) == {
        (0, 0, 0): ("s", "i", "0", "o", "2"),
        (0, 1, 0): ("r", "o", "2", "o", "3"),  # the rrcs forwards what it stored
        (1, 0, 0): ("rrs", "i", "1", "o", "2"),
        (2, 0, 0): ("rrs", "i", "2", "o", "2"),
        (3, 0, 0): ("rrcs", "i", "3", "o", "2"),
    }
    assert check_send_recv_fields(text) == ()
    assert generate_msccl_xml(parse_msccl_xml(text)) == text


def test_split_counts_advance_both_sides() -> None:
    plan = [Transfer(r, 1 - r, (I, 0), (O, 150 * r), count=150) for r in range(2)]
    plan += [LocalCopy(r, (I, 0), (O, 150 * r), count=150) for r in range(2)]
    text = generate_msccl_xml(lower_plan("big", Collective.ALLGATHER, 2, 300, plan))
    pairs = [(_four(s), _four(r), s["cnt"]) for s, r in _pairs(text)]
    assert pairs == [(("i", str(o), "o", str(150 * r + o)),) * 2 + ("50",) for r in (0, 1) for o in (0, 50, 100)]
    assert check_send_recv_fields(text) == () and generate_msccl_xml(parse_msccl_xml(text)) == text


def test_unmatched_steps_name_their_own_operand() -> None:
    lonely = _chain(
        (Threadblock(0, (Step(OpType.SEND, I, 1), Step(OpType.RECV_REDUCE_SEND, I, 2)), send_peer=1, recv_peer=1),),
        (Threadblock(0, (), send_peer=0),),
    )
    assert _written(generate_msccl_xml(lonely)) == {
        (0, 0, 0): ("s", "i", "1", "i", "1"),
        (0, 0, 1): ("rrs", "i", "2", "i", "2"),
    }


# -- the check and taccl verify ---------------------------------------------------------------------------


def test_a_tampered_recv_source_is_reported_at_the_receiver() -> None:
    text = generate_msccl_xml(ring_algorithm(Collective.ALLTOALL, 3))
    index = _step_line(text, 1, 1, 0)
    lines = text.splitlines()
    assert 'type="r" srcbuf="i" srcoff="1"' in lines[index]
    lines[index] = lines[index].replace('srcoff="1"', 'srcoff="2"')
    (violation,) = check_send_recv_fields("\n".join(lines), "t.xml")
    assert (violation.kind, violation.rank, violation.threadblock, violation.step) == (VIOLATION_KIND, 1, 1, 0)
    assert violation.message == (
        f"r at line {index + 1} names src i[2] on rank 0, where the matching s (tb 1, step 0) sends from i[1]; "
        "expected i[1] (msccl-tools) or the step's own dst o[0] (older taccl_py)"
    )


def test_verify_fails_on_a_tampered_send_destination(tmp_path, monkeypatch, capsys) -> None:
    text = generate_msccl_xml(ring_algorithm(Collective.ALLGATHER, 4))
    index = _step_line(text, 0, 1, 0)
    lines = text.splitlines()
    assert 'type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0"' in lines[index]
    lines[index] = lines[index].replace('dstoff="0"', 'dstoff="2"')
    path = tmp_path / "ring.xml"
    path.write_text("\n".join(lines) + "\n")
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "FAILED: ring_allgather_4: allgather, 4 ranks: 1 violation",
        f"  {VIOLATION_KIND} (rank 0, tb 1, step 0): s at line {index + 1} names dst o[2] on rank 1, "
        "where the matching r (tb 1, step 0) names dst o[0]; expected o[0]",
    ]
    assert main(["verify", "--json", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and [(v["kind"], v["rank"], v["step"]) for v in report["violations"]] == [
        (VIOLATION_KIND, 0, 0)
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO(path.read_text()))
    assert main(["verify", "-"]) == 1
    assert capsys.readouterr().out.splitlines() == out
    path.write_text(text)
    assert main(["verify", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ring_allgather_4")


def test_older_exports_still_read_and_verify(capsys) -> None:
    text = OLDER_EXPORT.read_text()
    assert re.search(r'type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1"', text)  # the older style
    assert check_send_recv_fields(text, str(OLDER_EXPORT)) == ()
    assert main(["verify", str(OLDER_EXPORT)]) == 0
    assert capsys.readouterr().out.startswith("ok: ring_alltoall_4: alltoall, 4 ranks")
    algorithm = read_msccl_xml(str(OLDER_EXPORT))
    assert verify_algorithm(algorithm).ok
    # written again, it names the peer side
    assert generate_msccl_xml(algorithm) == generate_msccl_xml(ring_algorithm(Collective.ALLTOALL, 4))


def test_the_check_refuses_a_malformed_file() -> None:
    with pytest.raises(FormatError, match=r"bad.xml: .*@cnt \(line 5\): 'one' is not an integer"):
        check_send_recv_fields((FIXTURES / "bad_xml/non_integer.xml").read_text(), "bad.xml")
