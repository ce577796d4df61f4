"""Simulating MSCCL++ execution plans (taccl_py.mscclpp.simulate) and ``taccl simulate plan.json``."""

from __future__ import annotations

import functools
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_simulate import BYTES_PER_US, full_mesh

from taccl_py.cli import main
from taccl_py.cli.algo import libraries_to_export
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.mscclpp import (
    generate_mscclpp_plan_json,
    parse_mscclpp_plan,
    read_mscclpp_plan,
    verify_mscclpp_plan,
)
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import library_plan_name
from taccl_py.mscclpp.plan import ChannelKind
from taccl_py.mscclpp.simulate import prepare_plan_simulation, simulate_mscclpp_plan
from taccl_py.simulate import simulate_plan, simulate_sizes
from taccl_py.topology import load_topology, read_topology, write_topology
from taccl_py.topology.model import route
from taccl_py.verify import exported_inplace_form

from shipped_bands import outer_bands, shipped_bands

FIXTURES = Path(__file__).parent / "fixtures" / "mscclpp"
ALPHA_US = 1.0
SIZE_BYTES = 40_000  # two chunks of 20 kB: 2 µs each at 10 GB/s
CHUNK_US = SIZE_BYTES / 2 / BYTES_PER_US
MODELS = ("chunks", "msccl", "pipelined", "msccl-net")  # msccl-net: one machine, so serialized
# An exported plan may be this much faster than its Algorithm under MSCCL's slice loop: the exporter
# cuts threadblocks over 64 ops in pieces, and each piece joins its own next pass.
SLICED_SLACK = 0.01


def _op(name: str, **fields) -> dict:
    return {"name": name, **fields}


def _memory(name: str) -> dict:
    return _op(name, channel_ids=[0], channel_type="memory")


def _put(rank: int) -> dict:
    """Put this GPU's input chunk into the peer's output chunk ``rank``."""
    src = [{"type": "i", "index": 0, "size": 1}]
    return _op("put", src_buff=src, dst_buff=[{"buffer_id": 0, "index": rank, "size": 1}], channel_type="memory")


def _copy(rank: int) -> dict:
    return _op(
        "copy", src_buff=[{"type": "i", "index": 0, "size": 1}], dst_buff=[{"type": "o", "index": rank, "size": 1}]
    )


def _allgather_pair(ops_of, name: str = "pair", channels: int = 1) -> str:
    """Return the JSON of a 2-GPU out-of-place AllGather whose GPU r runs ``ops_of(r)`` on one threadblock.

    The GPUs are joined by ``channels`` memory channels, all on the threadblock.
    """
    gpus = []
    for rank in range(2):
        threadblock = {
            "id": 0,
            "ops": ops_of(rank),
            "channels": [{"channel_type": "memory", "channel_ids": list(range(channels))}],
            "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}],
        }
        gpus.append(
            {
                "id": rank,
                "input_chunks": 1,
                "output_chunks": 2,
                "scratch_chunks": 0,
                "threadblocks": [threadblock],
                "channels": [{"channel_type": "memory", "connected_to": [1 - rank] * channels}],
                "remote_buffers": [{"rank": 1 - rank, "type": "o", "access_channel_types": ["memory"]}],
                "semaphores": [],
            }
        )
    document = {"name": name, "collective": "allgather", "protocol": "Simple", "inplace": False, "gpus": gpus}
    return json.dumps(document, indent=1)


def _handshake_plan(rank: int) -> list[dict]:
    """The exporter's shape: signal on entry, wait for the peer's entry, put, nop, signal, wait for its data."""
    return [
        _memory("signal"),
        _memory("wait"),
        _put(rank),
        _op("nop"),
        _memory("signal"),
        _memory("wait"),
        _op("nop"),
        _copy(rank),
    ]


def _no_handshake_plan(rank: int) -> list[dict]:
    return [_put(rank), _op("nop"), _memory("signal"), _memory("wait"), _op("nop"), _copy(rank)]


