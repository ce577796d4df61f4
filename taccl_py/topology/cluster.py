"""Clusters: machines of different kinds in rank order, with NICs down or at another speed.

A cluster is described by a ``taccl-cluster/1`` JSON file (docs/topology-format.md) or by the
command line's shorthand (``--cluster dgx-a100:2,dgx-h100:2``, ``--nic-down 1:nic3``,
``--nic-speed 0:nic0:12.5``); ``cluster_topology`` turns either into an ordinary ``Topology``
that everything downstream takes. A NIC that is down is left out of the node, with its links, so
no route, bound or schedule can use it; a NIC's speed override changes its network port
(both directions), not its PCIe link.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from taccl_py._io import is_readable_file
from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology.cluster_file import (
    CLUSTER_SCHEMA,
    MAX_CLUSTER_NODES,
    Cluster,
    ClusterNode,
    MAX_NIC_SPEED_GBps,
    is_builtin_machine,
    parse_cluster,
    read_cluster,
)
from taccl_py.topology.compose import checked_node_count, compose_machines, local_name
from taccl_py.topology.model import Topology, VertexKind, make_topology

__all__ = [
    "CLUSTER_SCHEMA",
    "Cluster",
    "ClusterNode",
    "NodeStatus",
    "cluster_topology",
    "describe_cluster",
    "load_cluster",
    "node_statuses",
    "parse_cluster",
    "parse_cluster_spec",
    "parse_nic_down",
    "parse_nic_speed",
    "read_cluster",
    "with_overrides",
]

# -- the command line's shorthand ------------------------------------------------------------------


def parse_cluster_spec(text: str, option: str = "--cluster") -> Cluster:
    """Return the cluster of ``MACHINE[:COUNT],...`` (rank order), or of the cluster file ``text`` names.

    >>> [node.machine for node in parse_cluster_spec("dgx-a100:2,dgx-h100").nodes]
    ['dgx-a100', 'dgx-a100', 'dgx-h100']
    """
    if is_readable_file(Path(text)) and not is_builtin_machine(text):
        return read_cluster(text)
    nodes: list[ClusterNode] = []
    for part in text.split(","):
        machine, _, count_text = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "1")
        if not machine:
            raise ArgumentError(text, option, f"empty machine in {part!r}", "MACHINE[:COUNT],... or a cluster file")
        if not is_builtin_machine(machine) and not is_readable_file(Path(machine)):
            raise ArgumentError(text, option, f"no such built-in machine or file {machine!r}", _machines_expected())
        try:
            count = int(count_text)
        except ValueError:
            count = 0
        if count < 1:
            raise ArgumentError(text, option, f"count {count_text!r} of {machine}", "an integer >= 1")
        if len(nodes) + count > MAX_CLUSTER_NODES:
            raise ArgumentError(text, option, f"{len(nodes) + count} machines", f"at most {MAX_CLUSTER_NODES}")
        nodes.extend([ClusterNode(machine)] * count)
    return Cluster(tuple(nodes), source=option)


def _machines_expected() -> str:
    from taccl_py.topology.builtins import builtin_topology_names

    return "one of " + ", ".join(builtin_topology_names()) + ", a topology file, or a taccl-cluster/1 file"


def parse_nic_down(text: str, option: str = "--nic-down") -> tuple[int, str]:
    """Return (node, NIC name) of ``NODE:NIC``, e.g. ``1:nic3``."""
    node, _, nic = text.partition(":")
    return _node_index(node, text, option, "NODE:NIC"), _nic_name(nic, text, option, "NODE:NIC")


def parse_nic_speed(text: str, option: str = "--nic-speed") -> tuple[int, str, float]:
    """Return (node, NIC name, GB/s) of ``NODE:NIC:GBPS``, e.g. ``0:nic0:12.5``."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ArgumentError(text, option, f"{text!r}", "NODE:NIC:GBPS, e.g. 0:nic0:12.5")
    try:
        speed = float(parts[2])
    except ValueError:
        speed = float("nan")
    if not (math.isfinite(speed) and 0 < speed <= MAX_NIC_SPEED_GBps):
        raise ArgumentError(
            text, option, f"speed {parts[2]!r}", f"GB/s per direction > 0 and at most {MAX_NIC_SPEED_GBps:g}"
        )
    form = "NODE:NIC:GBPS"
    return _node_index(parts[0], text, option, form), _nic_name(parts[1], text, option, form), speed


