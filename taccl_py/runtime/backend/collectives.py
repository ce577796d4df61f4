"""The ``taccl`` group's collective entry points: each of torch's signatures, routed to a Communicator or delegated.

:class:`CollectiveEntryPoints` is the part of
:class:`~taccl_py.runtime.backend.group.TacclProcessGroup` that torch calls: ``allreduce``,
``allgather`` / ``all_gather_single``, ``reduce_scatter`` / ``reduce_scatter_single`` (and their
coalesced forms), ``alltoall`` and ``alltoall_base`` / ``all_to_all_single`` (equal blocks) check
whether the call can run on a Communicator and run it in the group's issue order (see
:mod:`taccl_py.runtime.backend.issue_order`); everything else, and whatever cannot be routed, runs on the
inner gloo/NCCL backend, in the same order. Every entry
point torch has is a Python method here (see :mod:`taccl_py.runtime.backend` for why). The group
itself (inner backends, links, the routing decision, ordering) is in
:mod:`taccl_py.runtime.backend.group`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from taccl_py.ir.collectives import Collective
from taccl_py.runtime.backend.issue_order import IssueOrder
from taccl_py.runtime.backend.work import FutureWork
from taccl_py.runtime.communicator import Communicator

__all__ = ["CollectiveEntryPoints"]

# torch ReduceOp -> Communicator op; others (PRODUCT, PREMUL_SUM, bitwise) go to the inner backend
_OPS = (("SUM", "sum"), ("AVG", "avg"), ("MAX", "max"), ("MIN", "min"))


def _op_name(opts: Any) -> str | None:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for torch_name, name in _OPS:
        if op == getattr(dist.ReduceOp, torch_name):
            return name
    return None


def _first_tensor(value: Any) -> torch.Tensor | None:
    """Return the first tensor in ``value`` (a tensor, or nested lists/tuples of them), or None."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _on_inner_backend(name: str) -> Callable[..., Any]:
    """Return a method that runs the inner backend's ``name`` on its first tensor's device, in issue order."""

    def delegated(self: CollectiveEntryPoints, *args: Any, **kwargs: Any) -> Any:
        tensor = _first_tensor(args)
        device = tensor.device if tensor is not None else torch.device("cpu")
        return self._call_inner(device, name, args, kwargs)

    delegated.__name__ = delegated.__qualname__ = name
    delegated.__doc__ = f"Run the inner gloo/NCCL backend's ``{name}`` with these arguments; return its Work."
    return delegated


