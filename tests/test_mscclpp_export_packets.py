"""LL (packet) MSCCL++ plans: their slots and ops, back-to-back calls with flags, and when export picks LL."""

from __future__ import annotations

import copy
import functools
import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from taccl_py.baselines import ring_algorithm, tree_algorithm
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.files import read_any_algorithm
from taccl_py.ir.algorithm import Algorithm, input_slot, output_slot
from taccl_py.ir.collectives import Collective, expected_output, initial_value
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.mscclpp import parse_mscclpp_plan, verify_mscclpp_plan
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import choose_plan_protocol, generate_library_plans
from taccl_py.mscclpp.simulate import simulate_mscclpp_plan
from taccl_py.simulate import simulate_sizes
from taccl_py.topology import load_topology
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology

from helpers import FIXTURES, run_calls_interleaved
from shipped_bands import shipped_band

PAIR = FIXTURES / "cli_topo" / "pair.json"

# (machine, nodes, schedule): our baselines, and msccl-tools' rings, whose rcs, rrs and rrcs steps ours lack;
# pair.json twice is 4 GPUs on 2 machines, so those steps also send over port channels.
CASES = [(name, nodes, c) for name, nodes in (("ndv2", 1), ("dgx-a100", 2)) for c in ("ring", "tree")]
CASES += [(name, nodes, c) for name, nodes in (("ndv2", 1), ("dgx-a100", 2)) for c in ("allgather", "reducescatter")]
CASES += [("ndv2", 1, "allreduce_ring_8gpu_1ch_ll128.xml"), ("ndv2", 1, "sccl_allgather_dgx1_steps2.xml")]
CASES += [(str(PAIR), 2, "allreduce_ring_4gpu_simple.xml")]
# The ring across two DGX-A100 (16 ranks, 27 s of interleaved calls) runs with --runslow; the default
# run keeps its tree and the cross-machine allgather and reducescatter.
SLOW_CASES = {("dgx-a100", 2, "ring")}
# Which operands of each packet op hold packets: ("src"/"dst", index); None: every one after the first.
_PACKET_OPERANDS = {
    "ppkt": {("dst", 0)},
    "rppkt": {("src", 0), ("dst", 0)},
    "cpkt": {("dst", 0)},
    "upkt": {("src", 0)},
    "repkt": {("src", None)},
    "respkt": {("src", None), ("dst", None)},
    "recpkt": {("src", None), ("dst", 1)},
}


@functools.cache
def _topology(name: str, nodes: int):
    return load_topology(name, nodes=nodes)


def _algorithm(name: str, nodes: int, family: str) -> Algorithm:
    topology = _topology(name, nodes)
    if family.endswith(".xml"):
        return read_any_algorithm(FIXTURES / "msccl" / "microsoft" / family)
    if family == "tree":
        return tree_algorithm(topology, channels=2)
    collective = Collective.ALLREDUCE if family == "ring" else Collective(family)
    return ring_algorithm(topology, collective)


@functools.cache
def _plan(case: tuple[str, int, str]) -> dict:
    name, nodes, family = case
    return generate_mscclpp_plan(_algorithm(name, nodes, family), _topology(name, nodes), protocol="LL")


def _is_packet(op: dict, side: str, index: int) -> bool:
    marks = _PACKET_OPERANDS.get(op["name"], set())
    return (side, index) in marks or (index > 0 and (side, None) in marks)


def _remote(gpu: dict, tb: dict, op: dict, ref: dict) -> dict:
    ids = {r["access_channel_type"]: r["remote_buffer_ids"] for r in tb["remote_buffer_refs"]}
    return gpu["remote_buffers"][ids[op["channel_type"]][ref["buffer_id"]]]