def _node_index(text: str, whole: str, option: str, form: str) -> int:
    if not text.isdigit():
        raise ArgumentError(whole, option, f"node {text!r}", f"{form} with NODE a node index >= 0")
    return int(text)


def _nic_name(text: str, whole: str, option: str, form: str) -> str:
    if not text:
        raise ArgumentError(whole, option, "no NIC name", f"{form}, e.g. 1:nic3")
    return text


def with_overrides(
    cluster: Cluster, nics_down: Iterable[tuple[int, str]] = (), nic_speeds: Iterable[tuple[int, str, float]] = ()
) -> Cluster:
    """Return ``cluster`` with more NICs down and NIC speeds set, by node index.

    Raises ``ArgumentError`` for a node index out of range, a NIC down twice (here or in the
    cluster) and a NIC given two speeds here.
    """
    nodes = list(cluster.nodes)

    def checked(node: int, option: str) -> int:
        if not 0 <= node < len(nodes):
            raise ArgumentError(
                option, None, f"node {node} out of range (the cluster has {len(nodes)})", f"0..{len(nodes) - 1}"
            )
        return node

    for node, nic in nics_down:
        node = checked(node, "--nic-down")
        if nic in nodes[node].nics_down:  # by the cluster file or an earlier --nic-down
            raise ArgumentError(
                f"{node}:{nic}", "--nic-down", f"NIC {nic} of node {node} is named twice", "each NIC once"
            )
        nodes[node] = replace(nodes[node], nics_down=nodes[node].nics_down + (nic,))
    given: set[tuple[int, str]] = set()  # a --nic-speed may change the speed a cluster file gives, once
    for node, nic, speed in nic_speeds:
        node = checked(node, "--nic-speed")
        if (node, nic) in given:
            raise ArgumentError(
                f"{node}:{nic}", "--nic-speed", f"NIC {nic} of node {node} is given two speeds", "one speed per NIC"
            )
        given.add((node, nic))
        nodes[node] = replace(nodes[node], nic_speeds=nodes[node].nic_speeds + ((nic, speed),))
    return replace(cluster, nodes=tuple(nodes))


# -- building the topology -------------------------------------------------------------------------


def cluster_topology(cluster: Cluster) -> Topology:
    """Return the topology of ``cluster``: its machines, changed as it says, joined by one network switch.

    A cluster of N unchanged copies of one machine gives exactly ``load_topology(machine, N)``.

    Raises
    ------
    TopologyError
        If a machine is unknown, a NIC named does not exist, every NIC of a node is down (the node
        cannot communicate) or the machines differ in GPU count.
    """
    from taccl_py.topology.builtins import load_topology

    first = cluster.nodes[0]
    if all(node == first for node in cluster.nodes) and not (first.nics_down or first.nic_speeds):
        if cluster.name is None and not cluster.description and cluster.network_alpha_us is None:
            return load_topology(first.machine, nodes=len(cluster.nodes))
    loaded: dict[str, Topology] = {}
    machines = []
    for index, node in enumerate(cluster.nodes):
        if node.machine not in loaded:
            loaded[node.machine] = load_topology(node.machine)
        machines.append(_changed_machine(loaded[node.machine], node, index, cluster, len(cluster.nodes)))
    name = cluster.name or _cluster_name(cluster, [loaded[node.machine] for node in cluster.nodes])
    if len(machines) == 1:
        # one machine has no network to join; it keeps its own name unless the cluster changed it
        only = machines[0]
        if name == only.name and not cluster.description:
            return only
        description = cluster.description or only.description
        return make_topology(name, only.vertices, only.links, description=description, sources=only.sources)
    if cluster.network_alpha_us is not None:
        machines = [_with_network_alpha(machine, cluster.network_alpha_us) for machine in machines]
    return compose_machines(machines, name, _description(cluster, machines), source=cluster.source)