def _late_signal_plan(rank: int) -> list[dict]:
    """A put whose signal comes after a local copy: the flag is no longer behind the data."""
    return [_put(rank), _op("nop"), _copy(rank), _op("nop"), _memory("signal"), _memory("wait")]


def _pair_topology():
    return full_mesh(2, alpha_us=ALPHA_US)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("ops_of", "serialized_us", "pipelined_us"),
    [
        # entry signal (α), then the put (α + b/B) with its signal
        (_handshake_plan, 2 * ALPHA_US + CHUNK_US, 2 * ALPHA_US + CHUNK_US),
        # the signal travels with the put: no α of its own
        (_no_handshake_plan, ALPHA_US + CHUNK_US, ALPHA_US + CHUNK_US),
        # a signal after a copy is a flag alone: its own α, overlapping the put's when sends are pipelined
        (_late_signal_plan, 2 * ALPHA_US + CHUNK_US, ALPHA_US + CHUNK_US),
    ],
    ids=["handshake", "put-signal", "late-signal"],
)
def test_a_hand_built_pair_takes_the_time_worked_out_by_hand(ops_of, serialized_us, pipelined_us, model):
    plan = parse_mscclpp_plan(_allgather_pair(ops_of), "pair.json")
    verify_mscclpp_plan(plan)
    (result,) = simulate_mscclpp_plan(plan, _pair_topology(), [SIZE_BYTES], model=model)
    assert result.time_us == pytest.approx(pipelined_us if model == "pipelined" else serialized_us)
    assert result.num_transfers == 2 + 2 * (ops_of is not _no_handshake_plan)  # the puts, and each lone flag
    assert result.fraction_of_bound <= 1.0


@pytest.mark.parametrize("model", MODELS)
def test_a_signal_over_two_channels_travels_behind_the_put_on_both(model):
    # thread t of signal[0,1] signals channel t: neither flag is a lone one (export gathers signals so)
    def two_channels(rank: int) -> list[dict]:
        both = {"channel_ids": [0, 1], "channel_type": "memory"}
        return [_put(rank), _op("nop"), _op("signal", **both), _op("wait", **both), _op("nop"), _copy(rank)]

    plan = parse_mscclpp_plan(_allgather_pair(two_channels, channels=2), "pair.json")
    verify_mscclpp_plan(plan)
    (result,) = simulate_mscclpp_plan(plan, _pair_topology(), [SIZE_BYTES], model=model)
    assert result.time_us == pytest.approx(ALPHA_US + CHUNK_US)
    assert result.num_transfers == 2


def test_chunk_size_follows_the_collectives_layout():
    plan = parse_mscclpp_plan(_allgather_pair(_no_handshake_plan), "pair.json")
    small, large = simulate_mscclpp_plan(plan, _pair_topology(), [SIZE_BYTES, 2 * SIZE_BYTES], model="chunks")
    assert large.time_us - small.time_us == pytest.approx(CHUNK_US)  # AllGather's M / 2 per chunk


def test_a_wait_no_signal_meets_is_a_deadlock():
    def lonely(rank: int) -> list[dict]:
        return [_memory("wait")] * (1 + rank) + [_put(rank), _op("nop"), _memory("signal")]

    plan = parse_mscclpp_plan(_allgather_pair(lonely), "lonely.json")
    with pytest.raises(VerificationError, match="deadlock"):
        prepare_plan_simulation(plan, _pair_topology())


def test_wrong_rank_count_is_an_argument_error():
    plan = parse_mscclpp_plan(_allgather_pair(_no_handshake_plan), "pair.json")
    with pytest.raises(ArgumentError, match="2 GPUs but topology 'mesh4' has 4"):
        prepare_plan_simulation(plan, full_mesh(4))


