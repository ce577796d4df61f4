"""Write a one-machine ``Topology`` as an NCCL topology XML file (``NCCL_TOPO_FILE``).

A corrected or probed topology then helps plain NCCL too: NCCL reads the file instead of (or
before) detecting the machine itself. The layout is the one NCCL dumps
(``NCCL_TOPO_DUMP_FILE``)::

    <system version="1">
      <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
        <pci busid="0000:01:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
          <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
            <gpu dev="0" sm="80" rank="0" gdr="1">
              <nvlink target="0000:03:00.0" count="12" tclass="0x068000"/>
            </gpu>
          </pci>
          <pci busid="0000:04:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16">
            <nic><net name="mlx5_0" dev="0" speed="200000" port="1" latency="2.600000" guid="0x1"
                      maxconn="131072" gdr="1"/></nic>
          </pci>
        </pci>
      </cpu>
    </system>

Choices, each documented where it is made:

- One machine only: a multi-node topology raises ``ArgumentError`` (every node is a copy of
  one machine; export that machine).
- The PCIe tree is the breadth-first tree of PCIe links from the CPUs; each PCIe link becomes
  the (width, speed) pair whose NCCL bandwidth (width x lane rate / 80 GB/s) is nearest.
- Vertices without a ``pci_bus_id`` (the built-ins describe machine types, not machines) get
  invented, stable ones: ``DDDD:BB:00.0`` counting up from ``0000:01:00.0`` in vertex order,
  skipping buses the topology already uses. NCCL matches GPUs and NICs by bus id, so for a
  real machine export a probed topology (``taccl topo probe``), whose bus ids are real.
- NICs are named ``mlx5_<k>`` (IB) or ``eth<k>`` (Ethernet) by local index, with ``speed`` in
  Mb/s from ``net_bandwidth_GBps`` and ``latency`` = ``net_alpha_us``.
- ``sm`` (which NCCL keys its NVLink rate on) is guessed from the NVLink rate and count per
  GPU unless given; ``vendor``/``familyid``/``modelid`` of the CPUs are the CPU whose NCCL
  inter-socket bandwidth is nearest the topology's host links.
- A GPU with xGMI links is an AMD GPU, written as RCCL reads it (ROCm/rccl src/graph/topo.cc
  ncclTopoAddGpu, ncclTopoAddXGMI; src/graph/xml.cc ncclTopoFillGpu):
  ``<gpu dev rank gdr gcn="gfx942"><xgmi target count tclass/></gpu>``. ``gcn`` names the arch
  RCCL keys its xGMI rate on (gfx94* 48, gfx90a 36, else 24 GB/s per link: ncclTopoXGMISpeed),
  the one whose rate is nearest the links'. RCCL reads ``sm`` as the GPU's CU count and ``arch``
  as HIP's feature bits; neither is in a topology, so both are left out and RCCL fills them
  from the device, as it does for any attribute the file lacks.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from taccl_py._io import write_text_atomic
from taccl_py.errors import ArgumentError
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind
from taccl_py.topology.rates import (
    DEFAULT_NET_BANDWIDTH_GBPS,
    NCCL_PCI_BW_GBPS,
    PCI_GEN_LANE_100MBPS,
    pcie_bw_GBps,
    rccl_gcn_for_xgmi_bw,
)
from taccl_py.units import MBPS_PER_GBPS

__all__ = ["DEFAULT_SM", "generate_nccl_topology_xml", "write_nccl_topology_xml"]

logger = logging.getLogger(__name__)

DEFAULT_SM = 80  # a GPU without NVLinks: NCCL only keys NVLink rates on sm
_CLASS_BRIDGE = "0x060400"
_CLASS_GPU = "0x030200"
_CLASS_IB = "0x020700"
_CLASS_ETHERNET = "0x020000"
_TCLASS_GPU = "0x030200"
_TCLASS_NVSWITCH = "0x068000"
_MAXCONN = 131072  # what ConnectX NICs report in NCCL dumps
_WIDTHS = (16, 8, 4, 2, 1)
# (inter-socket GB/s NCCL assumes, vendor, familyid, modelid): NVIDIA/nccl src/graph/topo.cc
# ncclTopoGetInterCpuBw; Skylake 10, Sapphire Rapids 22, Emerald Rapids 40 (Intel family 6);
# Zen2 16, Zen3/4 24, Zen5 32 (AMD family 23, 25, 26).
_CPUS = (
    (10.0, "GenuineIntel", 6, 85),
    (22.0, "GenuineIntel", 6, 143),
    (40.0, "GenuineIntel", 6, 207),
    (16.0, "AuthenticAMD", 23, 49),
    (24.0, "AuthenticAMD", 25, 17),
    (32.0, "AuthenticAMD", 26, 2),
)


@dataclass(frozen=True)
class _Tree:
    """The PCIe tree: children of each CPU or switch, the PCIe link up from each node."""

    children: dict[str, list[str]]
    uplink: dict[str, Link | None]
    cpus: list[Vertex]


def generate_nccl_topology_xml(topology: Topology, sm: int | None = None) -> str:
    """Return the NCCL topology XML of one machine.

    Parameters
    ----------
    topology : Topology
        A one-node topology (built-in, imported or probed).
    sm : int, optional
        Compute capability written on every NVIDIA GPU (70 V100, 80 A100, 90 H100); guessed from
        the NVLinks when omitted. AMD GPUs (with xGMI links) get no ``sm``: see the module notes.

    Returns
    -------
    str
        ``<system version="1">`` ... as NCCL_TOPO_FILE reads it.

    Raises
    ------
    ArgumentError
        If the topology spans more than one node.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> xml = generate_nccl_topology_xml(load_topology("dgx-a100"))
    >>> xml.count("<gpu "), xml.count("<net "), 'count="12" tclass="0x068000"' in xml
    (8, 8, True)
    """
    if topology.nodes != 1:
        raise ArgumentError(
            topology.name,
            "nodes",
            f"topology spans {topology.nodes} nodes",
            "one machine (export the machine, not the composed cluster)",
        )
    bus_ids = _bus_ids(topology)
    tree = _pcie_tree(topology)
    gpu_sm = sm if sm is not None else _guess_sm(topology)
    vendor, family, model = _cpu_identity(topology)
    lines = ['<system version="1">']
    for cpu in tree.cpus:
        numa = cpu.numa if cpu.numa is not None else 0
        lines.append(f'  <cpu numaid="{numa}" arch="x86_64" vendor="{vendor}" familyid="{family}" modelid="{model}">')
        for child in tree.children.get(cpu.name, []):
            _emit(topology, tree, bus_ids, gpu_sm, child, 2, lines)
        lines.append("  </cpu>")
    lines.append("</system>")
    return "\n".join(lines) + "\n"


def write_nccl_topology_xml(topology: Topology, path: str | Path, sm: int | None = None) -> None:
    """Write ``generate_nccl_topology_xml(topology, sm)`` to ``path`` (``-``: stdout), atomically."""
    write_text_atomic(path, generate_nccl_topology_xml(topology, sm))


def _bus_ids(topology: Topology) -> dict[str, str]:
    """Return each vertex's PCI bus id, inventing stable ones where the topology has none."""
    used = {v.pci_bus_id.lower() for v in topology.vertices if v.pci_bus_id}
    ids, counter = {}, 1
    for vertex in topology.vertices:
        if vertex.pci_bus_id:
            ids[vertex.name] = vertex.pci_bus_id.lower()
            continue
        while f"{counter // 256:04x}:{counter % 256:02x}:00.0" in used:
            counter += 1
        ids[vertex.name] = f"{counter // 256:04x}:{counter % 256:02x}:00.0"
        used.add(ids[vertex.name])
        counter += 1
    return ids


