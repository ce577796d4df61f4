"""NCCL's ring and tree at scale: closed forms against the replay, their use above 64 GPUs, NCCL's latencies."""

from __future__ import annotations

import pytest

from taccl_py.baselines import closed_form
from taccl_py.baselines.build import build_baseline, size_groups
from taccl_py.baselines.closed_form import (
    CLOSED_FORM_ABOVE_RANKS,
    RING_AGREEMENT,
    RING_PIPELINED_AGREEMENT,
    TREE_AGREEMENT,
    nccl_latency_us,
    representative,
    ring_closed_form,
    tree_closed_form,
)
from taccl_py.baselines.nccl import nccl_best_times
from taccl_py.ir.collectives import Collective
from taccl_py.simulate import MSCCL_LOOP, WHOLE_CHUNKS, execution_model, prepare_simulation, simulate_plan
from taccl_py.topology import load_topology

SIZES = (2**20, 2**24, 2**26, 2**30)


@pytest.mark.parametrize(
    ("machine", "nodes", "collective", "model"),
    [
        ("dgx-h100", 2, Collective.ALLGATHER, MSCCL_LOOP),
        ("dgx-a100", 2, Collective.ALLREDUCE, MSCCL_LOOP),
        ("dgx-h100", 3, Collective.REDUCESCATTER, WHOLE_CHUNKS),
    ],
)
def test_ring_closed_form_equals_the_replay(machine, nodes, collective, model):
    topology = load_topology(machine, nodes=nodes)
    name, times = ring_closed_form(topology, collective, SIZES, model)
    ring = build_baseline("ring", topology, collective)
    plan = prepare_simulation(ring, topology, model=model)
    assert name == ring.name
    for size, time_us in zip(SIZES, times):
        assert time_us == pytest.approx(simulate_plan(plan, size).time_us, rel=RING_AGREEMENT)


@pytest.mark.parametrize(
    ("machine", "nodes", "collective", "model"),
    [
        ("dgx-h100", 2, Collective.ALLGATHER, "msccl-net"),
        ("dgx-h100", 8, Collective.ALLREDUCE, "msccl-net"),
        ("mi300x", 4, Collective.ALLREDUCE, "msccl-net"),
        ("ndv2", 3, Collective.REDUCESCATTER, "pipelined"),
    ],
)
def test_pipelined_ring_form_is_within_its_stated_range_of_the_replay(machine, nodes, collective, model):
    topology = load_topology(machine, nodes=nodes)
    sizes = (2**20, 2**24, 2**26, 2**30)
    _, times = ring_closed_form(topology, collective, sizes, execution_model(model))
    plan = prepare_simulation(build_baseline("ring", topology, collective), topology, model=execution_model(model))
    serialized = ring_closed_form(topology, collective, sizes, MSCCL_LOOP)[1]
    low, high = RING_PIPELINED_AGREEMENT
    for size, time_us, slower in zip(sizes, times, serialized):
        assert low <= time_us / simulate_plan(plan, size).time_us <= high
        assert time_us <= slower  # pipelining never slows the ring


@pytest.mark.parametrize("model", ["msccl", "msccl-net"])
def test_tree_closed_form_is_within_its_stated_range_of_the_replay(model):
    topology = load_topology("dgx-h100", nodes=2)
    sizes = (2**20, 2**30)
    forms = dict(zip(sizes, tree_closed_form(topology, sizes, execution_model(model))))
    _, groups = size_groups("tree", topology, "allreduce", sizes)
    for chunks, group in groups.items():
        tree = build_baseline("tree", topology, "allreduce", chunks, size_bytes=group[-1])
        plan = prepare_simulation(tree, topology, model=execution_model(model))
        for size in group:
            name, time_us = forms[size]
            assert name == tree.name  # the pipeline depth tree_algorithm picks
            low, high = TREE_AGREEMENT
            assert low <= time_us / simulate_plan(plan, size).time_us <= high


def test_a_ring_inside_one_rack_has_a_pipelined_form_too():
    rack = load_topology("gb200-nvl72")  # 72 GPUs, one machine: closed form, no hop between machines
    sizes = (2**20, 2**30)
    for collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        net = ring_closed_form(rack, collective, sizes, execution_model("msccl-net"))
        assert net == ring_closed_form(rack, collective, sizes, MSCCL_LOOP)  # nothing to pipeline inside a rack
        piped = ring_closed_form(rack, collective, sizes, execution_model("pipelined"))[1]
        assert all(p <= s for p, s in zip(piped, net[1]))


