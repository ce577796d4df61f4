"""What scripts/gpu_check.py checks: case tables from the library, the data, and the reference results.

Every shape comes from :func:`taccl_py.runtime.executor.block_layout` (a collective's input and
output blocks), every size from the library's bands, so a collective the library gains (AlltoAll)
is checked without a hand-written table. No process group is made here; :func:`reference_result`
runs on the one it is given. The report is in :mod:`gpu_check_report`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator.selection import AlgorithmChoices, Candidate, collective_size_bytes
from taccl_py.runtime.executor import REDUCE_OPS, SUPPORTED_DTYPES, block_layout
from taccl_py.runtime.executor.native import REDUCE_OP_NAMES, native_collective

__all__ = [
    "BAND_NUMEL",
    "COALESCED_ENTRIES",
    "DELEGATED_OPS",
    "DTYPES",
    "LIST_ENTRIES",
    "MAX_CHECK_BYTES",
    "MIX_ENTRY",
    "NO_OP",
    "NUMELS",
    "TENSOR_ENTRIES",
    "EntryCase",
    "ExecutorCase",
    "Shape",
    "backend_cases",
    "band_numel",
    "dtype_name",
    "executor_cases",
    "expects_routing",
    "first_band_numel",
    "integer_data",
    "ops_for",
    "reduce_op",
    "reference_result",
    "routed_bands",
    "shape_of",
]

#: Shard lengths (elements) each algorithm runs at through its Executor: odd (padded chunks) and > 64 KiB of fp32.
NUMELS = (1001, 65539)
#: The shard length (elements) a call in a band aims at, where the band's byte range allows it.
BAND_NUMEL = 1001
#: Largest call the check makes (bytes, nccl-tests size); a band that starts above it is reported as skipped.
MAX_CHECK_BYTES = 64 * 2**20
#: Every dtype the executor runs (its SUPPORTED_DTYPES).
DTYPES = SUPPORTED_DTYPES
#: Ops the ``taccl`` backend hands to its inner backend (backend_collectives._OPS routes only REDUCE_OPS).
DELEGATED_OPS = ("prod",)
#: The op column of a collective that does not reduce.
NO_OP = "-"
#: The torch.distributed call per collective that takes one input and one output tensor.
TENSOR_ENTRIES = MappingProxyType(
    {
        Collective.ALLREDUCE: "dist.all_reduce",
        Collective.ALLGATHER: "dist.all_gather_single",
        Collective.REDUCESCATTER: "dist.reduce_scatter_single",
        Collective.ALLTOALL: "dist.all_to_all_single",
    }
)
LIST_ENTRIES = MappingProxyType(
    {
        Collective.ALLGATHER: "dist.all_gather (list)",
        Collective.REDUCESCATTER: "dist.reduce_scatter (list)",
        Collective.ALLTOALL: "dist.all_to_all (list)",
    }
)
#: Two calls inside ``dist._coalescing_manager(async_ops=True)``: the group's ``*_coalesced`` methods.
COALESCED_ENTRIES = MappingProxyType(
    {
        Collective.ALLGATHER: "coalesced all_gather_single x2",
        Collective.REDUCESCATTER: "coalesced reduce_scatter_single x2",
    }
)
#: Routed and delegated calls in flight together (see gpu_check_backend.run_mix).
MIX_ENTRY = "async mix, routed + delegated"
_MIX_ROUTED = (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLTOALL)


# -- shapes and sizes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One call's tensors (elements): shard length ``numel``, input and output lengths from block_layout."""

    collective: Collective
    numel: int
    input_numel: int
    output_numel: int

    def size_bytes(self, dtype: torch.dtype) -> int:
        """Return the call's nccl-tests size in bytes for ``dtype``."""
        element = torch.empty((), dtype=dtype).element_size()
        return collective_size_bytes(self.collective, self.input_numel * element, self.output_numel * element)


def shape_of(collective: Collective, num_ranks: int, numel: int, chunks_per_loop: int | None = None) -> Shape:
    """Return the tensors of ``collective`` on ``num_ranks`` ranks with shard length ``numel`` (elements)."""
    in_blocks, out_blocks, _ = block_layout(collective, num_ranks, chunks_per_loop or num_ranks)
    return Shape(collective, numel, in_blocks * numel, out_blocks * numel)


