"""Which libraries serve a process group: by its members' global ranks, not only by its size.

A job of W ranks runs rank r on GPU r of the machine set a library names (torchrun's node-major
order). Per collective, a group of global ranks ``ranks`` takes the first non-empty tier:

1. exact: libraries whose group record serves ``ranks`` (``GroupRecord.serves``) in a job of W ranks;
2. placement: libraries with a group record of W ranks whose class representative (its
   ``members``) has the group's placement: same size, equal ``group_signature`` of
   ``group_topology`` on the library's machine set (``load_topology(topology, nodes)``), both
   groups alone. The schedule then runs on other GPUs than it was made for, on links that time
   alike; links the library shared with concurrent groups are not compared;
3. first ranks: libraries and algorithm files without a group record, only when ``ranks`` are
   0..n-1 (the world group, or a subgroup of the job's first n ranks). A group-less library names
   no members, so it is trusted only where its ranks are the job's ranks one for one; a subgroup
   elsewhere (size-only matching, as the backend did before) could run a schedule made for other
   links.

A group no tier serves runs its collective on the inner backend. Pure Python: no torch here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from taccl_py.errors import ArgumentError, TacclError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator.selection import Candidate, gather_candidates, library_specs

__all__ = ["GroupMatch", "MatchKind", "group_candidates"]

logger = logging.getLogger(__name__)


class MatchKind(Enum):
    """How a collective's libraries came to serve a group (the value is the word logs use)."""

    EXACT = "exact"
    PLACEMENT = "placement"
    FIRST_RANKS = "first ranks"


@dataclass(frozen=True)
class GroupMatch:
    """The libraries serving one collective of a group: how they matched and where they come from."""

    collective: Collective
    kind: MatchKind
    origins: tuple[str, ...]
    representative: tuple[int, ...] | None = None

    def describe(self) -> str:
        """Return the match in words: ``allreduce: placement match of [0, 4] (dp-0/allreduce.library.json)``."""
        how = self.kind.value if self.representative is None else f"placement match of {list(self.representative)}"
        return f"{self.collective.value}: {how} ({', '.join(self.origins)})"


def group_candidates(
    library: Any,
    ranks: Sequence[int],
    world_size: int,
    *,
    topology: str | None = None,
    nodes: int | None = None,
) -> tuple[tuple[Candidate, ...], tuple[GroupMatch, ...]]:
    """Return the candidates that serve the group of global ``ranks`` in a job of ``world_size`` ranks, and how.

    ``library``, ``topology`` and ``nodes`` are as for ``collect_algorithms``; the candidates keep
    their priority order within each collective. A spec whose shipped libraries have no group of
    this size is skipped (logged at DEBUG); a spec that names nothing readable raises ``ArgumentError``.
    """
    ranks = tuple(int(rank) for rank in ranks)
    found: list[Candidate] = []
    for spec in library_specs(library, topology):
        try:
            found += [c for c in gather_candidates(spec, len(ranks), nodes=nodes) if c.num_ranks == len(ranks)]
        except ArgumentError as error:
            if error.field != "world_size":
                raise
            logger.debug("group %s: %s", list(ranks), error)
    chosen: list[Candidate] = []
    matches: list[GroupMatch] = []
    signatures: dict[Any, Any] = {}
    for collective in dict.fromkeys(c.collective for c in found):
        of_collective = [c for c in found if c.collective is collective]
        tier, match = _first_tier(collective, of_collective, ranks, world_size, signatures)
        chosen += tier
        if match is not None:
            matches.append(match)
    return tuple(chosen), tuple(matches)


def _first_tier(
    collective: Collective, candidates: list[Candidate], ranks: tuple[int, ...], world_size: int, signatures: dict
) -> tuple[list[Candidate], GroupMatch | None]:
    """Return the candidates of the first tier (see the module notes) that serves ``ranks``, and the match."""
    grouped = [c for c in candidates if c.group is not None and c.group.world_size == world_size]
    exact = [c for c in grouped if c.group.serves(ranks)]
    if exact:
        return exact, GroupMatch(collective, MatchKind.EXACT, _origins(exact))
    placed = [c for c in grouped if _same_placement(c, ranks, signatures)]
    if placed:
        return placed, GroupMatch(collective, MatchKind.PLACEMENT, _origins(placed), placed[0].group.members)
    if ranks == tuple(range(len(ranks))):
        free = [c for c in candidates if c.group is None]
        if free:
            return free, GroupMatch(collective, MatchKind.FIRST_RANKS, _origins(free))
    return [], None


def _origins(candidates: list[Candidate]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.origin.split(" (")[0] for c in candidates))


def _same_placement(candidate: Candidate, ranks: tuple[int, ...], signatures: dict) -> bool:
    """Return True when ``ranks`` sit on the library's machine set as its group record's members do."""
    made_for, members = candidate.made_for, candidate.group.members
    if made_for.topology is None or made_for.nodes is None or len(members) != len(ranks):
        return False
    mine = _signature(made_for.topology, made_for.nodes, ranks, signatures)
    return mine is not None and mine == _signature(made_for.topology, made_for.nodes, members, signatures)


def _signature(topology: str, nodes: int, gpus: tuple[int, ...], cache: dict) -> Any:
    """Return the group signature of ``gpus`` alone on ``topology`` at ``nodes`` nodes; None where it has none."""
    key = (topology, nodes, gpus)
    if key not in cache:
        from taccl_py.placement.groups import group_signature, group_topology
        from taccl_py.topology.builtins import load_topology

        parent_key = (topology, nodes)
        try:
            if parent_key not in cache:
                cache[parent_key] = load_topology(topology, nodes=nodes)
            # sharing None: every link whole, as link_sharing(parent, [gpus]) gives for one group alone
            cache[key] = group_signature(group_topology(cache[parent_key], gpus))
        except TacclError as error:  # not a machine here, or ranks it cannot hold (out of range, uneven)
            logger.debug("group %s on %s n%d: %s", list(gpus), topology, nodes, error)
            cache[key] = None
    return cache[key]
