"""What a simulation returns: the collective's time, bandwidths, bound ratio and link usage.

Every quantity carries its unit in its name: µs for times, GB/s (1e9 bytes per second, per
direction) for bandwidths, bytes for sizes. Link resources are named by their (src, dst) vertex
names, as ``taccl_py.topology.Link.key``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from taccl_py.ir.collectives import Collective
from taccl_py.simulate.model import DEFAULT_MODEL

__all__ = [
    "FLOAT_TIE",
    "LinkUsage",
    "TimelineRecord",
    "SimulationResult",
    "faster",
    "simulation_result_to_dict",
    "resource_label",
]

# Two times this close (relative) are one time reached by different arithmetic: NCCL's ring in
# closed form and the same ring replayed differ in the last bit. A tie, not a win.
FLOAT_TIE = 1e-12


def faster(time_us: float, than_us: float) -> bool:
    """Return True when ``time_us`` is below ``than_us`` by more than rounding (``FLOAT_TIE``).

    >>> faster(2586.521614583334, 2586.5216145833347), faster(2586.0, 2586.5)
    (False, True)
    """
    return time_us < than_us * (1 - FLOAT_TIE)


def resource_label(resource: tuple[str, str]) -> str:
    """Return the display name of a link resource, ``"src→dst"``.

    >>> resource_label(("n0.gpu0", "n0.nvswitch"))
    'n0.gpu0→n0.nvswitch'
    """
    return f"{resource[0]}→{resource[1]}"


@dataclass(frozen=True)
class LinkUsage:
    """How much one directed link was used: bandwidth-busy time (µs), its share of the run, bytes moved."""

    resource: tuple[str, str]
    busy_us: float
    busy_fraction: float
    size_bytes: float


@dataclass(frozen=True)
class TimelineRecord:
    """One transfer's use of one link.

    ``ready_us`` is when the transfer's SEND could start (its latency α starts then),
    ``start_us`` when its bytes start to flow (after α), ``end_us`` when they have all arrived.
    """

    resource: tuple[str, str]
    transfer: int
    src_rank: int
    dst_rank: int
    size_bytes: float
    ready_us: float
    start_us: float
    end_us: float


@dataclass(frozen=True)
class SimulationResult:
    """The simulated run of an algorithm at one nccl-tests size.

    ``algbw_GBps`` is size / time and ``busbw_GBps`` is algbw times the collective's bus factor,
    as nccl-tests reports them; ``fraction_of_bound`` is the lower bound's time over the simulated
    time (1.0 is optimal). ``timeline`` is None unless it was asked for. A run with nothing to
    move takes 0 µs and reports infinite bandwidths. ``model`` names the execution model
    (``taccl_py.simulate.model``) and ``num_passes`` the passes of its slice loop at this size.
    """

    algorithm: str
    topology: str
    collective: Collective
    num_ranks: int
    size_bytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    bound_time_us: float
    fraction_of_bound: float
    num_transfers: int
    link_usage: tuple[LinkUsage, ...]
    timeline: tuple[TimelineRecord, ...] | None = None
    model: str = DEFAULT_MODEL.name
    num_passes: int = 1


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def simulation_result_to_dict(result: SimulationResult, *, timeline: bool = False) -> dict[str, Any]:
    """Return a JSON-ready dict of ``result`` (infinite values become None; timeline on request)."""
    out: dict[str, Any] = {
        "algorithm": result.algorithm,
        "topology": result.topology,
        "collective": result.collective.value,
        "num_ranks": result.num_ranks,
        "size_bytes": result.size_bytes,
        "time_us": result.time_us,
        "algbw_GBps": _finite(result.algbw_GBps),
        "busbw_GBps": _finite(result.busbw_GBps),
        "bound_time_us": result.bound_time_us,
        "fraction_of_bound": _finite(result.fraction_of_bound),
        "num_transfers": result.num_transfers,
        "model": result.model,
        "num_passes": result.num_passes,
        "link_usage": [
            {
                "resource": resource_label(u.resource),
                "busy_us": u.busy_us,
                "busy_fraction": u.busy_fraction,
                "size_bytes": u.size_bytes,
            }
            for u in result.link_usage
        ],
    }
    if timeline and result.timeline is not None:
        out["timeline"] = [
            {
                "resource": resource_label(r.resource),
                "transfer": r.transfer,
                "src_rank": r.src_rank,
                "dst_rank": r.dst_rank,
                "size_bytes": r.size_bytes,
                "ready_us": r.ready_us,
                "start_us": r.start_us,
                "end_us": r.end_us,
            }
            for r in result.timeline
        ]
    return out
