"""The Communicator's argument checks: tensors, reduction ops and all_to_all split sizes, before any message.

Each check raises :class:`~taccl_py.errors.ArgumentError` naming the call, the argument and the
fault, so a bad call fails on every rank before the group sends anything and stays in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from taccl_py.errors import ArgumentError
from taccl_py.runtime.executor import REDUCE_OPS, SUPPORTED_DTYPES

__all__ = ["check_split_sizes", "check_tensors", "splits_given", "op_name"]

_SOURCE = "Communicator"


def op_name(op: Any) -> str:
    """Return the op as one of REDUCE_OPS; accept torch.distributed.ReduceOp members too.

    >>> op_name("SUM")
    'sum'
    """
    name = op if isinstance(op, str) else str(getattr(op, "name", op)).rsplit(".", 1)[-1]
    name = name.lower()
    if name not in REDUCE_OPS:
        raise ArgumentError(_SOURCE, "op", f"{op!r}", " | ".join(REDUCE_OPS))
    return name


def check_tensors(what: str, output: Any, input: Any, device: Any, transport: str) -> None:
    """Raise ArgumentError unless both are contiguous tensors of one supported dtype on ``device``.

    A call on a GPU while the calling thread captures a CUDA graph is refused too: the executor's
    host-side rounds cannot be replayed by the graph (``cuda_graphs=True`` captures whole calls).
    """
    if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ArgumentError(
            _SOURCE,
            what,
            "called while this thread captures a CUDA graph",
            "a call outside the capture (Communicator(cuda_graphs=True) captures its own calls; the taccl "
            "backend's calls run NCCL's own during a capture)",
        )
    for role, tensor in (("output", output), ("input", input)):
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentError(_SOURCE, f"{what}.{role}", f"{type(tensor).__name__} is not a tensor", "a torch.Tensor")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise ArgumentError(
                _SOURCE,
                f"{what}.{role}",
                f"dtype {tensor.dtype} is not supported",
                ", ".join(str(d) for d in SUPPORTED_DTYPES),
            )
        if not tensor.is_contiguous():
            raise ArgumentError(
                _SOURCE, f"{what}.{role}", "tensor is not contiguous", "a contiguous tensor (call .contiguous())"
            )
        if tensor.device != device:
            raise ArgumentError(
                _SOURCE,
                f"{what}.{role}",
                f"tensor on {tensor.device}",
                f"a tensor on {device} for the {transport} transport",
            )
    if output.dtype != input.dtype:
        raise ArgumentError(_SOURCE, what, f"output is {output.dtype} but input is {input.dtype}", "one dtype")


def check_split_sizes(what: str, role: str, splits: Sequence[int] | None, tensor: Any, world_size: int) -> None:
    """Raise ArgumentError unless ``splits`` (None: equal blocks) cut ``tensor``'s first dimension into ``world_size``.

    Split sizes count rows of the first dimension, as in ``torch.distributed.all_to_all_single``.
    """
    rows = tensor.shape[0] if tensor.dim() else 1
    field = f"{what}.{role}_split_sizes"
    if splits is None or len(splits) == 0:
        if rows % world_size:
            raise ArgumentError(
                _SOURCE,
                f"{what}.{role}",
                f"{rows} rows do not split into {world_size} equal blocks",
                f"a first dimension that is a multiple of {world_size}, or split sizes",
            )
        return
    if len(splits) != world_size or any(int(s) < 0 for s in splits):
        raise ArgumentError(_SOURCE, field, f"{list(splits)}", f"{world_size} sizes of 0 or more, one per rank")
    if sum(int(s) for s in splits) != rows:
        raise ArgumentError(
            _SOURCE, field, f"{list(splits)} add up to {sum(int(s) for s in splits)}", f"the {rows} rows of the {role}"
        )


def splits_given(splits: Sequence[int] | None) -> bool:
    """Return True when a caller passed split sizes (torch reads None and [] alike: equal blocks).

    Only a call without split sizes promises equal blocks on every rank: a rank whose own splits
    are equal cannot tell whether another rank's are, and every rank must take the same path.

    >>> splits_given(None), splits_given([]), splits_given([2, 2])
    (False, False, True)
    """
    return splits is not None and len(splits) > 0
