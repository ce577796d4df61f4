"""Which switch designs to try on a machine whose NVSwitch reduces, verified and simulated beside the rest.

``switch_candidates`` returns the designs of ``taccl_py.synth.switch_designs`` over a small grid:
pure switch AllReduces (slice depth × threadblocks), splits of the buffer between the switch and
each given point-to-point AllReduce at a few switch shares, and multicast AllGathers. Where
MSCCL's selection rule asks for power-of-two chunk loops (``selectable_for_powers_of_two``), a
split's share is picked so that its loop stays one. Every design is verified (``check_algorithm``)
and simulated under the model against the bound that holds for it (``schedule_bounds``: the
in-network reduction bound for a switch AllReduce), so the band choice compares it with the
synthesized candidates and the baselines like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from taccl_py.bounds.reduction import schedule_bounds
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.msccl.selection import selectable_for_powers_of_two
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel, SimulationResult
from taccl_py.synth.candidates import simulate_at
from taccl_py.synth.switch_designs import has_switch_designs, multicast_allgather, split_allreduce, switch_allreduce
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm

__all__ = ["SPLIT_SHARES", "SWITCH_CHANNELS", "SWITCH_SLICES", "switch_candidates"]

#: Chunks per rank slice and threadblocks per rank of the pure switch AllReduces tried.
SWITCH_SLICES = (1, 2, 4, 8)
SWITCH_CHANNELS = (1, 2, 4)
#: The switch's share of the buffer in a split. The best share balances the ports' NVLS rate
#: against their point-to-point rate: about 0.88 on DGX-H100 (308.6 against 370.8 GB/s), 0.75
#: on a GB200 NVL72 rack, in the model.
SPLIT_SHARES = (0.5, 0.75, 0.875)


def switch_candidates(
    topology: Topology,
    collective: Collective,
    sizes: Sequence[int],
    p2p_parts: Sequence[Algorithm] = (),
    *,
    model: ExecutionModel = DEFAULT_MODEL,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[Algorithm, tuple[SimulationResult, ...]]]:
    """Return the switch designs for ``collective`` on ``topology``, each verified, with its results at ``sizes``.

    ``p2p_parts`` are point-to-point AllReduces of the same placement to split the buffer with
    (synthesized candidates, baselines); () when ``has_switch_designs`` is False.
    """
    if not has_switch_designs(topology, collective):
        return []
    designs = _allreduce_designs(topology, p2p_parts) if collective is Collective.ALLREDUCE else []
    if collective is Collective.ALLGATHER:
        designs = [
            multicast_allgather(topology, channels=c, name=_name(topology, collective, f"multicast-c{c}"))
            for c in SWITCH_CHANNELS
        ]
    sizes = tuple(sizes)
    out = []
    for index, design in enumerate(designs, 1):
        if progress is not None:
            progress(f"switch design {index}/{len(designs)}: {design.name}")
        verified = check_algorithm(design)
        bounds = schedule_bounds(topology, collective, sizes, reduces_in_switch=verified.reduces_in_switch)
        out.append((verified, simulate_at(verified, topology, sizes, bounds, None, model)))
    return out


def _name(topology: Topology, collective: Collective, label: str) -> str:
    return f"taccl-{collective.value}-{topology.name}-switch-{label}"


def _allreduce_designs(topology: Topology, p2p_parts: Sequence[Algorithm]) -> list[Algorithm]:
    """Return the pure switch AllReduces and, per point-to-point part, its splits at ``SPLIT_SHARES``."""
    designs = [
        switch_allreduce(topology, slice_chunks=k, channels=c, name=_name(topology, Collective.ALLREDUCE, f"s{k}c{c}"))
        for k in SWITCH_SLICES
        for c in SWITCH_CHANNELS
        if c <= k
    ]
    ranks = topology.num_ranks
    for part in p2p_parts:
        label = part.meta("source_algorithm") or part.name
        for k in sorted({_slice_for_share(share, part, ranks) for share in SPLIT_SHARES}):
            for c in (c for c in SWITCH_CHANNELS if c <= k):
                switch = switch_allreduce(
                    topology, slice_chunks=k, channels=c, inplace=part.inplace, first_channel=part.num_channels
                )
                name = _name(topology, Collective.ALLREDUCE, f"split-s{k}c{c}+{label}")
                split = split_allreduce(switch, part, name).with_metadata(source_algorithm=name)
                if selectable_for_powers_of_two(split) or not selectable_for_powers_of_two(part):
                    designs.append(split)
    return designs


def _slice_for_share(share: float, part: Algorithm, ranks: int) -> int:
    """Return the chunks per rank slice giving the switch about ``share`` of the buffer beside ``part``.

    Where a power-of-two loop exists near that share (ranks·k + the part's chunks a power of
    two), it is preferred: MSCCL++ and MSCCL select such loops at every power-of-two size.
    """
    chunks = part.chunks_per_loop
    wanted = max(1, round(share * chunks / ((1 - share) * ranks)))
    powers = [(p - chunks) // ranks for p in (1 << e for e in range(1, 24)) if p > chunks and (p - chunks) % ranks == 0]
    near = [k for k in powers if abs(k * ranks / (k * ranks + chunks) - share) <= 0.07]
    return min(near, key=lambda k: abs(k - wanted)) if near else wanted
