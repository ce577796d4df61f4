"""Baseline algorithms to compare against: NCCL-like rings, double binary trees, hierarchical rings and
spanning-tree packing (the bandwidth-optimal published method); for AlltoAll, direct and two-level
hierarchical exchanges.

Across machines of equally many GPUs the doubling family (``doubling.py``) is the latency-optimal
one: each rail (local GPU i of every machine) runs Bruck's doubling across machines, ceil(log2 M)
network steps instead of a ring's M - 1, and every block it receives goes straight on over NVLink
to the machine's other GPUs; ReduceScatter is its mirror and AllReduce the two (Rabenseifner).

Every baseline is built with ``lower_plan`` and returned only after ``check_algorithm`` proved
it implements its collective (``build.py``). ``compare_baselines`` (``choice.py``) simulates the
applicable ones and gives, per size, the fastest: what every result is compared with. It builds
them unverified and proves only the ones it returns, since most lose at every size. NCCL's
algorithms that no schedule expresses (NVLS, NVLS-Tree, PAT: ``nccl.py``) are modelled and compete
for the fastest too, never for what may be written; ``nccl_best_times`` gives NCCL's best per size.
"""

from __future__ import annotations

from taccl_py.baselines.alltoall import direct_alltoall_algorithm, hierarchical_alltoall_algorithm
from taccl_py.baselines.build import BaselineKind, all_baselines, applicable_kinds, build_baseline, size_groups
from taccl_py.baselines.choice import (
    ComparedBaseline,
    best_baseline,
    best_baselines,
    best_baselines_by_band,
    compare_baselines,
)
from taccl_py.baselines.doubling import doubling_algorithm
from taccl_py.baselines.hierarchical import hierarchical_algorithm, local_rings
from taccl_py.baselines.nccl import (
    ModelledBaseline,
    NcclChoice,
    is_schedule,
    nccl_best_times,
    nccl_modelled_times,
)
from taccl_py.baselines.packing import packed_trees_algorithm
from taccl_py.baselines.ring import ring_algorithm, ring_orders
from taccl_py.baselines.tree import tree_algorithm, tree_parents

__all__ = [
    "BaselineKind",
    "applicable_kinds",
    "build_baseline",
    "all_baselines",
    "ComparedBaseline",
    "compare_baselines",
    "best_baseline",
    "best_baselines",
    "best_baselines_by_band",
    "size_groups",
    "ModelledBaseline",
    "NcclChoice",
    "is_schedule",
    "nccl_best_times",
    "nccl_modelled_times",
    "ring_algorithm",
    "ring_orders",
    "tree_algorithm",
    "tree_parents",
    "hierarchical_algorithm",
    "local_rings",
    "packed_trees_algorithm",
    "doubling_algorithm",
    "direct_alltoall_algorithm",
    "hierarchical_alltoall_algorithm",
]
