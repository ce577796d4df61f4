"""Join machines into a multi-node topology through a non-blocking network switch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology.model import Link, Topology, Vertex, VertexKind, make_topology

__all__ = [
    "MAX_CLUSTER_NODES",
    "NETWORK_SWITCH",
    "checked_node_count",
    "compose_machines",
    "compose_nodes",
    "local_name",
    "machines_alike",
    "node_prefix",
]

# The one vertex every NIC of a composed topology is cabled to.
NETWORK_SWITCH = "netswitch"
# More machines than any bound, schedule or simulation here handles: a larger count (--nodes, a
# cluster file, --cluster) is a fault, refused before anything is built.
MAX_CLUSTER_NODES = 1024


def node_prefix(node: int) -> str:
    """Return the prefix of machine ``node``'s vertex names in a composed topology (``"n1."``)."""
    return f"n{node}."


def local_name(topology: Topology, name: str, node: int) -> str:
    """Return vertex ``name`` of machine ``node`` as the machine's own file names it (``"n1.nic3"`` -> ``"nic3"``).

    A one-machine topology's names carry no prefix and come back as they are.
    """
    prefix = node_prefix(node)
    return name[len(prefix) :] if topology.nodes > 1 and name.startswith(prefix) else name


def machines_alike(topology: Topology) -> bool:
    """Return True when every machine is a copy of machine 0: the same links at the same α and bandwidth.

    False for a cluster of several kinds, a NIC down or a NIC at another speed.
    """
    node_of = {v.name: v.node for v in topology.vertices if v.kind is not VertexKind.NET_SWITCH}
    signatures: list[Counter] = [Counter() for _ in range(topology.nodes)]
    for link in topology.links:
        for node in {node_of.get(link.src), node_of.get(link.dst)} - {None}:
            ends = (local_name(topology, link.src, node), local_name(topology, link.dst, node))
            signatures[node][(*ends, link.kind, link.alpha_us, link.bandwidth_GBps, link.count)] += 1
    return all(signature == signatures[0] for signature in signatures[1:])


def checked_node_count(nodes: object, source: str | None = None, field: str = "nodes") -> int:
    """Return ``nodes`` when it is a machine count from 1 to ``MAX_CLUSTER_NODES``; raise ``ArgumentError`` if not.

    The one check of a node count (``--nodes``, ``load_topology``, ``compose_nodes``), so that a
    count too large for any bound or schedule is refused before minutes of building.

    >>> checked_node_count(2)
    2
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_CLUSTER_NODES:
        raise ArgumentError(source, field, f"{nodes!r} nodes", f"an integer from 1 to {MAX_CLUSTER_NODES}")
    return nodes


def compose_nodes(machine: Topology, nodes: int) -> Topology:
    """Return ``nodes`` copies of a one-machine topology joined by one network switch.

    Copy k's vertices are named ``n{k}.<name>`` and its GPUs get ranks
    ``k * gpus_per_node + local rank`` (node-major). A vertex ``netswitch`` (kind
    ``net_switch``) gets, for each NIC, a link NIC -> switch carrying the NIC's network figures
    (kind ``net_kind``, ``net_alpha_us``, ``net_bandwidth_GBps``) and a link switch -> NIC with
    the same bandwidth and α 0: a non-blocking network whose one-way NIC-to-NIC latency is the
    sending NIC's ``net_alpha_us``.

    Parameters
    ----------
    machine : Topology
        A one-node topology, as ``read_topology`` returns.
    nodes : int
        The number of machines, >= 1; 1 returns ``machine`` itself.

    Returns
    -------
    Topology
        The topology named ``f"{machine.name}x{nodes}"`` with ``nodes`` nodes.

    Raises
    ------
    ArgumentError
        If ``nodes`` is not from 1 to ``MAX_CLUSTER_NODES`` (1024) or ``machine`` already spans several nodes.
    TopologyError
        If ``nodes > 1`` and the machine has no NIC, or a NIC lacks ``net_kind``,
        ``net_bandwidth_GBps`` or ``net_alpha_us``.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> pair = compose_nodes(load_topology("ndv2"), 2)
    >>> pair.name, pair.num_ranks, pair.gpu(9).name
    ('ndv2x2', 16, 'n1.gpu1')
    """
    checked_node_count(nodes, machine.name)
    if machine.nodes != 1:
        raise ArgumentError(
            machine.name, "nodes", f"topology already spans {machine.nodes} nodes", "a one-machine topology to compose"
        )
    if nodes == 1:
        return machine
    description = f"{nodes} x {machine.name} joined by a non-blocking network switch"
    if machine.description:
        description += f"; each: {machine.description}"
    return compose_machines([machine] * nodes, f"{machine.name}x{nodes}", description)


def compose_machines(machines: Sequence[Topology], name: str, description: str, source: str | None = None) -> Topology:
    """Return ``machines`` (one-node topologies, in rank order) joined by one network switch.

    Machine k's vertices are named ``n{k}.<name>`` and its GPUs get ranks ``k * G + local rank``,
    with G the GPUs per machine, which must be the same for every machine. Each NIC is cabled to
    ``netswitch`` as ``compose_nodes`` describes, with its own network figures, so machines may
    differ in everything else (GPU model, links, NIC count and speed).

    Raises
    ------
    TopologyError
        If a machine has no NIC or a NIC lacks its network figures, or the machines differ in
        GPU count (named after ``source``, default ``name``).
    """
    origin = source or name
    counts = [machine.num_ranks for machine in machines]
    for node, count in enumerate(counts):
        if count != counts[0]:
            raise TopologyError(
                origin,
                f"nodes[{node}]",
                f"node {node} ({machines[node].name}) has {count} GPUs, node 0 ({machines[0].name}) {counts[0]}",
                "the same GPU count on every node",
            )
    vertices: list[Vertex] = []
    links: list[Link] = []
    for node, machine in enumerate(machines):
        _check_nics(machine)
        prefix = node_prefix(node)
        for vertex in machine.vertices:
            rank = None if vertex.rank is None else node * counts[0] + vertex.rank
            vertices.append(replace(vertex, name=prefix + vertex.name, node=node, rank=rank))
        links.extend(replace(link, src=prefix + link.src, dst=prefix + link.dst) for link in machine.links)
    vertices.append(Vertex(name=NETWORK_SWITCH, kind=VertexKind.NET_SWITCH))
    for nic in (v for v in vertices if v.kind is VertexKind.NIC):
        links.append(Link(nic.name, NETWORK_SWITCH, nic.net_kind, nic.net_alpha_us, nic.net_bandwidth_GBps))
        links.append(Link(NETWORK_SWITCH, nic.name, nic.net_kind, 0.0, nic.net_bandwidth_GBps))
    sources = tuple(dict.fromkeys(text for machine in machines for text in machine.sources))
    return make_topology(
        name, vertices, links, nodes=len(machines), description=description, sources=sources, source=origin
    )


def _check_nics(machine: Topology) -> None:
    nics = machine.nics()
    if not nics:
        raise TopologyError(
            machine.name,
            "vertices",
            "no NIC to join machines through",
            "at least one vertex of kind 'nic' with net_* figures",
        )
    for nic in nics:
        for field in ("net_kind", "net_bandwidth_GBps", "net_alpha_us"):
            if getattr(nic, field) is None:
                raise TopologyError(
                    machine.name,
                    f"{nic.name}.{field}",
                    "NIC without its network figure",
                    "net_kind, net_bandwidth_GBps and net_alpha_us on every NIC",
                )
