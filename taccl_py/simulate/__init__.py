"""Simulate an Algorithm on a Topology: time, bandwidths, bound ratio and link usage per size.

The model (α-β links shared max-min fairly, zero-cost computes) is described in
``taccl_py.simulate.engine``; what LL and LL128 change is in ``taccl_py.simulate.protocol``;
``plot_timeline`` in ``taccl_py.simulate.plot`` draws a run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from taccl_py.bounds.reduction import schedule_bounds
from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import bus_factor
from taccl_py.simulate.engine import ReplayOutcome, replay
from taccl_py.simulate.model import (
    DEFAULT_MODEL,
    EXECUTION_MODELS,
    MSCCL_LOOP,
    MSCCL_NETWORK_PIPELINED,
    MSCCL_PIPELINED,
    WHOLE_CHUNKS,
    ExecutionModel,
    execution_model,
)
from taccl_py.simulate.plan import ProgramSummary, SimulationPlan, prepare_simulation
from taccl_py.simulate.protocol import NCCL_PROTOCOL_COSTS, PROTOCOLS, RCCL_PROTOCOL_COSTS, ProtocolCost
from taccl_py.simulate.result import (
    FLOAT_TIE,
    LinkUsage,
    SimulationResult,
    TimelineRecord,
    faster,
    resource_label,
    simulation_result_to_dict,
)
from taccl_py.topology.model import Topology
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "DEFAULT_MODEL",
    "EXECUTION_MODELS",
    "MSCCL_LOOP",
    "MSCCL_PIPELINED",
    "MSCCL_NETWORK_PIPELINED",
    "WHOLE_CHUNKS",
    "ExecutionModel",
    "execution_model",
    "NCCL_PROTOCOL_COSTS",
    "PROTOCOLS",
    "RCCL_PROTOCOL_COSTS",
    "ProtocolCost",
    "FLOAT_TIE",
    "LinkUsage",
    "SimulationPlan",
    "SimulationResult",
    "TimelineRecord",
    "faster",
    "prepare_simulation",
    "resource_label",
    "simulate",
    "simulate_plan",
    "simulate_sizes",
    "simulation_result_to_dict",
]


def _check_size(name: str, size_bytes: object) -> int:
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
        raise ArgumentError(name, "size_bytes", f"size {size_bytes!r}", "an integer number of bytes >= 1")
    return size_bytes


def _bounds_us(topology: Topology, program: Algorithm | ProgramSummary, sizes: tuple[int, ...]) -> tuple[float, ...]:
    """Return the bound (µs) that holds for ``program`` at each size: in-network ones where it sums in a switch."""
    reduces = program.reduces_in_switch
    return tuple(
        bound.time_us for bound in schedule_bounds(topology, program.collective, sizes, reduces_in_switch=reduces)
    )


def _timeline(plan: SimulationPlan, outcome: ReplayOutcome) -> tuple[TimelineRecord, ...]:
    """Return one record per link of every SEND of every pass (transfer numbers run on across passes)."""
    records = []
    actions_per_pass = len(plan.send_route)
    for transfer, (action, size) in enumerate(zip(outcome.send_actions, outcome.send_bytes)):
        route_id = plan.send_route[action % actions_per_pass]
        src, dst = plan.route_ranks[route_id]
        for link in plan.route_links[route_id]:
            records.append(
                TimelineRecord(
                    plan.link_keys[link],
                    transfer,
                    src,
                    dst,
                    size,
                    outcome.ready_us[action],
                    outcome.start_us[action],
                    outcome.end_us[action],
                )
            )
    return tuple(records)


def _result(plan: SimulationPlan, size_bytes: int, outcome: ReplayOutcome, bound_time_us: float) -> SimulationResult:
    algorithm = plan.algorithm
    time_us = outcome.time_us
    algbw = size_bytes / time_us / BYTES_PER_US_PER_GBPS if time_us > 0 else math.inf
    usage = tuple(
        LinkUsage(key, busy, busy / time_us if time_us > 0 else 0.0, moved)
        for key, busy, moved in zip(plan.link_keys, outcome.link_busy_us, outcome.link_bytes)
        if moved > 0
    )
    timeline = None
    if outcome.end_us is not None:
        timeline = _timeline(plan, outcome)
    return SimulationResult(
        algorithm=algorithm.name,
        topology=plan.topology.name,
        collective=algorithm.collective,
        num_ranks=algorithm.num_ranks,
        size_bytes=size_bytes,
        time_us=time_us,
        algbw_GBps=algbw,
        busbw_GBps=algbw * bus_factor(algorithm.collective, algorithm.num_ranks),
        bound_time_us=bound_time_us,
        fraction_of_bound=bound_time_us / time_us if time_us > 0 else math.inf,
        num_transfers=plan.num_transfers,
        link_usage=usage,
        timeline=timeline,
        model=plan.model.name,
        num_passes=outcome.num_passes,
    )


def simulate_plan(
    plan: SimulationPlan, size_bytes: int, *, record_timeline: bool = False, bound_time_us: float | None = None
) -> SimulationResult:
    """Return the simulated run of a prepared plan at ``size_bytes``; see ``simulate``.

    Pass ``bound_time_us`` (µs) to skip computing the lower bound, e.g. when simulating many
    candidate algorithms for one topology and size.
    """
    size_bytes = _check_size(plan.algorithm.name, size_bytes)
    if bound_time_us is None:
        bound_time_us = _bounds_us(plan.topology, plan.algorithm, (size_bytes,))[0]
    outcome = replay(plan, size_bytes, record=record_timeline)
    return _result(plan, size_bytes, outcome, bound_time_us)


def simulate(
    algorithm: Algorithm,
    topology: Topology,
    size_bytes: int,
    *,
    record_timeline: bool = False,
    bound_time_us: float | None = None,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
    model: ExecutionModel | str = DEFAULT_MODEL,
) -> SimulationResult:
    """Return the simulated time (µs), bandwidths (GB/s), bound ratio and link usage of one run.

    Parameters
    ----------
    algorithm : Algorithm
        The schedule; its rank count must equal the topology's GPU count.
    topology : Topology
        The machine; transfers take ``route(topology, src, dst)``.
    size_bytes : int
        The nccl-tests size M (AllGather: total output, ReduceScatter: total input,
        AllReduce: the buffer); each of the ``chunks_per_loop`` chunks holds M / chunks bytes.
    record_timeline : bool
        Also return one ``TimelineRecord`` per transfer and link it uses.
    bound_time_us : float, optional
        The lower bound (µs) to compare with; computed with ``lower_bound`` when omitted.
    protocol_costs : mapping of str to ProtocolCost
        What ``algorithm.protocol`` (Simple, LL, LL128) does to α and bandwidth (default
        NCCL's; ``RCCL_PROTOCOL_COSTS`` for RCCL's LL128 lines). Simple changes nothing.
    model : ExecutionModel or str
        How the runtime runs the program (``taccl_py.simulate.model``): ``msccl`` (default,
        MSCCL's loop over 2 MiB slices, serialized sends), ``pipelined`` (the same with sends
        overlapping through the connection's slots), ``msccl-net`` (overlapping only between
        machines, as MSCCL's Simple sends run) or ``chunks`` (whole chunks, as our executor).

    Returns
    -------
    SimulationResult
        ``time_us``, ``algbw_GBps = M / T``, ``busbw_GBps`` (nccl-tests' bus factor),
        ``bound_time_us`` and ``fraction_of_bound = bound / time``, link usage, timeline.

    Raises
    ------
    ArgumentError
        When the rank counts differ, ``size_bytes`` is not a positive integer or the
        algorithm's protocol is not in ``protocol_costs``.
    VerificationError
        When the algorithm is structurally broken (unmatched transfer, circular wait).

    Notes
    -----
    The model is in ``taccl_py.simulate.engine``. Cost: O(T log T) for T transfers when links
    are not shared, plus a max-min recomputation over the flows sharing links with each flow
    that starts or ends. Use ``simulate_sizes`` for several sizes (the plan and bounds are
    computed once).

    Examples
    --------
    >>> from taccl_py.ir.lowering import Transfer, lower_plan
    >>> from taccl_py.ir.algorithm import Buffer
    >>> from taccl_py.ir.collectives import Collective
    >>> from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology
    >>> gpus = [Vertex(f"gpu{r}", VertexKind.GPU, rank=r) for r in range(2)]
    >>> links = [Link("gpu0", "gpu1", LinkKind.NVLINK, 1.0, 10.0), Link("gpu1", "gpu0", LinkKind.NVLINK, 1.0, 10.0)]
    >>> topo = make_topology("pair", gpus, links)
    >>> algo = lower_plan("one", Collective.ALLGATHER, 2, 2, [Transfer(0, 1, (Buffer.INPUT, 0), (Buffer.OUTPUT, 0))])
    >>> simulate(algo, topo, 40_000, bound_time_us=1.0).time_us  # 1 µs + 20 kB at 10 GB/s
    3.0
    """
    return simulate_plan(
        prepare_simulation(algorithm, topology, protocol_costs=protocol_costs, model=execution_model(model)),
        size_bytes,
        record_timeline=record_timeline,
        bound_time_us=bound_time_us,
    )


def simulate_sizes(
    algorithm: Algorithm,
    topology: Topology,
    sizes_bytes: Iterable[int],
    *,
    record_timeline: bool = False,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
    model: ExecutionModel | str = DEFAULT_MODEL,
) -> tuple[SimulationResult, ...]:
    """Return ``simulate`` at each size, preparing the plan and the lower bounds once."""
    sizes = tuple(_check_size(algorithm.name, size) for size in sizes_bytes)
    plan = prepare_simulation(algorithm, topology, protocol_costs=protocol_costs, model=execution_model(model))
    bounds = _bounds_us(topology, algorithm, sizes)
    return tuple(
        _result(plan, size, replay(plan, size, record=record_timeline), bound) for size, bound in zip(sizes, bounds)
    )
