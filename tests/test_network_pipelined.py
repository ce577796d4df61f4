"""The ``msccl-net`` model: MSCCL's Simple sends serialized inside a machine, pipelined between machines (issue 47)."""

from __future__ import annotations

import pytest

from taccl_py.bounds import lower_bound
from taccl_py.cli import main
from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.algorithm_json import parse_algorithm_provenance, read_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import Transfer, lower_plan
from taccl_py.simulate import (
    DEFAULT_MODEL,
    MSCCL_LOOP,
    MSCCL_NETWORK_PIPELINED,
    MSCCL_PIPELINED,
    execution_model,
    simulate,
    simulate_sizes,
)
from taccl_py.simulate.plan import prepare_simulation
from taccl_py.stages.logical import LogicalLink, build_logical_graph
from taccl_py.stages.ordering import Ordering
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth import synthesize
from taccl_py.synth.candidates import candidate_chunkings
from taccl_py.topology import load_topology
from taccl_py.topology.cluster import load_cluster
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology

from helpers import ring_algorithm
from shipped_bands import shipped_band

MIB = 2**20
BYTES_PER_US = 10_000.0  # 10 GB/s on every link
#: Bar 15's two clusters (BENCHMARKS, "Heterogeneous and degraded clusters").
BAR_15 = {
    "mixed": {"cluster": "dgx-a100:2,dgx-h100:2"},
    "nicdown": {"topology": "dgx-a100", "nodes": 4, "nics_down": ["1:nic3"]},
}


def _two_machines(alpha_us: float):
    """Two machines of two GPUs: NVLink inside each, one IB link between every pair across them."""
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, node=r // 2, local_index=r % 2, rank=r) for r in range(4)]
    links = [
        Link(f"gpu{a}", f"gpu{b}", LinkKind.NVLINK if a // 2 == b // 2 else LinkKind.IB, alpha_us, 10.0)
        for a in range(4)
        for b in range(4)
        if a != b
    ]
    return make_topology("two-by-two", gpus, links)


def _one_send(src: int, dst: int):
    """Rank ``src`` sends its chunk to ``dst``: 4 chunks per loop, so a chunk is a quarter of the size."""
    transfer = Transfer(src, dst, (Buffer.INPUT, 0), (Buffer.OUTPUT, src))
    return lower_plan("one", Collective.ALLGATHER, 4, 4, [transfer])


def test_the_model_is_named_and_pipelines_only_between_machines():
    model = execution_model("msccl-net")
    assert model is MSCCL_NETWORK_PIPELINED is DEFAULT_MODEL
    assert (model.pipelines(True), model.pipelines(False)) == (True, False)
    assert (MSCCL_PIPELINED.pipelines(True), MSCCL_PIPELINED.pipelines(False)) == (True, True)
    assert (MSCCL_LOOP.pipelines(True), MSCCL_LOOP.pipelines(False)) == (False, False)
    plan = prepare_simulation(ring_algorithm(Collective.ALLGATHER, 4), _two_machines(1.0), model=model)
    crosses = [plan.topology.node_of(src) != plan.topology.node_of(dst) for src, dst in plan.route_ranks]
    assert list(plan.route_pipelined) == crosses and any(crosses) and not all(crosses)


def test_on_one_machine_the_default_times_a_schedule_as_msccl_does():
    # why one machine's libraries, chosen under msccl, need no new choice under the default
    topology = load_topology("dgx-h100")
    algorithm = shipped_band("dgx-h100", 1, "allreduce", 1)
    sizes = (MIB, 64 * MIB, 1024 * MIB)
    default = [r.time_us for r in simulate_sizes(algorithm, topology, sizes)]
    assert default == [r.time_us for r in simulate_sizes(algorithm, topology, sizes, model=MSCCL_LOOP)]


def test_a_send_inside_a_machine_pays_alpha_per_slice_and_one_between_machines_once():
    size = 20 * MIB  # 5 MiB chunks: passes of 2, 2 and 1 MiB
    bytes_us = 5 * MIB / BYTES_PER_US
    inside = simulate(_one_send(0, 1), _two_machines(1.0), size, model="msccl-net")
    across = simulate(_one_send(0, 2), _two_machines(1.0), size, model="msccl-net")
    assert inside.time_us == pytest.approx(3 * 1.0 + bytes_us)  # as under msccl
    assert across.time_us == pytest.approx(1.0 + bytes_us)  # as under pipelined
    assert (inside.num_passes, across.model) == (3, "msccl-net")


def test_a_send_between_machines_waits_for_a_free_slot():
    alpha = 1000.0  # far longer than a slice's 209.7 µs: the third slice waits for the first's RECV
    result = simulate(_one_send(0, 2), _two_machines(alpha), 20 * MIB, model="msccl-net", record_timeline=True)
    slice_us = 2 * MIB / BYTES_PER_US
    assert result.time_us == pytest.approx(alpha + slice_us + alpha + slice_us / 2)
    assert sorted(record.start_us for record in result.timeline) == pytest.approx([0.0, slice_us, alpha + slice_us])


def test_the_ordering_times_only_links_between_machines_as_pipelined():
    def link(internode: bool) -> LogicalLink:
        return LogicalLink(0, 1, 1.0, 10.0, (("a", "b"),), (10.0,), internode=internode)

    net = Ordering(None, 1, 1.0, (), pipelined_internode=True)
    assert (net.pipelines(link(True)), net.pipelines(link(False))) == (True, False)
    assert Ordering(None, 1, 1.0, (), pipelined=True).pipelines(link(False))


def test_candidates_under_the_model_order_only_sends_between_machines_as_pipelined():
    topology = load_topology("dgx-h100", 2)
    graph = build_logical_graph(topology, auto_sketch(topology))
    bound = lower_bound(topology, Collective.ALLGATHER, 10**9)
    chunkings = candidate_chunkings(graph, Collective.ALLGATHER, bound, model=MSCCL_NETWORK_PIPELINED)
    assert chunkings and all(c.pipelined_internode and not c.pipelined_sends for c in chunkings)


def test_synthesis_by_default_runs_under_the_model_records_it_and_times_its_choice_under_it(tmp_path, capsys):
    out, size = tmp_path / "ag.json", 4 * MIB
    argv = ["synthesize", "-t", "dgx-h100", "--nodes", "2", "-c", "allgather", "--size", str(size)]
    assert main([*argv, "--jobs", "1", "-o", str(out)]) == 0
    assert "model msccl-net" in capsys.readouterr().out
    assert parse_algorithm_provenance(out.read_text()).execution_model == "msccl-net"
    topology = load_topology("dgx-h100", 2)
    chosen = synthesize(topology, "allgather", size_bytes=size).choices[0].chosen_result
    algorithm = read_algorithm(str(out))
    assert (chosen.model, chosen.algorithm) == ("msccl-net", algorithm.name)
    assert chosen.time_us == pytest.approx(simulate(algorithm, topology, size, model="msccl-net").time_us)


@pytest.mark.slow
@pytest.mark.parametrize("cluster", BAR_15)
@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_bar_15_clusters_reach_nine_tenths_of_the_bound_at_64_mb_as_msccl_runs_network_sends(cluster, collective):
    # under the default model; under msccl (serialized everywhere) these read 0.874-0.887 (BENCHMARKS, bar 15)
    result = synthesize(load_cluster(**BAR_15[cluster]), collective, size_bytes=64_000_000, jobs=None)
    assert result.choices[0].chosen_result.fraction_of_bound >= 0.9
