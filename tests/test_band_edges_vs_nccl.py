"""Bands left to NCCL where its own built ring wins, and band edges where two bands cross (issue 47)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taccl_py.baselines import build_baseline, compare_baselines
from taccl_py.baselines.nccl import ModelledBaseline, nccl_best_times
from taccl_py.errors import InfeasibleError
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.msccl.selection import power_of_two_sizes
from taccl_py.simulate import simulate_sizes
from taccl_py.synth.bands import SizeChoice, build_library, choose_per_size, crossover_edge
from taccl_py.synth.candidates import exportable, geometric_middle
from taccl_py.topology import load_topology


def test_nccls_unloadable_built_ring_is_native_and_takes_the_size_it_wins():
    """NDv2 AllGather at 4 MB: NCCL's 6-channel ring (48 chunks a loop, never selected) beats every loadable one."""
    topology, size = load_topology("ndv2"), 4_096_000
    (compared,) = compare_baselines(topology, "allgather", (size,), keep=exportable)
    native, kept = compared.native, compared.kept
    assert native is not None and not exportable(native[0]), "NCCL's ring as built, not a loadable variant"
    (nccl,) = nccl_best_times(topology, "allgather", (size,))
    assert (native[0].name, native[1].time_us) == (nccl.name, nccl.time_us) == ("ring-6ch-1p", nccl.time_us)
    assert native[1].time_us < kept[1].time_us
    (choice,) = choose_per_size((size,), [], (compared,), leave_to_native=True)
    assert choice.native and choice.runs_us == nccl.time_us and choice.chosen is kept[0]


def test_a_size_where_no_schedule_loads_is_left_to_nccl_and_a_one_size_run_says_why():
    """Where every baseline breaks a runtime limit (NDv2 x32 AllReduce) the size is NCCL's, not ``min()`` of nothing."""
    topology, size = load_topology("ndv2"), 4_096_000
    (compared,) = compare_baselines(topology, "allgather", (size,), keep=exportable)
    nothing_loads = replace(compared, kept=None)
    (choice,) = choose_per_size((size,), [], (nothing_loads,), leave_to_native=True)
    assert choice.native and choice.runs_us == compared.native[1].time_us
    assert choice.chosen is compared.schedule[0] is compared.fastest[0] and choice.baseline_chosen
    library = build_library("ndv2", 1, choice.chosen.collective, 8, (choice,), "allgather")
    assert [band.native for band in library.bands] == [True]
    with pytest.raises(InfeasibleError, match=f"^synthesis: nothing that may be written runs {size} bytes"):
        choose_per_size((size,), [], (nothing_loads,))
    # Above 64 GPUs NCCL's ring is modelled, not built: the fastest baseline is no schedule (NDv2 x32 at 256 MiB).
    modelled = (ModelledBaseline("nccl-ring", choice.chosen.collective, 8), compared.native[1])
    (choice,) = choose_per_size((size,), [], (replace(nothing_loads, fastest=modelled),), leave_to_native=True)
    assert choice.native and choice.chosen is compared.schedule[0] and not choice.baseline_is_schedule
    with pytest.raises(InfeasibleError):
        choose_per_size((size,), [], (replace(nothing_loads, schedule=None),), leave_to_native=True)


def test_a_loadable_nccl_ring_stays_a_schedule_where_it_is_the_fastest():
    """Where NCCL's ring loads (PCIe, 2 channels) and is fastest, writing it ties NCCL: the size keeps the schedule."""
    topology, size = load_topology("pcie-8gpu"), 2**26
    (compared,) = compare_baselines(topology, "allgather", (size,), keep=exportable)
    assert compared.native[0] is compared.kept[0] and exportable(compared.kept[0])
    assert not choose_per_size((size,), [], (compared,), leave_to_native=True)[0].native


def _choice(algorithm, size, topology, native=False):
    """Return the choice of ``algorithm`` at ``size``; ``native``: left to NCCL, at NCCL's best time."""
    (result,) = simulate_sizes(algorithm, topology, (size,))
    (nccl,) = nccl_best_times(topology, algorithm.collective, (size,))
    return SizeChoice(
        size, algorithm, result, None, None, None, native=native, nccl=replace(result, time_us=nccl.time_us)
    )


def test_an_edge_to_nccl_sits_where_nccl_overtakes_not_at_the_middle_of_the_built_sizes():
    """DGX-H100 x2 AllReduce built at 1 and 4 MB: ours up to the crossover with NVLS-Tree, NCCL from there."""
    topology = load_topology("dgx-h100", nodes=2)
    shipped = read_library(next(p for p in shipped_library_paths("dgx-h100", 2) if p.name.startswith("allreduce")))
    ours = shipped.bands[0].algorithm
    low, high = 1_024_000, 4_096_000
    choices = (_choice(ours, low, topology), _choice(ours, high, topology, native=True))
    library = build_library("dgx-h100", 2, ours.collective, 16, choices, "allreduce", topology=topology)
    assert library.bands[0].max_bytes == library.bands[1].min_bytes != geometric_middle(low, high)
    assert library.bands[1].native
    probes = power_of_two_sizes(low + 1, high - 1)
    mine = [r.time_us for r in simulate_sizes(ours, topology, probes)]
    nccl = [c.time_us for c in nccl_best_times(topology, "allreduce", probes)]
    for size, us, them in zip(probes, mine, nccl):
        assert library.bands[0 if us <= them else 1].covers(size), size
    # without the topology the edge stays at the middle of the built sizes, as before
    assert build_library("dgx-h100", 2, ours.collective, 16, choices, "allreduce").bands[0].max_bytes == 2_048_000


def test_an_edge_between_two_schedules_sits_between_the_probes_where_they_cross():
    """DGX-H100 AllReduce, the tree built at 128 KiB, the ring at 8 MiB: they cross between 1 and 2 MiB, not at 1."""
    topology = load_topology("dgx-h100")
    tree, ring = build_baseline("tree", topology, "allreduce"), build_baseline("ring", topology, "allreduce")
    low, high = 2**17, 2**23
    probes = power_of_two_sizes(low + 1, high - 1)
    tree_us = [r.time_us for r in simulate_sizes(tree, topology, probes)]
    ring_us = [r.time_us for r in simulate_sizes(ring, topology, probes)]
    assert [r < t for t, r in zip(tree_us, ring_us)] == [size >= 2**21 for size in probes]
    choices = (_choice(tree, low, topology), _choice(ring, high, topology))
    edge = crossover_edge(*choices, topology)
    assert edge == geometric_middle(2**20, 2**21) != geometric_middle(low, high) == 2**20
    library = build_library("dgx-h100", 1, tree.collective, 8, choices, "allreduce", topology=topology)
    assert library.bands[0].covers(2**20) and library.bands[1].covers(2**21)
    assert crossover_edge(*choices, topology) == edge  # deterministic
    # built a power of two apart there is nothing between: the geometric middle, as before
    assert crossover_edge(_choice(tree, 2**20, topology), _choice(ring, 2**21, topology), topology) == edge
