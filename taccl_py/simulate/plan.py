"""The size-independent part of a simulation: an algorithm's actions, precedence and routes as tables.

``prepare_simulation`` builds them once (``build_dataflow``, routes, link capacities under the
algorithm's protocol); ``taccl_py.simulate.engine.replay`` runs them at a size, once per pass of
the execution model's slice loop (``taccl_py.simulate.passes``). ``assemble_simulation_plan``
builds the same tables for any other program given as actions (an MSCCL++ plan,
``taccl_py.mscclpp.simulate``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import ActionKind
from taccl_py.ir.flow_cache import dataflow_of
from taccl_py.simulate.model import DEFAULT_MODEL, ExecutionModel
from taccl_py.simulate.protocol import NCCL_PROTOCOL_COSTS, ProtocolCost, protocol_cost
from taccl_py.simulate.switch import switch_path
from taccl_py.topology.model import Topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "ProgramSummary",
    "PlannedSend",
    "PlannedSwitch",
    "SimulationPlan",
    "assemble_simulation_plan",
    "prepare_simulation",
]


@dataclass(frozen=True)
class ProgramSummary:
    """What a replay reads of a program besides its actions, as an ``Algorithm`` carries it.

    A chunk holds ``size_bytes / chunks_per_loop`` bytes; ``protocol`` names its cost
    (``taccl_py.simulate.protocol``).
    """

    name: str
    collective: Collective
    num_ranks: int
    chunks_per_loop: int
    protocol: str
    reduces_in_switch: bool = False


@dataclass(frozen=True)
class PlannedSend:
    """One transfer of a program given as actions: SEND ``action`` moves ``chunks`` chunks from ``src`` to ``dst``.

    ``recv`` is the action that has the bytes (it must succeed ``action``); ``connection`` (rank,
    peer, channel) groups the sends that share a connection's slots under a pipelined model.
    """

    action: int
    src: int
    dst: int
    chunks: float
    recv: int
    connection: tuple[int, int, int]


@dataclass(frozen=True)
class PlannedSwitch:
    """One switch action: ``chunks`` chunks through the switch of ``group`` (``taccl_py.simulate.switch``)."""

    action: int
    rank: int
    group: tuple[int, ...]
    chunks: float
    reduces: bool


@dataclass(frozen=True)
class SimulationPlan:
    """The size-independent part of a simulation: actions, precedence and routes as integer tables.

    Action ``a`` is a SEND when ``send_route[a] >= 0``; ``send_chunks[a]`` chunks then move along
    route ``send_route[a]`` (``route_links`` index into ``link_keys``; capacities in bytes/µs) to
    RECV ``matched_recv[a]`` over connection ``send_connection[a]`` (rank, peer, channel).
    ``threadblock_spans`` hold each threadblock's first and last action, which join passes.
    ``route_pipelined[r]``: sends over route ``r`` are pipelined under ``model`` (a switch route never).
    ``algorithm`` is the Algorithm simulated, or the ``ProgramSummary`` of another program.
    """

    algorithm: Algorithm | ProgramSummary
    topology: Topology
    successors: tuple[tuple[int, ...], ...]
    num_predecessors: tuple[int, ...]
    send_route: tuple[int, ...]
    send_chunks: tuple[float, ...]
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
    route_pipelined: tuple[bool, ...]

    @property
    def num_transfers(self) -> int:
        """Return the number of matched transfers."""
        return len(self.send_actions)


def prepare_simulation(
    algorithm: Algorithm,
    topology: Topology,
    *,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
    model: ExecutionModel = DEFAULT_MODEL,
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
    protocol_cost(algorithm.protocol, protocol_costs, algorithm.name)  # an unknown protocol is refused first
    flow = dataflow_of(algorithm)  # built once for verifying and simulating it
    if flow.violations:
        raise VerificationError(algorithm.name, flow.violations)
    sends, switches = [], []
    spans: dict[tuple[int, int], list[int]] = {}
    for action in flow.actions:
        span = spans.setdefault((action.rank, action.threadblock), [action.id, action.id])
        span[1] = action.id  # a threadblock's actions are numbered in program order
        if action.kind.is_switch:
            reduces = action.kind is ActionKind.SWITCH_REDUCE
            switches.append(PlannedSwitch(action.id, action.rank, action.group, action.sources[0].count, reduces))
        elif action.kind is ActionKind.SEND:
            connection = (action.rank, action.peer, action.channel)
            sends.append(
                PlannedSend(
                    action.id, action.rank, action.peer, action.sources[0].count, flow.match[action.id], connection
                )
            )
    return assemble_simulation_plan(
        algorithm,
        topology,
        flow.predecessors,
        sends,
        tuple(tuple(span) for span in spans.values()),
        protocol_costs=protocol_costs,
        model=model,
        switches=switches,
    )


def assemble_simulation_plan(
    program: Algorithm | ProgramSummary,
    topology: Topology,
    predecessors: Sequence[Sequence[int]],
    sends: Sequence[PlannedSend],
    threadblock_spans: Sequence[tuple[int, int]],
    *,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
    model: ExecutionModel = DEFAULT_MODEL,
    switches: Sequence[PlannedSwitch] = (),
) -> SimulationPlan:
    """Return the replay's tables for a program given as actions; every action not in ``sends`` takes 0 µs.

    ``predecessors[a]`` are the actions ``a`` waits for; ``sends`` (in increasing action order) move
    chunks over ``route(topology, src, dst)`` at ``program.protocol``'s α (µs) and capacity
    (bytes/µs); ``switches`` move chunks through a switch (``switch_path``), each on its own
    route and met by no RECV; ``threadblock_spans`` (first, last action) join the passes of a
    sliced model. Raises ``ArgumentError`` when the protocol is not in ``protocol_costs`` or a
    switch group shares no reducing switch.
    """
    cost = protocol_cost(program.protocol, protocol_costs, program.name)
    count = len(predecessors)
    successors: list[list[int]] = [[] for _ in range(count)]
    for action_id, preds in enumerate(predecessors):
        for pred in preds:
            successors[pred].append(action_id)
    link_index: dict[tuple[str, str], int] = {}
    link_capacity: list[float] = []
    route_index: dict[tuple[int, int], int] = {}
    route_alpha_us: list[float] = []
    route_links: list[tuple[int, ...]] = []
    route_pipelined: list[bool] = []
    send_route = [-1] * count
    send_chunks = [0] * count
    matched_recv = [-1] * count
    send_connection = {}
    for send in sends:
        send_connection[send.action] = send.connection
        pair = (send.src, send.dst)
        if pair not in route_index:
            path = route(topology, send.src, send.dst)
            for link in path.links:
                if link.key not in link_index:
                    link_index[link.key] = len(link_capacity)
                    link_capacity.append(_capacity(link.bandwidth_GBps, cost))
            route_index[pair] = len(route_alpha_us)
            route_alpha_us.append(cost.route_alpha_us(path))
            route_links.append(tuple(link_index[link.key] for link in path.links))
            route_pipelined.append(model.pipelines(topology.node_of(send.src) != topology.node_of(send.dst)))
        send_route[send.action] = route_index[pair]
        send_chunks[send.action] = send.chunks
        matched_recv[send.action] = send.recv
    route_ranks = sorted(route_index, key=route_index.__getitem__)
    switch_routes: dict[tuple, int] = {}
    for step in switches:
        key = (step.rank, step.group, step.reduces)
        if key not in switch_routes:
            path = switch_path(topology, step.rank, step.group, step.reduces, cost)
            for link_key, bandwidth_GBps in path.links:
                if link_key not in link_index:
                    link_index[link_key] = len(link_capacity)
                    link_capacity.append(_capacity(bandwidth_GBps, cost))
            switch_routes[key] = len(route_alpha_us)
            route_alpha_us.append(path.alpha_us)
            route_links.append(tuple(link_index[link_key] for link_key, _ in path.links))
            route_pipelined.append(False)  # a switch step has no RECV to take its α later
            route_ranks.append((step.rank, step.rank))
        send_route[step.action] = switch_routes[key]
        send_chunks[step.action] = step.chunks
    send_actions = sorted([send.action for send in sends] + [step.action for step in switches])
    return SimulationPlan(
        algorithm=program,
        topology=topology,
        successors=tuple(tuple(s) for s in successors),
        num_predecessors=tuple(len(p) for p in predecessors),
        send_route=tuple(send_route),
        send_chunks=tuple(send_chunks),
        send_actions=tuple(send_actions),
        route_ranks=tuple(route_ranks),
        route_alpha_us=tuple(route_alpha_us),
        route_links=tuple(route_links),
        link_keys=tuple(sorted(link_index, key=link_index.__getitem__)),
        link_capacity=tuple(link_capacity),
        matched_recv=tuple(matched_recv),
        send_connection=send_connection,
        threadblock_spans=tuple(threadblock_spans),
        model=model,
        route_pipelined=tuple(route_pipelined),
    )


def _capacity(bandwidth_GBps: float, cost: ProtocolCost) -> float:
    """Return a link's capacity (bytes/µs) under ``cost``; Simple's is exactly what it always was."""
    capacity = bandwidth_GBps * BYTES_PER_US_PER_GBPS
    return capacity if cost.is_simple else capacity * cost.bandwidth_factor
