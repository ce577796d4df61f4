"""Topologies: model, built-in machines, composition, importers, live probe, NCCL export.

User-facing entry points are re-exported here; see each module for the details. The lower bounds
moved to :mod:`taccl_py.bounds`; ``lower_bound`` and ``LowerBound`` still resolve here, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import warnings

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

# Names that moved to taccl_py.bounds (the README imported them from here): removed in 0.3.
_MOVED_TO_BOUNDS = frozenset({"LowerBound", "lower_bound"})


def __getattr__(name: str) -> object:
    """Return a name that moved to :mod:`taccl_py.bounds`, with a ``DeprecationWarning``."""
    if name in _MOVED_TO_BOUNDS:
        warnings.warn(
            f"taccl_py.topology.{name} moved to taccl_py.bounds.{name}; the old path goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        # A lazy import: bounds sit above the topology, and this alias is the one arrow back.
        from taccl_py import bounds

        return getattr(bounds, name)
    raise AttributeError(f"module 'taccl_py.topology' has no attribute {name!r}")
