"""Run one rank's part of an Algorithm on tensors: compile once, replay over a Transport.

An :class:`Executor` is built for one (algorithm, rank, dtype, element count, device). It compiles
the rank's :class:`~taccl_py.runtime.executor.rank_plan.RankPlan` (rounds of messages and chunk computations),
allocates the scratch, temporary and snapshot buffers, binds the plan to element ranges once per
aliasing form of a call's tensors (see :mod:`taccl_py.runtime.executor.call_binding`), and on each call
slices the tensors into the ranges' views (cached per pair of user tensors) and replays the plan
on them: per round, snapshot copies, all sends and receives posted together, then the receives
waited in order with each reduction (torch, on whole chunks or segments) run as soon as the data
it reads is in, after the lazily placed send waits.
Python does work per message and per chunk range, never per element.

On transports that match every message on its own (gloo), the executor also posts receives a
round ahead where nothing touches their target, cuts messages into segments, and forwards a
segment of the next round as soon as it is final: the ring then runs as a pipeline.

Element layout: the collective's unit ``numel`` is the length of a rank's shard (allgather:
the input; reducescatter: the output; allreduce: the tensor; alltoall: one peer's block). A user
tensor is one or ``num_ranks`` blocks of ``numel`` elements, each cut into the algorithm's chunks
of ``ceil(numel / chunks_per_block)`` elements. When ``numel`` does not divide, the executor works
on padded buffers and copies in and out; otherwise it works on views of the user's tensors.
An in-place schedule called in MSCCL's in-place form (one buffer: see
:func:`~taccl_py.runtime.executor.inplace_calls.is_inplace_call`) runs on that buffer with no copy; other
calls of it copy the input in, as does an out-of-place schedule whose input and output overlap.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import torch

from taccl_py.errors import ArgumentError, TacclError, TransportError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.dataflow import Dataflow
from taccl_py.runtime.executor.binding import BoundRound
from taccl_py.runtime.executor.binding_cache import BindingCache, unowned_alias
from taccl_py.runtime.executor.call_binding import (
    BoundCall,
    CallForm,
    CallLayout,
    IndexBinding,
    bind_index_space,
    call_form,
)
from taccl_py.runtime.executor.native import divide_for_avg
from taccl_py.runtime.executor.rank_plan import RankPlan, Storage, compile_rank_plan
from taccl_py.runtime.transports.interface import DEFAULT_TIMEOUT_S, Transport

__all__ = ["Executor", "SUPPORTED_DTYPES", "REDUCE_OPS", "block_layout"]

#: dtypes the executor runs (those torch reduces on CPU and GPU alike).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)
#: Reduction operators; avg is sum followed by a division by the rank count.
REDUCE_OPS = ("sum", "avg", "max", "min")
_COMBINE: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum}
)
_SOURCE = "executor"

logger = logging.getLogger(__name__)


def block_layout(collective: Collective, num_ranks: int, chunks_per_loop: int) -> tuple[int, int, int]:
    """Return (input blocks, output blocks, chunks per block) of a collective's user tensors.

    >>> block_layout(Collective.ALLGATHER, 4, 8)
    (1, 4, 2)
    """
    per_rank = max(chunks_per_loop // num_ranks, 1)
    if collective is Collective.ALLGATHER:
        return 1, num_ranks, per_rank
    if collective is Collective.REDUCESCATTER:
        return num_ranks, 1, per_rank
    if collective is Collective.ALLREDUCE:
        return 1, 1, chunks_per_loop
    return num_ranks, num_ranks, per_rank


class Executor:
    """Replay ``algorithm``'s part for ``rank`` on tensors of ``dtype`` with shard length ``numel``.

    Parameters
    ----------
    algorithm : Algorithm
        A structurally sound algorithm (see :func:`taccl_py.ir.dataflow.build_dataflow`).
    rank : int
        This process's rank in the algorithm (the transport's rank).
    dtype : torch.dtype
        One of :data:`SUPPORTED_DTYPES`.
    numel : int
        Elements of one rank's shard (see the module notes); any positive count.
    device : torch.device or str, default "cpu"
        Where the scratch buffers live (the transport's device).
    dataflow : Dataflow, optional
        ``build_dataflow(algorithm)`` when already computed.
    prepost_receives : bool
        Post receives a round early where safe, and a round's sends as soon as their data is
        final; only for transports whose ``independent_messages`` is True (see
        :func:`~taccl_py.runtime.executor.rank_plan.compile_rank_plan` and :mod:`taccl_py.runtime.executor.binding`).
    segment_bytes : int, optional
        Cut longer messages into segments of at most this many bytes and reduce each segment as
        it arrives (see :mod:`taccl_py.runtime.executor.binding`); every rank must use the same value.
        None sends every message whole.

    Raises
    ------
    ArgumentError
        Unsupported dtype, non-positive ``numel``, a rank outside the algorithm.
    VerificationError
        The algorithm is structurally broken.

    Notes
    -----
    Scratch, per-step temporaries and send snapshots are allocated once, here; the plan is bound
    in index space once per aliasing form (with its work buffers). The views of the user's tensors
    are sliced on the first run with a given (output, input) pair (tens of microseconds) and
    reused for the last two pairs while the caller keeps those tensors; they never keep the
    caller's memory alive (see :mod:`taccl_py.runtime.executor.binding_cache`).
    Temporaries are not shared between steps: a plan needs as many temporary chunks as its
    reducing receives carry.

    Examples
    --------
    >>> import threading
    >>> from taccl_py.ir.algorithm import Buffer
    >>> from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
    >>> from taccl_py.runtime.transports.local import LocalHub
    >>> I, O = Buffer.INPUT, Buffer.OUTPUT
    >>> algo = lower_plan("ag2", Collective.ALLGATHER, 2, 2, [
    ...     LocalCopy(0, (I, 0), (O, 0)), LocalCopy(1, (I, 0), (O, 1)),
    ...     Transfer(0, 1, (I, 0), (O, 0)), Transfer(1, 0, (I, 0), (O, 1))])
    >>> hub, outs = LocalHub(2), [torch.zeros(6), torch.zeros(6)]
    >>> def run(rank):
    ...     Executor(algo, rank, torch.float32, 3).run(outs[rank], torch.full((3,), float(rank)), hub.transport(rank))
    >>> threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    >>> _ = [t.start() for t in threads]; _ = [t.join() for t in threads]
    >>> outs[1].tolist()
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    """

    __slots__ = (
        "algorithm",
        "plan",
        "rank",
        "dtype",
        "numel",
        "device",
        "chunk_elems",
        "blocks",
        "padded",
        "segment_bytes",
        "eager_sends",
        "_scratch",
        "_scratch_stream",
        "_layout",
        "_forms",
        "_bindings",
    )

    def __init__(
        self,
        algorithm: Algorithm,
        rank: int,
        dtype: Any,
        numel: int,
        device: Any = "cpu",
        dataflow: Dataflow | None = None,
        *,
        prepost_receives: bool = False,
        segment_bytes: int | None = None,
    ) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise ArgumentError(
                _SOURCE, "dtype", f"{dtype} is not supported", ", ".join(str(d) for d in SUPPORTED_DTYPES)
            )
        if not isinstance(numel, int) or numel < 1:
            raise ArgumentError(_SOURCE, "numel", f"{numel!r}", "a positive element count")
        if segment_bytes is not None and segment_bytes < 1:
            raise ArgumentError(_SOURCE, "segment_bytes", f"{segment_bytes!r}", "a positive byte count or None")
        self.algorithm, self.rank, self.dtype, self.numel, self.segment_bytes = (
            algorithm,
            rank,
            dtype,
            numel,
            segment_bytes,
        )
        self.eager_sends = prepost_receives  # both need a transport that matches messages one by one
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.plan: RankPlan = compile_rank_plan(algorithm, rank, dataflow, prepost_receives=prepost_receives)
        in_blocks, out_blocks, per_block = block_layout(
            algorithm.collective, algorithm.num_ranks, algorithm.chunks_per_loop
        )
        self.blocks = (in_blocks, out_blocks, per_block)
        self.chunk_elems = math.ceil(numel / per_block)
        self.padded = self.chunk_elems * per_block != numel
        self._scratch = {
            storage: torch.zeros(self.plan.chunks(storage) * self.chunk_elems, dtype=dtype, device=self.device)
            for storage in (Storage.SCRATCH, Storage.TEMP, Storage.SNAP)
        }
        self._scratch_stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        element_size = torch.empty((), dtype=dtype).element_size()
        self._layout = CallLayout(
            rank,
            numel,
            self.chunk_elems,
            in_blocks,
            out_blocks,
            per_block,
            self.padded,
            None if segment_bytes is None else max(1, segment_bytes // element_size),
            prepost_receives,
        )
        self._forms: dict[CallForm, IndexBinding] = {}  # bound once per aliasing form, in index space
        self._bindings = BindingCache(limit=2)  # the views of the last two pairs: a DDP bucket alternates

    # -- shapes -----------------------------------------------------------------------------------

    def expected_numels(self) -> tuple[int, int]:
        """Return the element counts (input, output) of the user tensors ``run`` takes."""
        return self.blocks[0] * self.numel, self.blocks[1] * self.numel

    def check(self, output: Any, input: Any) -> None:
        """Raise ArgumentError unless ``output`` and ``input`` fit this executor."""
        want_in, want_out = self.expected_numels()
        for role, tensor, want in (("input", input, want_in), ("output", output, want_out)):
            if not isinstance(tensor, torch.Tensor):
                raise ArgumentError(_SOURCE, role, f"{type(tensor).__name__} is not a tensor", "a torch.Tensor")
            if tensor.dtype != self.dtype or tensor.device != self.device:
                raise ArgumentError(
                    _SOURCE, role, f"{tensor.dtype} on {tensor.device}", f"{self.dtype} on {self.device}"
                )
            if tensor.numel() != want:
                raise ArgumentError(
                    _SOURCE, role, f"{tensor.numel()} elements", f"{want} elements for {self.algorithm.name}"
                )
            if not tensor.is_contiguous():
                raise ArgumentError(_SOURCE, role, "not contiguous", "a contiguous tensor")

    # -- binding ----------------------------------------------------------------------------------

    def _binding(self, output: Any, input: Any) -> BoundCall:
        key = (output.data_ptr(), input.data_ptr())
        binding = self._bindings.get(key)
        if binding is None:
            form = call_form(self.plan, self._layout, output, input)
            indexed = self._forms.get(form)
            if indexed is None:
                indexed = self._forms[form] = self._bind_form(form)
            binding = indexed.bind(unowned_alias(output), unowned_alias(input))
            self._bindings.put(key, (output, input), binding)
        return binding

    def _bind_form(self, form: CallForm) -> IndexBinding:
        """Return the plan bound for calls of ``form``; its buffers belong to the scratch's stream."""
        if self._scratch_stream is None:
            return bind_index_space(self.plan, self._layout, form, self._scratch, self.dtype, self.device)
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._scratch_stream):
            indexed = bind_index_space(self.plan, self._layout, form, self._scratch, self.dtype, self.device)
        current.wait_stream(self._scratch_stream)  # the work buffers' zeros are written on the scratch's stream
        return indexed

    # -- replay -----------------------------------------------------------------------------------

    def run(
        self,
        output: Any,
        input: Any,
        transport: Transport,
        op: str = "sum",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        cuda_graph: bool = False,
    ) -> None:
        """Run the collective: ``output`` receives the result of ``input`` over all ranks.

        For allreduce pass the same tensor twice to reduce in place; an in-place schedule runs
        on the caller's buffer without copies when the tensors alias as MSCCL's in-place call
        (allreduce, allgather; an aliased reducescatter reduces in a copy). ``op`` applies when the
        collective reduces. With ``cuda_graph`` (CUDA tensors, a transport that
        :func:`~taccl_py.runtime.executor.graphs.graph_support` accepts; every rank alike) the second call
        with the same tensors, op and transport is captured into a CUDA graph and later ones
        replay it. Raises ArgumentError for tensors that do not fit (before anything is sent) and
        TransportError, naming the peer and the step, when a message fails.
        """
        if op not in REDUCE_OPS:
            raise ArgumentError(_SOURCE, "op", f"{op!r}", " | ".join(REDUCE_OPS))
        if cuda_graph and self.device.type != "cuda":
            raise ArgumentError(_SOURCE, "cuda_graph", f"tensors on {self.device}", "CUDA tensors")
        self.check(output, input)
        if transport.rank != self.rank or transport.world_size != self.algorithm.num_ranks:
            raise ArgumentError(
                _SOURCE,
                "transport",
                f"rank {transport.rank} of {transport.world_size}",
                f"rank {self.rank} of {self.algorithm.num_ranks} for {self.algorithm.name}",
            )
        binding = self._binding(output, input)
        self._mark_scratch_in_use()
        call = partial(self._call, binding, output, transport, op, timeout_s)
        if cuda_graph:
            binding.graphs.run((op, transport), call)  # the key holds the transport: its id is never reused
        else:
            call()

    def _call(self, binding: BoundCall, output: Any, transport: Transport, op: str, timeout_s: float) -> None:
        """Copy in, replay the rounds, copy out and average: one whole call (what a CUDA graph captures)."""
        for dst, src in binding.copy_in:
            dst.copy_(src)
        self._replay(binding, transport, _COMBINE[op], timeout_s)
        for dst, src in binding.copy_out:
            dst.copy_(src)
        if op == "avg" and self.algorithm.collective.reduces:
            divide_for_avg(output, self.algorithm.num_ranks)

    def _mark_scratch_in_use(self) -> None:
        """Tell the CUDA caching allocator that the scratch and work buffers are used on the current stream, too.

        They belong to the stream that was current when this executor was built; a run on
        another stream (DDP's, FSDP2's) must keep the memory from being handed out again, once the
        executor is dropped, before that stream's work is done.
        """
        if self._scratch_stream is None:
            return
        stream = torch.cuda.current_stream(self.device)
        if stream != self._scratch_stream:
            for tensor in self._scratch.values():
                tensor.record_stream(stream)
            for indexed in self._forms.values():
                for tensor in indexed.buffers:
                    tensor.record_stream(stream)

    def _replay(self, binding: BoundCall, transport: Transport, combine: Callable[..., Any], timeout_s: float) -> None:
        pending: list[list[Any]] = [[] for _ in range(self.plan.num_sends)]  # per plan send: its segments
        early: list[tuple[Any, tuple[int, int, int]]] = []  # receives posted ahead for the coming round
        sent_ahead = 0  # leading sends of the coming round already posted
        rounds = binding.rounds
        for number, rnd in enumerate(rounds):
            self._wait_sends(pending, rnd.pre_waits, timeout_s)
            for dst, src in rnd.snapshots:
                dst.copy_(src)
            arrived, early = early, []
            if len(rnd.sends) > sent_ahead or rnd.recvs:
                send_pending, recv_pending = self._post(transport, rnd, rnd.sends[sent_ahead:], rnd.recvs)
                for index, handle, where in zip(rnd.send_ids[sent_ahead:], send_pending, rnd.send_steps[sent_ahead:]):
                    pending[index].append((handle, rnd.index, where))
                cut = len(recv_pending) - rnd.num_early
                arrived += list(zip(recv_pending[:cut], rnd.recv_steps[:cut]))
                early = list(zip(recv_pending[cut:], rnd.recv_steps[cut:]))
            following = rounds[number + 1] if number + 1 < len(rounds) else None
            sent_ahead = self._progress(rnd, arrived, pending, combine, timeout_s, transport, following)
        self._wait_sends(pending, binding.final_waits, timeout_s)

    def _post(self, transport: Transport, rnd: BoundRound, sends: list, recvs: list) -> tuple[Any, Any]:
        try:
            return transport.post(sends, recvs)
        except TacclError as error:
            raise self._failure("post", rnd.index, (rnd.send_steps + rnd.recv_steps)[0], error) from error

    def _progress(
        self,
        rnd: BoundRound,
        arrived: list,
        pending: list[list[Any]],
        combine: Callable[..., Any],
        timeout_s: float,
        transport: Transport,
        following: BoundRound | None,
    ) -> int:
        """Wait for the round's receives in order, reducing each piece as soon as its data is in.

        Posts the leading sends of ``following`` whose data became final; returns how many.
        """
        computes, next_compute, ahead = rnd.computes, 0, 0
        eager = rnd.eager or []
        for position in range(len(arrived) + 1):
            if position == len(arrived):  # every receive is in: the sends the round overwrites may complete
                self._wait_sends(pending, rnd.send_waits, timeout_s)
            while next_compute < len(computes) and computes[next_compute][4] < position:
                target, a, b, staging, _after = computes[next_compute]
                if staging is not None:  # sources that overlap the target are read before it is written
                    a = staging[0].copy_(a)
                    b = None if b is None else staging[1].copy_(b)
                if b is None:
                    target.copy_(a)
                else:
                    combine(a, b, out=target)
                next_compute += 1
            ready = ahead
            while ready < len(eager) and eager[ready][0] < next_compute and eager[ready][1] < position:
                ready += 1
            if ready > ahead:
                handles, _ = self._post(transport, following, following.sends[ahead:ready], [])
                for index, handle, where in zip(
                    following.send_ids[ahead:ready], handles, following.send_steps[ahead:ready]
                ):
                    pending[index].append((handle, following.index, where))
                ahead = ready
            if position < len(arrived):
                handle, where = arrived[position]
                self._wait(handle, "receive from", rnd.index, where, timeout_s)
        return ahead

    def _wait_sends(self, pending: list[list[Any]], indices: list[int], timeout_s: float) -> None:
        for index in indices:
            for handle, level, where in pending[index]:
                self._wait(handle, "send to", level, where, timeout_s)
            pending[index] = []

    def _wait(self, handle: Any, what: str, level: int, where: tuple[int, int, int], timeout_s: float) -> None:
        try:
            handle.wait(timeout_s)
        except TacclError as error:
            raise self._failure(what, level, where, error) from error

    def _failure(self, what: str, level: int, where: tuple[int, int, int], error: BaseException) -> TransportError:
        peer, threadblock, step = where
        return TransportError(
            f"{self.algorithm.name}: rank {self.rank}: {what} rank {peer} failed in round {level} "
            f"(threadblock {threadblock}, step {step}): {error}; expected every rank to run the same collective"
        )