class CollectiveEntryPoints:
    """torch's collective methods of the ``taccl`` process group, routed or delegated call by call.

    A base of :class:`~taccl_py.runtime.backend.group.TacclProcessGroup` (before
    ``dist.ProcessGroup``, so that its methods are the ones torch finds), which provides
    ``_communicator`` (the Communicator that runs a call, or None), ``_submit`` (issue a routed
    job on the tensors it reads and writes), ``_order`` (the group's IssueOrder), ``_delegate``
    (run on the inner backend, counted), ``_call_inner`` (run on the inner backend after the
    routed calls before it), ``_log_split_sizes`` and ``size``.
    """

    _communicator: Callable[..., Communicator | None]
    _submit: Callable[..., Any]
    _order: IssueOrder
    _delegate: Callable[..., Any]
    _call_inner: Callable[..., Any]
    _log_split_sizes: Callable[[torch.Tensor], None]
    size: Callable[[], int]

    # -- routed collectives -----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """All-reduce ``tensors[0]`` in place; return its Work."""
        opts = dist.AllreduceOptions() if opts is None else opts
        op, tensor = _op_name(opts), tensors[0]
        routable = len(tensors) == 1 and op is not None
        communicator = self._communicator(Collective.ALLREDUCE, (tensor,), _nbytes(tensor)) if routable else None
        if communicator is None:
            return self._delegate(Collective.ALLREDUCE, "allreduce", tensor, tensors, opts)
        return self._submit(Collective.ALLREDUCE, partial(_all_reduce, communicator, tensor, op), (tensor,))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """Gather every rank's ``input`` into ``output`` (rank-major); return the Work."""
        communicator = self._communicator(Collective.ALLGATHER, (output, input), _nbytes(output))
        if communicator is None:
            return self._delegate(
                Collective.ALLGATHER, "_allgather_base", input, output, input, opts or AllgatherOptions()
            )
        return self._submit(Collective.ALLGATHER, partial(_all_gather, communicator, output, input), (output, input))

    _allgather_base = all_gather_single

    def allgather(
        self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """Gather ``input_tensors[0]`` of every rank into the list ``output_tensors[0]``; return the Work."""
        opts = AllgatherOptions() if opts is None else opts
        input = input_tensors[0]
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        routable = (
            len(input_tensors) == 1 and len(outputs) == self.size() and all(_same_kind(t, input) for t in outputs)
        )
        communicator = (
            self._communicator(Collective.ALLGATHER, (input, *outputs), _nbytes(input) * self.size())
            if routable
            else None
        )
        if communicator is None:
            return self._delegate(Collective.ALLGATHER, "allgather", input, output_tensors, input_tensors, opts)
        return self._submit(
            Collective.ALLGATHER, partial(_all_gather_list, communicator, outputs, input), (input, *outputs)
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """Reduce ``input`` over ranks and keep this rank's block in ``output``; return the Work."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op = _op_name(opts)
        communicator = self._communicator(Collective.REDUCESCATTER, (output, input), _nbytes(input)) if op else None
        if communicator is None:
            return self._delegate(Collective.REDUCESCATTER, "_reduce_scatter_base", input, output, input, opts)
        return self._submit(
            Collective.REDUCESCATTER, partial(_reduce_scatter, communicator, output, input, op), (output, input)
        )

    _reduce_scatter_base = reduce_scatter_single

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        """Send block j of ``input`` to rank j, into block ``rank`` of its ``output``; return the Work.

        Calls without split sizes run the library's alltoall; calls with split sizes (only those
        without promise equal blocks on every rank), and tensors whose first dimension does not
        split into equal blocks, run on the inner backend.
        """
        opts = dist.AllToAllOptions() if opts is None else opts
        even = not output_split_sizes and not input_split_sizes
        # what does not fit goes to the inner backend, to fail there as it would on gloo/NCCL
        routable = (
            even
            and _same_kind(output, input)
            and _equal_blocks(output, self.size())
            and _equal_blocks(input, self.size())
        )
        communicator = self._communicator(Collective.ALLTOALL, (output, input), _nbytes(input)) if routable else None
        if communicator is None:
            if not even:
                self._log_split_sizes(input)
            return self._delegate(
                Collective.ALLTOALL, "alltoall_base", input, output, input, output_split_sizes, input_split_sizes, opts
            )
        return self._submit(Collective.ALLTOALL, partial(_all_to_all, communicator, output, input), (output, input))

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Send ``input_tensors[j]`` to rank j, into its ``output_tensors[rank]``; return the Work.

        Routed when every tensor has the same size, dtype and device (equal blocks); else the inner backend's.
        """
        opts = dist.AllToAllOptions() if opts is None else opts
        first = _first_tensor((input_tensors, output_tensors))
        routable = (
            first is not None
            and len(input_tensors) == len(output_tensors) == self.size()
            and all(_same_kind(t, first) for t in (*input_tensors, *output_tensors))
        )
        communicator = (
            self._communicator(Collective.ALLTOALL, (*input_tensors, *output_tensors), _nbytes(first) * self.size())
            if routable
            else None
        )
        if communicator is None:
            tensor = first if first is not None else torch.empty(0)
            return self._delegate(Collective.ALLTOALL, "alltoall", tensor, output_tensors, input_tensors, opts)
        return self._submit(
            Collective.ALLTOALL,
            partial(_all_to_all_list, communicator, output_tensors, input_tensors),
            (*output_tensors, *input_tensors),
        )

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """All-gather each (output, input) pair as ``all_gather_single`` does; return one Work for all.

        What functional collectives (``all_gather_tensor``, DTensor) call.
        """
        opts = AllgatherOptions() if opts is None else opts
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _all_of(works, outputs, self._order)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """Reduce-scatter each (output, input) pair as ``reduce_scatter_single`` does; return one Work for all."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _all_of(works, outputs, self._order)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- delegated collectives: the inner backend's own, through its GIL-releasing bindings ------

    broadcast = _on_inner_backend("broadcast")
    reduce = _on_inner_backend("reduce")
    gather = _on_inner_backend("gather")
    scatter = _on_inner_backend("scatter")
    send = _on_inner_backend("send")
    recv = _on_inner_backend("recv")
    recv_anysource = _on_inner_backend("recv_anysource")
    allreduce_coalesced = _on_inner_backend("allreduce_coalesced")
    allgather_coalesced = _on_inner_backend("allgather_coalesced")

    def reduce_scatter(
        self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        """Reduce the list ``input_tensors[0]`` over ranks into ``output_tensors[0]``; return the Work."""
        opts = dist.ReduceScatterOptions() if opts is None else opts
        op, output = _op_name(opts), output_tensors[0]
        inputs = input_tensors[0] if len(input_tensors) == 1 else []
        routable = (
            op is not None
            and len(output_tensors) == 1
            and len(inputs) == self.size()
            and all(_same_kind(t, output) for t in inputs)
        )
        communicator = (
            self._communicator(Collective.REDUCESCATTER, (output, *inputs), _nbytes(output) * self.size())
            if routable
            else None
        )
        if communicator is None:
            return self._delegate(
                Collective.REDUCESCATTER, "reduce_scatter", output, output_tensors, input_tensors, opts
            )
        return self._submit(
            Collective.REDUCESCATTER, partial(_reduce_scatter_list, communicator, output, inputs, op), (output, *inputs)
        )


def _all_of(works: list[Any], outputs: list[torch.Tensor], order: IssueOrder) -> Any:
    """Return one Work that completes when all ``works`` have; ``wait`` raises the first failure."""
    if len(works) == 1:
        return works[0]
    if outputs[0].device.type == "cuda":  # the internal stream waits for each; the caller's stream goes on
        return order.joined(works, list(outputs))
    done = torch.futures.collect_all([work.get_future() for work in works])
    return FutureWork(done.then(partial(_outputs_after, outputs)))


def _outputs_after(outputs: list[torch.Tensor], done: torch.futures.Future) -> list[torch.Tensor]:
    for future in done.wait():
        future.wait()  # raises a failed collective's error
    return list(outputs)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _same_kind(tensor: torch.Tensor, like: torch.Tensor) -> bool:
    return tensor.numel() == like.numel() and tensor.dtype == like.dtype and tensor.device == like.device


def _all_reduce(communicator: Communicator, tensor: torch.Tensor, op: str) -> list[torch.Tensor]:
    communicator.all_reduce(tensor, op)
    return [tensor]


def _equal_blocks(tensor: torch.Tensor, world_size: int) -> bool:
    """Return True when ``tensor``'s first dimension splits into ``world_size`` equal blocks."""
    rows = tensor.shape[0] if tensor.dim() else 0
    return rows % world_size == 0 and rows > 0


def _all_to_all(communicator: Communicator, output: torch.Tensor, input: torch.Tensor) -> list[torch.Tensor]:
    communicator.all_to_all(output, input)
    return [output]


def _all_to_all_list(
    communicator: Communicator, outputs: list[torch.Tensor], inputs: list[torch.Tensor]
) -> list[torch.Tensor]:
    flat = torch.cat([t.reshape(-1) for t in inputs])
    received = torch.empty_like(flat)
    communicator.all_to_all(received, flat)
    for block, out in zip(received.chunk(len(outputs)), outputs):
        out.copy_(block.view_as(out))
    return list(outputs)


def _all_gather(communicator: Communicator, output: torch.Tensor, input: torch.Tensor) -> list[torch.Tensor]:
    communicator.all_gather(output, input)
    return [output]


def _all_gather_list(
    communicator: Communicator, outputs: list[torch.Tensor], input: torch.Tensor
) -> list[torch.Tensor]:
    flat = torch.empty(input.numel() * len(outputs), dtype=input.dtype, device=input.device)
    communicator.all_gather(flat, input.contiguous())
    for block, out in zip(flat.chunk(len(outputs)), outputs):
        out.copy_(block.view_as(out))
    return list(outputs)


def _reduce_scatter(
    communicator: Communicator, output: torch.Tensor, input: torch.Tensor, op: str
) -> list[torch.Tensor]:
    communicator.reduce_scatter(output, input, op)
    return [output]


def _reduce_scatter_list(
    communicator: Communicator, output: torch.Tensor, inputs: list[torch.Tensor], op: str
) -> list[torch.Tensor]:
    flat = torch.cat([t.reshape(-1) for t in inputs])
    communicator.reduce_scatter(output, flat, op)
    return [output]
