"""Fingerprints of machines and clusters: equal exactly when their α-β structure is equal.

A node's signature covers its vertices (kind, index, network port figures) and its links (ends,
kind, α, bandwidth, lanes), with vertex names taken relative to the node and PCI ids and NUMA
numbers left out, so two nodes of one kind match wherever they sit in a cluster and whatever
their bus numbering. A cluster's fingerprint is its nodes' signatures in rank order plus the
links between nodes: a NIC down or at another speed changes it, a cluster's name does not.
"""

from __future__ import annotations

import hashlib
import json

from taccl_py.topology.compose import local_name
from taccl_py.topology.model import Topology

__all__ = ["cluster_fingerprint", "machine_kind", "node_signature", "node_signatures"]

_NODE_DIGITS = 12
_CLUSTER_DIGITS = 16


def _digest(structure: object, digits: int) -> str:
    text = json.dumps(structure, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


def _canonical(rows) -> list:
    """Return ``rows`` in one order whatever their mix of None, numbers and strings."""
    return sorted(rows, key=json.dumps)


def _figure(value: float | None) -> float | None:
    return None if value is None else round(float(value), 9)


def _node_structure(topology: Topology, node: int, nics: bool = True) -> list:
    skipped = ("net_switch",) if nics else ("net_switch", "nic")
    members = {v.name for v in topology.vertices if v.node == node and v.kind.value not in skipped}
    vertices = _canonical(
        [
            local_name(topology, v.name, node),
            v.kind.value,
            v.local_index,
            v.net_kind.value if v.net_kind else None,
            _figure(v.net_bandwidth_GBps),
            _figure(v.net_alpha_us),
        ]
        for v in topology.vertices
        if v.name in members
    )
    links = _canonical(
        [
            local_name(topology, link.src, node),
            local_name(topology, link.dst, node),
            link.kind.value,
            _figure(link.alpha_us),
            _figure(link.bandwidth_GBps),
            link.count,
        ]
        for link in topology.links
        if link.src in members and link.dst in members
    )
    return [vertices, links]


def node_signature(topology: Topology, node: int) -> str:
    """Return a hex digest of machine ``node``'s structure: equal for two nodes of the same kind and state.

    >>> from taccl_py.topology import load_topology
    >>> pair = load_topology("ndv2", nodes=2)
    >>> node_signature(pair, 0) == node_signature(pair, 1) == node_signature(load_topology("ndv2"), 0)
    True
    """
    return _digest(_node_structure(topology, node), _NODE_DIGITS)


def machine_kind(topology: Topology, node: int) -> str:
    """Return a hex digest of machine ``node`` without its NICs: equal for a machine and its copies with NICs down.

    >>> from taccl_py.topology.cluster import load_cluster
    >>> t = load_cluster(topology="dgx-a100", nodes=2, nics_down=["1:nic3"])
    >>> machine_kind(t, 0) == machine_kind(t, 1), node_signature(t, 0) == node_signature(t, 1)
    (True, False)
    """
    return _digest(_node_structure(topology, node, nics=False), _NODE_DIGITS)


def node_signatures(topology: Topology) -> tuple[str, ...]:
    """Return every node's signature, in node order."""
    return tuple(node_signature(topology, node) for node in range(topology.nodes))


def cluster_fingerprint(topology: Topology) -> str:
    """Return a hex digest of the whole cluster: its nodes in rank order and the links between them.

    >>> from taccl_py.topology import load_topology
    >>> cluster_fingerprint(load_topology("ndv2", 2)) == cluster_fingerprint(load_topology("ndv2", 2))
    True
    """
    node_of = {v.name: v.node for v in topology.vertices if v.kind.value != "net_switch"}
    between = _canonical(
        [
            node_of.get(link.src),
            local_name(topology, link.src, node_of.get(link.src, -1)),
            node_of.get(link.dst),
            local_name(topology, link.dst, node_of.get(link.dst, -1)),
            link.kind.value,
            _figure(link.alpha_us),
            _figure(link.bandwidth_GBps),
            link.count,
        ]
        for link in topology.links
        if node_of.get(link.src) is None or node_of.get(link.dst) is None or node_of[link.src] != node_of[link.dst]
    )
    return _digest([list(node_signatures(topology)), between], _CLUSTER_DIGITS)
