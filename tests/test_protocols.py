"""Wire protocols: Simple simulates as before, LL and LL128 trade α for bandwidth, runtimes limit them, bands choose.

Covers ``taccl_py.simulate.protocol`` (the costs), the protocol rows of ``taccl_py.msccl.limits`` and
``taccl_py.msccl.protocol`` (the choice per band).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import NATIVE_ALGORITHM, SizeBand, read_library, shipped_library_dir
from taccl_py.ir.lowering import Transfer, lower_plan
from taccl_py.msccl.limits import check_protocol, protocol_limits, protocol_refusal
from taccl_py.msccl.protocol import (
    band_protocol_choices,
    band_protocols,
    band_sample_sizes,
    choose_protocol,
    choose_protocols,
    ll128_route_refusal,
)
from taccl_py.simulate import NCCL_PROTOCOL_COSTS, RCCL_PROTOCOL_COSTS, simulate
from taccl_py.topology import load_topology
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology

ROOT = Path(str(shipped_library_dir()))
# Shipped libraries whose stored band times Simple must reproduce bit for bit (8 and 16 GPUs).
STORED = ("ndv2/n1/allgather", "dgx-a100/n2/allreduce", "pcie-8gpu/n1/reducescatter", "dgx2/n1/alltoall")
SMALL_BYTES, LARGE_BYTES = 1_000, 64_000_000


def _library(name: str):
    return read_library(ROOT / f"{name}.library.json")


def _pair(alpha_us: float = 1.0, bandwidth_GBps: float = 10.0, kind: LinkKind = LinkKind.NVLINK):
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, rank=r) for r in range(2)]
    links = [Link("gpu0", "gpu1", kind, alpha_us, bandwidth_GBps), Link("gpu1", "gpu0", kind, alpha_us, bandwidth_GBps)]
    return make_topology("pair", gpus, links)


def _one_send(protocol: str = "Simple"):
    algorithm = lower_plan("one", Collective.ALLGATHER, 2, 2, [Transfer(0, 1, (Buffer.INPUT, 0), (Buffer.OUTPUT, 0))])
    return replace(algorithm, protocol=protocol)


@pytest.mark.parametrize("name", STORED)
def test_simple_reproduces_every_stored_band_time(name):
    library = _library(name)
    topology = load_topology(library.topology, library.nodes)
    for band in (band for band in library.bands if not band.native):  # native: NCCL's own algorithm
        size = next(size for size in library.provenance.sizes if band.covers(size))
        for costs in (NCCL_PROTOCOL_COSTS, RCCL_PROTOCOL_COSTS):
            result = simulate(band.algorithm, topology, size, bound_time_us=1.0, protocol_costs=costs)
            assert result.time_us == band.simulated_time_us, (name, band.min_bytes, size)


@pytest.mark.parametrize(
    ("protocol", "expected_us"),
    [
        ("Simple", 1.0 + 20_000 / 10_000),
        ("LL", 1.0 + 20_000 / 5_000),  # the link's own α (above NCCL's 0.6 µs); half the bandwidth
        ("LL128", 1.9 + 20_000 / (10_000 * 120 / 128)),  # NCCL's 1.9 µs NVLink hop, above the link's α
    ],
)
def test_one_transfer_costs_the_protocols_alpha_and_bandwidth(protocol, expected_us):
    result = simulate(_one_send(protocol), _pair(), 40_000, bound_time_us=1.0)
    assert result.time_us == pytest.approx(expected_us, rel=1e-12)


def test_rccl_prices_ll128_with_its_64_byte_lines():
    result = simulate(_one_send("LL128"), _pair(), 40_000, bound_time_us=1.0, protocol_costs=RCCL_PROTOCOL_COSTS)
    assert result.time_us == pytest.approx(1.9 + 20_000 / (10_000 * 56 / 64), rel=1e-12)


def test_network_and_pcie_routes_pay_their_own_class_latency_and_never_less_than_their_alpha():
    for kind, ll_alpha_us in ((LinkKind.PCIE, 2.0), (LinkKind.IB, 2.7), (LinkKind.NVLINK, 2.0)):
        result = simulate(_one_send("LL"), _pair(alpha_us=2.0, kind=kind), 2, bound_time_us=1.0)
        assert result.time_us == pytest.approx(ll_alpha_us + 1 / 5_000, rel=1e-12), kind
    tiny = simulate(_one_send("LL"), _pair(alpha_us=0.1, kind=LinkKind.PCIE), 2, bound_time_us=1.0)
    assert tiny.time_us == pytest.approx(1.0 + 1 / 5_000, rel=1e-12)  # NCCL's 1.0 µs PCI hop


def test_a_route_pays_the_latency_of_the_slowest_class_it_crosses():
    from taccl_py.simulate.protocol import LatencyClass, route_latency_class
    from taccl_py.topology.model import route

    topology = load_topology("ndv2", 2)
    assert route_latency_class(route(topology, 0, 1)) is LatencyClass.NVLINK
    assert route_latency_class(route(topology, 0, 8)) is LatencyClass.NET  # PCIe, then the NIC
    assert route_latency_class(route(load_topology("pcie-8gpu"), 0, 1)) is LatencyClass.PCI


def test_an_unknown_protocol_is_refused_by_name():
    with pytest.raises(ArgumentError, match="one: protocol: 'LL64'; expected one of Simple, LL, LL128"):
        simulate(_one_send("LL64"), _pair(), 1000)


def test_ll_and_ll128_never_beat_simple_and_lose_most_where_bytes_dominate():
    library = _library("dgx-a100/n2/allreduce")
    topology = load_topology(library.topology, library.nodes)
    algorithm = library.bands[0].algorithm
    for size in (SMALL_BYTES, LARGE_BYTES):
        times = {
            p: simulate(replace(algorithm, protocol=p), topology, size, bound_time_us=1.0).time_us
            for p in ("Simple", "LL", "LL128")
        }
        assert times["Simple"] <= times["LL128"] and times["Simple"] <= times["LL"], (size, times)
        if size == LARGE_BYTES:
            assert times["Simple"] < times["LL128"] < times["LL"], times


def test_runtime_limits_name_the_protocols_each_runtime_runs():
    assert protocol_limits("msccl-executor-nccl").protocols == ("Simple", "LL", "LL128")
    assert protocol_limits("msccl").protocols == ("Simple", "LL", "LL128")
    assert protocol_limits("rccl").protocols == ("Simple", "LL")
    assert protocol_limits("rccl", rccl_gpu_arch="gfx942").protocols == ("Simple", "LL", "LL128")
    assert protocol_limits("rccl", rccl_gpu_arch="gfx1201").protocols == ("Simple",)
    assert protocol_limits("portable").protocols == ("Simple", "LL")
    assert protocol_limits("portable", rccl_gpu_arch="gfx90a").protocols == ("Simple", "LL", "LL128")
    with pytest.raises(ArgumentError, match="runtime: 'nccl'; expected one of portable"):
        protocol_limits("nccl")


def test_runtime_limits_refuse_a_protocol_the_runtime_does_not_run():
    with pytest.raises(
        ArgumentError, match="ring: protocol: LL128 is not run by runtime rccl; expected one of Simple, LL"
    ):
        check_protocol("ring", "LL128", protocol_limits("rccl"))
    with pytest.raises(ArgumentError, match="LL is not run by runtime rccl; expected one of Simple$"):
        check_protocol("ring", "LL", protocol_limits("rccl", rccl_gpu_arch="gfx1200"))
    with pytest.raises(ArgumentError, match="LL128 is not run by every MSCCL runtime"):
        check_protocol("ring", "LL128", protocol_limits())
    check_protocol("ring", "LL128", protocol_limits("msccl-executor-nccl"))


def test_runtime_limits_keep_ll_and_ll128_to_one_pass_per_chunk():
    executor, rccl = protocol_limits("msccl-executor-nccl"), protocol_limits("rccl", rccl_gpu_arch="gfx942")
    assert (executor.ll_pass_bytes, executor.ll128_pass_bytes) == (32768, 576000)
    assert (rccl.ll_pass_bytes, rccl.ll128_pass_bytes) == (16384, 50176)
    assert protocol_refusal("LL", executor, 32768) is None
    assert "expected chunks of at most 32768 bytes, one LL pass" in protocol_refusal("LL", executor, 32769)
    assert "sizes without an upper end" in protocol_refusal("LL128", executor, None)
    assert protocol_refusal("Simple", executor, None) is None
    with pytest.raises(ArgumentError, match="LL128 with chunks of up to 60000 bytes; expected chunks of at most 50176"):
        check_protocol("band", "LL128", rccl, 60_000)


def test_band_sample_sizes_take_the_edges_and_their_middle():
    assert band_sample_sizes(0, 32000) == (1000, 5657, 32000)
    assert band_sample_sizes(0, 500) == (1, 22, 500)
    assert band_sample_sizes(4000, 16000) == (4000, 8000, 16000)
    assert band_sample_sizes(2_048_000, None) == (2_048_000, 8_192_000, 32_768_000)
    assert band_sample_sizes(100_000_000, None) == (100_000_000, 400_000_000, 1_000_000_000)
    assert band_sample_sizes(2_000_000_000, None) == (2_000_000_000,)
    with pytest.raises(ArgumentError, match=r"size band \[64, 64\); expected 0 <= min_bytes < max_bytes"):
        band_sample_sizes(64, 64)


def test_ll128_needs_nvlink_inside_a_machine_and_a_nic_off_the_cpu():
    a100 = _library("dgx-a100/n2/allreduce").bands[0].algorithm
    assert ll128_route_refusal(a100, load_topology("dgx-a100", 2)) is None
    ndv2 = _library("ndv2/n2/allreduce").bands[0].algorithm
    assert "crosses CPU" in ll128_route_refusal(ndv2, load_topology("ndv2", 2))
    pcie = _library("pcie-8gpu/n1/allgather").bands[0].algorithm
    assert "over pcie; expected NVLink inside a machine" in ll128_route_refusal(pcie, load_topology("pcie-8gpu"))


def test_choose_protocol_reports_every_protocol_it_tried_and_why_not_the_others():
    library = _library("dgx-a100/n2/allreduce")
    topology = load_topology(library.topology, library.nodes)
    band = library.bands[0]  # 0-512 KB: small enough for LL to be tried
    choice = choose_protocol(band.algorithm, topology, band.min_bytes, band.max_bytes, "msccl-executor-nccl")
    assert [name for name, _ in choice.times_us] == ["Simple", "LL", "LL128"]
    # Simple already pays only the wire's α; LL and LL128 pay at least that, with fewer data bytes per line.
    assert choice.protocol == "Simple" and choice.speedup == 1.0
    assert choice.total_us("Simple") == min(choice.total_us(p) for p in ("Simple", "LL", "LL128"))
    rccl = choose_protocol(band.algorithm, topology, band.min_bytes, band.max_bytes, "rccl")
    assert rccl.protocol != "LL128" and dict(rccl.refused)["LL128"].startswith("LL128 is not run by runtime rccl")
    assert rccl.total_us("LL128") is None


def test_choose_protocols_shares_simulations_and_matches_one_runtime_at_a_time():
    library = _library("ndv2/n1/allgather")
    topology = load_topology("ndv2")
    runtimes = (("portable", None), ("msccl-executor-nccl", None), ("rccl", "gfx942"))
    for band in (band for band in library.bands if not band.native):
        limits = [protocol_limits(runtime, rccl_gpu_arch=arch) for runtime, arch in runtimes]
        together = choose_protocols(band.algorithm, topology, band.min_bytes, band.max_bytes, limits)
        alone = tuple(
            choose_protocol(band.algorithm, topology, band.min_bytes, band.max_bytes, runtime, rccl_gpu_arch=arch)
            for runtime, arch in runtimes
        )
        assert together == alone


def test_choose_protocol_keeps_simple_where_nothing_else_may_run():
    library = _library("ndv2/n1/allgather")
    band = [band for band in library.bands if not band.native][-1]  # NCCL's 6 rings run from 2 MiB (issue 47)
    choice = choose_protocol(band.algorithm, load_topology("ndv2"), band.min_bytes, None, "msccl-executor-nccl")
    assert (choice.protocol, choice.speedup, [name for name, _ in choice.refused]) == ("Simple", 1.0, ["LL", "LL128"])
    assert choice.times_us == ()  # nothing to compare, nothing simulated
    limits = [protocol_limits("msccl-executor-nccl")]
    (report,) = choose_protocols(
        band.algorithm, load_topology("ndv2"), band.min_bytes, None, limits, simulate_simple_alone=True
    )
    assert report.protocol == "Simple" and report.total_us("Simple") > 0


@pytest.mark.parametrize("runtime", ["portable", "msccl-executor-nccl", "rccl"])
def test_band_protocols_keep_simple_where_no_protocol_beats_it(runtime):
    protocols = band_protocols(_library("dgx-a100/n2/allreduce"), runtime)
    assert protocols == ("Simple",) * len(protocols)


def test_pick_takes_another_protocol_only_past_the_near_tie():
    from taccl_py.msccl.protocol import _pick

    assert _pick([("Simple", (10.0, 20.0)), ("LL", (9.0, 18.0))]) == "LL"
    assert _pick([("Simple", (10.0, 20.0)), ("LL", (9.95, 19.9))]) == "Simple"  # within 1%


def test_band_protocols_skip_native_bands():
    library = _library("ndv2/n1/allgather")
    native = SizeBand(0, library.bands[0].max_bytes, None, NATIVE_ALGORITHM)
    protocols = band_protocols(replace(library, bands=(native, *library.bands[1:])))
    assert protocols[0] is None and protocols[1:] == band_protocols(library)[1:]


def test_band_protocols_keep_simple_off_the_builtin_machines(caplog):
    library = replace(_library("ndv2/n1/allgather"), topology="my-cluster.json")
    with caplog.at_level(logging.INFO, logger="taccl_py.msccl.protocol"):
        assert band_protocols(library) == tuple(None if band.native else "Simple" for band in library.bands)
    assert "topology 'my-cluster.json' is not a built-in machine" in caplog.text
    assert band_protocol_choices(library) == (None,) * len(library.bands)


# Every shipped library of one machine by default; 2, 4 and 8 machines with --runslow (about 5 minutes).
SWEEP_SIZES = (1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000)
SWEEP = [
    pytest.param(name, nodes, id=f"{name}x{nodes}", marks=[pytest.mark.slow] if nodes > 1 else [])
    for name in ("ndv2", "ndv2-teccl", "dgx1", "dgx2", "dgx-a100", "dgx-h100", "mi300x", "pcie-8gpu")
    for nodes in (1, 2, 4, 8)
    if nodes < 8 or name in ("dgx-a100", "dgx-h100")
]


@pytest.mark.parametrize(("name", "nodes"), SWEEP)
def test_no_shipped_band_in_any_protocol_simulates_below_its_bound(name, nodes):
    from taccl_py.bounds.reduction import schedule_bounds
    from taccl_py.ir.library import shipped_library_paths
    from taccl_py.simulate import simulate_sizes

    topology = load_topology(name, nodes)
    checked = 0
    for path in shipped_library_paths(name, nodes):
        library = read_library(path)
        for band in library.bands:
            sizes = [size for size in SWEEP_SIZES if band.covers(size)]
            if band.algorithm is None or not sizes:
                continue
            # a switch schedule is held to the in-network bound, every other one to the collective's
            held = schedule_bounds(
                topology, library.collective, sizes, reduces_in_switch=band.algorithm.reduces_in_switch
            )
            bounds = dict(zip(sizes, held))
            for protocol in ("Simple", "LL", "LL128"):
                for result in simulate_sizes(replace(band.algorithm, protocol=protocol), topology, sizes):
                    bound_us = bounds[result.size_bytes].time_us
                    where = f"{path.name} band {band.min_bytes} in {protocol} at {result.size_bytes} B"
                    assert result.time_us >= bound_us * (1 - 1e-12), f"{where}: {result.time_us} < {bound_us} µs"
                    checked += 1
    assert checked >= 3 * len(SWEEP_SIZES)
