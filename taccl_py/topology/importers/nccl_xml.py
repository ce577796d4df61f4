"""Read NCCL's topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``) into a ``Topology``.

The file nests ``<system>`` > ``<cpu numaid ...>`` > ``<pci busid class link_speed link_width>``
(PCIe switches nest further ``<pci>``) > ``<gpu dev sm ...><nvlink target count tclass/></gpu>`` or
``<nic><net name dev speed latency .../></nic>``. Bandwidths are derived the way NCCL derives them
(NVIDIA/nccl src/graph/topo.cc and topo.h):

- a PCIe link between an element and its parent: ``link_width`` (0 read as 16) x the per-lane rate
  of ``link_speed`` (kvDictPciGen, 100 Mb/s units: 2.5 GT/s 15 ... 32 GT/s 240) / 80 GB/s, so a
  Gen4 x16 link is 24 GB/s; an empty speed falls back to Gen3 as NCCL does;
- an NVLink: ``count`` x NCCL's per-link rate for the source GPU's ``sm`` (SM60 18, SM70 20,
  SM80 20, SM86 12, SM90 20.6, SM100 40.1 GB/s); every NVSwitch target (``tclass 0x068000``) is
  folded into one ``nvswitch0`` as NCCL folds them into one NVS node;
- an xGMI link, as RCCL writes an AMD GPU (``<gpu dev gcn ...><xgmi target count tclass/>``;
  ROCm/rccl src/graph/topo.cc ncclTopoAddXGMI): ``count`` x RCCL's per-link rate for the GPU's
  ``gcn`` arch (gfx94* 48, gfx90a 36, other 24 GB/s), one direction per element as for NVLink;
  such a GPU's ``sm`` is RCCL's CU count, not a compute capability, and is not read;
- a NIC port: ``speed`` Mb/s / 8000 GB/s (0 or -1, unknown, read as 10000 Mb/s as NCCL does);
- CPU to CPU (ncclTopoGetInterCpuBw): Intel Broadwell 6, Skylake 10, Sapphire Rapids 22, Emerald
  Rapids 40; AMD Zen1/2 16, Zen3/4 24, Zen5 32; POWER 32; ARM 6; anything else 5000 GB/s.

Partial files that list only ``<pci class=...>`` (Azure's NDv2/NDv4 files: GPUs class 0x0302xx or
0x0300xx, NICs 0x0207xx or 0x0200xx) still yield their GPUs and NICs with PCIe affinity; such GPUs
carry no NVLink information, which is logged as a warning. GPU ranks follow ``dev``; GPUs without
a ``<gpu>`` element follow PCI bus order after them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from taccl_py.errors import TopologyError
from taccl_py.topology.importers._xml_tree import XmlElement as _Element
from taccl_py.topology.importers._xml_tree import float_attr, int_attr, parse_xml_tree
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology
from taccl_py.topology.rates import (
    DEFAULT_NET_ALPHA_US,
    DEFAULT_NET_BANDWIDTH_GBPS,
    HOST_ALPHA_US,
    NCCL_LOC_BW_GBPS,
    NVLINK_ALPHA_US,
    NVSWITCH_HOP_ALPHA_US,
    PCI_GEN_LANE_100MBPS,
    PCI_GEN_LANE_FALLBACK_100MBPS,
    PCIE_ALPHA_US,
    XGMI_ALPHA_US,
    duplex,
    nccl_inter_cpu_bw_GBps,
    nccl_nvlink_bw_GBps,
    net_kind_from_name,
    pcie_bw_GBps,
    rccl_xgmi_bw_GBps,
)
from taccl_py.units import MBPS_PER_GBPS

__all__ = ["parse_nccl_topology_xml"]

logger = logging.getLogger(__name__)

# PCI class codes as NCCL's kvDictPciClass matches them (by prefix).
_CLASS_GPU = "0x03"
_CLASS_NIC = "0x02"
_CLASS_IB = "0x0207"
_CLASS_NVSWITCH = "0x068000"
_CLASS_CPU = "0x068001"  # IBM POWER NVLink bridge: the NVLink ends at the GPU's CPU
_CLASS_RE = re.compile(r"^0x[0-9a-fA-F]{6}$")
_BUSID_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s(\s+PCIe)?\s*$")
_NCCL_NO_SPEED_MBPS = 10000  # ncclTopoAddNet: "Some NICs define speed = -1"


@dataclass(frozen=True)
class _Socket:
    """A ``<cpu>``: its vertex name and NUMA id (None for NCCL's numaid -1, unknown)."""

    name: str
    numa: int | None


@dataclass(frozen=True)
class _Device:
    """A GPU or NIC port found in the tree, before ranks and names are assigned."""

    kind: VertexKind
    parent: str
    pcie_GBps: float
    socket: _Socket
    line: int
    busid: str | None = None
    dev: int | None = None
    sm: int | None = None
    element: _Element | None = None
    net_name: str | None = None
    net_kind: LinkKind | None = None
    net_GBps: float | None = None
    net_alpha_us: float | None = None
    gcn: str | None = None  # an AMD GPU's arch (RCCL), which keys its xGMI rate


@dataclass
class _Collected:
    """What one walk over the tree found (a private accumulator)."""

    source: str
    devices: list[_Device] = field(default_factory=list)
    switches: list[Vertex] = field(default_factory=list)
    switch_links: list[Link] = field(default_factory=list)
    cpus: dict[_Socket, float] = field(default_factory=dict)  # CPU -> bandwidth to the others (GB/s)
    busids: dict[str, int] = field(default_factory=dict)  # busid -> line first seen


def parse_nccl_topology_xml(
    text: str,
    source: str = "<string>",
    *,
    name: str | None = None,
    net_bandwidth_GBps: float = DEFAULT_NET_BANDWIDTH_GBPS,
) -> Topology:
    """Return the one-machine topology an NCCL topology XML file describes.

    Parameters
    ----------
    text : str
        The XML (``<system version="1">...``).
    source : str
        Where it came from, named in errors.
    name : str, optional
        The topology's name (default ``"nccl-topology"``).
    net_bandwidth_GBps : float
        Rate of NICs the file lists only as a PCI class, without ``<net speed>`` (GB/s).

    Returns
    -------
    Topology
        ``gpu{rank}`` by ``dev``, ``nic{j}`` by net ``dev``, ``pcie{k}`` per PCIe switch in file
        order, ``cpu{numaid}`` (numaid -1, unknown, takes the next unused number), and
        ``nvswitch0`` when any NVLink ends at an NVSwitch.

    Raises
    ------
    FormatError
        Malformed XML (with its line) or a root other than ``<system>``.
    TopologyError
        A GPU listed twice (same busid or same dev), a missing, non-numeric or negative value,
        an unknown PCI class or link speed, an NVLink to an unknown target.

    Examples
    --------
    >>> xml = '''<system version="1"><cpu numaid="0" arch="x86_64" vendor="AuthenticAMD" familyid="25">
    ...  <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
    ...   <gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:02:00.0" count="4" tclass="0x030200"/></gpu></pci>
    ...  <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
    ...   <gpu dev="1" sm="80" rank="1" gdr="1"><nvlink target="0000:01:00.0" count="4" tclass="0x030200"/></gpu></pci>
    ... </cpu></system>'''
    >>> topo = parse_nccl_topology_xml(xml)
    >>> topo.link("gpu0", "gpu1").bandwidth_GBps, topo.link("gpu0", "cpu0").bandwidth_GBps
    (80.0, 24.0)
    """
    root = parse_xml_tree(text, source, root_tag="system", expected="an NCCL topology XML document")
    collected = _Collected(source)
    for element in root.children:
        if element.tag in ("gpu", "pci", "nic"):
            raise TopologyError(source, f"line {element.line}", f"<{element.tag}> outside a <cpu>", "<system><cpu>...")
    cpus = [element for element in root.children if element.tag == "cpu"]
    numaids = [int_attr(element, "numaid", source, minimum=-1) for element in cpus]
    unnumbered = iter(range(max(numaids, default=-1) + 1, max(numaids, default=-1) + 1 + len(cpus)))
    for element, numa in zip(cpus, numaids):
        socket = _Socket(f"cpu{numa if numa >= 0 else next(unnumbered)}", numa if numa >= 0 else None)
        _walk_cpu(element, socket, collected, net_bandwidth_GBps)
    return _build_topology(collected, name or "nccl-topology")


# -- attribute readers ---------------------------------------------------------------------------


def _pci_GBps(element: _Element, source: str) -> float:
    width = int_attr(element, "link_width", source, default=0)
    speed = element.attrs.get("link_speed", "").strip()
    match = _SPEED_RE.match(speed)
    if speed in ("", "Unknown", "Unknown speed"):
        lane = PCI_GEN_LANE_FALLBACK_100MBPS
    elif match and float(match.group(1)) in PCI_GEN_LANE_100MBPS:
        lane = PCI_GEN_LANE_100MBPS[float(match.group(1))]
    else:
        raise TopologyError(
            source,
            f"line {element.line}",
            f"unknown link_speed {speed!r}",
            "2.5, 5, 8, 16, 32 or 64 GT/s (optionally followed by PCIe)",
        )
    return pcie_bw_GBps(width, lane)


def _pci_class(element: _Element, source: str) -> str:
    value = element.attrs.get("class", "")
    if value and not _CLASS_RE.match(value):
        raise TopologyError(
            source, f"line {element.line}", f"unknown PCI class {value!r}", "0x followed by 6 hex digits"
        )
    return value.lower()


def _register_busid(element: _Element, collected: _Collected) -> str:
    source = collected.source
    busid = element.attrs.get("busid", "").lower()
    if not _BUSID_RE.match(busid):
        raise TopologyError(source, f"line {element.line}", f"busid {busid!r} is not a PCI address", "dddd:bb:dd.f")
    if busid in collected.busids:
        raise TopologyError(
            source,
            f"line {element.line}",
            f"busid {busid} listed twice (first on line {collected.busids[busid]})",
            "each PCI device once",
        )
    collected.busids[busid] = element.line
    return busid


# -- walking the tree ----------------------------------------------------------------------------


def _walk_cpu(cpu: _Element, socket: _Socket, collected: _Collected, net_GBps: float) -> None:
    source = collected.source
    if socket in collected.cpus:
        raise TopologyError(
            source, f"line {cpu.line}", f"cpu numaid {socket.numa} listed twice", "one <cpu> per NUMA node"
        )
    family = int_attr(cpu, "familyid", source, default=0)
    model = int_attr(cpu, "modelid", source, default=0)
    collected.cpus[socket] = nccl_inter_cpu_bw_GBps(cpu.attrs.get("arch"), cpu.attrs.get("vendor"), family, model)
    for child in cpu.children:
        if child.tag == "pci":
            _walk_pci(child, socket.name, socket, collected, net_GBps)
        elif child.tag == "nic":
            # ncclTopoAddCpu joins a NIC that sits directly under a CPU with a LOC_BW link.
            _add_nic(child, None, "", socket.name, socket, NCCL_LOC_BW_GBPS, collected)
        elif child.tag == "gpu":
            raise TopologyError(
                source, f"line {child.line}", "<gpu> outside a <pci>", "<pci busid=...><gpu .../></pci>"
            )
        else:
            logger.debug("%s: line %d: ignoring <%s>", source, child.line, child.tag)


def _walk_pci(pci: _Element, parent: str, socket: _Socket, collected: _Collected, net_GBps: float) -> None:
    source = collected.source
    busid = _register_busid(pci, collected)
    pci_class = _pci_class(pci, source)
    pcie_GBps = _pci_GBps(pci, source)
    gpus = [c for c in pci.children if c.tag == "gpu"]
    nics = [c for c in pci.children if c.tag == "nic"]
    subs = [c for c in pci.children if c.tag == "pci"]
    if len(gpus) > 1:
        raise TopologyError(source, f"line {gpus[1].line}", f"GPU at busid {busid} listed twice", "one <gpu> per <pci>")
    for gpu in gpus:
        dev = int_attr(gpu, "dev", source)
        gcn = gpu.attrs.get("gcn")
        sm = None if gcn else int_attr(gpu, "sm", source, minimum=1)
        collected.devices.append(
            _Device(VertexKind.GPU, parent, pcie_GBps, socket, gpu.line, busid, dev, sm, gpu, gcn=gcn)
        )
    for nic in nics:
        _add_nic(nic, busid, pci_class, parent, socket, pcie_GBps, collected)
    if subs:
        switch = f"pcie{len(collected.switches)}"
        collected.switches.append(Vertex(switch, VertexKind.PCIE_SWITCH, pci_bus_id=busid, numa=socket.numa))
        collected.switch_links.extend(duplex(switch, parent, LinkKind.PCIE, PCIE_ALPHA_US, pcie_GBps))
        for sub in subs:
            _walk_pci(sub, switch, socket, collected, net_GBps)
    if gpus or nics or subs:
        return
    if pci_class.startswith(_CLASS_GPU):
        collected.devices.append(_Device(VertexKind.GPU, parent, pcie_GBps, socket, pci.line, busid))
    elif pci_class.startswith(_CLASS_NIC):
        kind = LinkKind.IB if pci_class.startswith(_CLASS_IB) else LinkKind.ETHERNET
        collected.devices.append(
            _Device(
                VertexKind.NIC,
                parent,
                pcie_GBps,
                socket,
                pci.line,
                busid,
                net_kind=kind,
                net_GBps=net_GBps,
                net_alpha_us=DEFAULT_NET_ALPHA_US,
            )
        )
    else:
        logger.debug("%s: line %d: ignoring PCI device %s of class %s", source, pci.line, busid, pci_class or "?")


def _add_nic(
    nic: _Element,
    busid: str | None,
    pci_class: str,
    parent: str,
    socket: _Socket,
    pcie_GBps: float,
    collected: _Collected,
) -> None:
    source = collected.source
    for net in nic.children:
        if net.tag != "net" or "dev" not in net.attrs:
            logger.debug("%s: line %d: ignoring <%s> without dev", source, net.line, net.tag)
            continue
        dev = int_attr(net, "dev", source)
        speed = int_attr(net, "speed", source, default=0, minimum=-1)  # -1: unknown, as NCCL reads it
        latency_us = float_attr(net, "latency", source)
        name = net.attrs.get("name", f"net{dev}")
        if pci_class.startswith(_CLASS_IB):
            kind = LinkKind.IB
        elif pci_class.startswith(_CLASS_NIC):
            kind = LinkKind.ETHERNET
        else:
            kind = net_kind_from_name(name)
        mbps = speed if speed > 0 else _NCCL_NO_SPEED_MBPS
        collected.devices.append(
            _Device(
                VertexKind.NIC,
                parent,
                pcie_GBps,
                socket,
                net.line,
                busid,
                dev,
                net_name=name,
                net_kind=kind,
                net_GBps=mbps / MBPS_PER_GBPS,
                net_alpha_us=latency_us or DEFAULT_NET_ALPHA_US,
            )
        )


# -- building the topology -----------------------------------------------------------------------


def _ordered(devices: list[_Device], kind: VertexKind, source: str) -> list[_Device]:
    chosen = [d for d in devices if d.kind is kind]
    seen: dict[int, int] = {}
    for device in chosen:
        if device.dev is not None:
            if device.dev in seen:
                what = "gpu" if kind is VertexKind.GPU else "net"
                raise TopologyError(
                    source,
                    f"line {device.line}",
                    f"{what} dev {device.dev} listed twice (first on line {seen[device.dev]})",
                    "each dev once",
                )
            seen[device.dev] = device.line
    return sorted(chosen, key=lambda d: (d.dev is None, d.dev or 0, d.busid or ""))


def _build_topology(collected: _Collected, name: str) -> Topology:
    source = collected.source
    gpus = _ordered(collected.devices, VertexKind.GPU, source)
    nics = _ordered(collected.devices, VertexKind.NIC, source)
    gpu_name = {id(d): f"gpu{i}" for i, d in enumerate(gpus)}
    vertices = [
        Vertex(f"gpu{i}", VertexKind.GPU, local_index=i, rank=i, pci_bus_id=d.busid, numa=d.socket.numa)
        for i, d in enumerate(gpus)
    ]
    vertices += [
        Vertex(
            f"nic{j}",
            VertexKind.NIC,
            local_index=j,
            pci_bus_id=d.busid,
            numa=d.socket.numa,
            net_kind=d.net_kind,
            net_bandwidth_GBps=d.net_GBps,
            net_alpha_us=d.net_alpha_us,
        )
        for j, d in enumerate(nics)
    ]
    upstream: dict[tuple[str, str], Link] = {}
    for vertex_name, device in [(gpu_name[id(d)], d) for d in gpus] + [(f"nic{j}", d) for j, d in enumerate(nics)]:
        for link in duplex(vertex_name, device.parent, LinkKind.PCIE, PCIE_ALPHA_US, device.pcie_GBps):
            upstream[link.key] = link
    for link in collected.switch_links:
        upstream[link.key] = link
    nvlinks = _nvlinks(gpus, gpu_name, source)
    if any(link.dst == "nvswitch0" for link in nvlinks):
        vertices.append(Vertex("nvswitch0", VertexKind.NVSWITCH))
    for link in nvlinks:  # an NVLink to the GPU's own CPU replaces the PCIe link there (POWER9)
        upstream.pop(link.key, None)
    vertices += collected.switches
    vertices += [Vertex(cpu.name, VertexKind.CPU, numa=cpu.numa) for cpu in collected.cpus]
    links = nvlinks + list(upstream.values())
    for a, a_GBps in collected.cpus.items():
        links += [Link(a.name, b.name, LinkKind.HOST, HOST_ALPHA_US, a_GBps) for b in collected.cpus if b != a]
    without = [d.busid for d in gpus if d.element is None]
    if without:
        logger.warning(
            "%s: no <gpu> element for GPU(s) at %s: the file carries no NVLink information for them; "
            "they are joined through PCIe only",
            source,
            ", ".join(map(str, without)),
        )
    per_gpu = max((sum(link.count for link in nvlinks if link.src == f"gpu{i}") for i in range(len(gpus))), default=0)
    lanes = "xGMI links" if any(link.kind is LinkKind.XGMI for link in nvlinks) else "NVLinks"
    description = (
        f"NCCL topology XML: {len(gpus)} GPUs, {len(nics)} NICs, {len(collected.cpus)} NUMA nodes, "
        f"up to {per_gpu} {lanes} per GPU" + (" (no NVLink information)" if without else "")
    )
    return make_topology(name, vertices, links, 1, description, (source,), source)


def _nvlinks(gpus: list[_Device], gpu_name: Mapping[int, str], source: str) -> list[Link]:
    by_busid = {d.busid: d for d in gpus}
    lanes: dict[tuple[str, str, str], int] = {}
    for gpu in gpus:
        for element in gpu.element.children if gpu.element is not None else ():
            if element.tag not in ("nvlink", "xgmi"):
                continue
            target = _nvlink_target(element, gpu, by_busid, gpu_name, source)
            if target is not None:
                key = (gpu_name[id(gpu)], target, element.tag)
                lanes[key] = lanes.get(key, 0) + int_attr(element, "count", source, minimum=1)
    links = []
    rate = {gpu_name[id(d)]: nccl_nvlink_bw_GBps(d.sm or 0) for d in gpus}
    xgmi_rate = {gpu_name[id(d)]: rccl_xgmi_bw_GBps(d.gcn or "") for d in gpus}
    for (src, dst, tag), count in lanes.items():
        bandwidth_GBps = count * (xgmi_rate[src] if tag == "xgmi" else rate[src])
        kind, alpha_us = (LinkKind.XGMI, XGMI_ALPHA_US) if tag == "xgmi" else (LinkKind.NVLINK, NVLINK_ALPHA_US)
        if dst == "nvswitch0":
            links += duplex(src, dst, LinkKind.NVSWITCH, NVSWITCH_HOP_ALPHA_US, bandwidth_GBps, count)
        elif dst.startswith("cpu"):
            links += duplex(src, dst, kind, alpha_us, bandwidth_GBps, count)
        else:  # NCCL adds one direction per <nvlink> (RCCL per <xgmi>); the peer's own element adds the other
            links.append(Link(src, dst, kind, alpha_us, bandwidth_GBps, count))
    return links


def _nvlink_target(
    element: _Element, gpu: _Device, by_busid: Mapping[str | None, _Device], gpu_name: Mapping[int, str], source: str
) -> str | None:
    target = element.attrs.get("target", "").lower()
    tclass = element.attrs.get("tclass", "").lower()
    where = f"line {element.line}"
    if not tclass and target in by_busid:
        tclass = _CLASS_GPU
    if tclass == _CLASS_NVSWITCH:
        return "nvswitch0"
    if tclass == _CLASS_CPU:  # ncclTopoAddNvLinks joins the GPU to its local CPU (findLocalCpu)
        return gpu.socket.name
    if not tclass.startswith(_CLASS_GPU):
        raise TopologyError(
            source,
            where,
            f"{element.tag} tclass {tclass or 'missing'!r}",
            f"{_CLASS_NVSWITCH} (NVSwitch), {_CLASS_CPU} (CPU) or 0x03.... (GPU)",
        )
    if target == gpu.busid:
        logger.debug("%s: %s: ignoring an NVLink from GPU %s to itself", source, where, target)
        return None
    if target not in by_busid:
        raise TopologyError(
            source, where, f"{element.tag} to unknown target {target!r}", "the busid of a GPU in the file"
        )
    return gpu_name[id(by_busid[target])]
