"""What a switch step (NVLink SHARP multimem) holds in the replay: its links, their capacities and its α.

A switch action of rank m over group G (``taccl_py.ir.dataflow``) is one fluid flow of b bytes
that holds, at the same rate, every port its bytes cross:

* a store (``ms``, ``multimem.st``): m's port into the switch once, and the switch's port into
  every member (m included) once: the switch copies the bytes;
* a reduce-store (``mrs``, ``multimem.ld_reduce`` then ``multimem.st``): every member's port into
  the switch (the switch reads each member's operand), the port back into m (the sum reaches m's
  SMs), then the store above. m's two ports are held twice, and max-min sharing counts a link
  listed twice as carrying the flow twice.

Each GPU port also has a *multimem twin*: a link of the switch's reduction rate per port
(``Vertex.reduce_bandwidth_GBps``, the NVLS rate, below the port's point-to-point rate on
DGX-H100) that only switch flows hold. So switch traffic alone runs at the NVLS rate, and a
schedule mixing switch and point-to-point transfers shares the physical port between them by
the same max-min rule as any two transfers. NCCL's NVLS kernel moves M (1 + 1/G) bytes per port
for an AllReduce of M, the figure ``taccl_py.baselines.nvls`` times at that rate; a reduce-store
schedule of G slices moves the same.

α: a reduce-store pays the switch's ``reduce_alpha_us`` (NCCL's NVLS latency, scaled as the
topology file states); a store pays its GPU-to-switch-to-GPU route's α, as a point-to-point
transfer does. Protocols scale capacities and raise α as for point-to-point transfers.
"""

from __future__ import annotations

from dataclasses import dataclass

from taccl_py.bounds.reduction import reducing_switches
from taccl_py.errors import ArgumentError
from taccl_py.simulate.protocol import ProtocolCost
from taccl_py.topology.model import Link, Route, Topology

__all__ = ["MULTIMEM_SUFFIX", "SwitchPath", "switch_path"]

#: The name of a GPU port's multimem twin is its switch's name with this suffix.
MULTIMEM_SUFFIX = "#multimem"


@dataclass(frozen=True)
class SwitchPath:
    """The links one switch step holds, as (link key, GB/s) repeated per crossing, and its α (µs)."""

    switch: str
    links: tuple[tuple[tuple[str, str], float], ...]
    alpha_us: float


def switch_path(
    topology: Topology, rank: int, group: tuple[int, ...], reduces: bool, cost: ProtocolCost | None = None
) -> SwitchPath:
    """Return what a switch step of ``rank`` over ``group`` holds: ports, multimem twins and α (µs).

    Raises
    ------
    ArgumentError
        When the group's GPUs do not all hang off one switch that reduces in the network.
    """
    gpus = {v.rank: v for v in topology.gpus}
    members = [gpus.get(r) for r in group]
    switch = next(
        (
            s
            for s in reducing_switches(topology)
            if all(g is not None and topology.link(g.name, s.name) and topology.link(s.name, g.name) for g in members)
        ),
        None,
    )
    if switch is None or rank not in group:
        raise ArgumentError(
            topology.name,
            "switch_group",
            f"ranks {list(group)} (step of rank {rank}) do not share a switch that reduces in the network",
            "the GPUs of one NVLink SHARP machine, the step's own rank among them",
        )
    twin = switch.name + MULTIMEM_SUFFIX
    rate = switch.reduce_bandwidth_GBps
    me = gpus[rank].name
    up = {g.name: topology.link(g.name, switch.name) for g in members}
    down = {g.name: topology.link(switch.name, g.name) for g in members}
    crossed = [*up.values(), down[me]] if reduces else []
    crossed += [up[me], *down.values()]
    held = tuple(item for link in crossed for item in _port_and_twin(link, switch.name, twin, rate))
    farthest = max((Route(rank, r, (up[me], down[gpus[r].name])) for r in group), key=lambda p: p.alpha_us)
    alpha_us = cost.route_alpha_us(farthest) if cost is not None else farthest.alpha_us
    if reduces:
        alpha_us = max(alpha_us, switch.reduce_alpha_us or 0.0)
    return SwitchPath(switch.name, held, alpha_us)


def _port_and_twin(link: Link, switch: str, twin: str, rate_GBps: float) -> tuple[tuple[tuple[str, str], float], ...]:
    """Return a GPU port (link key, GB/s) and its multimem twin, capped at the switch's NVLS rate."""
    twin_key = (link.src, twin) if link.dst == switch else (twin, link.dst)
    return (link.key, link.bandwidth_GBps), (twin_key, min(rate_GBps, link.bandwidth_GBps))
