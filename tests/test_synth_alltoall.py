"""AlltoAll synthesis: the routing LP, its lowering, the MSCCL limits, and ``taccl synthesize -c alltoall``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taccl_py.baselines import compare_baselines
from taccl_py.baselines.alltoall import direct_alltoall_algorithm
from taccl_py.cli import main
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm_json import generate_algorithm_json, read_algorithm
from taccl_py.ir.library import read_library
from taccl_py.stages.sketch.model import Sketch
from taccl_py.synth import synthesize
from taccl_py.synth.alltoall.plan import alltoall_algorithm
from taccl_py.synth.alltoall.routing import PathKind, path_classes, round_routing, route_alltoall
from taccl_py.synth.candidates import exportable
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import load_cluster

from helpers import assert_valid_algorithm

MB = 1 << 20


@pytest.fixture(scope="module")
def ndv2x2():
    return load_topology("ndv2", 2)


def test_model_size_does_not_grow_with_nodes():
    two, four = (path_classes(load_topology("dgx-a100", n)) for n in (2, 4))
    assert len(two) == len(four) == 8 * 8 + 8 * 7  # across machines, and inside one
    assert [c.kinds for c in two] == [c.kinds for c in four]


def test_relay_only_classes_drop_direct_where_a_relay_exists(ndv2x2):
    classes = path_classes(ndv2x2, direct=False)
    assert all(PathKind.DIRECT not in c.kinds or len(c.kinds) == 1 for c in classes if not c.same_machine)
    assert all(c.kinds[0] is PathKind.DIRECT for c in classes if c.same_machine)


def test_routing_shares_are_whole_blocks(ndv2x2):
    routing = route_alltoall(ndv2x2, 16 * MB)
    assert routing.status == "optimal"
    assert all(abs(sum(shares) - 1) < 1e-6 for shares in routing.shares)
    assert all(sum(counts) == 2 for counts in round_routing(routing, 2))


@pytest.mark.parametrize("split_own", [True, False], ids=["split", "gather"])
def test_every_path_kind_mixed_lowers_to_a_verified_alltoall(ndv2x2, split_own):
    """Blocks split over all four path kinds at once (both relays included) still implement AlltoAll."""
    routing = route_alltoall(ndv2x2, 16 * MB)
    even = tuple(tuple(1 / len(c.paths) for _ in c.paths) for c in routing.classes)
    algorithm = alltoall_algorithm(ndv2x2, replace(routing, shares=even), 4, split_own=split_own, name="mixed")
    assert_valid_algorithm(algorithm)
    assert algorithm.chunks_per_loop == 4 * ndv2x2.num_ranks


@pytest.mark.parametrize("machine", ["ndv2", "dgx-a100"])
def test_synthesis_never_slower_than_the_best_baseline(machine):
    result = synthesize(load_topology(machine, 2), "alltoall", sizes=(MB, 64 * MB))
    for choice in result.choices:
        assert choice.synthesized is not None and choice.baseline is not None
        assert choice.synthesized.time_us <= choice.baseline.time_us * (1 + 1e-9)
        assert choice.chosen_result.time_us <= choice.baseline.time_us
    assert_valid_algorithm(result.algorithm)
    for band in result.library.bands:
        assert_valid_algorithm(band.algorithm)


def test_nvlink_relays_beat_direct_on_one_dgx1():
    """Inside a hybrid cube-mesh, pairs without an NVLink relay through a GPU linked to both instead of the host."""
    result = synthesize(load_topology("dgx1"), "alltoall", size_bytes=16 * MB)
    choice = result.choices[0]
    assert not choice.baseline_chosen
    assert choice.synthesized.time_us < choice.baseline.time_us / 2
    assert_valid_algorithm(result.algorithm)


def test_nic_relays_spread_a_machine_with_nics_down_over_the_rest():
    """A DGX A100 pair with one NIC down on each machine: direct crowds two GPUs onto one NIC; the LP spreads them."""
    degraded = load_cluster(topology="dgx-a100", nodes=2, nics_down=["0:nic3", "1:nic5"])
    choice = synthesize(degraded, "alltoall", size_bytes=16 * MB).choices[0]
    assert not choice.baseline_chosen
    assert choice.synthesized.fraction_of_bound >= 0.9
    assert choice.synthesized.time_us < choice.baseline.time_us / 1.3


def test_relay_routing_fits_msccl_limits_where_direct_does_not():
    """64 GPUs: direct needs 127 threadblocks per GPU; the relay routing gathers across machines at the NIC GPUs."""
    dgx2x4 = load_topology("dgx2", 4)
    assert not exportable(direct_alltoall_algorithm(dgx2x4))
    routing = route_alltoall(dgx2x4, 64 * MB, direct=False)
    algorithm = alltoall_algorithm(dgx2x4, routing, 1, split_own=True, name="relay")
    assert exportable(algorithm)


def test_same_input_same_bytes(ndv2x2):
    texts = {generate_algorithm_json(synthesize(ndv2x2, "alltoall", size_bytes=MB).algorithm) for _ in range(2)}
    assert len(texts) == 1


def test_a_sketch_is_refused_for_alltoall(ndv2x2):
    with pytest.raises(ArgumentError, match=r"sketch: a sketch with alltoall; expected no sketch"):
        synthesize(ndv2x2, "alltoall", size_bytes=MB, sketch=Sketch())


def test_cli_writes_an_alltoall(tmp_path, capsys):
    out = tmp_path / "a2a.json"
    args = ["synthesize", "--topology", "ndv2", "--nodes", "2", "-c", "alltoall", "--size", "1MB", "-o", str(out)]
    assert main([*args, "--xml", str(tmp_path / "a2a.xml")]) == 0
    assert_valid_algorithm(read_algorithm(out))
    assert (tmp_path / "a2a.xml").exists()
    assert "alltoall on ndv2x2 (16 GPUs)" in capsys.readouterr().out


def test_cli_writes_an_alltoall_library(tmp_path):
    out = tmp_path / "alltoall.library.json"
    args = ["synthesize", "--topology", "dgx-a100", "--nodes", "2", "-c", "alltoall", "--sizes", "1MB,64MB"]
    assert main([*args, "-o", str(out), "--no-progress"]) == 0
    library = read_library(out)
    assert library.collective.value == "alltoall"
    assert all(band.algorithm is not None for band in library.bands)


def test_bands_write_only_baselines_that_load_and_compare_with_the_fastest(ndv2x2, monkeypatch):
    # as where direct needs more threadblocks than MSCCL allows (past 32 GPUs): only loadable baselines
    # may be written, but each size is still reported against the fastest baseline
    def loads(algorithm, runtime="portable"):
        return not algorithm.name.startswith("direct") and exportable(algorithm, runtime)

    monkeypatch.setattr("taccl_py.synth.outcome.exportable", loads)
    result = synthesize(ndv2x2, "alltoall", sizes=[MB, 64 * MB])
    fastest = compare_baselines(ndv2x2, "alltoall", [MB, 64 * MB])
    assert [choice.baseline_name for choice in result.choices] == [c.fastest[0].name for c in fastest]
    assert all(not choice.chosen.name.startswith("direct") for choice in result.choices)
