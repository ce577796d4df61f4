"""Which sizes of an exported band to leave to NCCL: those where NCCL's own algorithm is modelled faster.

A runtime that loads our files (MSCCL, MSCCL++) runs NCCL's own collective wherever no file
covers a size. So an export should cover only the sizes where the band's schedule, as exported
(its protocol, under the runtime's execution model), is at least ``KEEP_RATIO`` as fast as NCCL's
best (``taccl_py.baselines.nccl.nccl_best_times``): rings with NCCL's channel count, trees, NVLS,
PAT. ``compare_with_nccl`` probes a band at ``probe_sizes`` and returns the sub-ranges to keep and
the runs left to NCCL, each with a reason. The caller computes NCCL's times once per library, at
``library_probe_sizes`` of its bands, and passes them in: the exporters sit below the baselines,
so they are handed ``nccl_best_times`` (an ``NcclTimes``) rather than import it.

Between two consecutive probes with different verdicts the band is cut at their geometric mean;
sizes below the first probe and above the last follow that probe.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.simulate.engine import replay
from taccl_py.simulate.model import DEFAULT_MODEL, ExecutionModel
from taccl_py.simulate.plan import prepare_simulation
from taccl_py.simulate.protocol import NCCL_PROTOCOL_COSTS, ProtocolCost
from taccl_py.topology.model import Topology
from taccl_py.units import format_size

__all__ = [
    "NcclTime",
    "NcclTimes",
    "KEEP_RATIO",
    "SMALLEST_PROBE_BYTES",
    "LARGEST_PROBE_BYTES",
    "Probe",
    "SizeRange",
    "LeftToNccl",
    "NcclVerdict",
    "probe_sizes",
    "library_probe_sizes",
    "compare_with_nccl",
    "verdict_of",
]

#: A band keeps a size where its speed is at least this fraction of NCCL's (NCCL faster by at most 1%).
KEEP_RATIO = 0.99
#: The smallest probe (bytes): smaller sizes of a band follow the verdict at this one.
SMALLEST_PROBE_BYTES = 1024
#: The largest probe of an open-ended band (bytes). Both sides are bandwidth-bound long before it,
#: so larger sizes follow its verdict; a 4 GiB probe costs ~26 s of NCCL tree simulation on 16 GPUs.
LARGEST_PROBE_BYTES = 2**30


class NcclTime(Protocol):
    """NCCL's best algorithm at one size: ``taccl_py.baselines.nccl.NcclChoice`` (bytes, µs)."""

    size_bytes: int
    name: str
    time_us: float


class NcclTimes(Protocol):
    """What gives NCCL's best per size: ``taccl_py.baselines.nccl.nccl_best_times``."""

    def __call__(
        self, topology: Topology, collective: object, sizes_bytes: Iterable[int], *, model: ExecutionModel
    ) -> Sequence[NcclTime]: ...


@dataclass(frozen=True)
class Probe:
    """One probe size (bytes): our band's time and NCCL's best there (µs)."""

    size_bytes: int
    ours_us: float
    nccl: NcclTime

    @property
    def speed_ratio(self) -> float:
        """Return our speed over NCCL's best (NCCL's time over ours; 1.0: equal)."""
        return self.nccl.time_us / self.ours_us

    @property
    def kept(self) -> bool:
        """Return True when the band keeps this size (at least ``KEEP_RATIO`` of NCCL's speed)."""
        return self.speed_ratio >= KEEP_RATIO


@dataclass(frozen=True)
class SizeRange:
    """Sizes [min_bytes, max_bytes) in bytes; ``max_bytes`` None: no upper end."""

    min_bytes: int
    max_bytes: int | None

    def covers(self, size_bytes: int) -> bool:
        """Return True when ``size_bytes`` lies in the range."""
        return self.min_bytes <= size_bytes and (self.max_bytes is None or size_bytes < self.max_bytes)

    @property
    def label(self) -> str:
        """Return the range as a person reads it (``16MiB-1GiB``, ``8MB and up``)."""
        low = format_size(self.min_bytes)
        return f"{low} and up" if self.max_bytes is None else f"{low}-{format_size(self.max_bytes)}"


@dataclass(frozen=True)
class LeftToNccl:
    """A run of sizes (bytes) left to NCCL, and why (``nccl ring-6ch-1p modelled 1.05x faster at 16MiB-1GiB``)."""

    sizes: SizeRange
    reason: str


@dataclass(frozen=True)
class NcclVerdict:
    """A band against NCCL: every probe, the ranges to keep (in size order) and the runs left to NCCL."""

    probes: tuple[Probe, ...]
    kept: tuple[SizeRange, ...]
    left: tuple[LeftToNccl, ...]