def run_packet_plan(plan: dict, algorithm: Algorithm, seed: int, calls: int = 3) -> None:
    """Run ``calls`` back-to-back calls of an LL plan symbolically in a seeded random interleaving.

    As the executor does: call c carries flag c + 1, a packet read waits for its flag, and scratch
    (plain and packets) is the half of a double buffer chosen by the flag's parity. A GPU starts call
    c + 1 when its call c is done while its peers may lag, so a sender that could overwrite packets
    a slower peer still waits for leaves that peer waiting for ever: a deadlock here.
    """
    plain: dict[tuple, tuple] = {}
    packets: dict[tuple, tuple[int, tuple]] = {}  # (rank, half, index) -> (flag, value)
    semaphores: Counter = Counter()

    def key(rank: int, call: int, ref: dict, i: int) -> tuple:
        half = call % 2 if ref["type"] == "s" else 0
        return (rank, ref["type"], half, ref["index"] + i)

    def start(call: int, rank: int) -> None:
        for index in range(algorithm.layout.input_chunks):
            buffer, offset = input_slot(algorithm, rank, index)
            ref = {"type": buffer.value, "index": offset}
            plain[key(rank, call, ref, 0)] = tuple(pair + (call,) for pair in initial_value(rank, index))

    def finish(call: int, rank: int) -> None:
        for index in range(algorithm.layout.output_chunks):
            buffer, offset = output_slot(algorithm, rank, index)
            expected = tuple(sorted(pair + (call,) for pair in expected_output(algorithm.layout, rank, index)))
            assert plain.get(key(rank, call, {"type": buffer.value, "index": offset}, 0)) == expected, (call, rank)

    def step(call: int, gpu: dict, tb: dict, op: dict) -> bool:
        rank, flag = gpu["id"], call + 1
        if op["name"] == "sem_acquire":
            if any(semaphores[(rank, s)] == 0 for s in op["semaphore_ids"]):
                return False
            for s in op["semaphore_ids"]:
                semaphores[(rank, s)] -= 1
        elif op["name"] == "sem_release":
            for s in op["semaphore_ids"]:
                semaphores[(rank, s)] += 1
        elif op["name"] != "nop":
            assert op["name"] in _PACKET_OPERANDS or op["name"] in ("copy", "re"), op["name"]
            sources = []
            for index, ref in enumerate(op["src_buff"]):
                if _is_packet(op, "src", index):
                    read = [packets.get((rank, call % 2, ref["index"] + i)) for i in range(ref["size"])]
                    if any(p is None or p[0] != flag for p in read):
                        return False  # the flag has not arrived: keep polling
                    sources.append([value for _, value in read])
                else:
                    sources.append([plain.get(key(rank, call, ref, i), ()) for i in range(ref["size"])])
            values = [tuple(sorted(sum(parts, ()))) for parts in zip(*sources)]
            for index, ref in enumerate(op["dst_buff"]):
                owner = _remote(gpu, tb, op, ref)["rank"] if "buffer_id" in ref else rank
                for i, value in enumerate(values):
                    if _is_packet(op, "dst", index):
                        packets[(owner, call % 2, ref["index"] + i)] = (flag, value)
                    else:
                        plain[key(owner, call, ref, i)] = value
        return True

    slow = seed % algorithm.num_ranks  # lags, so that its peers run ahead into its next call
    run_calls_interleaved(plan, calls, random.Random(seed), start, step, finish, slow)
    assert not +semaphores, "releases left unconsumed"


# Seed 1 (a second interleaving, another rank lagging) of the 16-rank cases runs with --runslow.
SEEDED_CASES = [
    pytest.param(
        case,
        seed,
        marks=[pytest.mark.slow] * (case in SLOW_CASES or seed > 0 and case[0] == "dgx-a100"),
        id=f"{Path(case[0]).stem}-n{case[1]}-{case[2]}-{seed}",
    )
    for case in CASES
    for seed in (0, 1)
]


@pytest.mark.parametrize("case, seed", SEEDED_CASES)
def test_packet_plans_verify_and_run_back_to_back(case, seed):
    algorithm, plan = _algorithm(*case), _plan(case)
    assert plan["protocol"] == "LL" and plan["use_double_scratch_buffer"] is True
    names = {op["name"] for gpu in plan["gpus"] for tb in gpu["threadblocks"] for op in tb["ops"]}
    assert not names & {"signal", "wait", "flush", "put", "pwsf"}  # packets carry their own flags
    if seed == 0:  # the plan is the same for every seed
        verify_mscclpp_plan(parse_mscclpp_plan(json.dumps(plan), algorithm.name))
    run_packet_plan(plan, algorithm, seed)


def test_every_step_kind_lowers_to_its_packet_ops():
    names = Counter()
    for plan in map(_plan, CASES):
        names.update(op["name"] for gpu in plan["gpus"] for tb in gpu["threadblocks"] for op in tb["ops"])
    assert set(_PACKET_OPERANDS) <= set(names)


