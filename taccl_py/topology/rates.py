"""Figures and small builders the importers, the live probe and the NCCL exporter share.

Every default rate and latency a topology source falls back on is named here once, with its
source, so an imported, a probed and an exported machine cost the same. Bandwidths are GB/s
per direction (1 GB/s = 1e3 bytes/µs), latencies µs.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from taccl_py.topology.model import Link, LinkKind

__all__ = [
    "NVLINK_ALPHA_US",
    "NVSWITCH_HOP_ALPHA_US",
    "PCIE_ALPHA_US",
    "HOST_ALPHA_US",
    "DEFAULT_HOST_BANDWIDTH_GBPS",
    "DEFAULT_NET_BANDWIDTH_GBPS",
    "DEFAULT_NET_ALPHA_US",
    "NCCL_PCI_BW_GBPS",
    "NCCL_LOC_BW_GBPS",
    "MAX_NVLINKS_PER_GPU",
    "PCI_GEN_LANE_100MBPS",
    "PCI_GEN_LANE_FALLBACK_100MBPS",
    "PCI_WIDTH_FALLBACK",
    "nccl_inter_cpu_bw_GBps",
    "nccl_nvlink_bw_GBps",
    "XGMI_ALPHA_US",
    "rccl_xgmi_bw_GBps",
    "rccl_gcn_for_xgmi_bw",
    "pcie_bw_GBps",
    "net_kind_from_name",
    "duplex",
]

# NVLink α: TACCL's shipped NDv2/DGX-2 profiles (microsoft/taccl taccl/examples/topo/*.json,
# alpha 0.3 µs at 1 MB chunks); docs/design.md's cost-model table uses the same figure.
NVLINK_ALPHA_US = 0.3
# GPU -> NVSwitch -> GPU crosses two links; half of the NVLink α on each keeps the GPU-to-GPU
# route at NVLINK_ALPHA_US, as TACCL's DGX-2 profile (alpha 0.3 between any two GPUs) has it.
NVSWITCH_HOP_ALPHA_US = NVLINK_ALPHA_US / 2
# NCCL's PCI hardware latency for the LL protocol is 1.0 µs per GPU-to-GPU hop
# (NVIDIA/nccl src/graph/tuning.cc hwLat[NCCL_HW_PCI]); a hop is GPU -> switch -> GPU, two links.
PCIE_ALPHA_US = 0.5
# The SMP interconnect (QPI/UPI/xGMI) between sockets: one more PCIe-like hop (model choice).
HOST_ALPHA_US = 0.5
# Bandwidth between NUMA nodes when the source does not name the CPU: NCCL's SKL_QPI_BW
# (Skylake UPI), NVIDIA/nccl src/graph/topo.h.
DEFAULT_HOST_BANDWIDTH_GBPS = 10.0
# A NIC whose rate the source does not state: HDR InfiniBand, 200 Gb/s = 25 GB/s per direction
# (the DGX A100 / NDv4 row of docs/design.md's cost-model table).
DEFAULT_NET_BANDWIDTH_GBPS = 25.0
# TACCL's remote_alpha for NDv2 and DGX-2 (taccl/examples/topo/topo-*-1MB.json): 2.6 µs.
DEFAULT_NET_ALPHA_US = 2.6
# NVIDIA/nccl src/graph/topo.h: PCI_BW 12.0 (PCIe Gen3 x16) and LOC_BW 5000.0 (a local link).
NCCL_PCI_BW_GBPS = 12.0
NCCL_LOC_BW_GBPS = 5000.0
# The most NVLinks one GPU has (H100 and B200: 18). A same-count all-to-all NVLink matrix whose
# per-GPU total exceeds this cannot be point-to-point cabling: it goes through NVSwitches.
MAX_NVLINKS_PER_GPU = 18

# NVIDIA/nccl src/graph/topo.h ncclTopoNVLinkBw: effective GB/s per NVLink by compute capability
# (SM60_NVLINK_BW 18.0, SM70 20.0, SM80 20.0, SM86 12.0, SM90 20.6, SM100 40.1).
_NCCL_NVLINK_BW_BY_SM = ((100, 40.1), (90, 20.6), (80, 20.0), (70, 20.0), (60, 18.0))
_NCCL_SM86_NVLINK_BW = 12.0  # SM86 (GA10x) is the one exception to "at least this SM"
_NCCL_NVLINK_BW_DEFAULT = 20.0  # ncclTopoNVLinkBw's fallback for older or unknown SMs (SM80_NVLINK_BW)

# xGMI α: RCCL's MI300X model (ROCm/rccl src/graph/tuning.cc tuning_model_5) puts hwLat[NVLINK],
# which RCCL fills for xGMI, at 0.8 µs (Ring, LL); the mi300x built-in uses the same figure.
XGMI_ALPHA_US = 0.8
# ROCm/rccl src/graph/topo.h ncclTopoXGMISpeed: GB/s per xGMI link by the GPU's ``gcn`` arch name,
# matched by prefix (IsArchMatch): gfx90a MI200_XGMI_WIDTH 36, gfx94* GFX94X_XGMI_WIDTH 48, any
# other VEGA_XGMI_WIDTH 24. The arch written for each rate is the first one RCCL gives it.
_RCCL_XGMI_BW_BY_GCN = (("gfx94", 48.0, "gfx942"), ("gfx90a", 36.0, "gfx90a"))
_RCCL_XGMI_BW_DEFAULT = (24.0, "gfx906")


def rccl_xgmi_bw_GBps(gcn: str) -> float:
    """Return RCCL's bandwidth (GB/s per direction) of one xGMI link of a GPU whose arch is ``gcn``.

    >>> rccl_xgmi_bw_GBps("gfx942"), rccl_xgmi_bw_GBps("gfx90a"), rccl_xgmi_bw_GBps("gfx908")
    (48.0, 36.0, 24.0)
    """
    for prefix, bandwidth, _ in _RCCL_XGMI_BW_BY_GCN:
        if gcn.startswith(prefix):
            return bandwidth
    return _RCCL_XGMI_BW_DEFAULT[0]


def rccl_gcn_for_xgmi_bw(bandwidth_GBps: float) -> str:
    """Return the ``gcn`` arch whose RCCL xGMI rate is nearest ``bandwidth_GBps`` (GB/s per link).

    >>> rccl_gcn_for_xgmi_bw(48.0), rccl_gcn_for_xgmi_bw(50.0), rccl_gcn_for_xgmi_bw(20.0)
    ('gfx942', 'gfx942', 'gfx906')
    """
    rows = [(bandwidth, gcn) for _, bandwidth, gcn in _RCCL_XGMI_BW_BY_GCN] + [_RCCL_XGMI_BW_DEFAULT]
    return min(rows, key=lambda row: (abs(row[0] - bandwidth_GBps), -row[0]))[1]


# NVIDIA/nccl src/graph/topo.cc kvDictPciGen: per-lane rate in units of 100 Mb/s by link speed;
# the PCI link bandwidth is width * value / 80 GB/s (so Gen3 x16 = 12, Gen4 x16 = 24 GB/s).
PCI_GEN_LANE_100MBPS = MappingProxyType({2.5: 15, 5.0: 30, 8.0: 60, 16.0: 120, 32.0: 240, 64.0: 480})
PCI_GEN_LANE_FALLBACK_100MBPS = 60  # kvDictPciGen's default when the speed is unknown (Gen3)
PCI_WIDTH_FALLBACK = 16  # ncclTopoAddPci: "if (width == 0) width = 16"


def nccl_nvlink_bw_GBps(sm: int) -> float:
    """Return NCCL's effective bandwidth (GB/s per direction) of one NVLink of an SM ``sm`` GPU.

    >>> nccl_nvlink_bw_GBps(70), nccl_nvlink_bw_GBps(90)
    (20.0, 20.6)
    """
    if sm == 86:
        return _NCCL_SM86_NVLINK_BW
    for floor, bandwidth in _NCCL_NVLINK_BW_BY_SM:
        if sm >= floor:
            return bandwidth
    return _NCCL_NVLINK_BW_DEFAULT


# NVIDIA/nccl src/graph/topo.h: bandwidth between CPU sockets by CPU (GB/s).
_BDW_QPI, _SKL_QPI, _SRP_QPI, _ERP_QPI = 6.0, 10.0, 22.0, 40.0
_AMD_ZEN12, _AMD_ZEN34, _AMD_ZEN5 = 16.0, 24.0, 32.0
_ZPI, _YONGFENG_ZPI, _P9, _ARM = 6.0, 9.0, 32.0, 6.0


def nccl_inter_cpu_bw_GBps(arch: str | None, vendor: str | None, family: int, model: int) -> float:
    """Return NCCL's bandwidth (GB/s) from a CPU to another socket (ncclTopoGetInterCpuBw).

    Intel: family 6 model >= 0xCF (or 0xAD-0xAF) Emerald Rapids or later 40, >= 0x8F Sapphire
    Rapids 22, >= 0x55 Skylake 10, else Broadwell 6. AMD by CPUID family: 23 Zen1/2 16, 25 Zen3/4 24,
    26 Zen5 32. POWER 32, ARM 6; any other CPU LOC_BW (5000), as NCCL does.

    >>> (nccl_inter_cpu_bw_GBps("x86_64", "GenuineIntel", 6, 143),
    ...  nccl_inter_cpu_bw_GBps("x86_64", "AuthenticAMD", 23, 49))
    (22.0, 16.0)
    """
    if arch == "ppc64":
        return _P9
    if arch == "arm64":
        return _ARM
    if arch != "x86_64":
        return NCCL_LOC_BW_GBPS
    if vendor == "GenuineIntel":
        if family == 6 and (model >= 0xCF or model in (0xAD, 0xAE, 0xAF)):
            return _ERP_QPI
        return _SRP_QPI if family == 6 and model >= 0x8F else _SKL_QPI if family == 6 and model >= 0x55 else _BDW_QPI
    if vendor == "AuthenticAMD":  # NCCL also reads the codes 0x8F/0xAF/0xBF of injected topologies
        return _AMD_ZEN5 if family in (26, 0xBF) else _AMD_ZEN34 if family in (25, 0xAF) else _AMD_ZEN12
    if vendor in ("CentaurHauls", "  Shanghai  "):
        return _YONGFENG_ZPI if family == 7 and model == 0x5B else _ZPI
    return NCCL_LOC_BW_GBPS


def pcie_bw_GBps(width: int, lane_100Mbps: int) -> float:
    """Return NCCL's PCIe link bandwidth (GB/s): width (0 read as 16) x lane rate / 80.

    >>> pcie_bw_GBps(16, 60), pcie_bw_GBps(0, 240)
    (12.0, 48.0)
    """
    lanes = width or PCI_WIDTH_FALLBACK
    return lanes * lane_100Mbps / 80.0


def net_kind_from_name(name: str) -> LinkKind:
    """Return the network class a NIC name suggests: Ethernet for ``eth*``, else InfiniBand.

    >>> net_kind_from_name("mlx5_eth0").value, net_kind_from_name("mlx5_ib3").value
    ('ethernet', 'ib')
    """
    lowered = name.lower()
    if "eth" in lowered or lowered.startswith(("en", "bond")):
        return LinkKind.ETHERNET
    return LinkKind.IB


def duplex(a: str, b: str, kind: LinkKind, alpha_us: float, bandwidth_GBps: float, count: int = 1) -> Iterable[Link]:
    """Return the two directed links a <-> b with the same kind, α, bandwidth and lane count."""
    return (
        Link(a, b, kind, alpha_us, bandwidth_GBps, count),
        Link(b, a, kind, alpha_us, bandwidth_GBps, count),
    )