def describe_cluster(
    cluster: str | None = None,
    *,
    topology: str | None = None,
    nodes: int = 1,
    nics_down: Sequence[str] = (),
    nic_speeds: Sequence[str] = (),
) -> Cluster:
    """Return the cluster the command line's options describe (``load_cluster``'s arguments), checked.

    Raises ``ArgumentError`` naming the option for a malformed value, a node index out of range,
    a NIC the node lacks or a node left with every NIC down.
    """
    if cluster is not None:
        described = parse_cluster_spec(cluster)
    elif topology is not None:
        described = Cluster((ClusterNode(topology),) * checked_node_count(nodes, field="--nodes"), source=topology)
    else:
        raise ArgumentError(None, "--topology", "no topology and no cluster", "--topology NAME or --cluster SPEC")
    down = [parse_nic_down(text) for text in nics_down]
    speeds = [parse_nic_speed(text) for text in nic_speeds]
    described = with_overrides(described, down, speeds)
    _check_overrides(described, down, speeds)
    return described


def load_cluster(
    cluster: str | None = None,
    *,
    topology: str | None = None,
    nodes: int = 1,
    nics_down: Sequence[str] = (),
    nic_speeds: Sequence[str] = (),
) -> Topology:
    """Return the topology the command line's cluster options describe.

    ``cluster`` is the ``--cluster`` text (shorthand or a file); otherwise ``topology`` and
    ``nodes`` give N copies of one machine. ``nics_down`` and ``nic_speeds`` are the
    ``--nic-down`` / ``--nic-speed`` texts.
    """
    described = describe_cluster(cluster, topology=topology, nodes=nodes, nics_down=nics_down, nic_speeds=nic_speeds)
    return cluster_topology(described)


def _check_overrides(
    cluster: Cluster, nics_down: Sequence[tuple[int, str]], nic_speeds: Sequence[tuple[int, str, float]]
) -> None:
    """Raise ``ArgumentError`` naming the option for a NIC the node lacks or a node left without NICs.

    ``with_overrides`` has already checked the node indices; the cluster file's own faults are
    ``cluster_topology``'s to report.
    """
    from taccl_py.topology.builtins import load_topology

    loaded: dict[str, Topology] = {}

    def machine(node: int) -> Topology:
        name = cluster.nodes[node].machine
        if name not in loaded:
            loaded[name] = load_topology(name)
        return loaded[name]

    for option, node, nic in [("--nic-down", n, nic) for n, nic in nics_down] + [
        ("--nic-speed", n, nic) for n, nic, _ in nic_speeds
    ]:
        fault = _unknown_nic(machine(node), [nic])
        if fault is not None:
            raise ArgumentError(f"{node}:{nic}", option, f"{fault[0]} on node {node} ({machine(node).name})", fault[1])
    for node in sorted({n for n, _ in nics_down}):
        fault = _cannot_communicate(machine(node), node, cluster.nodes[node].nics_down, len(cluster.nodes))
        if fault is not None:
            raise ArgumentError(None, "--nic-down", *fault)


def _unknown_nic(machine: Topology, nics: Iterable[str]) -> tuple[str, str] | None:
    """Return (fault, expected) for the first of ``nics`` the machine lacks; None when it has them all."""
    names = [nic.name for nic in machine.nics()]
    for nic in nics:
        if nic not in names:
            return f"no NIC {nic!r}", "one of " + ", ".join(names)
    return None


def _cannot_communicate(machine: Topology, node: int, down: Iterable[str], nodes: int) -> tuple[str, str] | None:
    """Return (fault, expected) when ``down`` takes every NIC of machine ``node`` out of a cluster of ``nodes``."""
    if nodes > 1 and set(down) >= {nic.name for nic in machine.nics()}:
        return (
            f"node {node} ({machine.name}) cannot communicate: every NIC is down",
            "at least one NIC up on every node",
        )
    return None


