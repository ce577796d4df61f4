"""Where a job's ranks sit and which process groups 3D parallelism makes of them.

``parallel_groups({"tp": 8, "dp": 4})`` gives Megatron-LM's groups for its default order
(tensor parallel fastest, then data parallel, then pipeline): rank r is tensor-parallel index
r mod tp, data-parallel index (r div tp) mod dp and pipeline stage r div (tp·dp). A placement maps
each job rank to the topology GPU it runs on: torchrun's node-major order (the identity) unless a
``taccl-placement/1`` file says otherwise, ``{"schema": "taccl-placement/1", "gpus": [0, 8, 1, 9, ...]}``
(``gpus[r]`` is the topology rank of job rank r).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from taccl_py._io import decode_json, read_text
from taccl_py.errors import ArgumentError, FormatError

__all__ = [
    "PARALLEL_KINDS",
    "PLACEMENT_SCHEMA",
    "GroupKind",
    "parse_ranks",
    "parse_parallel",
    "parallel_groups",
    "read_placement",
    "placed",
]

#: The kinds ``--parallel`` takes, fastest-varying first (Megatron-LM's default order, tp-dp-pp).
PARALLEL_KINDS = ("tp", "dp", "pp")
PLACEMENT_SCHEMA = "taccl-placement/1"


@dataclass(frozen=True)
class GroupKind:
    """The process groups of one kind, each a tuple of job ranks in group-rank order (ascending, as torch sorts)."""

    kind: str
    groups: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        """Return the number of ranks in each group."""
        return len(self.groups[0])


def parse_ranks(text: str, option: str = "--ranks") -> tuple[int, ...]:
    """Return the ranks of ``0,8,16,24`` sorted (torch's group-rank order); raise ``ArgumentError`` on a fault."""
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ArgumentError(option, "ranks", repr(text), "comma-separated global ranks, e.g. 0,8,16,24") from None
    if len(ranks) < 2 or len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise ArgumentError(option, "ranks", repr(text), "two or more different non-negative ranks")
    return tuple(sorted(ranks))


def parse_parallel(text: str, option: str = "--parallel") -> dict[str, int]:
    """Return ``{"tp": 8, "dp": 4}`` for ``tp=8,dp=4``; raise ``ArgumentError`` naming the fault."""
    sizes: dict[str, int] = {}
    for part in text.split(","):
        kind, _, value = part.strip().partition("=")
        if kind not in PARALLEL_KINDS or kind in sizes or not value.isdigit() or int(value) < 1:
            raise ArgumentError(
                option, "parallel", repr(part), "KIND=SIZE with KIND one of tp, dp, pp once each, e.g. tp=8,dp=4"
            )
        sizes[kind] = int(value)
    return sizes


def parallel_groups(sizes: Mapping[str, int], world_size: int, option: str = "--parallel") -> tuple[GroupKind, ...]:
    """Return the groups of every kind in ``sizes`` with more than one rank, in ``PARALLEL_KINDS`` order.

    Raises ``ArgumentError`` when the kinds' product is not ``world_size``.
    """
    full = {kind: sizes.get(kind, 1) for kind in PARALLEL_KINDS}
    if math.prod(full.values()) != world_size:
        spelled = "·".join(f"{kind}={size}" for kind, size in full.items())
        raise ArgumentError(option, "parallel", f"{spelled} makes {math.prod(full.values())} ranks", f"{world_size}")
    kinds = []
    stride = 1
    for kind in PARALLEL_KINDS:
        size = full[kind]
        if size > 1:
            block = stride * size
            groups = tuple(
                tuple(start + i * stride for i in range(size))
                for base in range(0, world_size, block)
                for start in range(base, base + stride)
            )
            kinds.append(GroupKind(kind, groups))
        stride *= size
    return tuple(kinds)


def read_placement(path: str | Path, world_size: int) -> tuple[int, ...]:
    """Return job rank -> topology GPU rank from a ``taccl-placement/1`` file; raise ``FormatError`` on a fault."""
    source = str(path)
    obj = decode_json(read_text(Path(path)), source, FormatError, "a placement file")
    if not isinstance(obj, dict) or obj.get("schema") != PLACEMENT_SCHEMA:
        raise FormatError(source, "schema", "not a placement file", repr(PLACEMENT_SCHEMA))
    gpus = obj.get("gpus")
    if not isinstance(gpus, list) or sorted(gpus) != list(range(world_size)) or not all(type(g) is int for g in gpus):
        raise FormatError(source, "gpus", f"{gpus!r}", f"each GPU rank 0..{world_size - 1} once, indexed by job rank")
    return tuple(gpus)


def placed(groups: Sequence[Sequence[int]], placement: Sequence[int] | None) -> list[tuple[int, ...]]:
    """Return ``groups`` of job ranks as topology GPU ranks under ``placement`` (None: the identity)."""
    return [tuple(rank if placement is None else placement[rank] for rank in group) for group in groups]
