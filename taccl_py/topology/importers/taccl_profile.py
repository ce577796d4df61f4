"""Read TACCL's topology profiles (microsoft/taccl ``taccl/examples/topo/*.json``) into a ``Topology``.

A profile gives α and β per GPU link and per network hop in TACCL's time unit for one chunk
size: ``invbw`` ≈ α + β is the time of one chunk. The machines TACCL hard-codes
(taccl/topologies/generic.py) are recognised as it recognises them:

- two ``node_betas_list`` entries, 8 GPUs: NDv2 / DGX-1 hybrid cube-mesh; the first β on the
  double-NVLink pairs (0-1, 0-4, 1-3, 2-3, 2-6, 4-5, 5-7, 6-7), the second on the single ones;
- one entry and a name like ``DGX2``: 16 GPUs on NVSwitches, the β of each GPU's switch port;
- one entry otherwise (TACCL's hub-and-spoke, e.g. the MI300X profile): a direct link per pair;
- ``links``/``betas``/``invbws`` matrices (TACCL's ``custom``): a direct link where ``links > 0``.

Units. TACCL's profiles are made for one chunk size, named at the end of ``name`` (``NDv2_1KB``,
``NDv2_32KB``, ``DGX2_1MB``; none means 1 MB) with binary steps (1 KB = 1 MB / 1024: the shipped
1 KB, 32 KB and 1 MB NDv2 files agree only so), and the 1 KB and 32 KB files multiply every time
by 100 and 10 so that TACCL's integer truncation keeps precision (taccl-data README). So
α (µs) = α_file / scale and β (µs per MB) = β_file / scale x (1 MB / chunk); the bandwidth is
1e6 bytes / β, i.e. 1e3 / β GB/s, reading the 1 MB profiles' µs/MB as docs/design.md does
(23 µs/MB ≈ 43.5 GB/s). The NIC's ``net_alpha_us`` is ``remote_alpha`` and its rate comes from
``remote_beta``: TACCL's whole GPU-to-GPU cross-node cost, so the GPU-to-NIC PCIe links carry
no α of their own and never bottleneck the NIC.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from taccl_py._io import decode_json
from taccl_py.errors import ArgumentError, FormatError, TopologyError
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology
from taccl_py.topology.rates import (
    HOST_ALPHA_US,
    NCCL_PCI_BW_GBPS,
    PCIE_ALPHA_US,
    duplex,
)

__all__ = ["parse_taccl_profile", "MAX_DEVICES_PER_NODE", "REFERENCE_CHUNK_BYTES"]

logger = logging.getLogger(__name__)

REFERENCE_CHUNK_BYTES = 2**20  # the chunk of TACCL's "1MB" profiles, whose β is µs per MB
# A profile's counts expand into GPUs, NICs and all-to-all links (count² of them); no node comes near
# this (DGX-2: 16 GPUs, 8 NICs; an NVL72 rack: 72 GPUs), and a count past it would exhaust memory.
MAX_DEVICES_PER_NODE = 1024
_SIZE_SUFFIX_RE = re.compile(r"(?<!\d)(\d{1,6})\s*(KB|MB|GB)\s*$", re.IGNORECASE)  # 6 digits: up to ~1 PB
_BINARY_BYTES = MappingProxyType({"KB": 2**10, "MB": 2**20, "GB": 2**30})
# taccl-data README: the shipped 1 KB and 32 KB profiles scale times by 100 and 10.
_SHIPPED_TIME_SCALE = MappingProxyType({2**10: 100.0, 32 * 2**10: 10.0, 2**20: 1.0})
# taccl/topologies/generic.py ndv2(): node_betas_list[0] on these pairs, [1] on the others.
_NDV2_DOUBLE_PAIRS = ((0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7))
_NDV2_SINGLE_PAIRS = ((0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6))
# Azure's NDv2 (azure-ndv2-topo.xml): GPUs 0-3 and the one NIC on NUMA node 0, GPUs 4-7 on node 1,
# Skylake CPUs (familyid 6, modelid 85: NCCL's SKL_QPI_BW, 10 GB/s between them).
_NDV2_SOCKETS = ((0, 1, 2, 3), (4, 5, 6, 7))
_NDV2_HOST_GBPS = 10.0
_DGX2_NAME_RE = re.compile(r"dgx-?2", re.IGNORECASE)
_DGX2_NVLINKS_PER_GPU = 6  # a DGX-2 V100 has 6 NVLink2 ports into the NVSwitch plane
_AMD_NAME_RE = re.compile(r"MI\d{3}", re.IGNORECASE)
_MB_BYTES = 1e6
_NDV2_LAYOUT = "NDv2 hybrid cube-mesh"


@dataclass(frozen=True)
class _Units:
    chunk_bytes: int
    scale: float

    def us(self, value: float) -> float:
        return value / self.scale

    def GBps(self, beta: float) -> float:
        us_per_MB = beta / self.scale * (REFERENCE_CHUNK_BYTES / self.chunk_bytes)
        return _MB_BYTES / us_per_MB / 1e3


def parse_taccl_profile(
    text: str,
    source: str = "<string>",
    *,
    name: str | None = None,
    chunk_size_bytes: int | None = None,
    time_scale: float | None = None,
    gpu_link_kind: LinkKind | None = None,
) -> Topology:
    """Return the one-machine topology a TACCL profile JSON describes.

    Parameters
    ----------
    text : str
        The profile (``name``, ``gpus_per_node``, ``alpha``, ``node_betas_list`` and
        ``node_invbws_list`` or ``links``/``betas``/``invbws``; ``nics_per_node``,
        ``remote_alpha``, ``remote_beta``, ``remote_invbw``).
    source : str
        Where it came from, named in errors.
    name : str, optional
        The topology's name (default the profile's ``name``).
    chunk_size_bytes : int, optional
        The chunk the profile was made for, binary (1 KB = 1024). Default: the size ending the
        profile's name, else 1 MB.
    time_scale : float, optional
        The factor the file's times carry (default 100 for 1 KB, 10 for 32 KB, 1 for 1 MB
        profiles, TACCL's convention; 1 with a warning for other chunk sizes).
    gpu_link_kind : LinkKind, optional
        Kind of the direct GPU links (default ``xgmi`` for an AMD ``MI###`` name, ``pcie`` when
        the name says PCIe, else ``nvlink``).

    Returns
    -------
    Topology
        One node: ``gpu{i}`` by matrix index, ``nic{j}``, ``pcie{k}`` (one per NIC's GPU group),
        ``cpu{n}`` and ``nvswitch0`` for a DGX-2.

    Raises
    ------
    FormatError
        Malformed JSON (with its line) or not a JSON object.
    TopologyError
        A missing or ill-typed field, a non-positive β, a matrix of the wrong shape, a layout
        TACCL does not define (NDv2 needs 8 GPUs and two β).
    ArgumentError
        ``chunk_size_bytes`` or ``time_scale`` not positive.

    Examples
    --------
    >>> text = '{"name": "NDv2_1MB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.3, ' \\
    ...        '"node_betas_list": [23, 46], "node_invbws_list": [23, 46], "remote_alpha": 2.6, ' \\
    ...        '"remote_beta": 105, "remote_invbw": 107}'
    >>> topo = parse_taccl_profile(text)
    >>> round(topo.link("gpu0", "gpu1").bandwidth_GBps, 2), topo.link("gpu0", "gpu1").count
    (43.48, 2)
    >>> round(topo.vertex("nic0").net_bandwidth_GBps, 2), topo.vertex("nic0").net_alpha_us
    (9.52, 2.6)
    """
    for label, value in (("chunk_size_bytes", chunk_size_bytes), ("time_scale", time_scale)):
        if value is not None and not value > 0:
            raise ArgumentError(source, label, f"{value} is not positive", "a positive number")
    data = _load_object(text, source)
    profile_name = _field(data, "name", str, source)
    gpus = _count(data, "gpus_per_node", source, minimum=1)
    units = _units(profile_name, chunk_size_bytes, time_scale)
    kind = gpu_link_kind or _guess_link_kind(profile_name)
    alpha_us = units.us(_number(data, "alpha", source))
    gpu_links, layout, has_switch = _gpu_links(data, gpus, alpha_us, units, kind, profile_name, source)
    nic_vertices = _nics(data, units, source)
    groups = (_ndv2_groups if layout == _NDV2_LAYOUT else _nic_groups)(gpus, len(nic_vertices))
    vertices = [Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i, numa=_numa_of(i, groups)) for i in range(gpus)]
    vertices += [
        Vertex(
            v.name,
            v.kind,
            local_index=v.local_index,
            numa=_numa_of_nic(j, groups),
            net_kind=v.net_kind,
            net_bandwidth_GBps=v.net_bandwidth_GBps,
            net_alpha_us=v.net_alpha_us,
        )
        for j, v in enumerate(nic_vertices)
    ]
    if has_switch:
        vertices.append(Vertex("nvswitch0", VertexKind.NVSWITCH))
    pcie_GBps = max([NCCL_PCI_BW_GBPS] + [v.net_bandwidth_GBps or 0.0 for v in nic_vertices])
    pcie_vertices, pcie_links = _pcie_links(groups, pcie_GBps)
    vertices += pcie_vertices
    description = (
        f"TACCL profile {profile_name}: {gpus} GPUs ({layout}), {len(nic_vertices)} NICs; "
        f"chunk {units.chunk_bytes} B, file times / {units.scale:g}"
    )
    return make_topology(name or profile_name, vertices, gpu_links + pcie_links, 1, description, (source,), source)


# -- fields --------------------------------------------------------------------------------------


def _load_object(text: str, source: str) -> Mapping[str, object]:
    data = decode_json(text, source, FormatError, "a TACCL profile JSON object")
    if not isinstance(data, dict):
        raise FormatError(source, None, f"top level is a JSON {type(data).__name__}", "a JSON object")
    return data


def _field(data: Mapping[str, object], key: str, kind: type | tuple[type, ...], source: str) -> object:
    if key not in data:
        raise TopologyError(source, key, "missing", f"the field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TopologyError(source, key, f"{value!r} has the wrong type", f"{getattr(kind, '__name__', 'a number')}")
    return value


def _finite(value: int | float) -> float:
    """Return ``value`` as a float, NaN for one no float holds (json reads NaN, Infinity, 1e999, 10**400)."""
    try:
        number = float(value)
    except OverflowError:
        return math.nan
    return number if math.isfinite(number) else math.nan


def _number(data: Mapping[str, object], key: str, source: str, *, positive: bool = False) -> float:
    value = _finite(_field(data, key, (int, float), source))
    if math.isnan(value):
        raise TopologyError(source, key, f"{data[key]!r} is not finite", "a finite number")
    if value < 0 or (positive and value == 0):
        raise TopologyError(
            source,
            key,
            f"{value:g} is {'not positive' if positive else 'negative'}",
            "a number > 0" if positive else "a number >= 0",
        )
    return value


def _count(data: Mapping[str, object], key: str, source: str, minimum: int = 0) -> int:
    value = _field(data, key, int, source)
    if not minimum <= value <= MAX_DEVICES_PER_NODE:
        expected = f"an integer in {minimum}..{MAX_DEVICES_PER_NODE}"
        raise TopologyError(source, key, f"{value} is out of range", expected)
    return value


def _numbers(values: object, field: str, source: str, length: int | None = None) -> list[float]:
    expected = f"a list of {length} numbers >= 0" if length is not None else "a list of numbers >= 0"
    if not isinstance(values, list) or (length is not None and len(values) != length):
        raise TopologyError(source, field, f"{values!r} has the wrong shape", expected)
    for index, value in enumerate(values):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not _finite(value) >= 0:
            raise TopologyError(source, f"{field}[{index}]", f"{value!r} is not a finite number >= 0", "a number >= 0")
    return [float(v) for v in values]


def _units(profile_name: str, chunk_size_bytes: int | None, time_scale: float | None) -> _Units:
    chunk = chunk_size_bytes
    if chunk is None:
        match = _SIZE_SUFFIX_RE.search(profile_name)
        chunk = int(match.group(1)) * _BINARY_BYTES[match.group(2).upper()] if match else REFERENCE_CHUNK_BYTES
    scale = time_scale if time_scale is not None else _SHIPPED_TIME_SCALE.get(chunk)
    if scale is None:
        logger.warning(
            "profile %s: no known time scale for %d-byte chunks; reading its times as µs (pass time_scale)",
            profile_name,
            chunk,
        )
        scale = 1.0
    return _Units(chunk, scale)


def _guess_link_kind(profile_name: str) -> LinkKind:
    if _AMD_NAME_RE.search(profile_name):
        return LinkKind.XGMI
    return LinkKind.PCIE if "pcie" in profile_name.lower() else LinkKind.NVLINK


# -- GPU links -----------------------------------------------------------------------------------


def _gpu_links(
    data: Mapping[str, object],
    gpus: int,
    alpha_us: float,
    units: _Units,
    kind: LinkKind,
    profile_name: str,
    source: str,
) -> tuple[list[Link], str, bool]:
    """Return the GPU links, the layout's name and whether it uses ``nvswitch0``."""
    has_lists = "node_betas_list" in data or "node_invbws_list" in data
    if "links" in data or "betas" in data:
        if has_lists:
            raise TopologyError(source, "node_betas_list", "given beside links/betas", "one of the two forms")
        return _matrix_links(data, gpus, alpha_us, units, kind, source), "link matrix", False
    betas = _numbers(_field(data, "node_betas_list", list, source), "node_betas_list", source)
    _numbers(_field(data, "node_invbws_list", list, source), "node_invbws_list", source, len(betas))
    for index, beta in enumerate(betas):
        if beta == 0:
            raise TopologyError(source, f"node_betas_list[{index}]", "0 (infinite bandwidth)", "a number > 0")
    if len(betas) == 2:
        if gpus != 8:
            raise TopologyError(source, "gpus_per_node", f"{gpus} GPUs with two node betas", "8 (TACCL's NDv2 layout)")
        links = []
        for pairs, beta, count in ((_NDV2_DOUBLE_PAIRS, betas[0], 2), (_NDV2_SINGLE_PAIRS, betas[1], 1)):
            for a, b in pairs:
                links += duplex(f"gpu{a}", f"gpu{b}", kind, alpha_us, units.GBps(beta), count)
        return links, _NDV2_LAYOUT, False
    if len(betas) != 1:
        raise TopologyError(source, "node_betas_list", f"{len(betas)} betas", "1 (switch or all-to-all) or 2 (NDv2)")
    if _DGX2_NAME_RE.search(profile_name):
        links = []
        for i in range(gpus):
            links += duplex(
                f"gpu{i}", "nvswitch0", LinkKind.NVSWITCH, alpha_us / 2, units.GBps(betas[0]), _DGX2_NVLINKS_PER_GPU
            )
        return links, "NVSwitch", True
    links = [
        Link(f"gpu{i}", f"gpu{j}", kind, alpha_us, units.GBps(betas[0]))
        for i in range(gpus)
        for j in range(gpus)
        if i != j
    ]
    return links, f"all-to-all {kind.value}", False


def _matrix_links(
    data: Mapping[str, object], gpus: int, alpha_us: float, units: _Units, kind: LinkKind, source: str
) -> list[Link]:
    matrices = {}
    for key in ("links", "betas", "invbws"):
        rows = _field(data, key, list, source)
        if len(rows) != gpus:
            raise TopologyError(source, key, f"{len(rows)} rows", f"{gpus} rows (gpus_per_node)")
        matrices[key] = [_numbers(row, f"{key}[{i}]", source, gpus) for i, row in enumerate(rows)]
    links = []
    for i in range(gpus):
        for j in range(gpus):
            lanes, beta = matrices["links"][i][j], matrices["betas"][i][j]
            if lanes != int(lanes):
                raise TopologyError(source, f"links[{i}][{j}]", f"{lanes:g} is not a whole number", "a link count")
            if lanes and i == j:
                raise TopologyError(source, f"links[{i}][{j}]", f"a link from GPU {i} to itself", "0 on the diagonal")
            if lanes and beta == 0:
                raise TopologyError(source, f"betas[{i}][{j}]", "0 (infinite bandwidth) on a link", "a number > 0")
            if lanes:
                links.append(Link(f"gpu{i}", f"gpu{j}", kind, alpha_us, units.GBps(beta), int(lanes)))
    return links


# -- NICs, PCIe and CPUs ---------------------------------------------------------------------------


def _nics(data: Mapping[str, object], units: _Units, source: str) -> list[Vertex]:
    count = _count(data, "nics_per_node", source) if "nics_per_node" in data else 0
    if count == 0:
        return []
    remote_alpha_us = units.us(_number(data, "remote_alpha", source))
    remote_GBps = units.GBps(_number(data, "remote_beta", source, positive=True))
    _number(data, "remote_invbw", source)
    return [
        Vertex(
            f"nic{j}",
            VertexKind.NIC,
            local_index=j,
            net_kind=LinkKind.IB,
            net_bandwidth_GBps=remote_GBps,
            net_alpha_us=remote_alpha_us,
        )
        for j in range(count)
    ]


@dataclass(frozen=True)
class _Group:
    """GPUs and NICs behind one PCIe switch, on CPU ``cpu``."""

    gpus: tuple[int, ...]
    nics: tuple[int, ...]
    cpu: int


def _nic_groups(gpus: int, nics: int) -> list[_Group]:
    """NIC j serves GPUs g with g * nics // gpus == j (TACCL's DGX-2 sketches: GPU pairs per NIC)."""
    if nics == 0:
        return [_Group(tuple(range(gpus)), (), 0)]
    return [_Group(tuple(g for g in range(gpus) if g * nics // gpus == j), (j,), 0) for j in range(nics)]


def _ndv2_groups(gpus: int, nics: int) -> list[_Group]:
    """NDv2: the NIC(s) beside GPUs 0-3 on socket 0, as TACCL's NDv2 sketches send from GPU 0."""
    return [_Group(_NDV2_SOCKETS[0], tuple(range(nics)), 0), _Group(_NDV2_SOCKETS[1], (), 1)]


def _numa_of(gpu: int, groups: Sequence[_Group]) -> int:
    return next(group.cpu for group in groups if gpu in group.gpus)


def _numa_of_nic(nic: int, groups: Sequence[_Group]) -> int:
    return next(group.cpu for group in groups if nic in group.nics)


def _pcie_links(groups: Sequence[_Group], pcie_GBps: float) -> tuple[list[Vertex], list[Link]]:
    vertices: list[Vertex] = []
    links: list[Link] = []
    for k, group in enumerate(groups):
        switch = f"pcie{k}"
        vertices.append(Vertex(switch, VertexKind.PCIE_SWITCH, numa=group.cpu))
        for device in [f"gpu{g}" for g in group.gpus] + [f"nic{j}" for j in group.nics]:
            links += duplex(device, switch, LinkKind.PCIE, 0.0, pcie_GBps)
        links += duplex(switch, f"cpu{group.cpu}", LinkKind.PCIE, PCIE_ALPHA_US, pcie_GBps)
    cpus = sorted({group.cpu for group in groups})
    vertices += [Vertex(f"cpu{n}", VertexKind.CPU, numa=n) for n in cpus]
    for i, a in enumerate(cpus):
        for b in cpus[i + 1 :]:
            links += duplex(f"cpu{a}", f"cpu{b}", LinkKind.HOST, HOST_ALPHA_US, _NDV2_HOST_GBPS)
    return vertices, links