def _pcie_tree(topology: Topology) -> _Tree:
    """Return the breadth-first tree of PCIe links grown from the CPUs (devices are leaves)."""
    cpus = sorted(
        (v for v in topology.vertices if v.kind is VertexKind.CPU), key=lambda v: (v.numa is None, v.numa or 0, v.name)
    )
    pcie = [link for link in topology.links if link.kind is LinkKind.PCIE]
    neighbours: dict[str, list[Link]] = {}
    for link in pcie:
        neighbours.setdefault(link.dst, []).append(link)  # link child -> parent, found from the parent
    children: dict[str, list[str]] = {}
    uplink: dict[str, Link | None] = {}
    queue = deque(cpu.name for cpu in cpus)
    seen = set(queue)
    while queue:
        parent = queue.popleft()
        for link in sorted(neighbours.get(parent, []), key=lambda l: _order_key(topology, l.src)):
            child = link.src
            if child in seen or topology.vertex(child).kind not in (
                VertexKind.PCIE_SWITCH,
                VertexKind.GPU,
                VertexKind.NIC,
            ):
                continue
            seen.add(child)
            children.setdefault(parent, []).append(child)
            uplink[child] = link
            if topology.vertex(child).kind is VertexKind.PCIE_SWITCH:
                queue.append(child)
    orphans = [v for v in topology.vertices if v.kind in (VertexKind.GPU, VertexKind.NIC) and v.name not in seen]
    if orphans and not cpus:
        cpus = [Vertex("cpu0", VertexKind.CPU, numa=0)]
    for vertex in orphans:  # no PCIe path to a CPU (e.g. an NVLink-only sketch): hang under its NUMA node
        logger.info("%s: %s has no PCIe path to a CPU; placed under the first CPU", topology.name, vertex.name)
        home = next((c for c in cpus if c.numa == vertex.numa), cpus[0])
        children.setdefault(home.name, []).append(vertex.name)
        uplink[vertex.name] = None
    return _Tree(children, uplink, cpus)


