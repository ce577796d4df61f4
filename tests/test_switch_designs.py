"""Switch designs (NVLS as a schedule, switch + point-to-point splits, multicast AllGather) and their choice."""

from __future__ import annotations

import pytest

from taccl_py.baselines import build_baseline
from taccl_py.baselines.nvls import nvls_allreduce_times
from taccl_py.bounds.reduction import in_network_reduction_bounds
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.msccl.selection import selectable_for_powers_of_two
from taccl_py.simulate import simulate_sizes
from taccl_py.synth import synthesize
from taccl_py.synth.switch_candidates import _slice_for_share, switch_candidates
from taccl_py.synth.switch_designs import multicast_allgather, split_allreduce, switch_allreduce
from taccl_py.topology import load_topology
from taccl_py.verify import verify_algorithm

SIZES = [2**20, 2**26, 2**30]


@pytest.fixture(scope="module")
def h100():
    return load_topology("dgx-h100")


@pytest.mark.parametrize(("slice_chunks", "channels", "inplace"), [(1, 1, False), (7, 2, False), (4, 4, True)])
def test_switch_allreduces_verify(h100, slice_chunks, channels, inplace):
    algorithm = switch_allreduce(h100, slice_chunks=slice_chunks, channels=channels, inplace=inplace)
    assert algorithm.chunks_per_loop == 8 * slice_chunks
    assert verify_algorithm(algorithm).ok


def test_a_split_verifies_and_beats_nvls_where_the_ports_have_room_left(h100):
    """7/8 of the buffer through the switch at 308.6 GB/s, the rest point to point on the 370.8 GB/s ports."""
    ring = build_baseline("ring", h100, "allreduce", channels=1)
    split = split_allreduce(switch_allreduce(h100, slice_chunks=7, channels=2, first_channel=1), ring, "split")
    assert verify_algorithm(split).ok and split.chunks_per_loop == 64
    nvls = nvls_allreduce_times(h100, SIZES)
    for result, nccl, bound in zip(simulate_sizes(split, h100, SIZES), nvls, in_network_reduction_bounds(h100, SIZES)):
        assert result.time_us >= bound.time_us
    assert nvls[-1].time_us / result.time_us > 1.05  # at 1 GiB, in the msccl model


def test_the_model_caps_a_split_at_the_ports_mixed_rate(h100):
    """No split beats M / 309.8 GB/s, the best share s solving 1.125 s / 308.6 = (1.125 s + 1.75 (1 - s)) / 370.8."""
    ring = build_baseline("ring", h100, "allreduce", channels=1)
    split = split_allreduce(switch_allreduce(h100, slice_chunks=8, channels=2, first_channel=1), ring, "split")
    (result,) = simulate_sizes(split, h100, [2**30], model="chunks")
    share = 1.75 / (1.125 * 370.8 / 308.6 + 1.75 - 1.125)
    cap_GBps = 308.6 / (1.125 * share)
    assert 2**30 / result.time_us / 1e3 <= cap_GBps * 1.0001
    assert 2**30 / result.time_us / 1e3 > 0.99 * cap_GBps  # within 1% of it on whole chunks


def test_a_split_refuses_parts_of_different_collectives(h100):
    ring = build_baseline("ring", h100, "allgather", channels=1)
    with pytest.raises(ArgumentError, match="two AllReduces"):
        split_allreduce(switch_allreduce(h100), ring, "bad")


def test_the_multicast_allgather_verifies_and_takes_one_alpha(h100):
    algorithm = multicast_allgather(h100, channels=2)
    assert verify_algorithm(algorithm).ok
    (small,) = simulate_sizes(algorithm, h100, [1024], model="chunks")
    # each port takes in all 16 pieces (its own two included) at the NVLS rate
    assert small.time_us == pytest.approx(0.6 + 1024 / 308.6e3, rel=1e-9)


def test_designs_need_one_machine_whose_switch_reduces():
    with pytest.raises(ArgumentError, match="one machine whose NVSwitch reduces"):
        switch_allreduce(load_topology("dgx-a100"))
    assert switch_candidates(load_topology("dgx-h100", nodes=2), Collective.ALLREDUCE, SIZES) == []
    assert switch_candidates(load_topology("dgx-h100"), Collective.REDUCESCATTER, SIZES) == []


def test_split_shares_prefer_power_of_two_loops(h100):
    ring = build_baseline("ring", h100, "allreduce", channels=1)  # 8 chunks
    assert [_slice_for_share(share, ring, 8) for share in (0.5, 0.75, 0.875)] == [1, 3, 7]


def test_every_switch_candidate_is_verified_and_respects_its_bound(h100):
    ring = build_baseline("ring", h100, "allreduce", channels=1)
    found = switch_candidates(h100, Collective.ALLREDUCE, SIZES, [ring])
    assert len(found) > 10
    for algorithm, results in found:
        assert verify_algorithm(algorithm).ok
        assert selectable_for_powers_of_two(algorithm)
        assert all(r.time_us >= r.bound_time_us for r in results)


