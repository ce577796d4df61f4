"""Parsers for what the live probe reads: nvidia-smi text, sysfs files and PCI paths.

The ``nvidia-smi topo -m`` matrix is read by ``taccl_py.topology.importers.nvidia_smi_matrix``,
shared with the nvidia-smi importer.

Every function here is pure (text in, values out) or reads files under a ``root`` directory
(``"/"`` on a live machine, a fake tree in tests), so each source is tested on recorded
outputs. ``taccl_py.topology.probe`` puts the pieces together.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from taccl_py.errors import FormatError
from taccl_py.topology.rates import PCI_GEN_LANE_100MBPS, PCI_GEN_LANE_FALLBACK_100MBPS, pcie_bw_GBps

__all__ = [
    "NvlinkStatus",
    "PciDevice",
    "SysfsNic",
    "normalize_pci_bus_id",
    "parse_gpu_query_csv",
    "parse_ib_rate_gbps",
    "parse_ib_state",
    "parse_nvlink_status",
    "parse_pcie_speed_gts",
    "pcie_bandwidth_GBps",
    "read_pci_device",
    "read_sysfs_nics",
]

_log = logging.getLogger(__name__)

_BDF_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")
_GPU_HEADER_RE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: [^)]*\))?\s*$")
_LINK_RE = re.compile(r"^Link (\d+): (.*)$")
_RATE_GBPS_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?) GB/s$")
_IB_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?) Gb/sec\b")
_PCIE_SPEED_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?) ?GT/s\b")


def normalize_pci_bus_id(text: str | bytes, source: str = "<pci bus id>") -> str:
    """Return a PCI bus id as sysfs spells it: 4-digit domain, lower case (``0000:07:00.0``).

    nvidia-smi and NVML print an 8-digit domain (``00000000:07:00.0``); sysfs and NCCL's XML
    use 4 digits.

    >>> normalize_pci_bus_id("00000000:07:00.0"), normalize_pci_bus_id(b"0000:C4:00.0")
    ('0000:07:00.0', '0000:c4:00.0')
    """
    value = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    match = _BDF_RE.match(value.strip().strip("\x00"))
    if not match:
        raise FormatError(
            source,
            "pci bus id",
            f"cannot read PCI bus id {value!r}",
            "domain:bus:device.function in hex, e.g. 0000:07:00.0",
        )
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


@dataclass(frozen=True)
class NvlinkStatus:
    """One GPU of ``nvidia-smi nvlink -s``: its name and each link's rate (GB/s, None: inactive)."""

    index: int
    name: str
    links: tuple[tuple[int, float | None], ...]

    @property
    def active_rates_GBps(self) -> tuple[float, ...]:
        """Return the per-direction rates (GB/s) of the active links."""
        return tuple(rate for _, rate in self.links if rate is not None)