def probe_sizes(min_bytes: int, max_bytes: int | None) -> tuple[int, ...]:
    """Return the sizes (bytes) a band [min_bytes, max_bytes) is probed at.

    The powers of two inside it from ``SMALLEST_PROBE_BYTES`` (up to ``LARGEST_PROBE_BYTES`` when
    it has no upper end); where none lies inside, its geometric middle (an open band past the
    largest probe: its lowest power of two).

    >>> probe_sizes(8_192_000, None)[:2], probe_sizes(8_192_000, None)[-1] == LARGEST_PROBE_BYTES
    ((8388608, 16777216), True)
    >>> probe_sizes(0, 32_000), probe_sizes(5000, 6000)
    ((1024, 2048, 4096, 8192, 16384), (5477,))
    """
    if min_bytes < 0 or (max_bytes is not None and max_bytes <= min_bytes):
        raise ArgumentError(None, "band", f"[{min_bytes}, {max_bytes})", "a non-empty range of sizes")
    size = 1 << (max(min_bytes, SMALLEST_PROBE_BYTES) - 1).bit_length()
    end = LARGEST_PROBE_BYTES + 1 if max_bytes is None else max_bytes
    sizes = []
    while size < end:
        sizes.append(size)
        size <<= 1
    if sizes:
        return tuple(sizes)
    if max_bytes is None:
        return (size,)
    return (max(1, math.isqrt(max(min_bytes, 1) * max_bytes)),)


def library_probe_sizes(bands: Iterable[tuple[int, int | None]]) -> tuple[int, ...]:
    """Return every probe size (bytes, sorted) of the bands (min_bytes, max_bytes): what to pass ``nccl_best_times``."""
    return tuple(sorted({size for low, high in bands for size in probe_sizes(low, high)}))


def compare_with_nccl(
    algorithm: Algorithm,
    min_bytes: int,
    max_bytes: int | None,
    topology: Topology,
    nccl_times: Mapping[int, NcclTime],
    *,
    model: ExecutionModel = DEFAULT_MODEL,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
) -> NcclVerdict:
    """Return ``algorithm`` over the band [min_bytes, max_bytes) against NCCL's best: probes, kept ranges, runs left.

    ``algorithm`` runs with its own ``protocol`` (priced by ``protocol_costs``) under ``model``;
    ``nccl_times`` maps each ``probe_sizes`` size to NCCL's best there (``nccl_best_times`` under
    the same model). Sizes where NCCL is more than 1% faster (``KEEP_RATIO``) are left to it.

    Raises ``ArgumentError`` for an empty band or a probe size ``nccl_times`` lacks.
    """
    sizes = probe_sizes(min_bytes, max_bytes)
    missing = [size for size in sizes if size not in nccl_times]
    if missing:
        raise ArgumentError(
            algorithm.name, "nccl_times", f"no NCCL time at {format_size(missing[0])}", "one per probe size"
        )
    plan = prepare_simulation(algorithm, topology, protocol_costs=protocol_costs, model=model)
    probes = tuple(Probe(size, replay(plan, size).time_us, nccl_times[size]) for size in sizes)
    return verdict_of(probes, min_bytes, max_bytes)


def verdict_of(probes: Sequence[Probe], min_bytes: int, max_bytes: int | None) -> NcclVerdict:
    """Return the band [min_bytes, max_bytes) cut where its ``probes`` (ascending) change verdict.

    Consecutive probes of one verdict make one run; two runs meet at the geometric mean of their
    neighbouring probes; the first run starts at ``min_bytes`` and the last ends at ``max_bytes``.
    """
    kept, left = [], []
    start = 0
    for index in range(1, len(probes) + 1):
        if index < len(probes) and probes[index].kept == probes[start].kept:
            continue
        low = min_bytes if start == 0 else math.isqrt(probes[start - 1].size_bytes * probes[start].size_bytes)
        high = (
            max_bytes if index == len(probes) else math.isqrt(probes[index - 1].size_bytes * probes[index].size_bytes)
        )
        run = tuple(probes[start:index])
        if run[0].kept:
            kept.append(SizeRange(low, high))
        else:
            left.append(LeftToNccl(SizeRange(low, high), _reason(run)))
        start = index
    return NcclVerdict(tuple(probes), tuple(kept), tuple(left))


def _reason(run: tuple[Probe, ...]) -> str:
    """Return why a run of probes is left to NCCL: its algorithms, how much faster, at which probes."""
    names = "/".join(dict.fromkeys(probe.nccl.name for probe in run))
    factors = sorted(1 / probe.speed_ratio for probe in run)
    factor = (
        f"{factors[0]:.2f}x" if f"{factors[0]:.2f}" == f"{factors[-1]:.2f}" else f"{factors[0]:.2f}-{factors[-1]:.2f}x"
    )
    sizes = format_size(run[0].size_bytes) + ("" if len(run) == 1 else f"-{format_size(run[-1].size_bytes)}")
    return f"nccl {names} modelled {factor} faster at {sizes}"