def test_synthesis_on_dgx_h100_beats_nvls_with_a_switch_design(h100):
    result = synthesize(h100, "allreduce", sizes=[2**26])
    (choice,) = result.choices
    assert choice.chosen.uses_switch
    assert choice.baseline_name == "nccl-nvls"
    assert choice.baseline.time_us / choice.chosen_result.time_us >= 1.05
    assert result.library is not None and result.library.bands[0].algorithm.uses_switch


def test_a_library_without_routing_chooses_among_designs_and_baselines(h100):
    from taccl_py.synth.designs_only import DESIGNS_ONLY_NOTE, choose_designs

    result = choose_designs(h100, "allreduce", [2**20, 2**26])
    assert result.library.provenance.note == DESIGNS_ONLY_NOTE
    assert result.choices[-1].chosen.uses_switch  # no MILP, yet ahead of NVLS at 64 MiB
    assert result.choices[-1].baseline.time_us > result.choices[-1].chosen_result.time_us
    scatter = choose_designs(h100, "reducescatter", [2**20, 2**26])  # no design: the kept baselines
    assert all(not band.algorithm.uses_switch for band in scatter.library.bands)
    with pytest.raises(ArgumentError, match="two or more sizes"):
        choose_designs(h100, "alltoall", [2**20, 2**26])


def test_a_size_where_nccls_modelled_algorithm_wins_is_left_to_nccl(h100):
    """A library band never holds a schedule slower than NVLS: that size becomes a native band."""
    from taccl_py.baselines.nccl import is_schedule
    from taccl_py.ir.library import NATIVE_ALGORITHM
    from taccl_py.solvers import SolverOptions
    from taccl_py.synth.bands import build_library, choose_per_size
    from taccl_py.synth.outcome import best_baselines_per_size

    sizes = (2**16, 2**28)
    baselines = best_baselines_per_size(h100, Collective.ALLREDUCE, sizes, SolverOptions(), True, None)
    assert is_schedule(baselines[0].fastest[0]) and baselines[1].fastest[0].name == "nccl-nvls"
    ring = build_baseline("ring", h100, "allreduce", channels=1)
    pool = [(ring, tuple(simulate_sizes(ring, h100, sizes)))]
    choices = choose_per_size(sizes, pool, baselines, leave_to_native=True)
    assert not choices[0].native  # at 64 KiB a schedule is NCCL's fastest: it may be written
    assert choices[-1].native  # at 256 MiB the ring is 0.7x NVLS
    library = build_library("dgx-h100", 1, Collective.ALLREDUCE, 8, choices, "allreduce")
    top = library.bands[-1]
    assert top.native and top.algorithm_file == NATIVE_ALGORITHM
    assert top.simulated_time_us == baselines[-1].fastest[1].time_us
    assert not any(c.native for c in choose_per_size(sizes, pool, baselines))  # one size: never native


def test_nccl_is_left_a_size_even_where_an_unwritable_schedule_beats_it(h100):
    """NCCL runs a size its modelled algorithm wins against every writable one, however fast an unloadable one is."""
    from dataclasses import replace

    from taccl_py.baselines import ComparedBaseline
    from taccl_py.solvers import SolverOptions
    from taccl_py.synth.bands import build_library, choose_per_size
    from taccl_py.synth.outcome import best_baselines_per_size

    sizes = (2**28,)
    (compared,) = best_baselines_per_size(h100, Collective.ALLREDUCE, sizes, SolverOptions(), True, None)
    nvls = compared.native
    assert nvls is not None and nvls[0].name == "nccl-nvls"
    ring = build_baseline("ring", h100, "allreduce", channels=1)
    ring_result = simulate_sizes(ring, h100, sizes)[0]
    assert ring_result.time_us > nvls[1].time_us
    # A schedule MSCCL refuses (stood in by the ring at a tenth of NVLS's time) is the fastest baseline.
    unloadable = (replace(ring, name="unloadable"), replace(ring_result, time_us=nvls[1].time_us / 10))
    baselines = (ComparedBaseline(sizes[0], unloadable, (ring, ring_result), nvls),)
    (choice,) = choose_per_size(sizes, [], baselines, leave_to_native=True)
    assert choice.native and choice.baseline_name == "unloadable"
    assert choice.runs_us == nvls[1].time_us < choice.chosen_result.time_us
    band = build_library("dgx-h100", 1, Collective.ALLREDUCE, 8, (choice,), "allreduce").bands[0]
    assert band.native and band.simulated_time_us == nvls[1].time_us
    faster_ring = replace(ring_result, time_us=nvls[1].time_us / 2)  # a writable schedule faster than NCCL is kept
    baselines = (ComparedBaseline(sizes[0], unloadable, (ring, faster_ring), nvls),)
    assert not choose_per_size(sizes, [], baselines, leave_to_native=True)[0].native