def parse_nvlink_status(text: str, source: str = "nvidia-smi nvlink -s") -> tuple[NvlinkStatus, ...]:
    """Return each GPU's NVLink rates from ``nvidia-smi nvlink -s`` (``--status``) output.

    A link line reads ``Link 3: 25.781 GB/s`` when active and ``Link 3: <inactive>`` when
    not; a GPU without active links prints an ``NVML: ...`` note instead. Lines elided in
    published outputs (``...``) are skipped.

    >>> out = "GPU 0: Tesla V100-SXM2-32GB (UUID: GPU-1)\\n\\t Link 0: 25.781 GB/s\\n\\t Link 1: <inactive>\\n"
    >>> parse_nvlink_status(out)[0].links
    ((0, 25.781), (1, None))
    """
    gpus: list[NvlinkStatus] = []
    current: tuple[int, str] | None = None
    links: list[tuple[int, float | None]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        header = _GPU_HEADER_RE.match(line)
        link = _LINK_RE.match(line)
        if header:
            if current is not None:
                gpus.append(NvlinkStatus(current[0], current[1], tuple(links)))
            current, links = (int(header.group(1)), header.group(2).strip()), []
        elif link:
            if current is None:
                raise FormatError(source, f"line {number}", "link line before any GPU line", "'GPU <i>: <name>' first")
            links.append((int(link.group(1)), _link_rate(link.group(2).strip(), source, number)))
        elif line:  # notes such as "NVML: Unable to retrieve NVLink information", or "..."
            _log.debug("%s: line %d ignored: %r", source, number, line)
    if current is not None:
        gpus.append(NvlinkStatus(current[0], current[1], tuple(links)))
    if not gpus:
        raise FormatError(source, None, "no 'GPU <i>: <name>' line", "the output of 'nvidia-smi nvlink -s'")
    return tuple(gpus)


def _link_rate(text: str, source: str, number: int) -> float | None:
    if "inactive" in text.lower():
        return None
    match = _RATE_GBPS_RE.match(text)
    if not match:
        raise FormatError(source, f"line {number}", f"cannot read link rate {text!r}", "'<rate> GB/s' or '<inactive>'")
    return float(match.group(1))


def parse_gpu_query_csv(
    text: str, fields: tuple[str, ...], source: str = "nvidia-smi --query-gpu"
) -> tuple[dict[str, str], ...]:
    """Return one dict per GPU from ``nvidia-smi --query-gpu=<fields> --format=csv``.

    A header row (``--format=csv`` without ``noheader``) is recognised and skipped.

    >>> parse_gpu_query_csv("0, 00000000:07:00.0, NVIDIA A100-SXM4-40GB\\n", ("index", "pci.bus_id", "name"))
    ({'index': '0', 'pci.bus_id': '00000000:07:00.0', 'name': 'NVIDIA A100-SXM4-40GB'},)
    """
    rows = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        cells = [cell.strip() for cell in raw.split(",")]
        if number == 1 and [c.split(" [")[0] for c in cells] == list(fields):
            continue
        if len(cells) != len(fields):
            raise FormatError(
                source,
                f"line {number}",
                f"{len(cells)} fields in {raw.strip()!r}",
                f"{len(fields)}: {', '.join(fields)}",
            )
        rows.append(dict(zip(fields, cells)))
    return tuple(rows)


def parse_ib_rate_gbps(text: str, source: str = "rate") -> float:
    """Return the data rate (Gb/s) of a sysfs ``ports/<n>/rate`` file (``100 Gb/sec (4X EDR)``).

    >>> parse_ib_rate_gbps("200 Gb/sec (4X HDR)\\n"), parse_ib_rate_gbps("2.5 Gb/sec (1X SDR)")
    (200.0, 2.5)
    """
    match = _IB_RATE_RE.match(text)
    if not match:
        raise FormatError(source, None, f"cannot read port rate {text.strip()!r}", "'<n> Gb/sec (<width> <speed>)'")
    return float(match.group(1))


def parse_ib_state(text: str, source: str = "state") -> str:
    """Return the port state word of a sysfs ``ports/<n>/state`` file (``4: ACTIVE`` -> ``ACTIVE``).

    >>> parse_ib_state("4: ACTIVE\\n")
    'ACTIVE'
    """
    match = re.match(r"^\s*\d+:\s*([A-Z_]+)\s*$", text)
    if not match:
        raise FormatError(
            source, None, f"cannot read port state {text.strip()!r}", "'<n>: <STATE>' such as '4: ACTIVE'"
        )
    return match.group(1)


def parse_pcie_speed_gts(text: str) -> float | None:
    """Return the GT/s of a sysfs ``max_link_speed`` (``16.0 GT/s PCIe``); None when unknown.

    >>> parse_pcie_speed_gts("32.0 GT/s PCIe"), parse_pcie_speed_gts("Unknown")
    (32.0, None)
    """
    match = _PCIE_SPEED_RE.match(text)
    return float(match.group(1)) if match else None


def pcie_bandwidth_GBps(speed_gts: float | None, width: int | None) -> float:
    """Return NCCL's effective per-direction bandwidth (GB/s) of a PCIe link (width 0 or unknown: 16).

    >>> pcie_bandwidth_GBps(8.0, 16), pcie_bandwidth_GBps(16.0, 16), pcie_bandwidth_GBps(32.0, 0)
    (12.0, 24.0, 48.0)
    """
    lane = (
        PCI_GEN_LANE_100MBPS.get(speed_gts, PCI_GEN_LANE_FALLBACK_100MBPS)
        if speed_gts
        else PCI_GEN_LANE_FALLBACK_100MBPS
    )
    return pcie_bw_GBps(width or 0, lane)


@dataclass(frozen=True)
class PciDevice:
    """A PCI function found in sysfs: its chain from the host bridge, NUMA node and link."""

    bus_id: str
    chain: tuple[str, ...]
    numa: int | None
    bandwidth_GBps: float | None


def read_pci_device(root: str | Path, bus_id: str) -> PciDevice | None:
    """Return the sysfs facts of PCI function ``bus_id`` under ``root``; None if absent.

    ``chain`` lists the host bridge (``pci0000:00``) then every bridge down to the device,
    as the resolved ``/sys/bus/pci/devices/<bus_id>`` path names them.
    """
    link = Path(root, "sys/bus/pci/devices", bus_id)
    if not link.exists():
        return None
    return _pci_device_at(Path(os.path.realpath(link)), bus_id)


def _pci_device_at(path: Path, bus_id: str) -> PciDevice:
    parts = path.parts
    start = next((i for i, part in enumerate(parts) if _HOST_BRIDGE_RE.match(part)), None)
    kept = parts[start:] if start is not None else (bus_id,)
    chain = tuple(part.lower() for part in kept if _BDF_RE.match(part) or _HOST_BRIDGE_RE.match(part))
    numa_text = _read(path / "numa_node")
    numa = int(numa_text) if numa_text is not None and numa_text.lstrip("-").isdigit() and int(numa_text) >= 0 else None
    speed = parse_pcie_speed_gts(_read(path / "max_link_speed") or "")
    width_text = _read(path / "max_link_width")
    width = int(width_text) if width_text is not None and width_text.isdigit() else None
    # idle GPUs train their links down, so the max_* files, not current_*, give the capacity
    bandwidth = pcie_bandwidth_GBps(speed, width) if speed is not None else None
    return PciDevice(bus_id, chain, numa, bandwidth)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


@dataclass(frozen=True)
class SysfsNic:
    """A network port found in sysfs, with its PCI device and rate (Gb/s)."""

    name: str
    port: int
    link_layer: str
    rate_gbps: float
    state: str
    device: PciDevice
    rdma: bool


def read_sysfs_nics(root: str | Path) -> tuple[SysfsNic, ...]:
    """Return the RDMA ports (``/sys/class/infiniband``) and physical net devices (``/sys/class/net``).

    Net devices without a PCI ``device`` link (loopback, bridges, bonds) are left out; so
    are net devices of a PCI function that already has an RDMA port (RoCE netdevs).
    """
    rdma = tuple(_read_rdma_ports(Path(root, "sys/class/infiniband")))
    covered = {nic.device.bus_id for nic in rdma}
    net = tuple(nic for nic in _read_net_devices(Path(root, "sys/class/net")) if nic.device.bus_id not in covered)
    return rdma + net


def _read_rdma_ports(base: Path) -> list[SysfsNic]:
    nics = []
    for entry in sorted(base.iterdir()) if base.is_dir() else ():
        device = _device_of(entry)
        ports = entry / "ports"
        if device is None or not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            try:
                rate = parse_ib_rate_gbps(_read(port / "rate") or "", str(port / "rate"))
                state = parse_ib_state(_read(port / "state") or "", str(port / "state"))
            except FormatError as exc:  # a port without link may not report a rate (EINVAL)
                _log.info("RDMA port %s:%s unreadable: %s", entry.name, port.name, exc)
                rate, state = math.nan, "UNKNOWN"
            layer = _read(port / "link_layer") or "InfiniBand"
            nics.append(SysfsNic(entry.name, int(port.name), layer, rate, state, device, True))
    return nics


def _read_net_devices(base: Path) -> list[SysfsNic]:
    nics = []
    for entry in sorted(base.iterdir()) if base.is_dir() else ():
        device = _device_of(entry)
        if device is None:
            continue
        speed = _read(entry / "speed")
        rate = int(speed) / 1000.0 if speed is not None and speed.isdigit() else math.nan
        state = (_read(entry / "operstate") or "unknown").upper()
        nics.append(SysfsNic(entry.name, 1, "Ethernet", rate, "ACTIVE" if state == "UP" else state, device, False))
    return nics


def _device_of(entry: Path) -> PciDevice | None:
    link = entry / "device"
    if not link.exists():
        return None
    target = Path(os.path.realpath(link))
    if not _BDF_RE.match(target.name):
        return None
    return _pci_device_at(target, normalize_pci_bus_id(target.name, str(link)))