def _changed_machine(machine: Topology, node: ClusterNode, index: int, cluster: Cluster, count: int) -> Topology:
    if not node.nics_down and not node.nic_speeds:
        return machine
    source, where = cluster.source, f"nodes[{index}]"
    for field, nics in (("nics_down", node.nics_down), ("nic_speed_GBps", [nic for nic, _ in node.nic_speeds])):
        fault = _unknown_nic(machine, nics)
        if fault is not None:
            raise TopologyError(source, f"{where}.{field}", f"{fault[0]} on {machine.name}", fault[1])
    fault = _cannot_communicate(machine, index, node.nics_down, count)
    if fault is not None:
        raise TopologyError(source, where, *fault)
    down = set(node.nics_down)
    speeds = dict(node.nic_speeds)
    vertices = [
        replace(v, net_bandwidth_GBps=speeds.get(v.name, v.net_bandwidth_GBps)) if v.kind is VertexKind.NIC else v
        for v in machine.vertices
        if v.name not in down
    ]
    links = [link for link in machine.links if link.src not in down and link.dst not in down]
    return make_topology(
        machine.name, vertices, links, description=machine.description, sources=machine.sources, source=source
    )


def _with_network_alpha(machine: Topology, alpha_us: float) -> Topology:
    vertices = [replace(v, net_alpha_us=alpha_us) if v.kind is VertexKind.NIC else v for v in machine.vertices]
    return make_topology(
        machine.name, vertices, machine.links, description=machine.description, sources=machine.sources
    )


def _changes(node: ClusterNode) -> list[str]:
    return [f"{nic} down" for nic in node.nics_down] + [f"{nic} at {speed:g} GB/s" for nic, speed in node.nic_speeds]


def _cluster_name(cluster: Cluster, machines: Sequence[Topology]) -> str:
    """Return ``dgx-a100x2+dgx-h100x2``, with ``-n1nic3down`` / ``-n0nic0at12.5G`` for each change.

    One machine keeps its own name (``dgx-a100-n0nic3down``).
    """
    runs: list[list] = []
    for machine in machines:
        if runs and runs[-1][0] == machine.name:
            runs[-1][1] += 1
        else:
            runs.append([machine.name, 1])
    name = "+".join(f"{machine}x{count}" if len(machines) > 1 else machine for machine, count in runs)
    for index, node in enumerate(cluster.nodes):
        name += "".join(f"-n{index}{nic}down" for nic in node.nics_down)
        name += "".join(f"-n{index}{nic}at{speed:g}G" for nic, speed in node.nic_speeds)
    return name


def _description(cluster: Cluster, machines: Sequence[Topology]) -> str:
    if cluster.description:
        return cluster.description
    parts = []
    for index, (node, machine) in enumerate(zip(cluster.nodes, machines)):
        changes = _changes(node)
        parts.append(f"n{index} {machine.name}" + (f" ({', '.join(changes)})" if changes else ""))
    text = "; ".join(parts)
    if cluster.network_alpha_us is not None:
        text += f"; network alpha {cluster.network_alpha_us:g} us"
    return f"{len(machines)} machines joined by a non-blocking network switch: {text}"


# -- what each node has ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    """One machine of a topology as ``taccl topo show`` lists it.

    ``nics_up`` holds (NIC name relative to the node, network GB/s per direction) in file order;
    ``nics_down`` the NICs the cluster took out.
    """

    node: int
    machine: str
    ranks: tuple[int, ...]
    nics_up: tuple[tuple[str, float | None], ...]
    nics_down: tuple[str, ...]


def node_statuses(topology: Topology, cluster: Cluster | None = None) -> tuple[NodeStatus, ...]:
    """Return every node's machine kind, ranks and NICs up (with speeds) and down.

    ``cluster`` is the description ``topology`` was built from; without it (or when its node
    count differs, e.g. a topology file that already spans machines) every node is named after
    the topology and no NIC is known to be down.
    """
    from taccl_py.topology.builtins import load_topology

    matches = cluster is not None and len(cluster.nodes) == topology.nodes
    names: dict[str, str] = {}
    statuses = []
    for node in range(topology.nodes):
        machine, down = topology.name, ()
        if matches:
            entry = cluster.nodes[node]
            if entry.machine not in names:
                names[entry.machine] = load_topology(entry.machine).name
            machine, down = names[entry.machine], entry.nics_down
        up = tuple((local_name(topology, nic.name, node), nic.net_bandwidth_GBps) for nic in topology.nics(node))
        ranks = tuple(gpu.rank for gpu in topology.gpus if gpu.node == node)
        statuses.append(NodeStatus(node, machine, ranks, up, tuple(dict.fromkeys(down))))
    return tuple(statuses)
