"""Topologies: model, built-in machines, composition, importers, live probe, NCCL export, bounds.

User-facing entry points are re-exported here; see each module for the details.
"""

from __future__ import annotations

from taccl_py.topology.bounds import LowerBound, lower_bound
from taccl_py.topology.builtins import builtin_topology_names, load_topology
from taccl_py.topology.compose import compose_nodes
from taccl_py.topology.importers import (
    import_topology,
    parse_nccl_topology_xml,
    parse_nvidia_smi_topo,
    parse_taccl_profile,
)
from taccl_py.topology.model import (
    Link,
    LinkKind,
    Route,
    Topology,
    Vertex,
    VertexKind,
    make_topology,
    route,
    transfer_time_us,
)
from taccl_py.topology.nccl_export import generate_nccl_topology_xml, write_nccl_topology_xml
from taccl_py.topology.probe import probe_topology
from taccl_py.topology.schema import generate_topology, parse_topology, read_topology, write_topology

__all__ = [
    "Link",
    "LinkKind",
    "LowerBound",
    "Route",
    "Topology",
    "Vertex",
    "VertexKind",
    "builtin_topology_names",
    "compose_nodes",
    "generate_nccl_topology_xml",
    "generate_topology",
    "import_topology",
    "load_topology",
    "lower_bound",
    "make_topology",
    "parse_nccl_topology_xml",
    "parse_nvidia_smi_topo",
    "parse_taccl_profile",
    "parse_topology",
    "probe_topology",
    "read_topology",
    "route",
    "transfer_time_us",
    "write_nccl_topology_xml",
    "write_topology",
]
