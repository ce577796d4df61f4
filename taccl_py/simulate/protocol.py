"""What the wire protocols (Simple, LL, LL128) do to a transfer: its α and its links' bandwidth.

Simple is the α-β model of ``taccl_py.simulate.engine`` as it stands: the built-in machines' α and
bandwidths are Simple's, and a Simple algorithm simulates to exactly the numbers it always did. LL
and LL128 change a transfer relative to Simple:

* bandwidth: every link the transfer holds carries only the protocol's data fraction. LL sends
  16-byte lines of two 4-byte data words, each followed by its 4-byte flag (``union
  ncclLLFifoLine``): 1/2. LL128 sends 128-byte lines of 15 data words and one flag word in NCCL
  (``NCCL_LL128_LINESIZE 128``, ``NCCL_LL128_DATAELEMS = LINEELEMS - 1``): 120/128; RCCL's lines
  are 64 bytes (``NCCL_LL128_LINESIZE 64``): 56/64.
* latency: each link's α is scaled by NCCL's per-hop hardware latency of the protocol over that of
  Simple for the link's class (NVLink, PCI, network), from the Ring row of ``hwLat`` in NCCL's
  tuning model. The classes: NVLink, NVSwitch and xGMI links are NVLink (RCCL tunes xGMI as
  NVLink); PCIe and host links are PCI; InfiniBand and Ethernet links are the network.

The figures (α factor = the protocol's ``hwLat`` over Simple's, per link class)::

    protocol  bandwidth    α factor: NVLink     PCI              network
    Simple    1            1 (3.4 µs)           1 (5.7 µs)       1 (14.0 µs)
    LL        1/2          0.6/3.4 = 0.18       1.0/5.7 = 0.18   2.7/14.0 = 0.19
    LL128     120/128      1.9/3.4 = 0.56       2.5/5.7 = 0.44   4.0/14.0 = 0.29
              (RCCL 56/64)

Sources: NVIDIA/nccl ``src/graph/tuning.cc`` @b6475625 (v2.20.3) ``hwLat`` (Ring: NVLINK
{.6, 1.9, 3.4}, PCI {1.0, 2.5, 5.7}, NET {2.7, 4.0, 14.0}, per LL/LL128/Simple); NCCL's
``src/include/device.h`` as Azure/msccl-executor-nccl carries it @8959f0e5 (``ncclLLFifoLine``,
``NCCL_LL128_LINESIZE 128``; microsoft/msccl ``src/include/devcomm.h`` @0696e990 the same); ROCm/rccl
``src/include/device.h`` @0123763f (``NCCL_LL128_LINESIZE 64``). Not modelled: NCCL's per-collective
base latencies (``baseLat``), its extra LL bandwidth penalties (Ring LL bus bandwidth x 1/3 or 1/4,
capped by ``llMaxBws``) and the protocols' buffer sizes, which ``taccl_py.msccl.limits`` turns into
the sizes where LL and LL128 may be chosen at all.

Exporters that pick a band's protocol (``taccl_py.msccl.protocol``, ``taccl_py.mscclpp.files``)
simulate it at ``band_sample_sizes`` and keep Simple unless another protocol wins by ``NEAR_TIE``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from taccl_py.errors import ArgumentError
from taccl_py.topology.model import LinkKind

__all__ = [
    "SIMPLE",
    "LL",
    "LL128",
    "PROTOCOLS",
    "LatencyClass",
    "ProtocolCost",
    "NCCL_RING_HW_LATENCY_US",
    "LL_DATA_FRACTION",
    "NCCL_LL128_DATA_FRACTION",
    "RCCL_LL128_DATA_FRACTION",
    "NCCL_PROTOCOL_COSTS",
    "RCCL_PROTOCOL_COSTS",
    "PROTOCOL_COST_TABLES",
    "NEAR_TIE",
    "SMALLEST_SAMPLE_BYTES",
    "LARGEST_SAMPLE_BYTES",
    "OPEN_BAND_FACTORS",
    "band_sample_sizes",
    "latency_class",
    "protocol_cost",
]

# Another protocol must beat Simple by more than this fraction of its total to take a band (the
# issue's rule: Simple needs no flag polling and is what every runtime tunes first).
NEAR_TIE = 0.01
# A band from 0 bytes is sampled from 1 KB, the smallest size the shipped libraries were built for.
SMALLEST_SAMPLE_BYTES = 1000
# An open-ended band is sampled at its lower edge times these factors, at most 1 GB (10^9 bytes).
OPEN_BAND_FACTORS = (1, 4, 16)
LARGEST_SAMPLE_BYTES = 10**9

SIMPLE, LL, LL128 = "Simple", "LL", "LL128"  # the MSCCL XML ``proto`` spellings (msccl.dialect.Protocol)
PROTOCOLS = (SIMPLE, LL, LL128)


class LatencyClass(str, Enum):
    """The hardware classes NCCL's tuning model gives a per-hop latency for."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