def test_packets_cross_machines_staged_and_forwarded_on_port_channels():
    topology = _topology("dgx-a100", 2)
    plan = generate_mscclpp_plan(ring_algorithm(topology, Collective.ALLGATHER), topology, protocol="LL")
    seen = set()
    for gpu in plan["gpus"]:
        for tb in gpu["threadblocks"]:
            for index, op in enumerate(tb["ops"]):
                if op["name"] not in ("ppkt", "rppkt"):
                    continue
                target = _remote(gpu, tb, op, op["dst_buff"][0])
                assert target["type"] == "s"  # packets land in scratch only
                across = topology.node_of(target["rank"]) != topology.node_of(gpu["id"])
                assert op["channel_type"] == ("port" if across else "memory")
                assert ("channel_ids" in op) == across
                # a port channel copies raw bytes, so what it forwards must already be packets
                assert op["name"] == "rppkt" or not across
                seen.add((op["name"], op["channel_type"]))
                if across and tb["ops"][index - 2]["name"] == "cpkt":
                    assert tb["ops"][index - 2]["dst_buff"][0] == op["src_buff"][0]
    assert {("rppkt", "port"), ("ppkt", "memory")} <= seen


def _offset(chunk: int, chunks: int, size: int) -> int:
    """Return a chunk's byte offset as MSCCL++ cuts a rank's ``size`` bytes (calcOffset, 16-byte units)."""
    units = size // 16
    return 16 * (chunk * (units // chunks) + min(chunk, units % chunks))


@pytest.mark.parametrize("size", [16 * 4 * 3, 16 * 4 * 3 + 16 * 3, 1 << 20])
def test_plain_and_packet_scratch_never_share_a_byte(size):
    plan = _plan(CASES[-1])  # receives, rrs results and port sends: every kind of slot
    for gpu in plan["gpus"]:
        chunks = gpu["input_chunks"]
        plain, packet = [], []  # byte ranges [first, last)
        for tb in gpu["threadblocks"]:
            for op in tb["ops"]:
                for side in ("src", "dst"):
                    for index, ref in enumerate(op.get(f"{side}_buff", ())):
                        if ref.get("type") != "s":
                            continue
                        first, last = (_offset(c, chunks, size) for c in (ref["index"], ref["index"] + ref["size"]))
                        if _is_packet(op, side, index):
                            packet.append((2 * first, 2 * last))
                        else:
                            plain.append((first, last))
        assert plain and packet
        assert max(last for _, last in plain) <= min(first for first, _ in packet), gpu["id"]
        # the executor allocates 2 x scratch_chunks x ceil(size / chunks) bytes for an LL plan
        assert max(last for _, last in packet) <= 2 * gpu["scratch_chunks"] * -(-size // chunks)


@pytest.mark.parametrize("name", ["upkt", "ppkt", "rppkt", "cpkt", "repkt", "respkt", "recpkt", "sem_acquire"])
def test_a_plan_missing_one_op_is_refused(name):
    # the smallest plan holding the op: verifying a 4-GPU plan takes a tenth of a 16-GPU one's time
    plan, gpu, tb, index = next(
        (plan, g["id"], t["id"], i)
        for plan in sorted(map(_plan, CASES), key=lambda plan: len(plan["gpus"]))
        for g in plan["gpus"]
        for t in g["threadblocks"]
        for i, op in enumerate(t["ops"])
        if op["name"] == name
    )
    broken = copy.deepcopy(plan)
    del broken["gpus"][gpu]["threadblocks"][tb]["ops"][index]
    with pytest.raises(VerificationError, match=r"incorrect: (deadlock|race|wrong result|reads)"):
        verify_mscclpp_plan(parse_mscclpp_plan(json.dumps(broken), "broken"))


def test_unknown_protocols_are_refused():
    algorithm = ring_algorithm(_topology("ndv2", 1), Collective.ALLGATHER)
    with pytest.raises(ArgumentError, match="protocol: protocol 'LL128'; expected 'Simple' or 'LL'"):
        generate_mscclpp_plan(algorithm, protocol="LL128")


@functools.cache
def _library(name: str, nodes: int, collective: str):
    return next(read_library(p) for p in shipped_library_paths(name, nodes) if collective in p.name)


def _slow_link_mesh(alpha_us: float = 5.0):
    """Return four GPUs all linked at ``alpha_us`` (µs) and 20 GB/s: a Simple plan's entry handshake costs one α."""
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, rank=r) for r in range(4)]
    links = [Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, alpha_us, 20.0) for a in range(4) for b in range(4) if a != b]
    return make_topology("slow-links", gpus, links)


