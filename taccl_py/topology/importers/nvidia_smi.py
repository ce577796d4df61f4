"""Read the matrix ``nvidia-smi topo -m`` prints into a one-machine ``Topology``.

The matrix says, for each pair of devices (GPUs and NICs), how traffic between them travels:
``NV#`` over # bonded NVLinks, ``PIX`` through at most one PCIe switch, ``PXB`` through several,
``PHB`` through a CPU's PCIe host bridge, ``NODE`` between host bridges of one NUMA node, ``SYS``
across the SMP interconnect between NUMA nodes, ``X`` the device itself. The model built from it:

- GPUs ``gpu{i}`` ranked in header order (GPU0, GPU1, ...); NICs ``nic{j}`` in header order, named
  by the "NIC Legend" in the description.
- NVLinks: direct ``gpu{i} <-> gpu{j}`` links with the file's count, or, when every GPU pair shows
  the same ``NV#`` and that many links per peer exceed ``MAX_NVLINKS_PER_GPU`` (8 x NV12 on a DGX
  A100, 8 x NV18 on an HGX H100), one ``nvswitch0`` with a port of # links per GPU.
- PCIe: one switch ``pcie{k}`` per group of devices joined by ``PIX``/``PXB``; a group joined only
  through ``PXB`` whose parts are ``PIX`` groups gets a parent switch over leaf switches. A NIC's
  GPUs (its affinity) are those sharing its PCIe switch tree.
- NUMA: one ``cpu{n}`` per NUMA node (the GPUs' "NUMA Affinity", else devices joined by anything
  but ``SYS``); all CPUs are joined pairwise by ``host`` links.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from taccl_py.errors import ArgumentError
from taccl_py.topology.importers.nvidia_smi_matrix import (
    PIX_TOKENS,
    PXB_TOKENS,
    SAME_NUMA_TOKENS,
    TopoMatrix,
    parse_topo_matrix,
)
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology
from taccl_py.topology.rates import (
    DEFAULT_HOST_BANDWIDTH_GBPS,
    DEFAULT_NET_ALPHA_US,
    DEFAULT_NET_BANDWIDTH_GBPS,
    HOST_ALPHA_US,
    MAX_NVLINKS_PER_GPU,
    NCCL_PCI_BW_GBPS,
    NVLINK_ALPHA_US,
    NVSWITCH_HOP_ALPHA_US,
    PCIE_ALPHA_US,
    duplex,
    nccl_nvlink_bw_GBps,
    net_kind_from_name,
)

__all__ = ["parse_nvidia_smi_topo", "DEFAULT_HOST_BANDWIDTH_GBPS"]

logger = logging.getLogger(__name__)

# The GPU generation a per-GPU NVLink total points to: (most links, SM for NCCL's per-link rate,
# PCIe x16 GB/s by NCCL's width*speed/80: Gen3 12, Gen4 24, Gen5 48). V100 has 6 NVLinks, A100 12,
# H100 18 (NVIDIA product briefs).
_GENERATIONS = ((6, 70, 12.0), (12, 80, 24.0), (MAX_NVLINKS_PER_GPU, 90, 48.0))


def parse_nvidia_smi_topo(
    text: str,
    source: str = "<string>",
    nvlink_GBps: float | None = None,
    *,
    name: str | None = None,
    pcie_bandwidth_GBps: float | None = None,
    host_bandwidth_GBps: float = DEFAULT_HOST_BANDWIDTH_GBPS,
    net_bandwidth_GBps: float = DEFAULT_NET_BANDWIDTH_GBPS,
    net_alpha_us: float = DEFAULT_NET_ALPHA_US,
) -> Topology:
    """Return the one-machine topology that ``nvidia-smi topo -m`` output describes.

    Parameters
    ----------
    text : str
        The output, columns separated by tabs or runs of spaces, legend text after it allowed.
    source : str
        Where the text came from, named in errors.
    nvlink_GBps : float, optional
        Bandwidth of one NVLink (GB/s per direction). Default: NCCL's effective rate for the GPU
        generation the NVLinks per GPU suggest (<= 6: V100, 20; <= 12: A100, 20; else H100, 20.6).
        The matrix cannot tell H100 from B200 (both NV18): pass 40.1 for Blackwell.
    name : str, optional
        The topology's name (default ``"nvidia-smi"``).
    pcie_bandwidth_GBps : float, optional
        PCIe link bandwidth (GB/s). Default: x16 of the guessed generation (12, 24 or 48).
    host_bandwidth_GBps : float
        Bandwidth between NUMA nodes (GB/s); default NCCL's Skylake UPI figure, 10.
    net_bandwidth_GBps, net_alpha_us : float
        Rate (GB/s) and latency (µs) of every NIC's network port (default 25 GB/s = HDR 200 Gb/s,
        2.6 µs as TACCL's profiles).

    Returns
    -------
    Topology
        One node; GPUs ``gpu0..`` in header order, NICs ``nic0..``, ``pcie{k}``, ``cpu{numa}``
        and ``nvswitch0`` when the NVLinks go through NVSwitches.

    Raises
    ------
    FormatError
        No header row starting with GPU0, an unknown header column, a row of the wrong length, a cell
        token that is not X, NV#, PIX, PXB, PHB, NODE, SYS (or the older PSB, SOC).
    TopologyError
        No GPU rows, a device listed twice, a row missing, an asymmetric matrix, NVLink to a NIC.
    ArgumentError
        A bandwidth or latency argument that is not positive (latency: negative).

    Examples
    --------
    >>> text = '''        GPU0    GPU1    CPU Affinity    NUMA Affinity
    ... GPU0     X      NV4     0-15            0
    ... GPU1    NV4      X      0-15            0
    ... '''
    >>> topo = parse_nvidia_smi_topo(text)
    >>> topo.num_ranks, topo.link("gpu0", "gpu1").count, topo.link("gpu0", "gpu1").bandwidth_GBps
    (2, 4, 80.0)
    """
    for label, value in (
        ("nvlink_GBps", nvlink_GBps),
        ("pcie_bandwidth_GBps", pcie_bandwidth_GBps),
        ("host_bandwidth_GBps", host_bandwidth_GBps),
        ("net_bandwidth_GBps", net_bandwidth_GBps),
    ):
        if value is not None and not value > 0:
            raise ArgumentError(source, label, f"{value} is not positive", "GB/s > 0")
    if not net_alpha_us >= 0:
        raise ArgumentError(source, "net_alpha_us", f"{net_alpha_us} is negative", "µs >= 0")
    matrix = parse_topo_matrix(text, source)
    rates = _Rates(nvlink_GBps, pcie_bandwidth_GBps, host_bandwidth_GBps, net_bandwidth_GBps, net_alpha_us)
    return _build_topology(matrix, rates, name or "nvidia-smi", source)


# -- building the model ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rates:
    nvlink_GBps: float | None
    pcie_GBps: float | None
    host_GBps: float
    net_GBps: float
    net_alpha_us: float


def _components(nodes: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    graph = nx.Graph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    order = {node: i for i, node in enumerate(nodes)}
    parts = [sorted(part, key=order.__getitem__) for part in nx.connected_components(graph)]
    return sorted(parts, key=lambda part: order[part[0]])


def _edges(matrix: TopoMatrix, tokens: frozenset[str]) -> list[tuple[str, str]]:
    return [pair for pair, cell in matrix.cells.items() if cell in tokens]


def _nvlink_counts(matrix: TopoMatrix) -> dict[tuple[str, str], int]:
    return {pair: count for pair in matrix.cells if (count := matrix.nvlinks(*pair))}


def _uses_nvswitch(gpus: Sequence[str], counts: Mapping[tuple[str, str], int]) -> bool:
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    values = {counts.get(pair, 0) for pair in pairs}
    if len(gpus) < 3 or len(values) != 1:
        return False
    (per_peer,) = values
    return per_peer > 0 and per_peer * (len(gpus) - 1) > MAX_NVLINKS_PER_GPU


def _guess_generation(links_per_gpu: int) -> tuple[float, float]:
    if links_per_gpu == 0:
        return nccl_nvlink_bw_GBps(70), NCCL_PCI_BW_GBPS
    for most_links, sm, pcie_GBps in _GENERATIONS:
        if links_per_gpu <= most_links:
            return nccl_nvlink_bw_GBps(sm), pcie_GBps
    return nccl_nvlink_bw_GBps(100), _GENERATIONS[-1][2]


def _numa_labels(matrix: TopoMatrix) -> dict[str, tuple[str, int | None]]:
    """Map each device to (cpu vertex name, NUMA id or None)."""
    edges = _edges(matrix, PIX_TOKENS | PXB_TOKENS | SAME_NUMA_TOKENS)
    for key in (matrix.numa, matrix.cpu_affinity):
        first: dict[object, str] = {}
        for label, value in key.items():
            if value is not None:
                edges.append((first.setdefault(value, label), label))
    parts = _components(matrix.devices, edges)
    known = [{matrix.numa[label] for label in part if matrix.numa.get(label) is not None} for part in parts]
    next_free = max((max(ids) for ids in known if ids), default=-1) + 1
    labels: dict[str, tuple[str, int | None]] = {}
    for part, ids in zip(parts, known):
        if len(ids) > 1:
            logger.warning("devices %s share a PCIe tree but name NUMA nodes %s; using %d", part, sorted(ids), min(ids))
        numa = min(ids) if ids else None
        number = numa if numa is not None else next_free
        next_free += numa is None
        labels.update({label: (f"cpu{number}", numa) for label in part})
    return labels


def _pcie_tree(matrix: TopoMatrix, cpu_of: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """Return the PCIe switch names and each device's (or switch's) upstream vertex."""
    switches: list[str] = []
    upstream: dict[str, str] = {}
    leaves = _components(matrix.devices, _edges(matrix, PIX_TOKENS))
    for tree in _components(matrix.devices, _edges(matrix, PIX_TOKENS | PXB_TOKENS)):
        cpu = cpu_of[tree[0]]
        parts = [leaf for leaf in leaves if leaf[0] in tree]
        top = cpu
        if len(parts) > 1:
            top = f"pcie{len(switches)}"
            switches.append(top)
            upstream[top] = cpu
        for leaf in parts:
            attach = top
            if len(leaf) > 1:
                attach = f"pcie{len(switches)}"
                switches.append(attach)
                upstream[attach] = top
            upstream.update({device: attach for device in leaf})
    return switches, upstream


def _build_topology(matrix: TopoMatrix, rates: _Rates, name: str, source: str) -> Topology:
    gpus, nics = matrix.gpus, matrix.nics
    vertex_of = {label: f"gpu{i}" for i, label in enumerate(gpus)} | {label: f"nic{j}" for j, label in enumerate(nics)}
    counts = _nvlink_counts(matrix)
    switched = _uses_nvswitch(gpus, counts)
    per_gpu = [sum(counts.get((g, h), 0) for h in gpus) for g in gpus]
    links_per_gpu = counts.get((gpus[0], gpus[1]), 0) if switched else max(per_gpu, default=0)
    guessed_nvlink, guessed_pcie = _guess_generation(links_per_gpu)
    nvlink_GBps = rates.nvlink_GBps or guessed_nvlink
    pcie_GBps = rates.pcie_GBps or guessed_pcie
    numa = _numa_labels(matrix)
    switches, upstream = _pcie_tree(matrix, {label: cpu for label, (cpu, _) in numa.items()})
    cpus = sorted({cpu: n for cpu, n in numa.values()}.items(), key=lambda item: int(item[0][3:]))
    vertices = [
        Vertex(vertex_of[g], VertexKind.GPU, local_index=i, rank=i, numa=numa[g][1]) for i, g in enumerate(gpus)
    ]
    for j, nic in enumerate(nics):
        device = matrix.nic_names.get(nic, nic)
        vertices.append(
            Vertex(
                vertex_of[nic],
                VertexKind.NIC,
                local_index=j,
                numa=numa[nic][1],
                net_kind=net_kind_from_name(device),
                net_bandwidth_GBps=rates.net_GBps,
                net_alpha_us=rates.net_alpha_us,
            )
        )
    if switched:
        vertices.append(Vertex("nvswitch0", VertexKind.NVSWITCH))
    numa_of_cpu = dict(cpus)
    vertices += [Vertex(s, VertexKind.PCIE_SWITCH, numa=_numa_of_switch(s, upstream, numa_of_cpu)) for s in switches]
    vertices += [Vertex(cpu, VertexKind.CPU, numa=n) for cpu, n in cpus]
    links = _nvlink_links(gpus, counts, switched, nvlink_GBps, vertex_of)
    for child, parent in upstream.items():
        links += duplex(vertex_of.get(child, child), parent, LinkKind.PCIE, PCIE_ALPHA_US, pcie_GBps)
    for i, (a, _) in enumerate(cpus):
        for b, _ in cpus[i + 1 :]:
            links += duplex(a, b, LinkKind.HOST, HOST_ALPHA_US, rates.host_GBps)
    legend = ", ".join(f"{vertex_of[nic]}={matrix.nic_names.get(nic, nic)}" for nic in nics)
    nvlink = f"NV{links_per_gpu} per GPU via nvswitch0" if switched else f"up to {links_per_gpu} NVLinks per GPU"
    nvlink = f"{nvlink}, {nvlink_GBps:g} GB/s per NVLink" if links_per_gpu else "no NVLink"
    description = f"nvidia-smi topo -m: {len(gpus)} GPUs ({nvlink}), {len(nics)} NICs" + (
        f" ({legend})" if legend else ""
    )
    return make_topology(name, vertices, links, 1, description, (source,), source)


def _numa_of_switch(switch: str, upstream: Mapping[str, str], numa_of_cpu: Mapping[str, int | None]) -> int | None:
    vertex = upstream[switch]
    while vertex in upstream:
        vertex = upstream[vertex]
    return numa_of_cpu[vertex]


def _nvlink_links(
    gpus: Sequence[str],
    counts: Mapping[tuple[str, str], int],
    switched: bool,
    nvlink_GBps: float,
    vertex_of: Mapping[str, str],
) -> list[Link]:
    links: list[Link] = []
    if switched:
        port = counts[(gpus[0], gpus[1])]
        for gpu in gpus:
            links += duplex(
                vertex_of[gpu], "nvswitch0", LinkKind.NVSWITCH, NVSWITCH_HOP_ALPHA_US, port * nvlink_GBps, port
            )
        return links
    for (a, b), count in counts.items():
        links.append(Link(vertex_of[a], vertex_of[b], LinkKind.NVLINK, NVLINK_ALPHA_US, count * nvlink_GBps, count))
    return links