def _order_key(topology: Topology, name: str) -> tuple[int, int, str]:
    vertex = topology.vertex(name)
    rank = {VertexKind.PCIE_SWITCH: 0, VertexKind.GPU: 1, VertexKind.NIC: 2}.get(vertex.kind, 3)
    return (rank, vertex.local_index if vertex.local_index is not None else 0, name)


def _emit(
    topology: Topology, tree: _Tree, bus_ids: dict[str, str], sm: int, name: str, depth: int, lines: list[str]
) -> None:
    vertex = topology.vertex(name)
    pad = "  " * depth
    link = tree.uplink.get(name)
    speed, width = _speed_width(link.bandwidth_GBps if link is not None else NCCL_PCI_BW_GBPS)
    pci_class = {VertexKind.PCIE_SWITCH: _CLASS_BRIDGE, VertexKind.GPU: _CLASS_GPU}.get(
        vertex.kind, _CLASS_ETHERNET if vertex.net_kind is LinkKind.ETHERNET else _CLASS_IB
    )
    lines.append(f'{pad}<pci busid="{bus_ids[name]}" class="{pci_class}" link_speed="{speed}" link_width="{width}">')
    if vertex.kind is VertexKind.PCIE_SWITCH:
        for child in tree.children.get(name, []):
            _emit(topology, tree, bus_ids, sm, child, depth + 1, lines)
    elif vertex.kind is VertexKind.GPU:
        lines.extend(_gpu_lines(topology, bus_ids, sm, vertex, pad + "  "))
    else:
        lines.extend(_nic_lines(vertex, pad + "  "))
    lines.append(f"{pad}</pci>")


def _gpu_lines(topology: Topology, bus_ids: dict[str, str], sm: int, gpu: Vertex, pad: str) -> list[str]:
    xgmi = sorted((l for l in topology.links if l.src == gpu.name and l.kind is LinkKind.XGMI), key=lambda l: l.dst)
    if xgmi:
        return _amd_gpu_lines(bus_ids, gpu, xgmi, pad)
    lines = [f'{pad}<gpu dev="{gpu.rank}" sm="{sm}" rank="{gpu.rank}" gdr="1">']
    for link in _nvlinks_from(topology, gpu.name):
        tclass = _TCLASS_NVSWITCH if link.kind is LinkKind.NVSWITCH else _TCLASS_GPU
        lines.append(f'{pad}  <nvlink target="{bus_ids[link.dst]}" count="{link.count}" tclass="{tclass}"/>')
    lines.append(f"{pad}</gpu>")
    return lines


