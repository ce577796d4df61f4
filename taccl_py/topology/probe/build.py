"""Turn what the live probe found (``MachineProbe``) into a one-machine ``Topology``.

The model, with the importers' figures (``taccl_py.topology.rates``) so a probed
machine and an imported one cost the same:

- GPUs ``gpu{i}`` ranked by NVML/nvidia-smi index (PCI bus order), with bus id and NUMA node.
- NVLinks: ``gpu{i} -> gpu{j}`` with the count found and NCCL's effective rate per link for the
  NVLink version (1.0: SM60 18 GB/s; 2.x, 3.0: 20; 3.1: SM86 12; 4.0: 20.6; 5.0: 40.1);
  NVLinks to NVSwitches become one ``nvswitch`` vertex (a non-blocking fabric) with a port of
  all of a GPU's switch links, α split in two hops.
- PCIe: a ``pcie{k}`` switch for every bridge below which two probed devices (GPUs or NICs)
  meet, nested as the bridges are; each device hangs from its deepest such bridge, or from
  ``cpu{numa}`` (its root complex). Without sysfs chains, devices that ``topo -m`` joins by
  PIX/PXB share one switch. Link bandwidth: the device's PCIe width x speed (NCCL's table),
  a switch's uplink the largest of its children, Gen3 x16 when unknown.
- NICs ``nic{k}`` in PCI bus order, ``net_kind`` from the link layer, ``net_bandwidth_GBps`` the
  port rate / 8, ``net_alpha_us`` TACCL's 2.6 µs; ``compose_nodes`` joins probed machines.
- CPUs ``cpu{n}`` per NUMA node, pairwise ``host`` links (NCCL's Skylake UPI 10 GB/s).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology
from taccl_py.topology.rates import (
    DEFAULT_HOST_BANDWIDTH_GBPS,
    DEFAULT_NET_ALPHA_US,
    HOST_ALPHA_US,
    NCCL_PCI_BW_GBPS,
    NVLINK_ALPHA_US,
    NVSWITCH_HOP_ALPHA_US,
    PCIE_ALPHA_US,
    duplex,
    nccl_nvlink_bw_GBps,
)

__all__ = [
    "DEFAULT_HOST_BANDWIDTH_GBPS",
    "NVLINK_RATE_BY_VERSION_GBPS",
    "MachineProbe",
    "ProbedGpu",
    "ProbedNic",
    "ProbedNvlink",
    "build_probed_topology",
    "nvlink_bandwidth_GBps",
    "nvlink_version_of_rate",
]

_log = logging.getLogger(__name__)

# Per-direction signalling rate of one NVLink (GB/s) as `nvidia-smi nvlink -s` prints it:
# 2.x 25.781 (V100), 3.0 25 (A100), 3.1 14.062 (GA102, RTX A6000), 4.0 26.562 (H100), 5.0 53.125
# (GB200) in the recorded outputs of tests/fixtures/probe; 1.0 20 (P100: 8 lanes x 20 Gb/s,
# open-mpi/hwloc issue #574).
NVLINK_RATE_BY_VERSION_GBPS = MappingProxyType(
    {"1.0": 20.0, "2.0": 25.781, "2.2": 25.781, "3.0": 25.0, "3.1": 14.062, "4.0": 26.562, "5.0": 53.125}
)
# The compute capability NCCL's per-link table keys on, by NVLink version (P100 SM60, V100 SM70,
# A100 SM80, GA10x SM86, H100 SM90, B200 SM100).
_SM_BY_NVLINK_VERSION = MappingProxyType({"1.0": 60, "2.0": 70, "2.2": 70, "3.0": 80, "3.1": 86, "4.0": 90, "5.0": 100})
_GBIT_PER_GBYTE = 8.0


@dataclass(frozen=True)
class ProbedGpu:
    """A GPU: index (PCI bus order), bus id (sysfs spelling), model, NUMA node, PCIe chain."""

    index: int
    pci_bus_id: str
    name: str
    numa: int | None = None
    chain: tuple[str, ...] = ()
    pcie_bandwidth_GBps: float | None = None


@dataclass(frozen=True)
class ProbedNvlink:
    """``count`` active NVLinks of one version from GPU ``gpu_index`` to GPU ``peer_index`` or an NVSwitch."""

    gpu_index: int
    peer_index: int | None
    switch_bus_id: str | None
    count: int
    version: str | None = None


@dataclass(frozen=True)
class ProbedNic:
    """A network port: device name, port number, network kind, rate (Gb/s), PCI placement."""

    name: str
    port: int
    net_kind: LinkKind
    rate_gbps: float
    pci_bus_id: str | None
    numa: int | None = None
    chain: tuple[str, ...] = ()
    pcie_bandwidth_GBps: float | None = None


@dataclass(frozen=True)
class MachineProbe:
    """Everything the probe found about one machine.

    ``nic_affinity`` pairs (GPU index, NIC name) that ``topo -m`` puts on one PCIe switch
    (PIX/PXB); it is used only when sysfs gave no PCIe chains.
    """

    gpus: tuple[ProbedGpu, ...]
    nvlinks: tuple[ProbedNvlink, ...]
    nics: tuple[ProbedNic, ...]
    nic_affinity: tuple[tuple[int, str], ...] = ()
    sources: tuple[str, ...] = ()
    hostname: str = ""


def nvlink_version_of_rate(rate_GBps: float) -> str | None:
    """Return the NVLink version whose signalling rate ``nvidia-smi nvlink -s`` shows as ``rate_GBps``.

    >>> nvlink_version_of_rate(25.781), nvlink_version_of_rate(26.562), nvlink_version_of_rate(7.0)
    ('2.0', '4.0', None)
    """
    for version, rate in NVLINK_RATE_BY_VERSION_GBPS.items():
        if abs(rate - rate_GBps) < 0.01:
            return version
    return None


def nvlink_bandwidth_GBps(version: str | None) -> float:
    """Return NCCL's effective bandwidth (GB/s per direction) of one NVLink of ``version``.

    >>> nvlink_bandwidth_GBps("2.0"), nvlink_bandwidth_GBps("4.0"), nvlink_bandwidth_GBps(None)
    (20.0, 20.6, 20.0)
    """
    return nccl_nvlink_bw_GBps(_SM_BY_NVLINK_VERSION.get(version or "", 0))


def build_probed_topology(probe: MachineProbe, name: str | None = None) -> Topology:
    """Return the one-machine topology of ``probe`` (model in the module docstring).

    Raises
    ------
    TopologyError
        If the probe holds no GPU, or its GPU indices are not 0..N-1 once each.
    """
    topo_name = name or (f"probed-{probe.hostname}" if probe.hostname else "probed")
    gpus = sorted(probe.gpus, key=lambda g: g.index)
    nics = sorted(probe.nics, key=lambda n: (n.pci_bus_id or "", n.name, n.port))
    gpu_names = {g.index: f"gpu{g.index}" for g in gpus}
    nic_names = {(n.name, n.port): f"nic{k}" for k, n in enumerate(nics)}
    vertices = [
        Vertex(
            gpu_names[g.index], VertexKind.GPU, local_index=g.index, rank=g.index, pci_bus_id=g.pci_bus_id, numa=g.numa
        )
        for g in gpus
    ]
    nic_numa = _nic_numa(probe, gpus)
    for k, nic in enumerate(nics):
        vertices.append(
            Vertex(
                f"nic{k}",
                VertexKind.NIC,
                local_index=k,
                pci_bus_id=nic.pci_bus_id,
                numa=nic_numa.get((nic.name, nic.port)),
                net_kind=nic.net_kind,
                net_bandwidth_GBps=nic.rate_gbps / _GBIT_PER_GBYTE,
                net_alpha_us=DEFAULT_NET_ALPHA_US,
            )
        )
    links = _nvlink_links(probe.nvlinks, gpu_names, vertices)
    devices = [_Device(gpu_names[g.index], g.chain, g.numa, g.pcie_bandwidth_GBps) for g in gpus]
    devices += [
        _Device(nic_names[(n.name, n.port)], n.chain, nic_numa.get((n.name, n.port)), n.pcie_bandwidth_GBps)
        for n in nics
    ]
    if all(d.chain for d in devices):
        switches, parents = _pcie_tree_from_chains(devices)
    else:
        groups = _affinity_groups(probe.nic_affinity, gpu_names, {n.name: nic_names[(n.name, n.port)] for n in nics})
        switches, parents = _pcie_tree_from_groups(devices, groups)
    vertices += [Vertex(s.name, VertexKind.PCIE_SWITCH, pci_bus_id=s.bus_id, numa=s.numa) for s in switches]
    cpus = sorted({d.numa or 0 for d in devices} | {s.numa or 0 for s in switches})
    vertices += [Vertex(f"cpu{n}", VertexKind.CPU, numa=n) for n in cpus]
    bandwidth = {d.name: d.bandwidth_GBps for d in devices} | {s.name: s.bandwidth_GBps for s in switches}
    for child, parent in parents.items():
        links.extend(duplex(child, parent, LinkKind.PCIE, PCIE_ALPHA_US, bandwidth[child] or NCCL_PCI_BW_GBPS))
    for a, b in itertools.combinations(cpus, 2):
        links.extend(duplex(f"cpu{a}", f"cpu{b}", LinkKind.HOST, HOST_ALPHA_US, DEFAULT_HOST_BANDWIDTH_GBPS))
    description = _describe(probe, gpus, nics)
    return make_topology(topo_name, vertices, links, description=description, sources=probe.sources, source="probe")


def _nic_numa(probe: MachineProbe, gpus: Sequence[ProbedGpu]) -> dict[tuple[str, int], int | None]:
    numa_of_gpu = {g.index: g.numa for g in gpus}
    result = {}
    for nic in probe.nics:
        near = [numa_of_gpu[i] for i, name in probe.nic_affinity if name == nic.name and numa_of_gpu.get(i) is not None]
        result[(nic.name, nic.port)] = nic.numa if nic.numa is not None else (near[0] if near else None)
    return result


def _nvlink_links(nvlinks: Iterable[ProbedNvlink], gpu_names: dict[int, str], vertices: list[Vertex]) -> list[Link]:
    links: list[Link] = []
    switched: dict[int, list[ProbedNvlink]] = {}
    for item in nvlinks:
        if item.peer_index is None:
            switched.setdefault(item.gpu_index, []).append(item)
        elif item.peer_index != item.gpu_index:
            bandwidth = item.count * nvlink_bandwidth_GBps(item.version)
            links.append(
                Link(
                    gpu_names[item.gpu_index],
                    gpu_names[item.peer_index],
                    LinkKind.NVLINK,
                    NVLINK_ALPHA_US,
                    bandwidth,
                    item.count,
                )
            )
    if switched:
        vertices.append(Vertex("nvswitch", VertexKind.NVSWITCH))
    for index, items in sorted(switched.items()):
        count = sum(item.count for item in items)
        bandwidth = sum(item.count * nvlink_bandwidth_GBps(item.version) for item in items)
        links.extend(duplex(gpu_names[index], "nvswitch", LinkKind.NVSWITCH, NVSWITCH_HOP_ALPHA_US, bandwidth, count))
    return links


@dataclass(frozen=True)
class _Device:
    name: str
    chain: tuple[str, ...]
    numa: int | None
    bandwidth_GBps: float | None


@dataclass(frozen=True)
class _Switch:
    name: str
    bus_id: str | None
    numa: int | None
    bandwidth_GBps: float | None


def _pcie_tree_from_chains(devices: Sequence[_Device]) -> tuple[list[_Switch], dict[str, str]]:
    """Return the branching bridges as switches and each device's and switch's parent."""
    branching: set[str] = set()
    for a, b in itertools.combinations(devices, 2):
        common = _common_prefix(a.chain[:-1], b.chain[:-1])
        if len(common) >= 2:  # below the host bridge: they meet in a PCIe switch or root port
            branching.add(common[-1])
    ancestors = {
        bridge: d.chain[: d.chain.index(bridge)] for d in devices for bridge in d.chain[:-1] if bridge in branching
    }
    names = {bridge: f"pcie{k}" for k, bridge in enumerate(sorted(branching))}
    below: dict[str, list[_Device]] = {bridge: [d for d in devices if bridge in d.chain[:-1]] for bridge in branching}
    switches = [
        _Switch(names[b], b, below[b][0].numa, max((d.bandwidth_GBps or NCCL_PCI_BW_GBPS) for d in below[b]))
        for b in sorted(branching)
    ]
    parents = {d.name: _deepest(d.chain[:-1], branching, names, d.numa) for d in devices}
    parents |= {names[b]: _deepest(ancestors[b], branching, names, below[b][0].numa) for b in branching}
    return switches, parents


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    common = []
    for x, y in zip(a, b):
        if x != y:
            break
        common.append(x)
    return tuple(common)


def _deepest(chain: Sequence[str], branching: set[str], names: dict[str, str], numa: int | None) -> str:
    for bridge in reversed(chain):
        if bridge in branching:
            return names[bridge]
    return f"cpu{numa or 0}"


def _affinity_groups(
    affinity: Iterable[tuple[int, str]], gpu_names: dict[int, str], nic_vertex: dict[str, str]
) -> list[set[str]]:
    groups: list[set[str]] = []
    for index, nic in affinity:
        if nic not in nic_vertex or index not in gpu_names:
            continue
        pair = {gpu_names[index], nic_vertex[nic]}
        touching = [g for g in groups if g & pair]
        merged = set().union(pair, *touching)
        groups = [g for g in groups if not g & pair] + [merged]
    return sorted(groups, key=lambda g: sorted(g))


def _pcie_tree_from_groups(
    devices: Sequence[_Device], groups: Sequence[set[str]]
) -> tuple[list[_Switch], dict[str, str]]:
    by_name = {d.name: d for d in devices}
    switches, parents = [], {}
    for k, group in enumerate(groups):
        members = [by_name[name] for name in sorted(group)]
        numa = next((m.numa for m in members if m.numa is not None), None)
        switches.append(_Switch(f"pcie{k}", None, numa, max((m.bandwidth_GBps or NCCL_PCI_BW_GBPS) for m in members)))
        parents |= {m.name: f"pcie{k}" for m in members}
        parents[f"pcie{k}"] = f"cpu{numa or 0}"
    for device in devices:
        parents.setdefault(device.name, f"cpu{device.numa or 0}")
    return switches, parents


def _describe(probe: MachineProbe, gpus: Sequence[ProbedGpu], nics: Sequence[ProbedNic]) -> str:
    models = sorted({g.name for g in gpus})
    text = f"probed{' on ' + probe.hostname if probe.hostname else ''}: {len(gpus)} x {', '.join(models)}"
    if nics:
        ports = ", ".join(
            f"nic{k}={n.name}:{n.port} ({n.pci_bus_id}, {n.rate_gbps:g} Gb/s {n.net_kind.value})"
            for k, n in enumerate(nics)
        )
        text += f"; NICs: {ports}"
    return text
