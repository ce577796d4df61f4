"""Which message sizes MSCCL++'s executor takes for a plan (``checkMessageSize``), and where its 32-bit offsets end.

Hand-made plans check the rule itself; an export of the shipped NDv2 x1 AllGather library, rivals
built as ``taccl export-mscclpp`` builds them, checks that every plan written takes every size
frameworks pass in its range, on every rank.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from taccl_py.baselines import ring_algorithm
from taccl_py.cli.mscclpp import library_rivals
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library, shipped_library_paths
from taccl_py.mscclpp import parse_mscclpp_plan
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.files import generate_library_plans
from taccl_py.mscclpp.plan import ExecutionPlan, Gpu, Protocol
from taccl_py.mscclpp.sizes import (
    OFFSET_LIMIT,
    acceptance_rule,
    executor_accepts,
    first_accepted_min,
    framework_sizes,
    largest_addressable_size,
    refused_sizes,
)
from taccl_py.topology import load_topology

MIB = 1 << 20
POWERS = tuple(1 << bit for bit in range(33))


def _plan(
    collective: str,
    ranks: int,
    input_chunks: int,
    output_chunks: int,
    scratch_chunks: int = 0,
    **fields,
) -> ExecutionPlan:
    gpus = tuple(Gpu(rank, input_chunks, output_chunks, scratch_chunks, ()) for rank in range(ranks))
    return ExecutionPlan("hand-made", collective, Protocol.SIMPLE, False, gpus, **fields)


def test_six_rings_on_ndv2_refuse_every_power_of_two_and_take_3_mib():
    # ring-6ch-1p: AllReduce 48 chunks per buffer, AllGather 6 input and 48 output chunks
    for plan in (_plan("allreduce", 8, 48, 48, 84), _plan("allgather", 8, 6, 48, 36)):
        assert not any(executor_accepts(plan, size) for size in POWERS)
        assert executor_accepts(plan, 3 * MIB) and executor_accepts(plan, 24 * MIB)
        assert not executor_accepts(plan, 25 * MIB) and not executor_accepts(plan, 100 * MIB)
        rule = acceptance_rule(plan)
        assert (rule.multiple_bytes, rule.powers_of_two_from) == (768, None)
        assert rule.describe() == "multiples of 768 B (no power of two)"
        assert first_accepted_min(plan) is None
        assert 25 * MIB in refused_sizes(plan) and 3 * MIB not in refused_sizes(plan)


def test_buffers_must_split_into_aligned_chunks():
    plan = _plan("allreduce", 2, 4, 4)
    assert [executor_accepts(plan, size) for size in (16, 32, 48, 64, 128)] == [False, False, False, True, True]
    wide = replace(plan, buffer_alignment=32)
    assert not executor_accepts(wide, 64) and executor_accepts(wide, 128)
    assert acceptance_rule(plan).multiple_bytes == 64 and acceptance_rule(wide).multiple_bytes == 128


def test_allgather_and_reducescatter_split_the_message_over_the_ranks():
    allgather = _plan("allgather", 8, 1, 8)  # input: 1/8 of the message, in one chunk
    assert not executor_accepts(allgather, 64)  # 8 bytes per rank: not 16-byte aligned
    assert executor_accepts(allgather, 128) and not executor_accepts(allgather, 128 + 64)
    assert not executor_accepts(allgather, 16 * 8 * 3 + 4)  # no exact split over 8 ranks
    reducescatter = _plan("reducescatter", 8, 8, 1)  # output: 1/8 of the message
    assert not executor_accepts(reducescatter, 64) and executor_accepts(reducescatter, 128)
    assert executor_accepts(reducescatter, 3 * MIB) and executor_accepts(reducescatter, 25 * MIB)
    assert acceptance_rule(allgather).multiple_bytes == acceptance_rule(reducescatter).multiple_bytes == 128


def test_the_range_bounds_what_is_taken_and_narrows_to_the_first_taken_size():
    plan = _plan("allgather", 8, 1, 8, max_message_size=31999)
    assert refused_sizes(plan) == (1, 2, 4, 8, 16, 32, 64)
    assert first_accepted_min(plan) == 128 and acceptance_rule(plan).powers_of_two_from == 128
    assert not executor_accepts(plan, 32768)  # above the range
    later = replace(plan, min_message_size=32000, max_message_size=127999)
    assert refused_sizes(later) == () and first_accepted_min(later) == 32000
    assert acceptance_rule(later).powers_of_two_from == 32768


def test_framework_sizes_are_powers_of_two_and_three_mib_multiples():
    expected = sorted([*(1 << bit for bit in range(7, 25)), 3 * MIB, 25 * MIB])  # 128 B to 16 MiB
    assert framework_sizes(100, 30 * MIB) == tuple(expected)
    assert framework_sizes(0, 4) == (1, 2, 4) and framework_sizes(5, 7) == ()
    assert 100 * MIB in framework_sizes(64 * MIB, 128 * MIB)


def test_the_84_48_allreduce_ring_wraps_its_scratch_offsets_from_about_2_3_gib():
    plan = _plan("allreduce", 8, 48, 48, 84)
    largest = largest_addressable_size(plan)
    assert 2.28 * (1 << 30) < largest < 2.29 * (1 << 30)
    scratch_bytes = [size * 84 // 48 for size in (largest, largest + 1)]  # 84 chunks of size / 48
    assert scratch_bytes[0] < OFFSET_LIMIT <= scratch_bytes[1]
    ll = replace(plan, protocol=Protocol.LL, use_double_scratch_buffer=True)  # data and flag, twice
    assert largest_addressable_size(ll) == (OFFSET_LIMIT * 48 - 1) // (84 * 4)
    assert largest_addressable_size(_plan("allgather", 8, 1, 8)) == OFFSET_LIMIT - 1  # the output holds it all
    # an open range is checked only as far as it can address
    assert refused_sizes(plan)[-1] == 1 << 31 and framework_sizes(0, largest)[-1] == 1 << 31


@pytest.mark.parametrize("protocol", ["Simple", "LL"])
def test_an_exported_plan_ends_where_its_own_buffers_would_wrap(protocol):
    ring = ring_algorithm(load_topology("ndv2"), Collective.ALLREDUCE)
    document = generate_mscclpp_plan(ring, protocol=protocol)  # an open-ended band
    plan = parse_mscclpp_plan(json.dumps(document), "ring.json")
    assert document["max_message_size"] == largest_addressable_size(plan) < OFFSET_LIMIT
    (gpu,) = {(gpu.input_chunks, gpu.scratch_chunks) for gpu in plan.gpus}  # the real counts, not the algorithm's
    factor = 4 if protocol == "LL" else 1
    assert (document["max_message_size"] + 1) * gpu[1] * factor // gpu[0] >= OFFSET_LIMIT
    band = replace(ring, min_bytes=MIB, max_bytes=2 * MIB)
    assert generate_mscclpp_plan(band, protocol=protocol)["max_message_size"] == 2 * MIB - 1
    huge = replace(ring, min_bytes=3 << 30, max_bytes=None)  # every size past where the scratch wraps
    with pytest.raises(ArgumentError, match=r"offsets past 2\^32 bytes from \d+ bytes, below the band's 3221225472"):
        generate_mscclpp_plan(huge, protocol=protocol)


def test_the_ndv2_allgather_export_takes_every_framework_size_in_every_range():
    topology = load_topology("ndv2")
    library = read_library(next(p for p in shipped_library_paths("ndv2", 1) if "allgather" in p.name))
    plans = generate_library_plans(library, topology, rivals=library_rivals(library, topology))
    ours = [band for band in library.bands if not band.native]  # from 2 MiB NCCL's 6 rings run (issue 47)
    assert len(ours) >= 2 and plans.skipped == () and len(plans.files) == len(plans.ranges) == 2 * len(ours)
    for (name, text), served in zip(plans.files, plans.ranges):
        plan = parse_mscclpp_plan(text, name)
        assert "ring-6ch" not in plan.name  # the 6-ring rival takes no power of two
        assert plan.max_message_size <= largest_addressable_size(plan) < OFFSET_LIMIT
        assert (plan.min_message_size, plan.max_message_size) == (served.min_bytes, served.max_bytes)
        sizes = framework_sizes(plan.min_message_size, plan.max_message_size)
        assert sizes and all(executor_accepts(plan, size) for size in sizes), name  # every rank's buffers
        assert served.rule.powers_of_two_from is not None
    band0 = dict(zip((name for name, _ in plans.files), plans.ranges))["ndv2-n1-allgather-0.json"]
    assert band0.min_bytes == 128 and band0.narrowed == "serves from 128 bytes, 0-127 left to NCCL"


def test_a_band_whose_plan_takes_no_power_of_two_is_left_to_nccl():
    six_rings = ring_algorithm(load_topology("ndv2"), Collective.ALLGATHER)  # 6 chunks per rank
    bands = (SizeBand(0, MIB, None, "native"), SizeBand(MIB, 8 * MIB, six_rings, "1.json"))
    plans = generate_library_plans(AlgorithmLibrary("ndv2", 1, Collective.ALLGATHER, 8, bands))
    assert plans.files == () and plans.ranges == ()
    why = "its plan takes multiples of 768 B (no power of two); its sizes are left to NCCL"
    assert plans.skipped == ((1, f"out of place: {why}"), (1, f"in place: {why}"))


def test_verify_warns_where_mscclpp_would_misread_min_message_size():
    from taccl_py.mscclpp.sizes import MIN_MESSAGE_SIZE_LIMIT, executor_warnings

    plan = _plan("allreduce", 4, 8, 8, 8, min_message_size=MIN_MESSAGE_SIZE_LIMIT, max_message_size=2**32 - 1)
    assert any("reads as a negative int" in line for line in executor_warnings(plan))
    assert not any("negative" in line for line in executor_warnings(replace(plan, min_message_size=2**31 - 16)))