# -- MSCCL++'s own plans ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(path.name for path in FIXTURES.glob("*.json")))
def test_mscclpp_fixture_plans_simulate_on_a_matching_mesh(name):
    plan = read_mscclpp_plan(FIXTURES / name)
    topology = full_mesh(len(plan.gpus))
    if any(c.channel_type is ChannelKind.SWITCH for gpu in plan.gpus for c in gpu.channels):
        # a switch op is a switch flow: it needs a switch that reduces (tests/test_mscclpp_switch.py)
        gpus = len(plan.gpus)
        topology = (
            load_topology("dgx-h100") if gpus == 8 else read_topology(FIXTURES.parent / f"topo/nvls-{gpus}gpu.json")
        )
    results = simulate_mscclpp_plan(plan, topology, [1 << 20, 1 << 26], model="chunks")
    for result in results:
        assert result.num_transfers > 0
        assert 0 < result.fraction_of_bound <= 1.0
    assert results[1].time_us > results[0].time_us


def test_a_packet_plan_moves_its_chunk_at_half_the_bandwidth():
    # transfer_pack: each GPU puts its one chunk as LL packets; LL carries 8 data bytes per 16
    plan = read_mscclpp_plan(FIXTURES / "transfer_pack.json")
    small, large = simulate_mscclpp_plan(plan, full_mesh(2), [SIZE_BYTES, 2 * SIZE_BYTES], model="chunks")
    assert large.time_us - small.time_us == pytest.approx(CHUNK_US * 2)


# -- exported library bands against their Algorithm ------------------------------------------------


# The default run simulates the first and the last band of each of ndv2's libraries (allgather and
# reducescatter band 3: threadblocks cut at 64 ops), short of allreduce band 4 (1800 steps, both
# placements a third of the sweep); the bands between, and that one, run with --runslow.
DEFAULT_BANDS = outer_bands(shipped_bands("ndv2"), {("allreduce", 4)})


@functools.cache
def _ndv2_band_cases(slow: bool) -> tuple[tuple, ...]:
    """Return (plan file name, plan, band algorithm in the plan's placement, sizes) for ndv2's band plans.

    The plans ``generate_library_plans(..., protocol="Simple")`` writes, less their verification and
    served ranges (tests/test_cli_mscclpp.py), which no simulation reads. ``slow``: the bands
    outside ``DEFAULT_BANDS``, else those in it.
    """
    topology = load_topology("ndv2")
    cases = []
    for library in libraries_to_export("ndv2", 1):
        for index, band in enumerate(library.bands):
            if band.native or ((library.collective.value, index) not in DEFAULT_BANDS) != slow:
                continue
            name = library_plan_name(library, index).removesuffix(".json")
            base = replace(band.algorithm, name=name, min_bytes=band.min_bytes, max_bytes=band.max_bytes)
            variant, _ = exported_inplace_form(base)
            high = 16 * band.min_bytes if band.max_bytes is None else band.max_bytes - 1
            sizes = sorted({max(band.min_bytes, 1024), high})
            for algorithm in [base] if variant is None else [base, variant]:
                file_name = library_plan_name(library, index, algorithm.inplace)
                text = json.dumps(generate_mscclpp_plan(algorithm, topology, protocol="Simple"))
                cases.append((file_name, parse_mscclpp_plan(text, file_name), algorithm, sizes))
    return tuple(cases)


@pytest.fixture(scope="module")
def ndv2_bands():
    return _ndv2_band_cases(False)


@pytest.mark.parametrize("slow", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["bands", "slow-bands"])
@pytest.mark.parametrize("model", ["chunks", "msccl"])
def test_exported_bands_cost_their_algorithm_plus_the_entry_handshake(model, slow):
    topology = load_topology("ndv2")
    # the tolerance: one entry handshake per pass of the program, each at most the slowest route's α
    alpha_us = max(route(topology, a, b).alpha_us for a in range(8) for b in range(8) if a != b)
    collectives = set()
    for name, plan, algorithm, sizes in _ndv2_band_cases(slow):
        collectives.add(plan.collective)
        xml = simulate_sizes(algorithm, topology, sizes, model=model)
        ours = simulate_mscclpp_plan(plan, topology, sizes, model=model)
        for size, by_xml, by_plan in zip(sizes, xml, ours):
            where = f"{name} at {size} bytes ({model})"
            floor = by_xml.time_us * (1 - SLICED_SLACK) if model != "chunks" else by_xml.time_us
            assert floor - 1e-9 <= by_plan.time_us, where
            assert by_plan.time_us <= by_xml.time_us + by_plan.num_passes * alpha_us + 1e-9, where
            assert by_plan.fraction_of_bound <= 1.0 + 1e-9, where
            assert by_plan.bound_time_us == by_xml.bound_time_us
    # alltoall has two bands, both in the default run
    assert collectives == {"allgather", "reducescatter", "allreduce"} | (set() if slow else {"alltoall"})


