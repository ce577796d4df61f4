"""Fresh tensors every call: the plan is bound once per aliasing form, each call only slices its tensors.

A caller that allocates new tensors for every call (FSDP2's all-gather outputs, the backend's list
entry points) must not pay a bind per call: the index-space binding is made once per executor and
aliasing form, and the call's views neither outlive nor keep alive the caller's tensors.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the executor runs on torch tensors")

import taccl_py.runtime.executor as executor_module  # noqa: E402
from taccl_py.ir.algorithm import Algorithm  # noqa: E402
from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.ir.inplace import inplace_variant  # noqa: E402
from taccl_py.runtime.executor import Executor  # noqa: E402
from taccl_py.runtime.executor.binding import _pieces  # noqa: E402
from taccl_py.runtime.transports.local import LocalHub  # noqa: E402

from helpers import ring_algorithm  # noqa: E402

CALLS = 30
RANKS = 4


class CountingBind:
    """Wraps the executor's index-space bind and records the aliasing form of every bind."""

    def __init__(self) -> None:
        self.real = executor_module.bind_index_space
        self.forms: list[Any] = []

    def __call__(self, plan: Any, layout: Any, form: Any, *args: Any) -> Any:
        self.forms.append(form)
        return self.real(plan, layout, form, *args)


def fresh_pair(algorithm: Algorithm, rank: int, numel: int, generator: Any, inplace: bool) -> tuple[Any, Any, Any]:
    """Return (output, input, the rank's data) on new memory: separate tensors, or MSCCL's in-place aliasing."""
    n = algorithm.num_ranks
    collective = algorithm.collective
    in_blocks = n if collective in (Collective.REDUCESCATTER, Collective.ALLTOALL) else 1
    data = torch.randn(in_blocks * numel, generator=generator)
    if not inplace:
        out_blocks = n if collective in (Collective.ALLGATHER, Collective.ALLTOALL) else 1
        return torch.full((out_blocks * numel,), float("nan")), data.clone(), data
    if collective is Collective.ALLGATHER:
        buffer = torch.full((n * numel,), float("nan"))
        buffer.chunk(n)[rank].copy_(data)
        return buffer, buffer.chunk(n)[rank], data
    buffer = data.clone()
    return buffer, buffer, data


def wanted(collective: Collective, data: list[Any], rank: int) -> Any:
    """Return torch's result for ``rank`` of ``collective`` over the ranks' ``data``."""
    if collective is Collective.ALLGATHER:
        return torch.cat(data)
    total = torch.stack(data).sum(0)
    return total.chunk(len(data))[rank] if collective is Collective.REDUCESCATTER else total


