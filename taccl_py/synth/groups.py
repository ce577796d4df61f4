"""Synthesis for process groups: one library per placement class of a kind of group, the whole kind at once.

The groups of one kind (the 8 data-parallel rails of DGX-H100 ×4, NDv2's tensor-parallel halves)
split into placement classes, groups whose topologies time alike (``placement_classes``). Each class
is synthesized once, on its first group's topology with every link shared among all groups of the
kind that cross it (``group_topology``), so baselines, bounds and the simulator see the group as it
runs beside the others. The library records the class's groups (``GroupRecord``) and names the
whole machine set it was made on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, GroupRecord, cluster_record
from taccl_py.placement.groups import group_label, group_topology, link_sharing, placement_classes
from taccl_py.placement.parallel import GroupKind, placed
from taccl_py.synth import synthesize
from taccl_py.synth.outcome import SynthesisResult
from taccl_py.topology.model import Topology

__all__ = ["GroupSynthesis", "group_folder_name", "group_topologies", "synthesize_groups"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupSynthesis:
    """One placement class's result: its record, the group topology it ran on, the synthesis and its library.

    ``library`` (None for one size) names the machine set (``topology``, ``nodes``) and carries ``record``.
    """

    record: GroupRecord
    topology: Topology
    result: SynthesisResult
    library: AlgorithmLibrary | None


def group_folder_name(record: GroupRecord) -> str:
    """Return the folder ``--parallel`` writes a class's libraries into: ``<kind>-<first member>``, e.g. ``dp-0``."""
    return f"{record.kind}-{record.members[0]}"


def group_topologies(
    topology: Topology, kind: GroupKind, placement: Sequence[int] | None = None
) -> list[tuple[GroupRecord, Topology]]:
    """Return, per placement class of ``kind``'s groups, its record and its first group's shared topology.

    ``placement`` maps job rank -> topology GPU rank (None: node-major, torchrun's order).
    """
    gpu_groups = placed(kind.groups, placement)
    job_groups = dict(zip(gpu_groups, kind.groups))
    sharing = link_sharing(topology, gpu_groups)
    classes = []
    for members in placement_classes(topology, gpu_groups, sharing):
        served = tuple(job_groups[gpus] for gpus in members)
        record = GroupRecord(kind.kind, topology.num_ranks, served[0], served, kind.groups)
        name = group_label(topology, kind.kind, served[0])
        classes.append((record, group_topology(topology, members[0], sharing, name=name)))
    return classes


def synthesize_groups(
    topology: Topology,
    collective: Collective | str,
    kind: GroupKind,
    *,
    placement: Sequence[int] | None = None,
    machine: str | None = None,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> tuple[GroupSynthesis, ...]:
    """Return one synthesis per placement class of ``kind`` on ``topology`` (``options`` go to ``synthesize``).

    ``machine`` is the name the libraries record for the machine set (default ``topology.name``),
    the one ``load_topology`` takes back with the library's ``nodes``.
    """
    outcomes = []
    classes = group_topologies(topology, kind, placement)
    for index, (record, group) in enumerate(classes):
        if progress is not None:
            progress(
                f"group class {index + 1}/{len(classes)}: {kind.kind} {list(record.members)} "
                f"({len(record.groups)} alike, {len(record.concurrent)} at once)"
            )
        result = synthesize(group, collective, progress=progress, **options)
        library = None
        if result.library is not None:
            library = replace(
                result.library,
                topology=machine or topology.name,
                nodes=topology.nodes,
                cluster=cluster_record(topology),
                group=record,
            )
        logger.info("%s on %s: %d group(s) of this class", result.collective.value, group.name, len(record.groups))
        outcomes.append(GroupSynthesis(record, group, result, library))
    return tuple(outcomes)
