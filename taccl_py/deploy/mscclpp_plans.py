"""The plans of an exported MSCCL++ folder, checked against the job that is to load them.

A plan cannot say which job it is for beyond its rank count, and MSCCL++ keys algorithms by name
and trusts each plan's size range, so the folder is checked here before anything is registered:
world size, machine boundaries (memory and switch channels need one machine), unique names, and no
two plans of one collective and placement covering one size. Reduction ops are checked against
the plans too: MSCCL++ runs every reduction as a sum (``taccl_py.deploy.mscclpp``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from taccl_py.errors import ArgumentError
from taccl_py.mscclpp.parse import read_mscclpp_plan
from taccl_py.mscclpp.plan import ChannelKind, ExecutionPlan
from taccl_py.mscclpp.sizes import executor_accepts, largest_addressable_size

__all__ = [
    "FORCE_NCCL_ENV",
    "REDUCE_OPS",
    "SHIM_COLLECTIVES",
    "SUM_ONLY_COLLECTIVES",
    "DeployPlan",
    "check_job",
    "check_reduce_ops",
    "read_plan_folder",
]

#: The collectives MSCCL++'s NCCL shim routes through a selector (nccl.cc: ncclAllReduce,
#: ncclReduceScatter, ncclAllGather); its ncclAllToAll returns an error (nccl.cc:794-805).
SHIM_COLLECTIVES = ("allgather", "allreduce", "reducescatter")
#: The collectives that reduce, which MSCCL++ runs as a sum whatever the call's op.
SUM_ONLY_COLLECTIVES = frozenset({"allreduce", "reducescatter"})
#: Reduction op names a job may declare: NCCL's ``ncclRedOp_t`` (nccl.h) and PyTorch's ``ReduceOp`` spellings.
REDUCE_OPS = frozenset({"sum", "prod", "product", "min", "max", "avg", "premul_sum", "band", "bor", "bxor"})
#: How to keep a whole collective on NCCL under the shim (include/mscclpp/env.hpp:96-99; read at src/core/env.cpp:66).
FORCE_NCCL_ENV = "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION"


@dataclass(frozen=True)
class DeployPlan:
    """One plan of the folder: its file, the plan, and the largest size (bytes) it is picked at.

    ``largest_bytes`` is ``max_message_size`` capped where an offset would pass 2^32 bytes.
    """

    path: Path
    plan: ExecutionPlan
    largest_bytes: int

    @classmethod
    def of(cls, path: Path, plan: ExecutionPlan) -> DeployPlan:
        """Return the plan read from ``path`` with its addressable limit."""
        return cls(path, plan, min(plan.max_message_size, largest_addressable_size(plan)))

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def collective(self) -> str:
        return self.plan.collective

    @property
    def inplace(self) -> bool:
        return self.plan.inplace

    def serves(self, message_size: int) -> bool:
        """Return True when the executor runs this plan at ``message_size`` bytes without throwing or wrapping."""
        return self.plan.min_message_size <= message_size <= self.largest_bytes and executor_accepts(
            self.plan, message_size
        )


def read_plan_folder(folder: str | Path, *, world_size: int, ranks_per_node: int) -> tuple[DeployPlan, ...]:
    """Return every plan (``*.json``) of ``folder``, checked for a job of ``world_size`` ranks, ``ranks_per_node`` each.

    Raises
    ------
    FormatError
        A file is no MSCCL++ plan (the message names the file and the field).
    ArgumentError
        The folder holds no plan; a plan is for another world size, links ranks of two machines by
        memory or switch channels, shares its name with another (MSCCL++ keys algorithms by name), or
        covers sizes another plan of its collective and placement covers too.
    """
    check_job(world_size, ranks_per_node)
    root = Path(folder)
    if not root.is_dir():
        raise ArgumentError(str(folder), None, "no such folder", "a folder written by taccl export-mscclpp")
    paths = sorted(path for path in root.glob("*.json") if path.is_file())
    if not paths:
        raise ArgumentError(str(folder), None, "holds no plan (*.json)", "a folder written by taccl export-mscclpp")
    plans = []
    for path in paths:
        plan = read_mscclpp_plan(path)
        if len(plan.gpus) != world_size:
            raise ArgumentError(
                str(path), "gpus", f"a plan for {len(plan.gpus)} ranks", f"plans for the job's {world_size} ranks"
            )
        _check_machines(path, plan, ranks_per_node)
        plans.append(DeployPlan.of(path, plan))
    _check_names(plans)
    _check_ranges(plans)
    return tuple(plans)


def check_job(world_size: int, ranks_per_node: int) -> None:
    if world_size < 2:
        raise ArgumentError(None, "world_size", f"{world_size} ranks", "at least 2")
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ArgumentError(
            None, "ranks_per_node", f"{ranks_per_node} ranks per machine", f"a divisor of the world size {world_size}"
        )


def _check_machines(path: Path, plan: ExecutionPlan, ranks_per_node: int) -> None:
    """Raise ArgumentError where a memory or switch channel joins ranks of two machines (they share no memory)."""
    for gpu in plan.gpus:
        for index, channel in enumerate(gpu.channels):
            peers = channel.connected_to
            if channel.channel_type is ChannelKind.SWITCH:
                peers = tuple(rank for group in channel.rank_groups for rank in group.ranks)
            elif channel.channel_type is not ChannelKind.MEMORY:
                continue
            for peer in peers:
                if peer // ranks_per_node != gpu.id // ranks_per_node:
                    raise ArgumentError(
                        str(path),
                        f"gpus[{gpu.id}].channels[{index}]",
                        f"a {channel.channel_type.value} channel to rank {peer}, on another machine at "
                        f"{ranks_per_node} ranks per machine",
                        f"plans exported for machines of {ranks_per_node} GPUs",
                    )


def _check_names(plans: list[DeployPlan]) -> None:
    seen: dict[str, Path] = {}
    for entry in plans:
        if entry.name in seen:
            raise ArgumentError(
                str(entry.path),
                "name",
                f"{entry.name!r} also names {seen[entry.name].name}",
                "one name per plan (MSCCL++ keys its algorithms by name)",
            )
        seen[entry.name] = entry.path


def _check_ranges(plans: list[DeployPlan]) -> None:
    groups: dict[tuple[str, bool], list[DeployPlan]] = {}
    for entry in plans:
        groups.setdefault((entry.collective, entry.inplace), []).append(entry)
    for (collective, inplace), members in groups.items():
        members.sort(key=lambda entry: entry.plan.min_message_size)
        for before, after in zip(members, members[1:]):
            if after.plan.min_message_size <= before.plan.max_message_size:
                placement = "in place" if inplace else "out of place"
                raise ArgumentError(
                    str(after.path),
                    "min_message_size",
                    f"{collective} {placement} from {after.plan.min_message_size} B overlaps {before.path.name} "
                    f"(up to {before.plan.max_message_size} B)",
                    "one plan per size for each collective and placement",
                )


def check_reduce_ops(plans: Iterable[DeployPlan], reduce_ops: Iterable[str]) -> tuple[str, ...]:
    """Return ``reduce_ops`` in lower case; raise ArgumentError if one is unknown, or not a sum while a plan reduces."""
    ops = tuple(op.lower() for op in reduce_ops)
    for op in ops:
        if op not in REDUCE_OPS:
            raise ArgumentError(None, "reduce_ops", f"unknown op {op!r}", "any of " + ", ".join(sorted(REDUCE_OPS)))
    others = sorted(set(ops) - {"sum"})
    reducing = [entry for entry in plans if entry.collective in SUM_ONLY_COLLECTIVES]
    if others and reducing:
        raise ArgumentError(
            str(reducing[0].path),
            "reduce_ops",
            f"the job reduces with {', '.join(others)}, but MSCCL++ runs every {reducing[0].collective} plan as a "
            "sum whatever the call's op (the op reaches no plan and no selector)",
            f"reduce_ops sum only, or collectives allgather only, with {FORCE_NCCL_ENV}=allreduce,reducescatter "
            "keeping those on NCCL",
        )
    return ops
