"""The size-independent part of a simulation: an algorithm's actions, precedence and routes as tables.

``prepare_simulation`` builds them once (``build_dataflow``, routes, link capacities under the
algorithm's protocol); ``taccl_py.simulate.engine.replay`` runs them at a size, once per pass of
the execution model's slice loop (``taccl_py.simulate.passes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.dataflow import ActionKind, build_dataflow
from taccl_py.simulate.model import MSCCL_LOOP, ExecutionModel
from taccl_py.simulate.protocol import NCCL_PROTOCOL_COSTS, ProtocolCost, protocol_cost
from taccl_py.topology.model import Route, Topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = ["SimulationPlan", "prepare_simulation"]


@dataclass(frozen=True)
class SimulationPlan:
    """The size-independent part of a simulation: actions, precedence and routes as integer tables.

    Action ``a`` is a SEND when ``send_route[a] >= 0``; ``send_chunks[a]`` chunks then move along
    route ``send_route[a]`` (``route_links`` index into ``link_keys``; capacities in bytes/µs) to
    RECV ``matched_recv[a]`` over connection ``send_connection[a]`` (rank, peer, channel).
    ``threadblock_spans`` hold each threadblock's first and last action, which join passes.
    """

    algorithm: Algorithm
    topology: Topology
    successors: tuple[tuple[int, ...], ...]
    num_predecessors: tuple[int, ...]
    send_route: tuple[int, ...]
    send_chunks: tuple[int, ...]
    send_actions: tuple[int, ...]
    route_ranks: tuple[tuple[int, int], ...]
    route_alpha_us: tuple[float, ...]
    route_links: tuple[tuple[int, ...], ...]
    link_keys: tuple[tuple[str, str], ...]
    link_capacity: tuple[float, ...]
    matched_recv: tuple[int, ...]
    send_connection: Mapping[int, tuple[int, int, int]]
    threadblock_spans: tuple[tuple[int, int], ...]
    model: ExecutionModel

    @property
    def num_transfers(self) -> int:
        """Return the number of matched transfers."""
        return len(self.send_actions)


def prepare_simulation(
    algorithm: Algorithm,
    topology: Topology,
    *,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
    model: ExecutionModel = MSCCL_LOOP,
) -> SimulationPlan:
    """Return the integer tables the replay needs; reuse them to simulate several sizes.

    Routes' α (µs) and link capacities (bytes/µs) are those of ``algorithm.protocol`` in
    ``protocol_costs`` (default: NCCL's; Simple leaves them as the topology states them);
    ``model`` is how the runtime runs the program (default: MSCCL's slice loop, serialized sends).

    Raises ``ArgumentError`` when the algorithm's rank count differs from the topology's or its
    protocol is unknown, and ``VerificationError`` when the algorithm is structurally broken
    (unmatched transfers, circular waits, bad references): such a program has no finishing time.
    """
    if algorithm.num_ranks != topology.num_ranks:
        raise ArgumentError(
            algorithm.name,
            "num_ranks",
            f"{algorithm.num_ranks} ranks but topology {topology.name!r} has {topology.num_ranks} GPUs",
            "an algorithm for the topology's rank count",
        )
    cost = protocol_cost(algorithm.protocol, protocol_costs, algorithm.name)
    flow = build_dataflow(algorithm)
    if flow.violations:
        raise VerificationError(algorithm.name, flow.violations)
    count = len(flow.actions)
    successors: list[list[int]] = [[] for _ in range(count)]
    for action_id, preds in enumerate(flow.predecessors):
        for pred in preds:
            successors[pred].append(action_id)
    link_index: dict[tuple[str, str], int] = {}
    link_capacity: list[float] = []
    route_index: dict[tuple[int, int], int] = {}
    route_alpha_us: list[float] = []
    route_links: list[tuple[int, ...]] = []
    send_route = [-1] * count
    send_chunks = [0] * count
    send_actions = []
    send_connection = {}
    spans: dict[tuple[int, int], list[int]] = {}
    for action in flow.actions:
        span = spans.setdefault((action.rank, action.threadblock), [action.id, action.id])
        span[1] = action.id  # a threadblock's actions are numbered in program order
        if action.kind is not ActionKind.SEND:
            continue
        send_connection[action.id] = (action.rank, action.peer, action.channel)
        pair = (action.rank, action.peer)
        if pair not in route_index:
            path = route(topology, action.rank, action.peer)
            for link in path.links:
                if link.key not in link_index:
                    link_index[link.key] = len(link_capacity)
                    link_capacity.append(_capacity(link.bandwidth_GBps, cost))
            route_index[pair] = len(route_alpha_us)
            route_alpha_us.append(_route_alpha_us(path, cost))
            route_links.append(tuple(link_index[link.key] for link in path.links))
        send_route[action.id] = route_index[pair]
        send_chunks[action.id] = action.sources[0].count
        send_actions.append(action.id)
    return SimulationPlan(
        algorithm=algorithm,
        topology=topology,
        successors=tuple(tuple(s) for s in successors),
        num_predecessors=tuple(len(p) for p in flow.predecessors),
        send_route=tuple(send_route),
        send_chunks=tuple(send_chunks),
        send_actions=tuple(send_actions),
        route_ranks=tuple(sorted(route_index, key=route_index.__getitem__)),
        route_alpha_us=tuple(route_alpha_us),
        route_links=tuple(route_links),
        link_keys=tuple(sorted(link_index, key=link_index.__getitem__)),
        link_capacity=tuple(link_capacity),
        matched_recv=tuple(flow.match[a] if a in send_connection else -1 for a in range(count)),
        send_connection=send_connection,
        threadblock_spans=tuple(tuple(span) for span in spans.values()),
        model=model,
    )


def _capacity(bandwidth_GBps: float, cost: ProtocolCost) -> float:
    """Return a link's capacity (bytes/µs) under ``cost``; Simple's is exactly what it always was."""
    capacity = bandwidth_GBps * BYTES_PER_US_PER_GBPS
    return capacity if cost.is_simple else capacity * cost.bandwidth_factor


def _route_alpha_us(path: Route, cost: ProtocolCost) -> float:
    """Return a route's α (µs) under ``cost``: each link's α scaled by its class's factor."""
    if cost.is_simple:  # Route.alpha_us itself, so Simple times stay bit-identical
        return path.alpha_us
    return sum(link.alpha_us * cost.alpha_factor(link.kind) for link in path.links)