def test_representative_joins_copies_of_the_machine_and_refuses_differing_ones():
    big = load_topology("dgx-h100", nodes=5)
    small = representative(big, 2)
    assert small.nodes == 2 and small.num_ranks == 16
    assert sorted(map(repr, small.links)) == sorted(map(repr, load_topology("dgx-h100", nodes=2).links))
    assert representative(load_topology("dgx-h100", nodes=2), 4).nodes == 2  # already small enough


def test_nccl_best_times_above_64_gpus_builds_and_replays_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a schedule was built above 64 GPUs")

    monkeypatch.setattr("taccl_py.baselines.nccl.build_baseline", refuse)
    gather = nccl_best_times(load_topology("dgx-h100", nodes=9), "allgather", SIZES)
    assert [c.name for c in gather] == ["nccl-ring-8ch-1p"] * 4
    times = [c.time_us for c in gather]
    assert times == sorted(times)
    reduce = nccl_best_times(load_topology("dgx-a100", nodes=9), "allreduce", SIZES)
    assert {c.name.split("-")[1] for c in reduce} <= {"ring", "tree"}
    assert reduce[0].name.startswith("nccl-tree")  # at 1 MiB the tree's log depth beats 142 ring steps


def test_the_ring_grows_linearly_with_the_ranks_the_tree_with_log2_of_the_machines():
    tiny = (1024,)
    ring = [
        ring_closed_form(load_topology("dgx-a100", nodes=n), Collective.ALLREDUCE, tiny, MSCCL_LOOP)[1][0]
        for n in (9, 17, 33)
    ]
    assert ring[2] - ring[1] == pytest.approx(2 * (ring[1] - ring[0]), rel=1e-5)  # 128 ranks more, then 256
    tree = [tree_closed_form(load_topology("dgx-a100", nodes=n), tiny, MSCCL_LOOP)[0][1] for n in (9, 17, 33)]
    assert tree[2] - tree[1] == pytest.approx(tree[1] - tree[0], rel=1e-9)  # one machine level more each time
    assert tree[2] < ring[0]


def test_nccls_latency_constants_ring_linear_tree_and_pat_logarithmic():
    ring = [nccl_latency_us("ring", Collective.ALLREDUCE, 8 * n, n) for n in (8, 16, 32, 64)]
    steps = [b - a for a, b in zip(ring, ring[1:])]
    assert steps[1] == pytest.approx(2 * steps[0]) and steps[2] == pytest.approx(2 * steps[1])
    tree = [nccl_latency_us("tree", Collective.ALLREDUCE, 8 * n, n) for n in (8, 16, 32, 64)]
    assert [b - a for a, b in zip(tree, tree[1:])] == pytest.approx([2 * 14.0] * 3)  # 2 interLat per doubling
    # PAT: log2i(nNodes) * interLat / 3.5 plus NCCL's linear 2.8 µs per rank (tuning.cc l. 432-433)
    assert nccl_latency_us("pat", Collective.ALLGATHER, 64, 64) == pytest.approx(6 * 14.0 / 3.5 + 2.8 * 64)
    assert nccl_latency_us("ring", Collective.ALLGATHER, 8, 1, "LL") == pytest.approx(7 * 0.6)
    assert closed_form.NCCL_BASE_LATENCY_US["ring"] == (6.6, 14.0, 8.4)


def test_the_threshold_keeps_64_gpus_built():
    assert CLOSED_FORM_ABOVE_RANKS == 64
    from taccl_py.baselines.nccl import closed_form_applies

    assert not closed_form_applies(load_topology("dgx-h100", nodes=8), "allgather")
    assert closed_form_applies(load_topology("dgx-h100", nodes=9), "allgather")
    assert not closed_form_applies(load_topology("dgx-h100", nodes=9), "alltoall")


def test_compare_baselines_above_64_gpus_sets_the_closed_form_ring_beside_the_built_kinds(monkeypatch):
    from taccl_py.baselines import choice
    from taccl_py.baselines.build import BaselineKind

    def refuse(*args, **kwargs):
        raise AssertionError("the ring was built above 64 GPUs")

    # only the ring family: the others (hierarchical, packed trees) are built as before, at their cost
    monkeypatch.setattr(choice, "applicable_kinds", lambda topology, collective: (BaselineKind.RING,))
    monkeypatch.setattr(choice, "build_baseline", refuse)
    (compared,) = choice.compare_baselines(load_topology("dgx-h100", nodes=9), "allgather", (2**24,))
    baseline, result = compared.fastest
    assert baseline.name == "nccl-ring-8ch-1p" and not baseline.is_schedule
    assert result.model == "nccl-model" and result.bound_time_us <= result.time_us
    assert compared.kept is None  # a modelled ring cannot be written in a band's place