def run_fresh_calls(algorithm: Algorithm, numel: int, inplace: bool, **options: Any) -> tuple[list[Executor], list]:
    """Run CALLS calls on one thread per rank, each on new tensors; return the executors and storage refs."""
    n = algorithm.num_ranks
    executors = [Executor(algorithm, r, torch.float32, numel, **options) for r in range(n)]
    hub = LocalHub(n)
    generators = [torch.Generator().manual_seed(1000 * r + numel) for r in range(n)]
    refs = []
    for call in range(CALLS):
        pairs = [fresh_pair(algorithm, r, numel, generators[r], inplace) for r in range(n)]
        threads = [
            threading.Thread(target=executors[r].run, args=(pairs[r][0], pairs[r][1], hub.transport(r), "sum", 10.0))
            for r in range(n)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        data = [pair[2] for pair in pairs]
        for rank, (output, _input, _data) in enumerate(pairs):
            want = wanted(algorithm.collective, data, rank)
            assert torch.allclose(output, want, atol=1e-5), f"call {call} rank {rank}: {output[:4]} != {want[:4]}"
        refs += [weakref.ref(t.untyped_storage()) for pair in pairs for t in pair[:2]]
    return executors, refs


CASES = [
    pytest.param(ring_algorithm(Collective.ALLGATHER, RANKS), 1000, False, {}, id="allgather"),
    pytest.param(inplace_variant(ring_algorithm(Collective.ALLGATHER, RANKS)), 1000, True, {}, id="allgather-inplace"),
    pytest.param(ring_algorithm(Collective.REDUCESCATTER, RANKS), 999, False, {}, id="reducescatter"),
    pytest.param(ring_algorithm(Collective.ALLREDUCE, RANKS), 1001, False, {}, id="allreduce-padded"),
    pytest.param(
        ring_algorithm(Collective.ALLREDUCE, RANKS, inplace=True),
        4000,
        True,
        {"prepost_receives": True, "segment_bytes": 1000},
        id="allreduce-inplace-segments",
    ),
]


@pytest.mark.parametrize(("algorithm", "numel", "inplace", "options"), CASES)
def test_fresh_tensors_every_call_bind_once_give_torchs_result_and_stay_freed(
    monkeypatch: pytest.MonkeyPatch, algorithm: Algorithm, numel: int, inplace: bool, options: dict
) -> None:
    counting = CountingBind()
    monkeypatch.setattr(executor_module, "bind_index_space", counting)
    executors, refs = run_fresh_calls(algorithm, numel, inplace, **options)
    assert len(counting.forms) == RANKS, f"{len(counting.forms)} index-space binds for {CALLS} calls on {RANKS} ranks"
    assert all(form.one_buffer == (inplace and algorithm.inplace) for form in counting.forms)
    assert all(len(e._forms) == 1 for e in executors)
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0, "a call's tensors outlived the caller's references"
    assert all(len(e._bindings) == 0 for e in executors)


def test_an_overlapping_call_binds_its_own_form_once() -> None:
    executor = Executor(ring_algorithm(Collective.ALLGATHER, 2), 0, torch.float32, 6)
    separate = executor._binding(torch.zeros(12), torch.zeros(6))
    buffer = torch.zeros(12)
    overlapping = executor._binding(buffer, buffer[3:9])  # the input is copied in before the output is written
    assert sorted(form.input_overlaps for form in executor._forms) == [False, True]
    assert not separate.copy_in and len(overlapping.copy_in) == 1
    executor._binding(torch.zeros(12), torch.zeros(6))
    assert len(executor._forms) == 2


@pytest.mark.parametrize("length", [1, 7, 250, 1000, 1001, 4097])
@pytest.mark.parametrize("segment", [None, 1, 3, 250, 1000])
def test_index_space_segments_are_torchs_tensor_split(length: int, segment: int | None) -> None:
    pieces = _pieces((5, 40, 40 + length), segment)
    tensor = torch.arange(40, 40 + length)
    parts = [tensor] if segment is None or length <= segment else tensor.tensor_split(-(-length // segment))
    assert [(start, stop) for _source, start, stop in pieces] == [(int(p[0]), int(p[-1]) + 1) for p in parts], (
        "both ends must cut a message the same way"
    )
    assert all(source == 5 for source, _a, _b in pieces)


# -- multi-process: the Communicator on gloo, against torch's own collectives ---------------------------


def _fresh_tensor_calls(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from taccl_py.runtime.communicator import Communicator

    from ddp_helpers import ring_library

    counting = CountingBind()
    executor_module.bind_index_space = counting  # this process is the rank's own: nothing to restore
    comm = Communicator(dist.new_group(backend="gloo"), ring_library(world_size), calibration=False)
    generator = torch.Generator().manual_seed(rank)
    mismatches, binds, refs = [], {}, []
    for name in ("all_gather", "all_gather_inplace", "reduce_scatter", "all_reduce"):
        before = len(counting.forms)
        for call in range(CALLS):
            data = torch.randn(1000 * world_size if name == "reduce_scatter" else 1000, generator=generator)
            if name == "all_gather":
                output, want = torch.empty(1000 * world_size), torch.empty(1000 * world_size)
                comm.all_gather(output, data)
                dist.all_gather_single(want, data)
            elif name == "all_gather_inplace":  # FSDP2's form: the input is block `rank` of the output
                output, want = torch.empty(1000 * world_size), torch.empty(1000 * world_size)
                output.chunk(world_size)[rank].copy_(data)
                comm.all_gather(output, output.chunk(world_size)[rank])
                dist.all_gather_single(want, data)
            elif name == "reduce_scatter":
                output, want = torch.empty(1000), torch.empty(1000)
                comm.reduce_scatter(output, data)
                dist.reduce_scatter_single(want, data.clone())
            else:
                output, want = data.clone(), data.clone()
                comm.all_reduce(output)
                dist.all_reduce(want)
            if not torch.allclose(output, want, atol=1e-4):
                mismatches.append(f"{name} call {call}")
            refs.append(weakref.ref(output.untyped_storage()))
        binds[name] = len(counting.forms) - before
    del output, data, want
    gc.collect()
    return {
        "mismatches": mismatches,
        "binds": binds,
        "alive": sum(ref() is not None for ref in refs),
        "executors": len(comm._executors),
    }


@pytest.mark.multiprocess
def test_fresh_tensors_on_gloo_match_torch_and_bind_once_per_executor() -> None:
    from taccl_py.runtime.launch import run_local

    results = run_local(_fresh_tensor_calls, RANKS, timeout_s=240)
    for rank, result in enumerate(results):
        assert result["mismatches"] == [], f"rank {rank}: differs from torch in {result['mismatches'][:3]}"
        # one executor each: allgather, its in-place variant, reducescatter, allreduce's in-place variant
        assert result["executors"] == 4, f"rank {rank}: {result['executors']} executors; were the calls routed?"
        assert result["binds"] == dict.fromkeys(result["binds"], 1), f"rank {rank}: binds {result['binds']}"
        assert result["alive"] == 0, f"rank {rank}: {result['alive']} outputs outlived the caller's references"
