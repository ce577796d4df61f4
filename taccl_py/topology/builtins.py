"""The built-in machines (``topologies/*.json``) and the one loader the CLI and the library use."""

from __future__ import annotations

import json
import logging
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType

from taccl_py._io import is_readable_file, read_text
from taccl_py.errors import ArgumentError, TopologyError
from taccl_py.topology.compose import checked_node_count, compose_nodes
from taccl_py.topology.model import Topology, VertexKind
from taccl_py.topology.schema import parse_topology

__all__ = [
    "ALIASES",
    "BUILTIN_PACKAGE",
    "builtin_topology_dir",
    "builtin_topology_name",
    "builtin_topology_names",
    "load_topology",
    "nic_affinity",
]

logger = logging.getLogger(__name__)

# The package that carries topologies/ as data (pyproject.toml maps the folder onto it).
BUILTIN_PACKAGE = "taccl_py.data.topologies"

# Other names users know the built-in machines by (lower case) -> file stem in topologies/.
ALIASES = MappingProxyType(
    {
        "ndv4": "dgx-a100",
        "dgxa100": "dgx-a100",
        "dgxh100": "dgx-h100",
        "ndv5": "dgx-h100",
        "dgx-1": "dgx1",
        "dgx-2": "dgx2",
        "ndmi300xv5": "mi300x",  # Azure ND MI300X v5
        # DGX H200 differs from DGX H100 only in GPU memory (141 GB HBM3e per GPU): the same four
        # NVSwitch chips (NVLink4), 2 Xeon 8480C and 8 ConnectX-7 400 Gb/s, one spec list for both
        # (docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html)  # noqa: E501
        "h200": "dgx-h100",
        "dgx-h200": "dgx-h100",
        "dgxh200": "dgx-h100",
        "b200": "dgx-b200",
        "dgxb200": "dgx-b200",
        "gb200": "gb200-nvl72",
        "nvl72": "gb200-nvl72",
    }
)


def builtin_topology_dir() -> Traversable:
    """Return the folder of built-in topology files, from the installed package's data."""
    return files(BUILTIN_PACKAGE)


def builtin_topology_names() -> tuple[str, ...]:
    """Return the names of the built-in topologies, sorted (aliases not included).

    >>> "ndv2" in builtin_topology_names()
    True
    """
    folder = builtin_topology_dir()
    return tuple(sorted(item.name.removesuffix(".json") for item in folder.iterdir() if item.name.endswith(".json")))


def builtin_topology_name(text: str) -> str | None:
    """Return the built-in machine ``text`` names (any case, or an alias), or None when it names none.

    >>> builtin_topology_name("NDv4"), builtin_topology_name("ndv2"), builtin_topology_name("my.json")
    ('dgx-a100', 'ndv2', None)
    """
    key = ALIASES.get(text.lower(), text.lower())
    return key if key in builtin_topology_names() else None


def load_topology(name_or_path: str | Path, nodes: int = 1) -> Topology:
    """Return a topology: a built-in machine, a topology file or an imported description.

    Parameters
    ----------
    name_or_path : str or Path
        A built-in name or alias, any case (``"ndv2"``, ``"NDv4"``); a path to a
        ``taccl-topology/1`` JSON file; or a path to any file ``import_topology`` reads
        (``nvidia-smi topo -m`` output, NCCL topology XML, TACCL profile JSON).
    nodes : int
        Machines to join with ``compose_nodes`` (default 1: the machine itself).

    Returns
    -------
    Topology
        The machine, or ``nodes`` copies of it joined by a network switch.

    Raises
    ------
    ArgumentError
        If ``name_or_path`` is neither a built-in name nor an existing file (the message lists
        the built-in names), or ``nodes`` is not from 1 to 1024 (``MAX_CLUSTER_NODES``).
    TopologyError
        If the file is malformed, or ``nodes > 1`` for a machine without NIC figures.

    Examples
    --------
    >>> load_topology("ndv2").num_ranks
    8
    >>> load_topology("NDv4", nodes=2).name
    'dgx-a100x2'
    """
    checked_node_count(nodes)
    machine = _load_machine(str(name_or_path))
    return compose_nodes(machine, nodes)


def _load_machine(name_or_path: str) -> Topology:
    key = builtin_topology_name(name_or_path)
    if key is not None:
        path = builtin_topology_dir() / f"{key}.json"
        return parse_topology(read_text(path, TopologyError), source=str(path))
    path = Path(name_or_path)
    if not is_readable_file(path):
        raise ArgumentError(
            name_or_path,
            None,
            "no such built-in topology or file",
            "one of " + ", ".join(builtin_topology_names() + tuple(sorted(ALIASES))) + ", or a topology file",
        )
    text = read_text(path, TopologyError)
    if _is_taccl_topology(path, text):
        return parse_topology(text, source=str(path))
    from taccl_py.topology.importers import import_topology

    logger.info("importing %s", path)
    return import_topology(path)


def _is_taccl_topology(path: Path, text: str) -> bool:
    """Return True when ``text`` is meant as our format: a JSON object with a ``schema`` key.

    A ``.json`` file that is not valid JSON is ours too, so that its error names the line.
    """
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return path.suffix.lower() == ".json"
    return isinstance(document, dict) and "schema" in document


def nic_affinity(topology: Topology) -> dict[str, tuple[int, ...]]:
    """Return, for each NIC, the ranks of the GPUs fewest PCIe/host hops away from it.

    Hops count links in either direction through switches and CPUs (not through GPUs,
    NVSwitches or the network switch): on ndv2 the one NIC is nearest GPUs 0-3 (same NUMA
    node), on dgx1 each NIC is nearest the GPU pair on its PCIe switch.

    >>> nic_affinity(load_topology("dgx1"))["nic1"]
    (2, 3)
    """
    skip = {VertexKind.GPU, VertexKind.NVSWITCH, VertexKind.NET_SWITCH}
    undirected = topology.graph.to_undirected(as_view=True)
    affinity = {}
    for nic in topology.nics():
        distance = {nic.name: 0}
        frontier = [nic.name]
        found: list[int] = []
        while frontier and not found:
            following = []
            for name in frontier:
                for neighbour in undirected.neighbors(name):
                    if neighbour in distance:
                        continue
                    distance[neighbour] = distance[name] + 1
                    vertex = topology.vertex(neighbour)
                    if vertex.kind is VertexKind.GPU:
                        found.append(vertex.rank)
                    elif vertex.kind not in skip:
                        following.append(neighbour)
            frontier = following
        affinity[nic.name] = tuple(sorted(found))
    return affinity
