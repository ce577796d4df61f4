"""scripts/gpu_check.py's check of the ``taccl`` torch.distributed backend: every entry point, and its routing.

The default group is ``taccl``; each case of :func:`gpu_check_cases.backend_cases` runs on it and
on the plain reference group (NCCL on a GPU, gloo on CPU). Tensor, list and coalesced calls are
compared with the reference group's single-tensor collective on the same data (gloo has no AVG,
so avg is its sum divided, as the executor does); the async mix is compared with the same
sequence of calls made synchronously on the reference group. The group's ``routed`` counter must
grow by exactly the calls the library has an algorithm for: a routed call that ran on the inner
backend, or a delegated one that did not, fails its case. On a GPU, an all_reduce captured into a
CUDA graph must run the inner NCCL backend's own (the backend's rule during a capture) and replay right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from gpu_check_cases import (
    COALESCED_ENTRIES,
    LIST_ENTRIES,
    MIX_ENTRY,
    EntryCase,
    backend_cases,
    dtype_name,
    expects_routing,
    first_band_numel,
    integer_data,
    reduce_op,
    reference_result,
    shape_of,
)
from gpu_check_exact import difference
from gpu_check_report import Outcome

from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator.selection import AlgorithmChoices
from taccl_py.runtime.executor.native import all_gather_single, reduce_scatter_single

__all__ = ["RoutingCounts", "check_backend", "run_mix"]

#: Calls per collective over the backend check: (routed, routed expected, delegated, delegated expected).
RoutingCounts = tuple[Counter, Counter, Counter, Counter]


def _tensor_call(case: EntryCase, data: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Run the single-tensor entry point of ``case`` on ``group`` (None: the taccl group); return its output."""
    world, (tensor,) = dist.get_world_size(group), data
    if case.collective is Collective.ALLREDUCE:
        output = tensor.clone()
        dist.all_reduce(output, op=reduce_op(case.op), group=group)
    elif case.collective is Collective.ALLGATHER:
        output = tensor.new_empty(world * case.numel)
        all_gather_single(output, tensor, group)
    elif case.collective is Collective.REDUCESCATTER:
        output = tensor.new_empty(case.numel)
        reduce_scatter_single(output, tensor, reduce_op(case.op), group)
    else:
        output = torch.empty_like(tensor)
        dist.all_to_all_single(output, tensor, group=group)
    return [output]