def _amd_gpu_lines(bus_ids: dict[str, str], gpu: Vertex, xgmi: list[Link], pad: str) -> list[str]:
    """Return an AMD GPU as RCCL reads it: ``gcn`` for the xGMI rate, one ``<xgmi>`` per peer (GPU targets)."""
    per_link_GBps = sum(link.bandwidth_GBps for link in xgmi) / sum(link.count for link in xgmi)
    gcn = rccl_gcn_for_xgmi_bw(per_link_GBps)
    lines = [f'{pad}<gpu dev="{gpu.rank}" gcn="{gcn}" rank="{gpu.rank}" gdr="1">']
    for link in xgmi:
        lines.append(f'{pad}  <xgmi target="{bus_ids[link.dst]}" count="{link.count}" tclass="{_TCLASS_GPU}"/>')
    lines.append(f"{pad}</gpu>")
    return lines


def _nvlinks_from(topology: Topology, name: str) -> list[Link]:
    out = []
    for link in topology.links:
        if link.src != name:
            continue
        target = topology.vertex(link.dst).kind
        if (link.kind is LinkKind.NVLINK and target is VertexKind.GPU) or (
            link.kind is LinkKind.NVSWITCH and target is VertexKind.NVSWITCH
        ):
            out.append(link)
    return sorted(out, key=lambda l: l.dst)


def _nic_lines(nic: Vertex, pad: str) -> list[str]:
    index = nic.local_index if nic.local_index is not None else 0
    name = f"eth{index}" if nic.net_kind is LinkKind.ETHERNET else f"mlx5_{index}"
    speed = round((nic.net_bandwidth_GBps or DEFAULT_NET_BANDWIDTH_GBPS) * MBPS_PER_GBPS)
    latency = nic.net_alpha_us or 0.0
    net = (
        f'<net name={quoteattr(name)} dev="{index}" speed="{speed}" port="1" latency="{latency:.6f}" '
        f'guid="0x{index + 1:x}" maxconn="{_MAXCONN}" gdr="1"/>'
    )
    return [f"{pad}<nic>", f"{pad}  {net}", f"{pad}</nic>"]


def _speed_width(bandwidth_GBps: float) -> tuple[str, int]:
    """Return the NCCL link_speed and link_width whose bandwidth is nearest ``bandwidth_GBps``.

    >>> _speed_width(24.0), _speed_width(12.0), _speed_width(15.75)
    (('16.0 GT/s PCIe', 16), ('8.0 GT/s PCIe', 16), ('8.0 GT/s PCIe', 16))
    """
    options = [
        (abs(pcie_bw_GBps(width, lane) - bandwidth_GBps), -width, speed)
        for width in _WIDTHS
        for speed, lane in PCI_GEN_LANE_100MBPS.items()
    ]
    _, neg_width, speed = min(options)
    return f"{speed:.1f} GT/s PCIe", -neg_width


def _guess_sm(topology: Topology) -> int:
    """Return the SM whose NCCL NVLink rate and link count match the GPUs' NVLinks best."""
    per_gpu: dict[str, list[Link]] = {}
    for link in topology.links:
        if link.kind in (LinkKind.NVLINK, LinkKind.NVSWITCH) and topology.vertex(link.src).kind is VertexKind.GPU:
            per_gpu.setdefault(link.src, []).append(link)
    if not per_gpu:
        return DEFAULT_SM
    links = max(per_gpu.values(), key=len)
    count = sum(link.count for link in links)
    per_link = sum(link.bandwidth_GBps for link in links) / max(count, 1)
    if per_link >= 30.0:
        return 100
    if count > 12:
        return 90
    if per_link < 15.0:
        return 86
    if count <= 4 and per_link < 19.0:
        return 60
    return 70 if count <= 6 else 80


def _cpu_identity(topology: Topology) -> tuple[str, int, int]:
    host = [link.bandwidth_GBps for link in topology.links if link.kind is LinkKind.HOST]
    target = min(host) if host else _CPUS[0][0]
    _, vendor, family, model = min(_CPUS, key=lambda row: (abs(row[0] - target), row[0]))
    return vendor, family, model