def ops_for(collective: Collective) -> tuple[str, ...]:
    """Return the ops checked for ``collective``: every routed reduction, or NO_OP for one that moves data only."""
    return REDUCE_OPS if collective.reduces else (NO_OP,)


def routed_bands(choices: AlgorithmChoices, collective: Collective) -> tuple[Candidate, ...]:
    """Return the bands of ``collective`` where the library runs one of its algorithms (not "native")."""
    return tuple(c for c in choices.candidates if c.collective is collective and c.algorithm is not None)


def band_numel(candidate: Candidate, dtype: torch.dtype) -> int | None:
    """Return a shard length (elements, odd where the band allows) whose call falls in ``candidate``'s band.

    Near BAND_NUMEL; None when the band starts above MAX_CHECK_BYTES.
    """
    unit = shape_of(candidate.collective, candidate.num_ranks, 1).size_bytes(dtype)  # bytes per shard element
    low = max(1, math.ceil(candidate.min_bytes / unit))
    high = MAX_CHECK_BYTES // unit
    if candidate.max_bytes is not None:
        high = min(high, (candidate.max_bytes - 1) // unit)
    if low > high:
        return None
    numel = min(max(BAND_NUMEL, low), high)
    if numel % 2 == 0:  # an odd shard pads the algorithm's chunks
        numel = numel + 1 if numel + 1 <= high else numel - 1 if numel - 1 >= low else numel
    return numel


def first_band_numel(choices: AlgorithmChoices, collective: Collective, dtype: torch.dtype) -> int:
    """Return the shard length of the first routed band of ``collective`` that fits, else BAND_NUMEL."""
    for candidate in routed_bands(choices, collective):
        numel = band_numel(candidate, dtype)
        if numel is not None:
            return numel
    return BAND_NUMEL


def expects_routing(choices: AlgorithmChoices, collective: Collective, size_bytes: int, op: str) -> bool:
    """Return True when the ``taccl`` group should run this call with one of the library's algorithms."""
    if op not in (*REDUCE_OPS, NO_OP):
        return False
    candidate = choices.select(collective, size_bytes)
    return candidate is not None and candidate.algorithm is not None


# -- case tables ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutorCase:
    """One Executor run: shard length (elements), dtype, op, and whether it runs on a side CUDA stream."""

    numel: int
    dtype: torch.dtype
    op: str
    side_stream: bool = False


def executor_cases(collective: Collective, cuda: bool) -> tuple[ExecutorCase, ...]:
    """Return an algorithm's Executor cases: every dtype and op at NUMELS[0], float32 above, side streams on CUDA."""
    ops = ops_for(collective)
    cases = [ExecutorCase(NUMELS[0], dtype, op) for dtype in DTYPES for op in ops]
    cases += [ExecutorCase(numel, torch.float32, op) for numel in NUMELS[1:] for op in ops]
    if cuda:
        cases += [ExecutorCase(numel, torch.float32, ops[0], side_stream=True) for numel in NUMELS]
    return tuple(cases)


@dataclass(frozen=True)
class EntryCase:
    """One call pattern through torch.distributed on the ``taccl`` group, and how the group should run it.

    ``collective`` None is the mix; ``numel`` the shard length (elements) of ``collective``'s calls;
    ``routed`` and ``delegated`` the calls per collective the group should run with one of the
    library's algorithms and on its inner backend (sorted, zeros left out; broadcasts are not counted).
    """

    entry: str
    collective: Collective | None
    dtype: torch.dtype
    op: str
    numel: int
    routed: tuple[tuple[str, int], ...]
    delegated: tuple[tuple[str, int], ...] = ()


def _counts(
    choices: AlgorithmChoices, calls: Iterable[tuple[Collective, int, str]]
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """Return the calls (collective, size in bytes, op) the group should route, and those it should delegate."""
    routed: Counter = Counter()
    delegated: Counter = Counter()
    for collective, size_bytes, op in calls:
        (routed if expects_routing(choices, collective, size_bytes, op) else delegated)[collective.value] += 1
    return tuple(sorted(routed.items())), tuple(sorted(delegated.items()))


def _entry(choices: AlgorithmChoices, entry: str, shape: Shape, dtype: torch.dtype, op: str, calls: int) -> EntryCase:
    size = shape.size_bytes(dtype)
    routed, delegated = _counts(choices, [(shape.collective, size, op)] * calls)
    return EntryCase(entry, shape.collective, dtype, op, shape.numel, routed, delegated)


def _mix_case(choices: AlgorithmChoices, dtype: torch.dtype) -> EntryCase:
    """Return the async mix's case: each routed collective at its first band, and a PRODUCT all-reduce."""
    sizes = {
        c: shape_of(c, choices.world_size, first_band_numel(choices, c, dtype)).size_bytes(dtype) for c in Collective
    }
    calls = [(c, sizes[c], "sum") for c in _MIX_ROUTED] + [(Collective.ALLREDUCE, sizes[Collective.ALLREDUCE], "prod")]
    return EntryCase(MIX_ENTRY, None, dtype, "sum", BAND_NUMEL, *_counts(choices, calls))


def backend_cases(choices: AlgorithmChoices) -> tuple[EntryCase, ...]:
    """Return the backend's cases for the library's collectives, each dtype and op.

    The single-tensor calls at each routed band, PRODUCT all-reduces (delegated), the list and
    coalesced calls at each collective's first band, and the async mix.
    """
    world, cases = choices.world_size, []
    for collective in sorted(choices.collectives, key=list(Collective).index):
        for dtype in DTYPES:
            sizes = [band_numel(band, dtype) for band in routed_bands(choices, collective)]
            for numel in dict.fromkeys(n for n in sizes if n is not None):
                shape = shape_of(collective, world, numel)
                cases += [
                    _entry(choices, TENSOR_ENTRIES[collective], shape, dtype, op, 1) for op in ops_for(collective)
                ]
            first = shape_of(collective, world, first_band_numel(choices, collective, dtype))
            if collective is Collective.ALLREDUCE:
                cases += [_entry(choices, TENSOR_ENTRIES[collective], first, dtype, op, 1) for op in DELEGATED_OPS]
            for entries, calls in ((LIST_ENTRIES, 1), (COALESCED_ENTRIES, 2)):
                if collective in entries:
                    cases += [
                        _entry(choices, entries[collective], first, dtype, op, calls) for op in ops_for(collective)
                    ]
    return tuple(cases) + tuple(_mix_case(choices, dtype) for dtype in DTYPES)


# -- data and references --------------------------------------------------------------------------------


def integer_data(numel: int, dtype: torch.dtype, seed: int, device: Any, op: str = "sum") -> torch.Tensor:
    """Return ``numel`` small random integers as ``dtype``, exact under any order of reduction.

    -4..4: sums over up to 64 ranks stay within ±256, where bfloat16 holds every integer; for
    ``prod``, ±1 and ±2, whose products are powers of two.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    if op in DELEGATED_OPS:
        values = torch.tensor([-2, -1, 1, 2], device=device)
        return values[torch.randint(0, 4, (numel,), generator=generator, device=device)].to(dtype)
    return torch.randint(-4, 5, (numel,), generator=generator, device=device).to(dtype)


def reduce_op(op: str) -> Any:
    """Return the torch ReduceOp of ``op`` as the ``taccl`` group takes it (avg: AVG)."""
    return getattr(dist.ReduceOp, "AVG" if op == "avg" else REDUCE_OP_NAMES.get(op, "SUM"))


def reference_result(collective: Collective, data: torch.Tensor, numel: int, op: str, group: Any) -> torch.Tensor:
    """Return ``collective`` of ``data`` (shard length ``numel``) by ``group``'s own backend.

    avg is the sum divided by the rank count (integers truncate toward zero, as NCCL's ncclAvg
    does): the executor's rule (:func:`~taccl_py.runtime.executor.native.native_collective`), where NCCL's
    float avg would premultiply each input by 1/n.
    """
    world = dist.get_world_size(group)
    if collective is Collective.ALLGATHER:
        out = data.new_empty(world * numel)
    elif collective is Collective.REDUCESCATTER:
        out = data.new_empty(numel)
    elif collective is Collective.ALLTOALL:
        out = torch.empty_like(data)
    else:
        out = data.clone()  # reduced in place
    native_collective(collective, out, data, op if collective.reduces else "sum", group)
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """Return ``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")
