"""What the wire protocols (Simple, LL, LL128) do to a transfer: its α and its links' bandwidth.

Simple is the α-β model of ``taccl_py.simulate.engine`` as it stands: the built-in machines' α and
bandwidths are Simple's, and a Simple algorithm simulates to exactly the numbers it always did. LL
and LL128 change a transfer relative to Simple:

* bandwidth: every link the transfer holds carries only the protocol's data fraction. LL sends
  16-byte lines of two 4-byte data words, each followed by its 4-byte flag (``union
  ncclLLFifoLine``): 1/2. LL128 sends 128-byte lines of 15 data words and one flag word in NCCL
  (``NCCL_LL128_LINESIZE 128``, ``NCCL_LL128_DATAELEMS = LINEELEMS - 1``): 120/128; RCCL's lines
  are 64 bytes (``NCCL_LL128_LINESIZE 64``): 56/64.
* latency: a transfer pays its route's α as the topology states it (the hardware's latency, which
  no protocol undercuts) or NCCL's per-hop latency of the protocol for the route's class, whichever
  is larger. NCCL's figures are per ring step, one GPU-to-GPU hop, from the Ring row of ``hwLat`` in
  NCCL's tuning model; a route's class is the slowest it crosses: the network if any link is
  InfiniBand or Ethernet, else PCI if any is PCIe or a host link, else NVLink (NVLink, NVSwitch and
  xGMI: RCCL tunes xGMI as NVLink).

The figures::

    protocol  bandwidth    route α at least: NVLink   PCI      network
    Simple    1            the topology's α alone
    LL        1/2                            0.6 µs   1.0 µs   2.7 µs
    LL128     120/128                        1.9 µs   2.5 µs   4.0 µs
              (RCCL 56/64)

Simple is left as the topology states it, so every stored Simple time reproduces. NCCL's Simple
figure (3.4 µs per NVLink hop) is its per-step synchronisation on top of the wire, which this model
does not charge; so in this model LL and LL128 never beat Simple on α, only MSCCL++ plans can gain
from LL (no signal/wait round trip, ``taccl_py.mscclpp.simulate``). Neither protocol can undercut a
lower bound of ``taccl_py.bounds``: they only raise α and lower bandwidth.

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
from taccl_py.topology.model import LinkKind, Route

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
    "route_latency_class",
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

# NVIDIA/nccl src/graph/tuning.cc @b6475625 (v2.20.3), hwLat[hw][NCCL_ALGO_RING][proto], µs per hop
# (one GPU-to-GPU ring step). Only the LL and LL128 figures are used, as least route α (see above).
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
    """How a protocol changes a transfer: a factor on link bandwidth, a least route α (µs) per latency class.

    ``hop_latency_us`` holds (class, µs) pairs; empty, it leaves α as the topology states it (Simple).
    """

    protocol: str
    bandwidth_factor: float
    hop_latency_us: tuple[tuple[LatencyClass, float], ...] = ()

    @property
    def is_simple(self) -> bool:
        """Return True when this cost leaves α and bandwidth as they are (Simple)."""
        return self.bandwidth_factor == 1.0 and not self.hop_latency_us

    def route_alpha_us(self, path: Route) -> float:
        """Return ``path``'s α (µs) under this protocol: its own α or the protocol's hop latency, the larger."""
        if not self.hop_latency_us:
            return path.alpha_us
        return max(path.alpha_us, dict(self.hop_latency_us)[route_latency_class(path)])


def latency_class(kind: LinkKind) -> LatencyClass:
    """Return the hardware class (NVLink, PCI, network) whose per-hop latency a link of ``kind`` has."""
    return _LATENCY_CLASS[kind]


def route_latency_class(path: Route) -> LatencyClass:
    """Return the slowest latency class ``path`` crosses: network, else PCI, else NVLink."""
    classes = {latency_class(link.kind) for link in path.links}
    return next(c for c in (LatencyClass.NET, LatencyClass.PCI, LatencyClass.NVLINK) if c in classes)


def _cost(protocol: str, bandwidth_factor: float) -> ProtocolCost:
    latencies = tuple((c, NCCL_RING_HW_LATENCY_US[c][protocol]) for c in LatencyClass)
    return ProtocolCost(protocol, bandwidth_factor, latencies)


_SIMPLE_COST = ProtocolCost(SIMPLE, 1.0)

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
    >>> cost.bandwidth_factor, dict(cost.hop_latency_us)[LatencyClass.NVLINK]
    (0.5, 0.6)
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