def test_a_small_band_is_written_in_ll_when_it_simulates_faster():
    # LL pays the same α per transfer as Simple (never less), but no entry handshake: where α is
    # large beside the band's bytes, that handshake is what LL saves.
    topology = _slow_link_mesh()
    band = replace(ring_algorithm(topology, Collective.ALLGATHER), min_bytes=0, max_bytes=32_000)
    text, choice = choose_plan_protocol(band, topology)
    assert json.loads(text)["protocol"] == "LL" == choice.protocol
    simple, ll = (sum(times) for _, times in choice.times_us)
    assert [name for name, _ in choice.times_us] == ["Simple", "LL"] and ll < simple
    assert choice.why == f"LL simulates {simple / ll:.2f}x faster than Simple"
    assert choice.sizes_bytes[0] == 1000 and choice.sizes_bytes[-1] == band.max_bytes


def test_the_shipped_small_bands_stay_simple_where_ll_saves_less_than_its_lines_cost():
    library = _library("ndv2", 2, "allgather")
    text, choice = choose_plan_protocol(library.bands[0].algorithm, _topology("ndv2", 2))
    assert json.loads(text)["protocol"] == "Simple" == choice.protocol
    simple, ll = (sum(times) for _, times in choice.times_us)
    assert ll > simple and choice.why == f"LL simulates {simple / ll:.2f}x Simple's speed"


def test_large_and_open_bands_stay_simple_without_an_ll_plan():
    library = _library("ndv2", 2, "allgather")
    topology = _topology("ndv2", 2)
    closed = next(b for b in library.bands if b.max_bytes is not None and b.min_bytes >= 8_000_000)
    _, choice = choose_plan_protocol(closed.algorithm, topology)
    assert choice.protocol == "Simple" and choice.why == "LL cannot win: its bytes alone take longer"
    assert [name for name, _ in choice.times_us] == ["Simple"]  # the bound ruled LL out before any LL plan
    open_ended = library.bands[-1]
    assert open_ended.max_bytes is None
    text, choice = choose_plan_protocol(open_ended.algorithm, topology)
    assert json.loads(text)["protocol"] == "Simple" and choice.why.startswith("open-ended band")
    assert choose_plan_protocol(library.bands[0].algorithm, None)[1].why == "no machine to time LL on"


def test_library_plans_name_each_file_protocol_and_honour_a_forced_one():
    # its first two bands: LL is timed and loses in band 0; the later ones (LL not timed, or 900
    # steps forced into LL) are test_large_and_open_bands_... and test_packet_plans_...
    full = _library("ndv2", 1, "reducescatter")
    library = replace(full, bands=full.bands[:2])
    topology = _topology("ndv2", 1)
    chosen = generate_library_plans(library, topology)
    assert len(chosen.files) == 4  # both placements of both bands
    assert [name for name, _ in chosen.protocols] == [name for name, _ in chosen.files]
    by_name = dict(chosen.protocols)
    assert by_name["ndv2-n1-reducescatter-0.json"].protocol == "Simple"
    assert by_name["ndv2-n1-reducescatter-0.json"].why.startswith("LL simulates")
    for name, text in chosen.files:
        assert json.loads(text)["protocol"] == by_name[name].protocol
    forced = generate_library_plans(library, topology, protocol="LL")
    assert {json.loads(text)["protocol"] for _, text in forced.files} == {"LL"}
    assert {choice.why for _, choice in forced.protocols} == {"asked for"}


@pytest.mark.parametrize("nodes", [1, 2])
def test_an_ll_plan_simulates_as_its_algorithm_does_under_ll(nodes):
    # No entry handshake under LL, so the plan costs exactly what its schedule does (the Simple plan pays one α).
    topology = _topology("ndv2", nodes)
    for collective in ("allgather", "reducescatter", "allreduce", "alltoall"):
        algorithm = shipped_band("ndv2", nodes, collective, 0)
        plan = parse_mscclpp_plan(json.dumps(generate_mscclpp_plan(algorithm, topology, protocol="LL")), collective)
        sizes = [1024, 8192, 32000]
        ours = simulate_mscclpp_plan(plan, topology, sizes, model="chunks")
        xml = simulate_sizes(replace(algorithm, protocol="LL"), topology, sizes, model="chunks")
        assert [r.time_us for r in ours] == pytest.approx([r.time_us for r in xml]), collective
