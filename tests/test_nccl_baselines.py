"""Tests of NCCL's own algorithms as baselines: NVLS AllGather/ReduceScatter, PAT, their place in compare_baselines,
``nccl_best_times`` and ``taccl baseline nvls``.

Expected times are computed here from the topology files' figures and the formulas of
``taccl_py.baselines.nccl``, not read back from the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from taccl_py.baselines import (
    ModelledBaseline,
    best_baselines,
    build_baseline,
    compare_baselines,
    is_schedule,
    nccl_best_times,
    nccl_modelled_times,
)
from taccl_py.bounds import lower_bounds
from taccl_py.bounds.reduction import in_network_reduction_bounds
from taccl_py.cli import main
from taccl_py.ir.algorithm import Algorithm
from taccl_py.simulate import simulate
from taccl_py.synth.candidates import exportable
from taccl_py.topology import load_topology

from helpers import write_one_gpu_machine

REPO = Path(__file__).resolve().parents[1]
MB = 10**6
SIZES = (64 * 2**10, 2**20, 16 * 2**20, 64 * 2**20, 2**30)


def _dgx_h100_figures() -> tuple[float, float, float, float]:
    """Return DGX-H100's switch reduce rate and α, and a GPU's NVSwitch link rate and α, from its file."""
    data = json.loads((REPO / "topologies" / "dgx-h100.json").read_text())
    switch = next(v for v in data["vertices"] if v["kind"] == "nvswitch")
    link = next(link for link in data["links"] if link["src"] == "gpu0" and link["dst"] == switch["name"])
    return switch["reduce_bandwidth_GBps"], switch["reduce_alpha_us"], link["bandwidth_GBps"], link["alpha_us"]


def _nvls_allreduce_us(size: int) -> float:
    rate, alpha, link_rate, _ = _dgx_h100_figures()
    # each GPU moves M (1 + 1/8) per direction through its port at min(switch rate, link rate); 1 GB/s = 1000 B/µs
    return alpha + size * (1 + 1 / 8) / (min(rate, link_rate) * 1000)


# GPU -> PCIe switch -> NIC -> network -> NIC -> PCIe switch -> GPU: α 0.5 + 0.5 + 2 + 0 + 0.5 + 0.5, narrowest 25 GB/s
PAT_ROUTE_ALPHA_US, PAT_ROUTE_GBPS = 4.0, 25.0


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_nvls_allgather_and_reducescatter_move_the_whole_buffer_through_the_switch_port(collective):
    rate, alpha, link_rate, _ = _dgx_h100_figures()
    times = nccl_modelled_times(load_topology("dgx-h100"), collective, SIZES)
    assert list(times) == ["nccl-nvls"]
    for size, time in zip(SIZES, times["nccl-nvls"]):
        assert time.time_us == pytest.approx(alpha + size / (min(rate, link_rate) * 1000), rel=1e-12)


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_no_modelled_nvls_time_is_below_the_bound_that_holds_for_it(nodes, collective):
    topology = load_topology("dgx-h100", nodes=nodes)
    bounds = (
        in_network_reduction_bounds(topology, SIZES)
        if collective == "allreduce"
        else lower_bounds(topology, collective, SIZES)
    )
    modelled = nccl_modelled_times(topology, collective, SIZES)
    # NCCL runs NVLS AllGather/ReduceScatter on one machine only (several need CollNet)
    assert bool(modelled) == (collective == "allreduce" or nodes == 1)
    for times in modelled.values():
        for time, bound in zip(times, bounds):
            assert time.time_us >= bound.time_us
            assert time.bound_time_us == pytest.approx(bound.time_us) and time.fraction_of_bound <= 1


def test_a_ring_beats_nvls_allgather_at_large_sizes_on_dgx_h100():
    """NVLS does not cut AllGather time: each port takes in M at the switch rate, a ring (N-1)/N M at the link rate."""
    (large,) = nccl_best_times(load_topology("dgx-h100"), "allgather", [2**30])
    assert large.name.startswith("ring-")
    rate, alpha, _, _ = _dgx_h100_figures()
    assert large.time_us < alpha + 2**30 / (rate * 1000)


@pytest.mark.parametrize("nodes", [2, 3, 4, 8])
@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_pat_takes_log2_steps_of_the_route_alpha_and_a_rings_bytes_over_the_nic(tmp_path, nodes, collective):
    topology = load_topology(write_one_gpu_machine(tmp_path), nodes=nodes)
    times = nccl_modelled_times(topology, collective, SIZES)
    assert list(times) == ["nccl-pat"]
    bounds = lower_bounds(topology, collective, SIZES)
    steps = math.ceil(math.log2(nodes))
    for size, time, bound in zip(SIZES, times["nccl-pat"], bounds):
        expected = steps * PAT_ROUTE_ALPHA_US + (nodes - 1) / nodes * size / (PAT_ROUTE_GBPS * 1000)
        assert time.time_us == pytest.approx(expected, rel=1e-12)
        assert time.time_us >= bound.time_us


def test_pat_needs_one_gpu_per_machine_and_several_machines(tmp_path):
    assert nccl_modelled_times(load_topology(write_one_gpu_machine(tmp_path), nodes=1), "allgather", SIZES) == {}
    assert nccl_modelled_times(load_topology(write_one_gpu_machine(tmp_path), nodes=4), "allreduce", SIZES) == {}
    assert "nccl-pat" not in nccl_modelled_times(load_topology("dgx-h100", nodes=2), "allgather", SIZES)
    assert nccl_modelled_times(load_topology("dgx-a100", nodes=2), "allgather", SIZES) == {}


def test_nccl_best_times_picks_pat_on_one_gpu_machines_at_large_sizes(tmp_path):
    topology = load_topology(write_one_gpu_machine(tmp_path), nodes=8)
    best = nccl_best_times(topology, "allgather", [2**30])
    expected = 3 * PAT_ROUTE_ALPHA_US + 7 / 8 * 2**30 / (PAT_ROUTE_GBPS * 1000)
    assert [(c.name, c.size_bytes) for c in best] == [("nccl-pat", 2**30)]
    assert best[0].time_us == pytest.approx(expected, rel=1e-12)


def test_nccl_best_times_is_nvls_at_64mb_and_a_ring_or_tree_without_a_reducing_switch():
    (h100,) = nccl_best_times(load_topology("dgx-h100"), "allreduce", [64 * 2**20])
    assert h100.name == "nccl-nvls" and h100.time_us == pytest.approx(_nvls_allreduce_us(64 * 2**20), rel=1e-12)
    a100 = nccl_best_times(load_topology("dgx-a100"), "allreduce", [2**10, 64 * 2**20])
    assert all(choice.name.startswith(("ring-", "tree-")) for choice in a100)
    # only NCCL's own algorithms: never our packed trees or hierarchical rings, which compare_baselines also has
    compared = compare_baselines(load_topology("dgx-a100"), "allreduce", [2**10, 64 * 2**20])
    for choice, baseline in zip(a100, compared):
        assert choice.time_us >= baseline.fastest[1].time_us


def _every_candidate_simulated(topology, collective: str, sizes) -> list[tuple[str, float]]:
    """Return NCCL's best per size the exhaustive way: every ring and tree built and simulated at every size.

    The path ``nccl_best_times`` took before it skipped sizes where the bound exceeds a modelled
    time: a tree per size at its own pipeline depth, ties to the earlier of ring, tree, modelled.
    """
    best: dict[int, tuple[str, float]] = {}

    def faster(size: int, name: str, time_us: float) -> None:
        if size not in best or time_us < best[size][1]:
            best[size] = (name, time_us)

    kinds = ("ring", "tree") if collective == "allreduce" else ("ring",)
    for kind in kinds:
        for size in sizes:
            algorithm = build_baseline(kind, topology, collective, size_bytes=size)
            faster(size, algorithm.name, simulate(algorithm, topology, size).time_us)
    for name, times in nccl_modelled_times(topology, collective, sizes).items():
        for time in times:
            faster(time.size_bytes, name, time.time_us)
    return [best[size] for size in sizes]


@pytest.mark.parametrize(
    ("machine", "nodes", "collective"),
    [
        ("dgx-h100", 1, "allreduce"),
        pytest.param("dgx-h100", 2, "allreduce", marks=pytest.mark.slow),  # 40 s: 16 GPUs' ring and tree
        ("dgx-h100", 1, "allgather"),
        ("dgx-a100", 1, "allreduce"),
    ],
)
def test_nccl_best_times_equals_simulating_every_candidate_at_every_size(machine, nodes, collective):
    topology = load_topology(machine, nodes=nodes)
    sizes = [2**k for k in range(16, 31, 2)]
    fast = [(choice.name, choice.time_us) for choice in nccl_best_times(topology, collective, sizes)]
    assert fast == _every_candidate_simulated(topology, collective, sizes)
    # the one-machine AllReduce skips rings and trees at large sizes, where NVLS is below every one's bound
    if (machine, nodes, collective) == ("dgx-h100", 1, "allreduce"):
        assert fast[-1][0] == "nccl-nvls"


def test_nvls_is_the_fastest_baseline_at_64mb_on_dgx_h100_but_never_kept():
    topology = load_topology("dgx-h100")
    compared = compare_baselines(topology, "allreduce", SIZES, keep=exportable)
    big = compared[SIZES.index(64 * 2**20)]
    modelled, result = big.fastest
    assert isinstance(modelled, ModelledBaseline) and not is_schedule(modelled)
    assert modelled.name == "nccl-nvls"
    assert result.time_us == pytest.approx(_nvls_allreduce_us(64 * 2**20), rel=1e-12)
    assert result.model == "nccl-model" and result.fraction_of_bound <= 1
    assert isinstance(big.kept[0], Algorithm) and exportable(big.kept[0])
    assert big.kept[1].time_us > result.time_us
    for baseline in compared:
        assert isinstance(baseline.kept[0], Algorithm) and is_schedule(baseline.kept[0])
    # without keep too: kept is the fastest schedule, best_baselines never returns the modelled one
    assert all(isinstance(found[0], Algorithm) for found in best_baselines(topology, "allreduce", SIZES))


def test_no_modelled_baseline_competes_without_a_reducing_switch():
    compared = compare_baselines(load_topology("dgx-a100"), "allreduce", [64 * 2**20])
    assert is_schedule(compared[0].fastest[0]) and compared[0].fastest == compared[0].kept


# `taccl synthesize` on DGX-H100 against NVLS (the row's baseline, its time and the vs-baseline cell):
# tests/test_cli_synth.py::test_allreduce_on_dgx_h100_is_ahead_of_nccls_nvls_and_measured_against_the_in_network_bound.


def test_cli_baseline_nvls_prints_the_modelled_times(capsys):
    assert main(["baseline", "nvls", "--topology", "dgx-h100", "--sizes", "64MB,1GB"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip().startswith(("64MB", "1GB"))}
    rate, _, link_rate, _ = _dgx_h100_figures()
    for label, size in (("64MB", 64 * MB), ("1GB", 10**9)):
        _, name, time_us, algbw, busbw, fraction = rows[label]
        expected = _nvls_allreduce_us(size)
        bound = in_network_reduction_bounds(load_topology("dgx-h100"), [size])[0].time_us
        assert name == "nccl-nvls" and float(time_us) == pytest.approx(expected, abs=0.01)
        assert float(algbw) == pytest.approx(size / expected / 1000, abs=0.01)
        assert float(busbw) == pytest.approx(size / expected / 1000 * 2 * 7 / 8, abs=0.01)
        assert float(fraction) == pytest.approx(bound / expected, abs=1e-3)
    assert "cannot be written as a schedule" in out
    assert link_rate > rate  # the switch's rate binds, not the link's


def test_cli_baseline_nvls_refuses_an_output_file(tmp_path, capsys):
    out = tmp_path / "nvls.json"
    assert main(["baseline", "nvls", "--topology", "dgx-h100", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {out}: -o: ") and "no schedule" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_baseline_nvls_refuses_a_machine_without_it(capsys):
    assert main(["baseline", "nvls", "--topology", "dgx-a100"]) == 2
    assert "NCCL runs no nvls allreduce on dgx-a100" in capsys.readouterr().err


def test_cli_baseline_ring_still_needs_an_output_file(capsys):
    assert main(["baseline", "ring", "--topology", "ndv2", "-c", "allgather"]) == 2
    assert "-o: missing for ring" in capsys.readouterr().err


def test_cli_baseline_pat_prints_its_time_on_one_gpu_machines(tmp_path, capsys):
    path = write_one_gpu_machine(tmp_path)
    assert (
        main(["baseline", "pat", "--topology", str(path), "--nodes", "4", "-c", "reducescatter", "--sizes", "1MB"]) == 0
    )
    out = capsys.readouterr().out
    (row,) = [line.split() for line in out.splitlines() if line.strip().startswith("1MB")]
    expected = 2 * PAT_ROUTE_ALPHA_US + 3 / 4 * MB / (PAT_ROUTE_GBPS * 1000)
    assert row[1] == "nccl-pat" and float(row[2]) == pytest.approx(expected, abs=0.01)
    assert "reducescatter, 4 GPUs" in out
