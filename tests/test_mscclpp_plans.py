"""Reading, writing and verifying MSCCL++ execution plans (taccl_py.mscclpp, issue 33).

The fixtures are MSCCL++'s own test plans (tests/fixtures/README.md); the hostile plans are
those fixtures with one field or op changed, so each test shows the one fault it names.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from taccl_py.errors import FormatError, VerificationError
from taccl_py.mscclpp import (
    check_mscclpp_plan,
    generate_mscclpp_plan_json,
    parse_mscclpp_plan,
    read_mscclpp_plan,
    verify_mscclpp_plan,
)

FIXTURES = Path(__file__).parent / "fixtures" / "mscclpp"
ALL_PLANS = sorted(path.name for path in FIXTURES.glob("*.json"))
# reduce_tbg.json splits a two-chunk copy over a threadblock group, so half of what GPU 0's
# threadblock 0 reads remotely is written by GPU 1's threadblock 1, which never signals it.
RACY_PLANS = {"reduce_tbg.json"}


def _document(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _parse(document: dict):
    return parse_mscclpp_plan(json.dumps(document), "hostile.json")


def _ops(document: dict, gpu: int, tb: int) -> list:
    return document["gpus"][gpu]["threadblocks"][tb]["ops"]


def test_every_fixture_is_listed_in_the_readme():
    readme = (FIXTURES.parent / "README.md").read_text()
    assert len(ALL_PLANS) == 12
    for name in ALL_PLANS:
        assert f"mscclpp/{name}" in readme


@pytest.mark.parametrize("name", ALL_PLANS)
def test_fixture_round_trips(name):
    plan = read_mscclpp_plan(FIXTURES / name)
    text = generate_mscclpp_plan_json(plan)
    assert parse_mscclpp_plan(text, "generated") == plan
    assert generate_mscclpp_plan_json(parse_mscclpp_plan(text)) == text


@pytest.mark.parametrize("name", sorted(set(ALL_PLANS) - RACY_PLANS))
def test_fixture_verifies(name):
    plan = read_mscclpp_plan(FIXTURES / name)
    assert check_mscclpp_plan(plan) == []
    verify_mscclpp_plan(plan, pipeline_iterations=2)


def test_fields_read_as_the_executor_reads_them():
    plan = read_mscclpp_plan(FIXTURES / "allreduce_pipeline.json")
    assert (plan.collective, plan.protocol.value, plan.inplace, plan.reuse_resources) == (
        "allreduce",
        "Simple",
        True,
        True,
    )
    assert plan.buffer_alignment == 16 and plan.max_message_size == 2**64 - 1  # absent: the executor's defaults
    gpu = plan.gpus[2]
    assert (gpu.input_chunks, gpu.output_chunks, gpu.scratch_chunks, gpu.semaphores) == (4, 0, 4, (0, 0, 32))
    pipeline = gpu.threadblocks[1].ops[0]
    assert (pipeline.name.value, pipeline.unit_size, pipeline.num_chunks) == ("pipeline", 524288, 1)
    assert [op.name.value for op in pipeline.ops] == ["sem_acquire", "nop", "glres", "nop", "sem_release"]
    assert gpu.channels[0].buffer.value == "s" and gpu.channels[0].rank_groups[0].ranks == (0, 1, 2, 3)
    packet = read_mscclpp_plan(FIXTURES / "reduce_pack_tbg.json")
    put = packet.gpus[0].threadblocks[0].ops[0]
    assert (put.name.value, put.tbg.tb_id, put.tbg.tbg_size, put.dst[0].buffer_id) == ("ppkt", 0, 2, 0)


def test_racy_fixture_is_refused_naming_the_reader():
    plan = read_mscclpp_plan(FIXTURES / "reduce_tbg.json")
    with pytest.raises(
        VerificationError,
        match=r"race \(rank 0, tb 0, step 7\): gpu 0 tb 0 op 7 \(get\): reads GPU 1 s slice 2 before it is guaranteed",
    ):
        verify_mscclpp_plan(plan)
    kinds = {(v.kind, v.rank, v.threadblock) for v in check_mscclpp_plan(plan)}
    assert kinds == {("race", 0, 0), ("race", 0, 1)}


def _set(path: str, value):
    def change(document: dict) -> None:
        *parents, last = path.split(".")
        target = document
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is _DELETE:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value

    return change


_DELETE = object()
_HOSTILE_FORMATS = [
    ("missing field", _set("gpus.0.input_chunks", _DELETE), r"gpus\[0\]\.input_chunks: missing field"),
    ("wrong type", _set("gpus.0.input_chunks", "16"), r"gpus\[0\]\.input_chunks: '16' is not an integer"),
    ("gpu id", _set("gpus.1.id", 0), r"gpus\[1\]\.id: id 0 at position 1; expected GPUs listed in id order"),
    ("rank", _set("gpus.0.remote_buffers.0.rank", 2), r"remote_buffers\[0\]\.rank: 2 out of range"),
    ("peer", _set("gpus.1.channels.0.connected_to.0", 7), r"channels\[0\]\.connected_to\[0\]: 7 out of range"),
    ("self", _set("gpus.1.channels.0.connected_to.0", 1), r"connected_to: GPU 1 itself; expected other GPUs"),
    ("unknown op", _set("gpus.0.threadblocks.2.ops.3.name", "teleport"), r"ops\[3\]\.name: unknown value 'teleport'"),
    (
        "local index",
        _set("gpus.0.threadblocks.2.ops.3.src_buff.0.index", 16),
        r"src_buff\[0\]\.index: chunks 16\.\.16; expected chunks inside GPU 0's i buffer of 16",
    ),
    (
        "remote index",
        _set("gpus.1.threadblocks.0.ops.3.dst_buff.1.index", 16),
        r"dst_buff\[1\]\.index: chunks 16\.\.16; expected chunks inside GPU 0's i buffer of 16",
    ),
    (
        "op channel",
        _set("gpus.0.threadblocks.0.ops.5.channel_ids", [1]),
        r"ops\[5\]\.channel_ids: memory channel 1; expected one of the threadblock's 1 memory channels",
    ),
    (
        "threadblock channel",
        _set("gpus.0.threadblocks.0.channels.0.channel_ids", [8]),
        r"channels\[0\]\.channel_ids: memory channel 8; expected one of the GPU's 8 memory channels",
    ),
    (
        "remote buffer",
        _set("gpus.0.threadblocks.0.ops.3.src_buff.1.buffer_id", 1),
        r"buffer_id: remote buffer 1; expected one of the threadblock's 1 remote buffers",
    ),
    ("operands", _set("gpus.0.threadblocks.0.ops.3.src_buff", []), r"src_buff: operands none for rres"),
    ("protocol", _set("protocol", "LL128"), r"protocol: unknown value 'LL128'; expected one of LL, Simple"),
    ("collective", _set("collective", "allfoo"), r"collective: unknown value 'allfoo'; expected one of allgather"),
    (
        "size window",
        _set("min_message_size", 4097),
        r"min_message_size: 4097 above max_message_size 4096; expected at most the maximum",
    ),
    ("threads", _set("num_threads_per_block", 10**9), r"num_threads_per_block: 1000000000 out of range; .* 1\.\.1024"),
    ("no gpus", _set("gpus", _DELETE), r"gpus: missing; expected a list of per-GPU programs"),
]


@pytest.mark.parametrize(
    ("change", "message"), [case[1:] for case in _HOSTILE_FORMATS], ids=[c[0] for c in _HOSTILE_FORMATS]
)
def test_hostile_plan_gives_one_clear_error(change, message):
    document = {**_document("allreduce.json"), "max_message_size": 4096}
    change(document)
    with pytest.raises(FormatError, match=message) as caught:
        _parse(document)
    assert str(caught.value).startswith("hostile.json: ") and "\n" not in str(caught.value)


def test_not_json_and_missing_semaphore():
    with pytest.raises(FormatError, match=r"^hostile\.json: line 1: not JSON"):
        parse_mscclpp_plan("{", "hostile.json")
    document = _document("allreduce_pipeline.json")
    _ops(document, 0, 0)[0]["ops"][0]["semaphore_ids"] = [3]
    with pytest.raises(FormatError, match=r"semaphore 3; expected one of the GPU's 3 semaphores"):
        _parse(document)


def test_removed_data_op_is_refused_naming_the_missing_chunk():
    document = _document("allreduce.json")
    del _ops(document, 0, 3)[3]  # GPU 0's rres of chunk 3: neither rank gets the other's part
    with pytest.raises(VerificationError, match=r"wrong result \(rank 0, chunk 3\): GPU 0 output chunk 3 holds "):
        verify_mscclpp_plan(_parse(document))
    chunks = {(v.rank, v.chunk) for v in check_mscclpp_plan(_parse(document))}
    assert chunks == {(0, 3), (1, 3)}


def test_swapped_signal_and_wait_is_a_deadlock_cycle():
    document = _document("allreduce.json")
    for gpu in (0, 1):
        ops = _ops(document, gpu, 0)
        ops[5], ops[6] = ops[6], ops[5]  # both GPUs wait before they signal
    with pytest.raises(VerificationError, match=r"deadlock .*a cycle of waits: .*gpu [01] tb 0 op 5 \(wait\)"):
        verify_mscclpp_plan(_parse(document))


def test_wait_without_signal_is_a_deadlock():
    document = _document("allreduce.json")
    del _ops(document, 1, 4)[5]
    with pytest.raises(VerificationError, match=r"deadlock \(rank 0, tb 4, step 6\): .*meets no signal"):
        verify_mscclpp_plan(_parse(document))


def test_read_before_wait_is_refused_naming_the_op():
    document = _document("reduce.json")
    ops = _ops(document, 0, 0)
    assert ops[4]["name"] == "wait" and ops[6]["name"] == "rres"
    del ops[4]
    with pytest.raises(
        VerificationError, match=r"race \(rank 0, tb 0, step 5\): gpu 0 tb 0 op 5 \(rres\): reads GPU 1"
    ):
        verify_mscclpp_plan(_parse(document))


def test_relaxed_signal_does_not_publish_data():
    document = _document("reduce.json")
    for gpu in (0, 1):
        for op in _ops(document, gpu, 0)[:5]:
            if op["name"] in ("signal", "wait"):
                op["name"] = "rlx" + op["name"]
    problems = check_mscclpp_plan(_parse(document))
    assert problems and problems[0].kind == "race" and "before it is guaranteed written" in problems[0].message


def test_packet_nobody_writes_is_a_deadlock():
    document = _document("allreduce_packet.json")
    ops = _ops(document, 1, 0)
    assert ops[0]["name"] == "ppkt"
    del ops[0]  # GPU 1's packets into GPU 0's scratch chunks 0-1, which GPU 0's respkt waits for
    with pytest.raises(
        VerificationError, match=r"deadlock \(rank 0, tb 0, step 1\): .*reads GPU 0 packet s slice 0, which nothing"
    ):
        verify_mscclpp_plan(_parse(document))


def _port_allgather(signal: dict, wait: dict | None = None) -> dict:
    """Return a 2-GPU allgather: copy in place, a port-channel put to the peer, then ``signal`` and ``wait``."""
    gpus = []
    for rank in (0, 1):
        ops = [
            {
                "name": "copy",
                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                "dst_buff": [{"type": "o", "index": rank, "size": 1}],
            },
            {
                "name": "put",
                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                "dst_buff": [{"buffer_id": 0, "index": rank, "size": 1}],
                "channel_ids": [0],
                "channel_type": "port",
            },
            signal,
            wait or {"name": "wait", "channel_ids": [0], "channel_type": "port"},
            {
                "name": "copy",
                "src_buff": [{"type": "o", "index": 1 - rank, "size": 1}],
                "dst_buff": [{"type": "s", "index": 0, "size": 1}],
            },
        ]
        tb = {
            "id": 0,
            "ops": ops,
            "channels": [{"channel_type": "port", "channel_ids": [0]}, {"channel_type": "memory", "channel_ids": [0]}],
            "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0]}],
        }
        gpus.append(
            {
                "id": rank,
                "input_chunks": 1,
                "output_chunks": 2,
                "scratch_chunks": 1,
                "threadblocks": [tb],
                "channels": [
                    {"channel_type": "port", "connected_to": [1 - rank]},
                    {"channel_type": "memory", "connected_to": [1 - rank]},
                ],
                "remote_buffers": [{"rank": 1 - rank, "type": "o", "access_channel_types": ["port"]}],
            }
        )
    return {"name": "port_allgather", "collective": "allgather", "protocol": "Simple", "inplace": False, "gpus": gpus}


def test_port_put_is_seen_after_a_signal_on_its_channel():
    port_signal = {"name": "signal", "channel_ids": [0], "channel_type": "port"}
    plan = _parse(_port_allgather(port_signal))
    verify_mscclpp_plan(plan)
    assert parse_mscclpp_plan(generate_mscclpp_plan_json(plan)) == plan
    # A signal on another (memory) channel does not wait for the proxy's write.
    memory_signal = {"name": "signal", "channel_ids": [0], "channel_type": "memory"}
    memory_wait = {"name": "wait", "channel_ids": [0], "channel_type": "memory"}
    problems = check_mscclpp_plan(_parse(_port_allgather(memory_signal, memory_wait)))
    assert problems[0].kind == "race" and "op 4 (copy): reads GPU" in problems[0].message


def test_port_put_without_signal_deadlocks_its_peer():
    nop = {"name": "nop"}
    with pytest.raises(VerificationError, match=r"deadlock \(rank [01], tb 0, step 3\): .*meets no signal"):
        verify_mscclpp_plan(_parse(_port_allgather(nop)))


def test_generated_json_keeps_the_dsl_layout():
    document = _document("allreduce_packet.json")
    generated = json.loads(generate_mscclpp_plan_json(_parse(copy.deepcopy(document))))
    assert generated == document


def test_semaphore_without_credit_is_a_deadlock_cycle():
    document = _document("allreduce_pipeline.json")
    document["gpus"][0]["semaphores"][2]["init_value"] = 0  # tb 0 now waits for tb 2, which waits for tb 0
    problems = check_mscclpp_plan(_parse(document))
    assert problems[0].kind == "deadlock" and problems[0].rank == 0
    assert "a cycle of waits" in problems[0].message and "(sem_acquire)" in problems[0].message


def test_layout_and_collective_must_fit():
    document = _document("allreduce.json")
    document["collective"] = "allgather"
    with pytest.raises(
        VerificationError, match=r"layout \(rank 0\): GPU 0 has 16 input and 16 output chunks; allgather"
    ):
        verify_mscclpp_plan(_parse(document))
    document["collective"] = "sendrecv"  # a name MSCCL++'s DSL writes, with no postcondition here
    assert check_mscclpp_plan(_parse(document))[0].kind == "unsupported"
