"""torch.distributed's own collectives ("native"), run as the executor runs ours: one op set, avg as sum then divide.

The Communicator falls back to these, its calibration times them, and the tests and the GPU check
use them as the reference, so all of them average alike: the sum divided by the rank count,
integers truncating toward zero as NCCL's ncclAvg does (gloo has no AVG).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch.distributed as dist

from taccl_py.ir.collectives import Collective

__all__ = ["REDUCE_OP_NAMES", "all_gather_single", "divide_for_avg", "native_collective", "reduce_scatter_single"]

#: Our op name -> the name of the torch ReduceOp that computes it (avg: SUM, then divide_for_avg).
REDUCE_OP_NAMES: Mapping[str, str] = MappingProxyType(
    {"sum": "SUM", "avg": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT"}
)


def divide_for_avg(tensor: Any, world_size: int) -> Any:
    """Divide ``tensor`` by ``world_size`` in place and return it; integers truncate toward zero.

    >>> import torch
    >>> divide_for_avg(torch.tensor([-7, 7]), 2).tolist()
    [-3, 3]
    """
    if tensor.dtype.is_floating_point:
        return tensor.div_(world_size)
    return tensor.div_(world_size, rounding_mode="trunc")


def all_gather_single(output: Any, input: Any, group: Any = None, async_op: bool = False) -> Any:
    """Run torch's single-tensor all-gather (``all_gather_into_tensor`` where torch lacks that name)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output: Any, input: Any, op: Any, group: Any = None, async_op: bool = False) -> Any:
    """Run torch's single-tensor reduce-scatter (``reduce_scatter_tensor`` where torch lacks that name)."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, input, op=op, group=group, async_op=async_op)


def native_collective(collective: Collective, output: Any, input: Any, op: str, group: Any = None) -> None:
    """Run torch.distributed's ``collective`` of ``input`` into ``output`` on ``group``; avg as sum then divide.

    All-reduce reduces ``output`` in place: pass the same tensor twice, or an ``output`` holding the input.
    """
    reduce_op = getattr(dist.ReduceOp, REDUCE_OP_NAMES[op])
    if collective is Collective.ALLGATHER:
        all_gather_single(output, input, group)
    elif collective is Collective.REDUCESCATTER:
        reduce_scatter_single(output, input, reduce_op, group)
    elif collective is Collective.ALLTOALL:
        dist.all_to_all_single(output, input, group=group)
    else:
        dist.all_reduce(output, op=reduce_op, group=group)
    if op == "avg" and collective.reduces:
        divide_for_avg(output, dist.get_world_size(group))