def _list_call(case: EntryCase, data: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Run the list entry point of ``case`` on ``group``; return its output, flattened rank-major."""
    world, (tensor,) = dist.get_world_size(group), data
    if case.collective is Collective.ALLGATHER:
        outputs = [tensor.new_empty(case.numel) for _ in range(world)]
        dist.all_gather(outputs, tensor, group=group)
        return [torch.cat(outputs)]
    blocks = [block.clone() for block in tensor.split(case.numel)]  # separate tensors, as a user has them
    if case.collective is Collective.REDUCESCATTER:
        output = tensor.new_empty(case.numel)
        dist.reduce_scatter(output, blocks, op=reduce_op(case.op), group=group)
        return [output]
    outputs = [tensor.new_empty(case.numel) for _ in range(world)]
    dist.all_to_all(outputs, blocks, group=group)
    return [torch.cat(outputs)]


def _coalesced_call(case: EntryCase, data: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Run two calls of ``case``'s collective in one async coalescing block on ``group``; return both outputs.

    torch 2.13 collects them (no device given: no inner-backend coalescing) and calls the group's
    ``all_gather_single_coalesced`` / ``reduce_scatter_single_coalesced`` once.
    """
    world = dist.get_world_size(group)
    gathers = case.collective is Collective.ALLGATHER
    outputs = [t.new_empty(world * case.numel if gathers else case.numel) for t in data]
    with dist._coalescing_manager(group, async_ops=True) as manager:
        for output, tensor in zip(outputs, data, strict=True):
            if gathers:
                all_gather_single(output, tensor, group)
            else:
                reduce_scatter_single(output, tensor, reduce_op(case.op), group)
    manager.wait()
    return outputs


def _mix_inputs(case: EntryCase, choices: AlgorithmChoices, seed: int, device: Any) -> list[torch.Tensor]:
    world, dtype = choices.world_size, case.dtype
    numels = {c: first_band_numel(choices, c, dtype) for c in Collective}
    return [
        integer_data(numels[Collective.ALLREDUCE], dtype, seed, device),
        integer_data(numels[Collective.ALLREDUCE], dtype, seed + 1, device),
        integer_data(numels[Collective.ALLGATHER], dtype, seed + 2, device),
        integer_data(numels[Collective.ALLREDUCE], dtype, seed + 3, device, "prod"),
        integer_data(world * numels[Collective.ALLTOALL], dtype, seed + 4, device),
        integer_data(world * numels[Collective.REDUCESCATTER], dtype, seed + 5, device),
    ]


def run_mix(data: list[torch.Tensor], group: Any, async_op: bool) -> list[torch.Tensor]:
    """Run all_reduce, broadcast, all_gather, PRODUCT all_reduce, all_to_all and reduce_scatter on ``data``.

    With ``async_op`` every collective but the broadcast is started async and all are waited out of
    order at the end, so routed calls (queued on the taccl group's worker) and delegated ones (the
    broadcast and the PRODUCT, on the inner backend) are in flight together. Returns the outputs.
    """
    world = dist.get_world_size(group)
    summed, broadcast, gathered, multiplied, exchanged, scattered = (t.clone() for t in data)
    gather_out = gathered.new_empty(world * gathered.numel())
    exchange_out = torch.empty_like(exchanged)
    scatter_out = scattered.new_empty(scattered.numel() // world)
    works = [dist.all_reduce(summed, group=group, async_op=async_op)]
    dist.broadcast(broadcast, src=0, group=group)
    works.append(all_gather_single(gather_out, gathered, group, async_op=async_op))
    works.append(dist.all_reduce(multiplied, op=dist.ReduceOp.PRODUCT, group=group, async_op=async_op))
    works.append(dist.all_to_all_single(exchange_out, exchanged, group=group, async_op=async_op))
    works.append(reduce_scatter_single(scatter_out, scattered, dist.ReduceOp.SUM, group, async_op=async_op))
    for work in reversed(works):
        if work is not None:
            work.wait()
    return [summed, broadcast, gather_out, multiplied, exchange_out, scatter_out]


def _inputs(case: EntryCase, choices: AlgorithmChoices, seed: int, device: Any) -> list[torch.Tensor]:
    """Return ``case``'s input tensors (the same on every call with ``seed``)."""
    if case.collective is None:
        return _mix_inputs(case, choices, seed, device)
    shape = shape_of(case.collective, choices.world_size, case.numel)
    parts = 2 if case.entry in COALESCED_ENTRIES.values() else 1
    return [integer_data(shape.input_numel, case.dtype, seed + part, device, case.op) for part in range(parts)]


def _reference(case: EntryCase, data: list[torch.Tensor], reference: Any) -> list[torch.Tensor]:
    """Return what ``case`` should give: the reference group's collective, or for the mix its sequence, sync."""
    if case.collective is None:
        return run_mix(data, reference, async_op=False)
    results = [reference_result(case.collective, t, case.numel, case.op, reference) for t in data]
    return results if case.entry in COALESCED_ENTRIES.values() else results[:1]


def _runner(case: EntryCase) -> Callable[[EntryCase, list[torch.Tensor], Any], list[torch.Tensor]]:
    if case.entry == MIX_ENTRY:
        return lambda _case, data, group: run_mix(data, group, async_op=True)
    if case.entry in COALESCED_ENTRIES.values():
        return _coalesced_call
    if case.entry in LIST_ENTRIES.values():
        return _list_call
    return _tensor_call


def _label(case: EntryCase) -> tuple[str, str]:
    """Return the report's collective column and case text for ``case``."""
    if case.collective is None:
        return "mixed", "each collective at its first band"
    return case.collective.value, f"numel={case.numel}"


def _failure(
    got: list[torch.Tensor], expected: list[torch.Tensor], routed: Counter, delegated: Counter, case: EntryCase
) -> str | None:
    """Return what went wrong in ``case``: outputs that differ, or routing other than expected; None: neither.

    A routed call that ran the group's own collective inside (a fallback) shows as one more delegated call.
    """
    problems = []
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        problem = difference(mine, theirs)
        if problem:
            problems.append(f"output {index}: {problem}" if len(got) > 1 else problem)
    for what, counts, want in (("routed", routed, case.routed), ("delegated", delegated, case.delegated)):
        seen = tuple(sorted((name, count) for name, count in counts.items() if count))
        if seen != want:
            problems.append(f"{what} {dict(seen)}, expected {dict(want)}")
    return "; ".join(problems) or None


def check_backend(
    choices: AlgorithmChoices, rank: int, device: Any, reference: Any
) -> tuple[list[Outcome], RoutingCounts]:
    """Return the outcomes of every backend case on the default ``taccl`` group, and its routing counters.

    ``choices`` are the library's algorithms for the group's world size (what the group routes).
    """
    group = dist.group.WORLD
    transport = f"taccl ({dist.get_backend(reference)} inner)"
    start = (Counter(group.routed), Counter(group.delegated))
    expected: tuple[Counter, Counter] = (Counter(), Counter())
    outcomes = []
    for index, case in enumerate(backend_cases(choices)):
        data = _inputs(case, choices, 9000 + 100 * index + rank, device)
        want = _reference(case, data, reference)
        before = (Counter(group.routed), Counter(group.delegated))
        got = _runner(case)(case, data, None)
        routed, delegated = Counter(group.routed) - before[0], Counter(group.delegated) - before[1]
        failure = _failure(got, want, routed, delegated, case)
        expected[0].update(dict(case.routed))
        expected[1].update(dict(case.delegated))
        collective, label = _label(case)
        outcomes.append(Outcome(collective, dtype_name(case.dtype), case.op, case.entry, transport, label, failure))
    if torch.device(device).type == "cuda":
        outcome, (routed_want, delegated_want) = _captured_all_reduce(choices, rank, device, reference, transport)
        outcomes.append(outcome)
        expected[0].update(routed_want)
        expected[1].update(delegated_want)
    routed, delegated = Counter(group.routed) - start[0], Counter(group.delegated) - start[1]
    return outcomes, (routed, expected[0], delegated, expected[1])


def _captured_all_reduce(
    choices: AlgorithmChoices, rank: int, device: Any, reference: Any, transport: str
) -> tuple[Outcome, tuple[Counter, Counter]]:
    """Capture a taccl-group all_reduce into a CUDA graph, replay it on new data; compare with the reference.

    The group runs NCCL's own during a capture (its rounds cannot be replayed): the captured call
    is delegated whatever the library holds, and the replay must give the reference's bits. Returns
    the outcome and the (routed, delegated) calls expected of the warm-up and the capture.
    """
    group = dist.group.WORLD
    numel = first_band_numel(choices, Collective.ALLREDUCE, torch.float32)
    warm_up_routed = expects_routing(choices, Collective.ALLREDUCE, numel * 4, "sum")
    want = (
        Counter({Collective.ALLREDUCE.value: 1} if warm_up_routed else {}),
        Counter({Collective.ALLREDUCE.value: 1 if warm_up_routed else 2}),
    )
    buffer = integer_data(numel, torch.float32, 7700 + rank, device)
    before = (Counter(group.routed), Counter(group.delegated))
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(buffer)  # warm-up outside the capture, as torch's graph notes ask for NCCL
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        dist.all_reduce(buffer)
    data = integer_data(numel, torch.float32, 7800 + rank, device)
    buffer.copy_(data)
    graph.replay()
    torch.cuda.synchronize()
    routed, delegated = Counter(group.routed) - before[0], Counter(group.delegated) - before[1]
    problem = difference(buffer, reference_result(Collective.ALLREDUCE, data, numel, "sum", reference))
    if (+routed, +delegated) != want:
        seen = f"routed {dict(+routed)}, delegated {dict(+delegated)}; expected {dict(want[0])}, {dict(want[1])}"
        problem = "; ".join(filter(None, [problem, seen]))
    entry = "captured in a CUDA graph"
    return Outcome("allreduce", "float32", "sum", entry, transport, f"numel={numel}", problem), want
