"""The doubling baseline: Bruck's doubling per rail across machines, direct exchange inside a machine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taccl_py.baselines import BaselineKind, applicable_kinds, build_baseline, compare_baselines
from taccl_py.baselines.doubling import bruck_steps, doubling_algorithm, doubling_pieces_by_size
from taccl_py.errors import ArgumentError
from taccl_py.simulate import MSCCL_LOOP, simulate
from taccl_py.synth.candidates import exportable
from taccl_py.topology import load_topology
from taccl_py.verify import verify_algorithm

from helpers import write_one_gpu_machine

MiB = 1 << 20
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def test_bruck_steps_cover_every_other_machine_once():
    for machines in range(2, 20):
        steps = bruck_steps(machines)
        assert len(steps) == (machines - 1).bit_length()
        assert 1 + sum(count for _, count in steps) == machines


@pytest.mark.parametrize("nodes", [2, 4, 3])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_doubling_is_verified_on_dgx_a100_machines(nodes, collective):
    topology = load_topology("dgx-a100", nodes=nodes)
    for pieces in (None, 1):
        algorithm = build_baseline("doubling", topology, collective, pieces)
        assert verify_algorithm(algorithm).ok, algorithm.name
        assert max(len(program.threadblocks) for program in algorithm.ranks) <= 64


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_doubling_is_verified_with_one_gpu_on_each_of_six_machines(tmp_path, collective):
    topology = load_topology(write_one_gpu_machine(tmp_path), nodes=6)
    assert BaselineKind.DOUBLING in applicable_kinds(topology, collective)
    algorithm = doubling_algorithm(topology, collective, piece_blocks=1)
    assert verify_algorithm(algorithm).ok
    # Bruck over 6 machines: 3 steps to the machines 1, 2 and 4 back; the reductions mirror a gather
    # that runs the other way round, so every collective sends to the same three machines
    sends = {tb.send_peer for tb in algorithm.ranks[0].threadblocks if tb.send_peer is not None}
    assert sends == {5, 4, 2}


def test_doubling_beats_the_ring_at_one_mebibyte_on_eight_dgx_h100():
    topology = load_topology("dgx-h100", nodes=8)
    ring = build_baseline("ring", topology, "allgather")
    doubling = build_baseline("doubling", topology, "allgather")
    ring_us = simulate(ring, topology, MiB, model=MSCCL_LOOP).time_us
    doubling_us = simulate(doubling, topology, MiB, model=MSCCL_LOOP).time_us
    # 3 network steps of α 2.7 µs against the ring's 63 hops, 7 of them across machines
    assert doubling_us < ring_us / 4
    assert max(len(program.threadblocks) for program in doubling.ranks) <= 64
    assert max(len(tb.steps) for program in doubling.ranks for tb in program.threadblocks) <= 64
    assert exportable(doubling), "MSCCL loads it, so it may stand in a library band"


def test_doubling_reaches_four_fifths_of_the_bound_at_16_mib_on_128_h100():
    """Issue 47: 16 MiB on DGX H100 x 16 in half blocks, two channels half a block apart (53.0 us; 56.3 before)."""
    topology = load_topology("dgx-h100", nodes=16)
    (pieces,) = doubling_pieces_by_size(topology, [16 * MiB])
    algorithm = doubling_algorithm(topology, "allgather", piece_blocks=pieces)
    # 128 KiB blocks go in halves: 128 ranks x 2 channels x 2 halves
    assert algorithm.chunks_per_loop == 128 * 4
    result = simulate(algorithm, topology, 16 * MiB, model=MSCCL_LOOP)
    assert result.fraction_of_bound >= 0.80, (algorithm.name, result.time_us, result.bound_time_us)


def test_doubling_pieces_go_in_halves_from_128_kib_blocks_gathering_and_512_kib_reducing():
    topology = load_topology("dgx-h100", nodes=16)  # 128 GPUs: 1 MiB is 8 KiB blocks, 16 MiB 128 KiB, 64 MiB 512 KiB
    sizes = [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    assert doubling_pieces_by_size(topology, sizes) == {None: [MiB], 2: [4 * MiB], 1: [16 * MiB, 64 * MiB]}
    for collective in ("reducescatter", "allreduce"):
        groups = doubling_pieces_by_size(topology, sizes, collective)
        assert groups == {None: [MiB], 2: [4 * MiB, 16 * MiB], 1: [64 * MiB]}


def test_doubling_competes_in_compare_baselines():
    topology = load_topology("dgx-h100", nodes=4)
    (compared,) = compare_baselines(topology, "allgather", [MiB])
    assert compared.fastest is not None and compared.fastest[0].name.startswith("doubling-")


def test_doubling_refuses_one_machine_and_alltoall():
    with pytest.raises(ArgumentError, match="two or more machines"):
        doubling_algorithm(load_topology("dgx-h100"), "allgather")
    with pytest.raises(ArgumentError, match="no doubling baseline for alltoall"):
        doubling_algorithm(load_topology("dgx-h100", nodes=2), "alltoall")
    assert BaselineKind.DOUBLING not in applicable_kinds(load_topology("dgx-h100"), "allgather")


def test_local_copies_spread_over_threadblocks_so_two_channels_load_on_many_machines(tmp_path):
    """Each forwarding lane's copies get a threadblock of their own: 39 steps, where one held 81 (MSCCL loads 64)."""
    topology = load_topology(write_one_gpu_machine(tmp_path), nodes=40)
    two = doubling_algorithm(topology, "allgather", channels=2, piece_blocks=2)
    assert exportable(two, "msccl") and verify_algorithm(two).ok
    for program in two.ranks:
        local = [tb for tb in program.threadblocks if tb.send_peer is None and tb.recv_peer is None]
        # Both channels' own parts and the staggered channel's scratch copy of its own; each lane's 39 blocks.
        assert sorted(len(tb.steps) for tb in local) == [3, 39, 39]
        assert len({tb.channel for tb in local}) == 3


