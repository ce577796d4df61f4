"""Choose the wire protocol (Simple, LL, LL128) of each size band by simulating the band under each.

A band's algorithm is simulated (``taccl_py.simulate``, protocol costs in
``taccl_py.simulate.protocol``) at a few sizes of the band (``band_sample_sizes``) under every protocol its runtime runs
and may use there (``taccl_py.msccl.limits.protocol_refusal``: LL and LL128 only where every chunk
fits one pass of the protocol's buffer, so never in an open-ended band), and under LL128 only
where NCCL and RCCL enable it (``ll128_route_refusal``). The protocol with the smallest total time
wins; Simple keeps the band when it is within ``NEAR_TIE`` of the best. ``band_protocols`` gives
the protocol of every band of a library, for its MSCCL XML ``proto``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.msccl.limits import DEFAULT_RUNTIME, ProtocolLimits, Runtime, protocol_limits, protocol_refusal
from taccl_py.placement.groups import library_topology
from taccl_py.simulate.engine import replay
from taccl_py.simulate.plan import prepare_simulation
from taccl_py.simulate.protocol import (
    LARGEST_SAMPLE_BYTES,
    LL128,
    NEAR_TIE,
    OPEN_BAND_FACTORS,
    PROTOCOL_COST_TABLES,
    PROTOCOLS,
    SIMPLE,
    SMALLEST_SAMPLE_BYTES,
    ProtocolCost,
    band_sample_sizes,
)
from taccl_py.topology.builtins import builtin_topology_name, load_topology
from taccl_py.topology.model import LinkKind, Topology, VertexKind, route

__all__ = [
    "NEAR_TIE",
    "SMALLEST_SAMPLE_BYTES",
    "LARGEST_SAMPLE_BYTES",
    "OPEN_BAND_FACTORS",
    "ProtocolChoice",
    "band_sample_sizes",
    "ll128_route_refusal",
    "choose_protocol",
    "choose_protocols",
    "band_protocol_choices",
    "band_protocols",
]

logger = logging.getLogger(__name__)

# Link kinds LL128 may use between two GPUs of one machine: NCCL enables LL128 only when the
# intra-node path is NVLink (tuning.cc: typeIntra <= PATH_NVB), RCCL when it is xGMI (PATH_NVL).
_LL128_INTRA_KINDS = frozenset({LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.XGMI})
_NETWORK_KINDS = frozenset({LinkKind.IB, LinkKind.ETHERNET})


@dataclass(frozen=True)
class ProtocolChoice:
    """The protocol chosen for a band, the sizes (bytes) sampled and each simulated protocol's times (µs) there.

    ``times_us`` holds (protocol, time at each of ``sizes_bytes``) for every protocol simulated,
    Simple first (empty when only Simple may run and nothing was simulated); ``refused`` holds
    (protocol, why) for the protocols not tried.
    """

    protocol: str
    sizes_bytes: tuple[int, ...]
    times_us: tuple[tuple[str, tuple[float, ...]], ...]
    refused: tuple[tuple[str, str], ...]

    def total_us(self, protocol: str) -> float | None:
        """Return the time (µs) summed over the sampled sizes under ``protocol``; None if it was not simulated."""
        for name, times in self.times_us:
            if name == protocol:
                return sum(times)
        return None

    @property
    def speedup(self) -> float:
        """Return Simple's total time over the chosen protocol's (1.0 when Simple is chosen)."""
        if self.protocol == SIMPLE:
            return 1.0
        return self.total_us(SIMPLE) / self.total_us(self.protocol)


def ll128_route_refusal(algorithm: Algorithm, topology: Topology) -> str | None:
    """Return why NCCL and RCCL would not run LL128 on the routes ``algorithm`` sends over (None: they would).

    They enable LL128 only where GPUs of one machine talk over NVLink (xGMI in RCCL) and reach
    their NIC without crossing a CPU (NVIDIA/nccl ``src/graph/tuning.cc`` @b6475625: ``typeIntra <=
    PATH_NVB``, ``typeInter <= PATH_PXB``; "other cases are not tested and may cause silent data
    corruption"; ROCm/rccl ``src/graph/tuning.cc`` @9e22c79d the same with ``PATH_NVL``).
    """
    pairs = sorted(
        {(prog.rank, tb.send_peer) for prog in algorithm.ranks for tb in prog.threadblocks if tb.send_peer is not None}
    )
    for src, dst in pairs:
        path = route(topology, src, dst)
        crossed = [topology.vertex(link.dst) for link in path.links[:-1]]
        cpu = next((vertex.name for vertex in crossed if vertex.kind is VertexKind.CPU), None)
        if cpu is not None:
            return f"LL128: rank {src} to rank {dst} crosses CPU {cpu!r}; expected NVLink or a NIC behind a PCIe switch"
        kinds = {link.kind for link in path.links}
        if not kinds & _NETWORK_KINDS and not kinds <= _LL128_INTRA_KINDS:
            found = ", ".join(sorted(kind.value for kind in kinds))
            return f"LL128: rank {src} to rank {dst} over {found}; expected NVLink inside a machine"
    return None


def _times_us(
    algorithm: Algorithm, topology: Topology, protocol: str, costs: Mapping[str, ProtocolCost], sizes: tuple[int, ...]
) -> tuple[float, ...]:
    plan = prepare_simulation(replace(algorithm, protocol=protocol), topology, protocol_costs=costs)
    return tuple(replay(plan, size).time_us for size in sizes)


def _pick(times_us: list[tuple[str, tuple[float, ...]]]) -> str:
    """Return the protocol of smallest total; Simple when it is within ``NEAR_TIE`` of that total."""
    totals = {protocol: sum(times) for protocol, times in times_us}
    best = min(totals, key=totals.__getitem__)
    return SIMPLE if totals[SIMPLE] <= totals[best] * (1 + NEAR_TIE) else best


def choose_protocol(
    algorithm: Algorithm,
    topology: Topology,
    min_bytes: int,
    max_bytes: int | None,
    runtime: Runtime | str = DEFAULT_RUNTIME,
    *,
    rccl_gpu_arch: str | None = None,
) -> ProtocolChoice:
    """Return the protocol ``runtime`` should run ``algorithm`` with in the band [min_bytes, max_bytes).

    Parameters
    ----------
    algorithm : Algorithm
        The band's schedule (its own ``protocol`` is ignored).
    topology : Topology
        The machine it runs on; its rank count must be the algorithm's.
    min_bytes, max_bytes : int, int or None
        The band (bytes, nccl-tests sizes); ``max_bytes`` None: no upper end.
    runtime : Runtime or str
        Which protocols may be used and how many bytes one pass holds
        (``taccl_py.msccl.limits.protocol_limits``); default portable.
    rccl_gpu_arch : str, optional
        The AMD GPU (``"gfx942"``) for RCCL and portable: RCCL runs LL128 on gfx90a, gfx942 and
        gfx950 only.

    Returns
    -------
    ProtocolChoice
        The protocol, the sizes sampled (``band_sample_sizes``), every simulated protocol's times
        (µs) and why the others were not tried.

    Raises
    ------
    ArgumentError
        For an unknown runtime, an empty band, or rank counts that differ.
    VerificationError
        When the algorithm is structurally broken.

    Notes
    -----
    Cost: at most three simulations (one per protocol) of three sizes each, none where only
    Simple may run. LL and LL128 are simulated only when every chunk of the band's largest size
    fits one pass of their buffer, so an open-ended band costs nothing.

    Examples
    --------
    >>> from taccl_py.ir.library import read_library, shipped_library_dir
    >>> library = read_library(shipped_library_dir() / "ndv2" / "n1" / "allgather.library.json")
    >>> band = library.bands[0]
    >>> choice = choose_protocol(band.algorithm, load_topology("ndv2"), band.min_bytes, band.max_bytes)
    >>> choice.protocol, choice.sizes_bytes, [name for name, _ in choice.refused]
    ('Simple', (1000, 11314, 128000), ['LL128'])
    >>> choice.total_us("LL") > choice.total_us("Simple")  # LL pays Simple's α with half the data per line
    True
    """
    limits = protocol_limits(runtime, rccl_gpu_arch=rccl_gpu_arch)
    return choose_protocols(algorithm, topology, min_bytes, max_bytes, (limits,))[0]


def choose_protocols(
    algorithm: Algorithm,
    topology: Topology,
    min_bytes: int,
    max_bytes: int | None,
    limits: Sequence[ProtocolLimits],
    *,
    simulate_simple_alone: bool = False,
) -> tuple[ProtocolChoice, ...]:
    """Return ``choose_protocol`` under each of ``limits``, simulating each protocol and cost table once.

    For comparing runtimes on one band: Simple and LL cost the same in every runtime, so they are
    simulated once for all of them. Where only Simple may run, nothing is simulated unless
    ``simulate_simple_alone`` (for reports that print Simple's times).
    """
    sizes = band_sample_sizes(min_bytes, max_bytes)
    chunk_bytes = None if max_bytes is None else max_bytes / algorithm.chunks_per_loop
    simulated: dict[tuple[str, ProtocolCost], tuple[float, ...]] = {}
    choices = []
    for runtime_limits in limits:
        costs = PROTOCOL_COST_TABLES[runtime_limits.cost_table]
        allowed, refused = [], []
        for protocol in PROTOCOLS:
            reason = protocol_refusal(protocol, runtime_limits, chunk_bytes)
            if reason is None and protocol == LL128:
                reason = ll128_route_refusal(algorithm, topology)
            if reason is None:
                allowed.append(protocol)
            else:
                refused.append((protocol, reason))
        if allowed == [SIMPLE] and not simulate_simple_alone:
            allowed = []  # nothing to compare: Simple without a simulation
        times_us = []
        for protocol in allowed:
            key = (protocol, costs[protocol])
            if key not in simulated:
                simulated[key] = _times_us(algorithm, topology, protocol, costs, sizes)
            times_us.append((protocol, simulated[key]))
        choice = ProtocolChoice(_pick(times_us) if times_us else SIMPLE, sizes, tuple(times_us), tuple(refused))
        logger.debug(
            "%s on %s, band [%d, %s), %s: %s (%s)",
            algorithm.name,
            topology.name,
            min_bytes,
            max_bytes,
            runtime_limits.runtime.value,
            choice.protocol,
            ", ".join(f"{name} {sum(times):.2f} us" for name, times in times_us),
        )
        choices.append(choice)
    return tuple(choices)


def band_protocol_choices(
    library: AlgorithmLibrary, runtime: Runtime | str = DEFAULT_RUNTIME, *, rccl_gpu_arch: str | None = None
) -> tuple[ProtocolChoice | None, ...]:
    """Return ``choose_protocol`` for every band of ``library``; None for a native band or an unknown machine.

    The machine is the built-in topology the library names, at its node count. A library whose
    topology is no built-in name cannot be simulated here: every band is None, and a log line says so.
    """
    if builtin_topology_name(library.topology) is None:
        logger.info(
            "%s x%d %s: topology %r is not a built-in machine, so no protocol is simulated; its bands keep %s",
            library.topology,
            library.nodes,
            library.collective.value,
            library.topology,
            SIMPLE,
        )
        return tuple(None for _ in library.bands)
    topology = library_topology(load_topology(library.topology, library.nodes), library)
    return tuple(
        None
        if band.native
        else choose_protocol(
            band.algorithm, topology, band.min_bytes, band.max_bytes, runtime, rccl_gpu_arch=rccl_gpu_arch
        )
        for band in library.bands
    )


def band_protocols(
    library: AlgorithmLibrary, runtime: Runtime | str = DEFAULT_RUNTIME, *, rccl_gpu_arch: str | None = None
) -> tuple[str | None, ...]:
    """Return the protocol (``proto``) of every band of ``library`` under ``runtime``; None for a native band.

    Parameters
    ----------
    library : AlgorithmLibrary
        Its ``topology`` names the built-in machine the bands are simulated on (``nodes`` copies).
    runtime : Runtime or str
        The runtime the XML is written for (default portable: a protocol every runtime runs).
    rccl_gpu_arch : str, optional
        The AMD GPU for RCCL and portable (LL128 on gfx90a, gfx942 and gfx950 only).

    Returns
    -------
    tuple of str or None
        One entry per band: ``"Simple"``, ``"LL"`` or ``"LL128"``; None for a native band
        (it gets no XML). Bands of a library whose topology is not a built-in machine keep Simple.

    Raises
    ------
    ArgumentError
        For an unknown runtime, or a library whose bands do not fit its machine's rank count.

    Examples
    --------
    >>> from taccl_py.ir.library import read_library, shipped_library_dir
    >>> band_protocols(read_library(shipped_library_dir() / "ndv2" / "n1" / "allgather.library.json"))
    ('Simple', 'Simple', None)
    """
    choices = band_protocol_choices(library, runtime, rccl_gpu_arch=rccl_gpu_arch)
    return tuple(
        None if band.native else SIMPLE if choice is None else choice.protocol
        for band, choice in zip(library.bands, choices)
    )
