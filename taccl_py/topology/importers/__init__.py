"""Import a machine's topology from what the machine or a peer tool already prints.

Three formats are read, each into a one-machine ``Topology`` (``nodes=1``; join machines with
``compose_nodes``):

- ``nvidia-smi topo -m`` output (``parse_nvidia_smi_topo``),
- NCCL's topology XML, as ``NCCL_TOPO_FILE`` takes and ``NCCL_TOPO_DUMP_FILE`` writes
  (``parse_nccl_topology_xml``),
- TACCL's topology profiles and its ``custom`` link-matrix format (``parse_taccl_profile``).

``import_topology(path)`` reads a file and picks the parser by sniffing its content; a file in our
own ``taccl-topology/1`` format is read as it is (``parse_topology``), so that ``taccl topo import``
takes any topology file a user holds.
"""

from __future__ import annotations

import re
from dataclasses import replace
from enum import Enum
from pathlib import Path

from taccl_py._io import decode_json, read_text
from taccl_py.errors import FormatError
from taccl_py.topology.importers.nccl_xml import parse_nccl_topology_xml
from taccl_py.topology.importers.nvidia_smi import parse_nvidia_smi_topo
from taccl_py.topology.importers.taccl_profile import parse_taccl_profile
from taccl_py.topology.model import Topology
from taccl_py.topology.schema import not_a_topology, parse_topology

__all__ = [
    "TopologyFormat",
    "detect_topology_format",
    "import_topology",
    "parse_nccl_topology_xml",
    "parse_nvidia_smi_topo",
    "parse_taccl_profile",
]

_XML_ROOT_RE = re.compile(r"<\s*([A-Za-z_][\w.-]*)")
_NVIDIA_SMI_HEADER_RE = re.compile(r"^\s*GPU0(\s|$)", re.MULTILINE)
_EXPECTED = "NCCL topology XML (<system>), a TACCL profile JSON or `nvidia-smi topo -m` output"


class TopologyFormat(str, Enum):
    """The formats ``import_topology`` reads; values are their command-line names."""

    NVIDIA_SMI = "nvidia-smi"
    NCCL_XML = "nccl-xml"
    TACCL_PROFILE = "taccl-profile"
    TACCL_TOPOLOGY = "taccl-topology"


def detect_topology_format(text: str, source: str = "<string>") -> TopologyFormat:
    """Return which ``TopologyFormat`` ``text`` is in; raise ``FormatError`` if none.

    XML whose first element is ``<system>`` is NCCL topology XML; a JSON object with
    ``gpus_per_node`` and ``node_betas_list`` or ``links``/``betas`` is a TACCL profile; one with
    ``schema`` or ``vertices`` is our own ``taccl-topology/1``; text with a header row starting
    with ``GPU0`` is ``nvidia-smi topo -m`` output.

    >>> detect_topology_format('<system version="1"></system>').value
    'nccl-xml'
    >>> detect_topology_format('{"gpus_per_node": 8, "node_betas_list": [8]}').value
    'taccl-profile'
    """
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("<"):
        return _detect_xml(stripped, source)
    if stripped.startswith("{"):
        return _detect_json(stripped, source)
    if _NVIDIA_SMI_HEADER_RE.search(text):
        return TopologyFormat.NVIDIA_SMI
    raise FormatError(source, None, "unknown topology format", _EXPECTED)


def _detect_xml(text: str, source: str) -> TopologyFormat:
    body = re.sub(r"<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>]*>", "", text, flags=re.DOTALL)
    match = _XML_ROOT_RE.search(body)
    root = match.group(1) if match else None
    if root == "system":
        return TopologyFormat.NCCL_XML
    if root == "algo":  # MSCCL-IR XML (taccl_py.msccl.parse reads <algo>)
        raise FormatError(source, None, "an algorithm file (MSCCL XML), not a topology", _EXPECTED)
    hint = " (an NCCL graph file, NCCL_GRAPH_FILE, not a topology)" if root == "graphs" else ""
    raise FormatError(source, None, f"unknown XML root element <{root}>{hint}", _EXPECTED)


def _detect_json(text: str, source: str) -> TopologyFormat:
    data = decode_json(text, source, FormatError, "a TACCL profile JSON object")
    if (
        isinstance(data, dict)
        and "gpus_per_node" in data
        and ("node_betas_list" in data or ("links" in data and "betas" in data))
    ):
        return TopologyFormat.TACCL_PROFILE
    other = not_a_topology(data)
    if other is not None:
        raise FormatError(source, None, f"{other}, not a topology", _EXPECTED)
    if isinstance(data, dict) and ("schema" in data or "vertices" in data):
        return TopologyFormat.TACCL_TOPOLOGY
    raise FormatError(source, None, "JSON without gpus_per_node and node_betas_list or links/betas", _EXPECTED)


def import_topology(path: str | Path, name: str | None = None) -> Topology:
    """Return the one-machine topology the file at ``path`` describes, whatever its format.

    Parameters
    ----------
    path : str or Path
        An ``nvidia-smi topo -m`` output, an NCCL topology XML, a TACCL profile JSON or a
        ``taccl-topology/1`` file (read as it is, its name kept); ``-`` reads standard input.
    name : str, optional
        The topology's name; default the TACCL profile's ``name`` or the file's stem.

    Returns
    -------
    Topology
        One node, built and validated by ``make_topology``; GPU ranks follow the file's own
        numbering (GPU0.. for nvidia-smi, ``dev`` for NCCL XML, matrix index for TACCL).

    Raises
    ------
    FormatError
        The file cannot be read, is in none of the formats, or breaks its format's syntax.
    TopologyError
        The content is inconsistent (a device listed twice, an NVLink to an unknown target, ...),
        or a ``taccl-topology/1`` file breaks its schema.

    Notes
    -----
    The parsers take options this function leaves at their defaults (e.g. ``nvlink_GBps`` for
    nvidia-smi output, ``time_scale`` for TACCL profiles); call them directly to set those.
    """
    source = str(path)
    text = read_text(path, FormatError).removeprefix("\ufeff")  # a BOM some editors write
    kind = detect_topology_format(text, source)
    stem = Path(source).stem if source != "-" else None
    if kind == TopologyFormat.NCCL_XML:
        return parse_nccl_topology_xml(text, source, name=name or stem)
    if kind == TopologyFormat.TACCL_PROFILE:
        return parse_taccl_profile(text, source, name=name)
    if kind == TopologyFormat.TACCL_TOPOLOGY:
        topology = parse_topology(text, source)
        return topology if name is None else replace(topology, name=name)
    return parse_nvidia_smi_topo(text, source, name=name or stem)