def test_a_doubling_over_the_threadblock_limit_competes_with_fewer_channels():
    from taccl_py.baselines.choice import _loadable_variant
    from taccl_py.ir.collectives import Collective

    topology = load_topology("dgx-h100", nodes=4)
    two = build_baseline("doubling", topology, "allgather", 2, size_bytes=64 * MiB)
    assert two.meta("channels", str(two.num_channels)) == "2"
    # Stand-in for 65 threadblocks: MSCCL loads 64 per GPU, and a variant must fit that limit.
    crowded = replace(two, ranks=(replace(two.ranks[0], threadblocks=two.ranks[0].threadblocks * 3),) + two.ranks[1:])

    def keep(algorithm):
        return algorithm.meta("channels", str(algorithm.num_channels)) == "1" and exportable(algorithm)

    one = _loadable_variant(crowded, keep, BaselineKind.DOUBLING, topology, Collective.ALLGATHER, 2, 64 * MiB)
    assert one is not None and keep(one)
    assert verify_algorithm(one).ok
    assert _loadable_variant(two, keep, BaselineKind.DOUBLING, topology, Collective.ALLGATHER, 2, 64 * MiB) is None


@pytest.mark.parametrize("collective", ["reducescatter", "allreduce"])
@pytest.mark.parametrize(("machine", "nodes", "piece_blocks"), [("one-gpu", 4, None), ("ndv2", 2, 1)])
def test_doubling_reductions_are_right_in_place(tmp_path, collective, machine, nodes, piece_blocks):
    """PyTorch's all_reduce runs in place: each rank's sums start from its own input, never overwrite it."""
    from taccl_py.ir.inplace import serves_both_placements
    from taccl_py.verify import exported_inplace_form

    name = write_one_gpu_machine(tmp_path) if machine == "one-gpu" else machine
    topology = load_topology(name, nodes=nodes)
    algorithm = doubling_algorithm(topology, collective, piece_blocks=piece_blocks)
    variant, why_not = exported_inplace_form(algorithm)
    assert why_not is None and variant is not None and verify_algorithm(variant).ok
    # the own-input copies that seed the sums copy a chunk onto itself in place, and go
    assert not serves_both_placements(algorithm, variant)
