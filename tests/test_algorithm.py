"""The IR's JSON form: stable round trip and clear errors."""

from __future__ import annotations

import json

import pytest

from taccl_py.errors import FormatError
from taccl_py.ir.algorithm import Algorithm, Buffer, OpType, RankProgram, Step, Threadblock, input_slot, output_slot
from taccl_py.ir.algorithm_json import (
    generate_algorithm_json,
    parse_algorithm_json,
    parse_algorithm_provenance,
    read_algorithm,
    write_algorithm,
)
from taccl_py.ir.collectives import Collective
from taccl_py.ir.provenance import Provenance


def _exchange(collective: Collective = Collective.ALLGATHER, inplace: bool = False) -> Algorithm:
    """Return a 2-rank allgather where each rank sends its input to the other."""
    programs = []
    for rank in range(2):
        peer = 1 - rank
        tbs = (
            Threadblock(0, (Step(OpType.SEND, Buffer.INPUT, 0, None, 0, 1),), send_peer=peer),
            Threadblock(1, (Step(OpType.RECV, None, 0, Buffer.OUTPUT, peer, 1),), recv_peer=peer),
            Threadblock(2, (Step(OpType.COPY, Buffer.INPUT, 0, Buffer.OUTPUT, rank, 1, depends=((0, 0),)),)),
        )
        programs.append(RankProgram(rank, tbs, 1, 2))
    return Algorithm("exchange", collective, 2, 2, tuple(programs), inplace=inplace, metadata=(("topology", "toy"),))


def test_json_round_trip_is_exact_and_stable():
    algorithm = _exchange()
    text = generate_algorithm_json(algorithm)
    assert parse_algorithm_json(text) == algorithm
    assert generate_algorithm_json(parse_algorithm_json(text)) == text
    json.loads(text)  # valid JSON


PROVENANCE = Provenance(
    taccl_py="0.1.0",
    solver="highs (highspy 1.16.0)",
    solver_options=(("gap_rel", 0.001), ("node_limit", 100), ("time_limit_s", 30.0)),
    sketch="auto-ndv2",
    sizes=(1000000,),
    timed_out=False,
    command="taccl synthesize -t ndv2 -c allgather --size 1MB -o a.json",
    execution_model="msccl",
)


def test_provenance_is_written_and_read_back_and_old_files_have_none(tmp_path):
    path = tmp_path / "a.json"
    write_algorithm(_exchange(), str(path), PROVENANCE)
    text = path.read_text()
    assert json.loads(text)["provenance"]["solver_options"]["node_limit"] == 100
    assert read_algorithm(str(path)) == _exchange() and parse_algorithm_provenance(text) == PROVENANCE
    assert generate_algorithm_json(_exchange(), PROVENANCE) == text
    assert parse_algorithm_provenance(generate_algorithm_json(_exchange())) is None


def test_a_malformed_provenance_names_its_field():
    document = json.loads(generate_algorithm_json(_exchange(), PROVENANCE))
    document["provenance"]["sizes"] = ["1MB"]
    with pytest.raises(FormatError, match=r"a\.json: provenance\.sizes: \['1MB'\]; expected a list of sizes in bytes"):
        parse_algorithm_json(json.dumps(document), "a.json")


def test_write_then_read(tmp_path):
    path = tmp_path / "a.json"
    write_algorithm(_exchange(), str(path))
    assert read_algorithm(str(path)) == _exchange()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda obj: obj.pop("collective"), r"collective: missing"),
        (lambda obj: obj.update(collective="gather"), r"collective: unknown value 'gather'"),
        (lambda obj: obj.update(schema="other"), r"schema"),
        (
            lambda obj: obj["ranks"][0]["threadblocks"][0]["steps"][0].update(op="xx"),
            r"steps\[0\]\.op: unknown value 'xx'",
        ),
        (
            lambda obj: obj["ranks"][0]["threadblocks"][0]["steps"][0].update(src=["q", 0]),
            r"steps\[0\]\.src: unknown value 'q'",
        ),
        (lambda obj: obj["ranks"][1].pop("input_chunks"), r"ranks\[1\]\.input_chunks: missing"),
        # each of these got past the reader and crashed later (a fuzzer found them: tests/test_reader_fuzz.py)
        (lambda obj: obj["ranks"][0]["threadblocks"][0]["steps"][0].pop("src"), r"steps\[0\]\.src: missing"),
        (lambda obj: obj["ranks"][0]["threadblocks"][0]["steps"][0].update(depends=None), r"steps\[0\]\.depends"),
        (lambda obj: obj["ranks"][0]["threadblocks"][0].update(send_peer="1"), r"send_peer: '1' has the wrong type"),
        (lambda obj: obj["ranks"][0]["threadblocks"][0].update(send_peer=7), r"send_peer: 7 out of range"),
        (lambda obj: obj["ranks"][0]["threadblocks"][0].update(send_peer=0), r"send_peer: peer 0 is the rank itself"),
        (lambda obj: obj["ranks"][0]["threadblocks"][0].update(channel=-1), r"channel: -1 out of range"),
        (lambda obj: obj["ranks"][0].update(rank=5), r"ranks\[0\]\.rank: 5 out of range"),
        (lambda obj: obj["ranks"].pop(), r"ranks: ranks \[0\] for 2 ranks"),
        (lambda obj: obj["ranks"][0]["threadblocks"][0]["steps"][0].update(count=-1), r"count: -1 out of range"),
        (lambda obj: obj.update(num_ranks=0), r"num_ranks: 0 out of range"),
        (lambda obj: obj.update(num_ranks=10**12, chunks_per_loop=10**12), r"ranks: ranks \[0, 1\] for 10+ ranks"),
        (lambda obj: obj.update(metadata=[]), r"metadata: \[\] has the wrong type"),
        (lambda obj: obj.update(min_bytes=1.5), r"min_bytes: 1.5 has the wrong type"),
        (lambda obj: obj.update(inplace="no"), r"inplace: 'no' has the wrong type"),
    ],
)
def test_malformed_json_names_the_field(mutate, match):
    obj = json.loads(generate_algorithm_json(_exchange()))
    mutate(obj)
    with pytest.raises(FormatError, match=match):
        parse_algorithm_json(json.dumps(obj), "bad.json")


def test_truncated_json_names_file_and_line():
    text = generate_algorithm_json(_exchange())
    with pytest.raises(FormatError, match=r"^bad\.json: line \d+: invalid JSON"):
        parse_algorithm_json(text[: len(text) // 2], "bad.json")


def test_unreadable_file_is_a_format_error(tmp_path):
    with pytest.raises(FormatError, match="cannot read"):
        read_algorithm(str(tmp_path / "missing.json"))


def test_inplace_slots_alias_buffers():
    ag = _exchange(inplace=True)
    assert input_slot(ag, 1, 0) == (Buffer.OUTPUT, 1)
    assert output_slot(ag, 1, 0) == (Buffer.OUTPUT, 0)
    ar = Algorithm("ar", Collective.ALLREDUCE, 2, 2, (), inplace=True)
    assert output_slot(ar, 1, 1) == (Buffer.INPUT, 1)
    rs = Algorithm("rs", Collective.REDUCESCATTER, 2, 4, (), inplace=True)
    assert output_slot(rs, 1, 1) == (Buffer.INPUT, 3)


def test_metadata_merges_sorted():
    algorithm = _exchange().with_metadata(solver="highs", chunks="2")
    assert algorithm.meta("solver") == "highs"
    assert [key for key, _ in algorithm.metadata] == sorted(key for key, _ in algorithm.metadata)