def test_the_handshake_is_on_the_critical_path_of_a_small_band(ndv2_bands):
    name, plan, algorithm, sizes = ndv2_bands[0]
    topology = load_topology("ndv2")
    plan_us = simulate_mscclpp_plan(plan, topology, sizes[:1], model="chunks")[0].time_us
    xml_us = simulate_sizes(algorithm, topology, sizes[:1], model="chunks")[0].time_us
    assert plan_us == pytest.approx(xml_us + route(topology, 0, 1).alpha_us), name  # NVLink α 0.3 µs


def test_a_plan_is_reusable_across_sizes():
    plan = parse_mscclpp_plan(_allgather_pair(_handshake_plan), "pair.json")
    prepared = prepare_plan_simulation(plan, _pair_topology(), model="chunks")
    assert simulate_plan(prepared, SIZE_BYTES).time_us == pytest.approx(2 * ALPHA_US + CHUNK_US)
    assert prepared.algorithm.chunks_per_loop == 2 and prepared.algorithm.protocol == "Simple"


# -- taccl simulate plan.json ----------------------------------------------------------------------


@pytest.fixture
def mesh2(tmp_path):
    path = tmp_path / "mesh2.json"
    write_topology(_pair_topology(), path)
    return path


def test_cli_simulates_a_plan(tmp_path, mesh2, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(_allgather_pair(_handshake_plan, "handshake"))
    args = ["simulate", str(plan), "--topology", str(mesh2), "--sizes", "40000", "--no-baselines"]
    assert main([*args, "--json", "--model", "chunks"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["time_us"] == pytest.approx(2 * ALPHA_US + CHUNK_US)
    assert record["algorithm"] == "handshake" and record["model"] == "chunks"
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("handshake: allgather, 2 ranks on mesh2\n")
    assert "of bound" in out


def test_cli_reads_a_plan_from_stdin(monkeypatch, mesh2, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(_allgather_pair(_no_handshake_plan, "piped")))
    args = ["simulate", "-", "--topology", str(mesh2), "--sizes", "40000", "--no-baselines", "--model", "chunks"]
    assert main([*args, "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["algorithm"] == "piped" and record["time_us"] == pytest.approx(ALPHA_US + CHUNK_US)


def test_cli_simulates_an_exported_band_with_baselines(tmp_path, ndv2_bands, capsys):
    name, plan, _, sizes = ndv2_bands[0]
    path = tmp_path / name
    path.write_text(generate_mscclpp_plan_json(plan))
    assert main(["simulate", str(path), "--topology", "ndv2", "--sizes", str(sizes[0]), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["best_baseline"] is not None and record["time_us"] > 0


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"name": "bad", "gpus": [{"id": 0, "threadblocks": []}]}, "error: "),
        (
            json.loads(_allgather_pair(_handshake_plan)) | {"collective": "broadcast"},
            "collective: unknown value 'broadcast'",
        ),
    ],
    ids=["malformed", "unknown-collective"],
)
def test_cli_refuses_a_bad_plan_in_one_line(tmp_path, mesh2, capsys, document, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    assert main(["simulate", str(path), "--topology", str(mesh2), "--no-baselines"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_cli_refuses_a_plan_for_another_rank_count(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(_allgather_pair(_handshake_plan))
    assert main(["simulate", str(path), "--topology", "ndv2", "--no-baselines"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 GPUs but topology ndv2 has 8" in err[0]