_LATENCY_CLASS = MappingProxyType(
    {
        LinkKind.NVLINK: LatencyClass.NVLINK,
        LinkKind.NVSWITCH: LatencyClass.NVLINK,
        LinkKind.XGMI: LatencyClass.NVLINK,  # RCCL fills hwLat[NCCL_HW_NVLINK] for xGMI
        LinkKind.PCIE: LatencyClass.PCI,
        LinkKind.HOST: LatencyClass.PCI,
        LinkKind.IB: LatencyClass.NET,
        LinkKind.ETHERNET: LatencyClass.NET,
    }
)

# NVIDIA/nccl src/graph/tuning.cc @b6475625 (v2.20.3), hwLat[hw][NCCL_ALGO_RING][proto], µs per hop.
# Ring, not Tree: an MSCCL step is a point-to-point send to one peer, as a ring step is.
NCCL_RING_HW_LATENCY_US: Mapping[LatencyClass, Mapping[str, float]] = MappingProxyType(
    {
        LatencyClass.NVLINK: MappingProxyType({LL: 0.6, LL128: 1.9, SIMPLE: 3.4}),
        LatencyClass.PCI: MappingProxyType({LL: 1.0, LL128: 2.5, SIMPLE: 5.7}),
        LatencyClass.NET: MappingProxyType({LL: 2.7, LL128: 4.0, SIMPLE: 14.0}),
    }
)
# Data bytes per line byte. NCCL src/include/device.h: union ncclLLFifoLine {data1, flag1, data2, flag2}
# (4 bytes each); NCCL_LL128_LINESIZE 128 with one flag word of 16; RCCL's device.h: LINESIZE 64, one of 8.
LL_DATA_FRACTION = 8 / 16
NCCL_LL128_DATA_FRACTION = 120 / 128
RCCL_LL128_DATA_FRACTION = 56 / 64


@dataclass(frozen=True)
class ProtocolCost:
    """How a protocol changes a transfer relative to Simple: a factor on link bandwidth, one on α per link class."""

    protocol: str
    bandwidth_factor: float
    alpha_factor_nvlink: float
    alpha_factor_pci: float
    alpha_factor_net: float

    @property
    def is_simple(self) -> bool:
        """Return True when this cost leaves α and bandwidth as they are (Simple)."""
        factors = (self.bandwidth_factor, self.alpha_factor_nvlink, self.alpha_factor_pci, self.alpha_factor_net)
        return factors == (1.0, 1.0, 1.0, 1.0)

    def alpha_factor(self, kind: LinkKind) -> float:
        """Return the factor on the α (µs) of a link of ``kind``."""
        return {
            LatencyClass.NVLINK: self.alpha_factor_nvlink,
            LatencyClass.PCI: self.alpha_factor_pci,
            LatencyClass.NET: self.alpha_factor_net,
        }[latency_class(kind)]


def latency_class(kind: LinkKind) -> LatencyClass:
    """Return the hardware class (NVLink, PCI, network) whose per-hop latency a link of ``kind`` has."""
    return _LATENCY_CLASS[kind]


