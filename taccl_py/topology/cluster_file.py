"""The ``taccl-cluster/1`` file: machines in rank order and what differs on each (docs/topology-format.md).

``parse_cluster`` / ``read_cluster`` return a ``Cluster``; ``taccl_py.topology.cluster`` turns it
into a ``Topology`` and reads the command line's shorthand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taccl_py._io import decode_json, is_readable_file, read_text
from taccl_py.errors import TopologyError
from taccl_py.topology.compose import MAX_CLUSTER_NODES

__all__ = [
    "CLUSTER_SCHEMA",
    "MAX_CLUSTER_NODES",
    "MAX_NIC_SPEED_GBps",
    "Cluster",
    "ClusterNode",
    "is_builtin_machine",
    "parse_cluster",
    "read_cluster",
]

CLUSTER_SCHEMA = "taccl-cluster/1"
_TOP_FIELDS = ("schema", "name", "description", "nodes", "network")
_NODE_FIELDS = ("machine", "count", "nics_down", "nic_speed_GBps")
_NETWORK_FIELDS = ("alpha_us",)
# The fastest network port a NIC may be given, GB/s per direction: 10 TB/s, fifty times the 200 GB/s
# of a 1.6 Tb/s Ethernet port (IEEE 802.3dj, the fastest NIC port specified) and over ten times a
# GPU's whole NVLink 5 (900 GB/s per direction); a larger figure is a typo or a unit slip (Gb/s, B/s).
MAX_NIC_SPEED_GBps = 10_000.0


@dataclass(frozen=True)
class ClusterNode:
    """One machine of a cluster: a built-in name or a topology file, and what differs on it.

    ``nic_speeds`` holds (NIC name, GB/s per direction) pairs for the NICs' network ports.
    """

    machine: str
    nics_down: tuple[str, ...] = ()
    nic_speeds: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Cluster:
    """Machines in rank order (node k holds ranks k*G .. k*G+G-1) and the network between them.

    ``network_alpha_us`` replaces every NIC's own network latency (µs) when given.
    """

    nodes: tuple[ClusterNode, ...]
    name: str | None = None
    description: str = ""
    network_alpha_us: float | None = None
    source: str = "<cluster>"


# -- reading ---------------------------------------------------------------------------------------


def parse_cluster(text: str, source: str = "<string>", base: Path | None = None) -> Cluster:
    """Return the cluster of a ``taccl-cluster/1`` document; machine paths are relative to ``base``."""
    document = decode_json(text, source, TopologyError, "a taccl-cluster/1 JSON object")
    if not isinstance(document, dict):
        raise TopologyError(source, None, f"a JSON {type(document).__name__}", "a taccl-cluster/1 JSON object")
    _check_fields(document, _TOP_FIELDS, source, "")
    if document.get("schema") != CLUSTER_SCHEMA:
        raise TopologyError(source, "schema", f"{document.get('schema')!r}", repr(CLUSTER_SCHEMA))
    entries = document.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise TopologyError(source, "nodes", f"{entries!r}", "a non-empty list of node objects")
    nodes: list[ClusterNode] = []
    for index, entry in enumerate(entries):
        node, count = _parse_node(entry, source, f"nodes[{index}]", base)
        if len(nodes) + count > MAX_CLUSTER_NODES:
            raise TopologyError(
                source, f"nodes[{index}].count", f"{len(nodes) + count} machines", f"at most {MAX_CLUSTER_NODES}"
            )
        nodes.extend([node] * count)
    network = document.get("network", {})
    if not isinstance(network, dict):
        raise TopologyError(source, "network", f"{network!r}", "an object")
    _check_fields(network, _NETWORK_FIELDS, source, "network.")
    alpha = network.get("alpha_us")
    if alpha is not None:
        alpha = _number(alpha, source, "network.alpha_us", positive=False)
    name = document.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise TopologyError(source, "name", f"{name!r}", "a non-empty string")
    description = document.get("description", "")
    if not isinstance(description, str):
        raise TopologyError(source, "description", f"{description!r}", "a string")
    return Cluster(tuple(nodes), name=name, description=description, network_alpha_us=alpha, source=source)


def read_cluster(path: str | Path) -> Cluster:
    """Return the cluster in the ``taccl-cluster/1`` file at ``path``."""
    path = Path(path)
    return parse_cluster(read_text(path, TopologyError), str(path), base=path.parent)


def _check_fields(obj: dict, allowed: tuple[str, ...], source: str, where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise TopologyError(source, f"{where}{key}", "unknown field", "one of " + ", ".join(allowed))


def _number(value: Any, source: str, field: str, positive: bool, maximum: float = math.inf) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0) or value > maximum:
        expected = "a number > 0" if positive else "a number >= 0"
        raise TopologyError(
            source, field, f"{value!r}", expected + (f" and at most {maximum:g}" if maximum < math.inf else "")
        )
    return float(value)


def _parse_node(entry: Any, source: str, where: str, base: Path | None) -> tuple[ClusterNode, int]:
    if not isinstance(entry, dict):
        raise TopologyError(source, where, f"{entry!r}", "a node object with a 'machine'")
    _check_fields(entry, _NODE_FIELDS, source, where + ".")
    machine = entry.get("machine")
    if not isinstance(machine, str) or not machine:
        raise TopologyError(source, f"{where}.machine", f"{machine!r}", "a built-in machine name or a topology file")
    if not is_builtin_machine(machine):
        path = base / machine if base is not None and not Path(machine).is_absolute() else Path(machine)
        if not is_readable_file(path):
            from taccl_py.topology.builtins import builtin_topology_names

            raise TopologyError(
                source,
                f"{where}.machine",
                f"no such built-in machine or file {str(path)!r}",
                "one of " + ", ".join(builtin_topology_names()) + " or a topology file (relative to the cluster file)",
            )
        machine = str(path)
    count = entry.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TopologyError(source, f"{where}.count", f"{count!r}", "an integer >= 1")
    down = entry.get("nics_down", [])
    if not isinstance(down, list) or not all(isinstance(nic, str) for nic in down):
        raise TopologyError(source, f"{where}.nics_down", f"{down!r}", "a list of NIC names")
    seen: set[str] = set()
    for nic in down:
        if nic in seen:
            raise TopologyError(source, f"{where}.nics_down", f"{nic!r} listed twice", "each NIC once")
        seen.add(nic)
    speeds = entry.get("nic_speed_GBps", {})
    if not isinstance(speeds, dict):
        raise TopologyError(source, f"{where}.nic_speed_GBps", f"{speeds!r}", "an object of NIC name: GB/s")
    pairs = tuple(
        (nic, _number(value, source, f"{where}.nic_speed_GBps.{nic}", positive=True, maximum=MAX_NIC_SPEED_GBps))
        for nic, value in speeds.items()
    )
    return ClusterNode(machine, tuple(down), pairs), count


def is_builtin_machine(machine: str) -> bool:
    from taccl_py.topology.builtins import builtin_topology_name

    return builtin_topology_name(machine) is not None