def _cost(protocol: str, bandwidth_factor: float) -> ProtocolCost:
    ratios = {c: NCCL_RING_HW_LATENCY_US[c][protocol] / NCCL_RING_HW_LATENCY_US[c][SIMPLE] for c in LatencyClass}
    return ProtocolCost(
        protocol, bandwidth_factor, ratios[LatencyClass.NVLINK], ratios[LatencyClass.PCI], ratios[LatencyClass.NET]
    )


_SIMPLE_COST = ProtocolCost(SIMPLE, 1.0, 1.0, 1.0, 1.0)

#: Protocol costs of the NCCL-based runtimes (msccl-executor-nccl, microsoft/msccl).
NCCL_PROTOCOL_COSTS: Mapping[str, ProtocolCost] = MappingProxyType(
    {SIMPLE: _SIMPLE_COST, LL: _cost(LL, LL_DATA_FRACTION), LL128: _cost(LL128, NCCL_LL128_DATA_FRACTION)}
)
#: Protocol costs under RCCL: NCCL's latency ratios, RCCL's 64-byte LL128 lines.
RCCL_PROTOCOL_COSTS: Mapping[str, ProtocolCost] = MappingProxyType(
    {SIMPLE: _SIMPLE_COST, LL: _cost(LL, LL_DATA_FRACTION), LL128: _cost(LL128, RCCL_LL128_DATA_FRACTION)}
)
#: The cost tables by name, as ``taccl_py.msccl.limits.ProtocolLimits.cost_table`` names them.
PROTOCOL_COST_TABLES: Mapping[str, Mapping[str, ProtocolCost]] = MappingProxyType(
    {"nccl": NCCL_PROTOCOL_COSTS, "rccl": RCCL_PROTOCOL_COSTS}
)


def protocol_cost(
    protocol: str, costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS, name: str | None = None
) -> ProtocolCost:
    """Return the cost of ``protocol`` in ``costs``; raise ``ArgumentError`` (naming ``name``) for an unknown one.

    >>> cost = protocol_cost("LL")
    >>> cost.bandwidth_factor, round(cost.alpha_factor(LinkKind.NVLINK), 3)
    (0.5, 0.176)
    """
    try:
        return costs[protocol]
    except KeyError:
        raise ArgumentError(name, "protocol", f"{protocol!r}", "one of " + ", ".join(PROTOCOLS)) from None


def band_sample_sizes(min_bytes: int, max_bytes: int | None) -> tuple[int, ...]:
    """Return the sizes (bytes) a band is simulated at: its edges and their geometric middle.

    A band from 0 starts at ``SMALLEST_SAMPLE_BYTES`` (at 1 byte when it ends below that); an open-ended
    band (``max_bytes`` None) is sampled at ``min_bytes`` times ``OPEN_BAND_FACTORS``, at most
    ``LARGEST_SAMPLE_BYTES``. Raises ``ArgumentError`` for a negative or empty band.

    >>> band_sample_sizes(0, 32000), band_sample_sizes(2048000, None), band_sample_sizes(512_000_000, None)
    ((1000, 5657, 32000), (2048000, 8192000, 32768000), (512000000, 1000000000))
    """
    if min_bytes < 0 or max_bytes is not None and max_bytes <= min_bytes:
        band = f"[{min_bytes}, {'inf' if max_bytes is None else max_bytes})"
        raise ArgumentError(None, "band", f"size band {band}", "0 <= min_bytes < max_bytes")
    low = min_bytes
    if low == 0:
        low = SMALLEST_SAMPLE_BYTES if max_bytes is None or max_bytes > SMALLEST_SAMPLE_BYTES else 1
    if max_bytes is None:
        return tuple(sorted({min(low * factor, max(low, LARGEST_SAMPLE_BYTES)) for factor in OPEN_BAND_FACTORS}))
    return tuple(sorted({low, round(math.sqrt(low * max_bytes)), max_bytes}))
