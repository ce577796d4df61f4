"""scripts/gpu_check.py's exactness checks of the library's algorithms: through Executors and a Communicator.

Each algorithm runs through its own :class:`~taccl_py.runtime.executor.Executor` on every
transport given (on CUDA also on a side stream and through one CUDA graph), and the Communicator
runs every collective at a size in each band of the library, so each band's algorithm answers a
real call; every result is compared bit for bit with the reference group's own collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from gpu_check_cases import (
    DTYPES,
    NO_OP,
    NUMELS,
    Shape,
    band_numel,
    dtype_name,
    executor_cases,
    integer_data,
    ops_for,
    reference_result,
    routed_bands,
    shape_of,
)
from gpu_check_report import Outcome

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.communicator.selection import AlgorithmChoices
from taccl_py.runtime.executor import Executor
from taccl_py.runtime.executor.binding import DEFAULT_SEGMENT_BYTES

__all__ = ["check_algorithms", "check_communicator", "check_graphs", "difference"]

#: The ops an executor runs where the op column says NO_OP (the collective does not reduce).
_EXECUTOR_OP = {NO_OP: "sum"}
#: The Communicator call per collective.
_COMMUNICATOR_ENTRY = {
    Collective.ALLGATHER: "Communicator.all_gather",
    Collective.REDUCESCATTER: "Communicator.reduce_scatter",
    Collective.ALLREDUCE: "Communicator.all_reduce",
    Collective.ALLTOALL: "Communicator.all_to_all",
}


def difference(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Return how ``got`` differs from ``expected`` (first differing element), or None when bit-equal."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"got {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} {expected.dtype}"
    if torch.equal(got, expected):
        return None
    bad = (got != expected).nonzero().flatten()
    first = int(bad[0])
    mine, theirs = got[first].item(), expected[first].item()
    return f"{bad.numel()} of {got.numel()} elements differ, first [{first}]: {mine} vs {theirs}"


def _run_executor(
    executor: Executor, transport: Any, data: torch.Tensor, shape: Shape, op: str, side: Any
) -> torch.Tensor:
    """Return the executor's result on ``data``, run on CUDA stream ``side`` (None: the current stream).

    On a side stream the caller's stream is ordered after it by an event, as a user would do.
    """
    caller = torch.cuda.current_stream() if side is not None else None
    if side is not None:
        side.wait_stream(caller)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        in_place = shape.collective is Collective.ALLREDUCE
        output = data.clone() if in_place else data.new_empty(shape.output_numel)
        executor.run(output, output if in_place else data, transport, op=_EXECUTOR_OP.get(op, op))
    if side is not None:
        caller.wait_stream(side)
        output.record_stream(caller)
        data.record_stream(side)
    return output


def _executor_for(algorithm: Algorithm, transport: Any, dtype: torch.dtype, numel: int) -> Executor:
    """Return an Executor set up as a Communicator would for ``transport`` (gloo: receives posted early, segments)."""
    independent = transport.independent_messages
    return Executor(
        algorithm,
        transport.rank,
        dtype,
        numel,
        transport.device,
        prepost_receives=independent,
        segment_bytes=DEFAULT_SEGMENT_BYTES if independent else None,
    )


def check_algorithms(
    algorithms: Sequence[Algorithm], transports: dict[str, Any], reference: Any, rank: int
) -> list[Outcome]:
    """Return the outcomes of every algorithm's Executor cases on every transport, against ``reference``'s results."""
    outcomes = []
    for algorithm in algorithms:
        collective = algorithm.collective
        for name, transport in transports.items():
            cuda = transport.device.type == "cuda"
            side = torch.cuda.Stream(transport.device) if cuda else None
            executors: dict[tuple, Executor] = {}
            for seed, case in enumerate(executor_cases(collective, cuda)):
                shape = shape_of(collective, algorithm.num_ranks, case.numel, algorithm.chunks_per_loop)
                key = (case.dtype, case.numel)
                if key not in executors:
                    executors[key] = _executor_for(algorithm, transport, case.dtype, case.numel)
                data = integer_data(shape.input_numel, case.dtype, 1000 * seed + rank, transport.device, case.op)
                expected = reference_result(collective, data, case.numel, case.op, reference)
                got = _run_executor(executors[key], transport, data, shape, case.op, side if case.side_stream else None)
                entry = "Executor.run, side stream" if case.side_stream else "Executor.run"
                outcomes.append(
                    Outcome(
                        collective.value,
                        dtype_name(case.dtype),
                        case.op,
                        entry,
                        name,
                        f"{algorithm.name} numel={case.numel}",
                        difference(got, expected),
                    )
                )
    return outcomes


def check_graphs(algorithms: Sequence[Algorithm], transport: Any, reference: Any, rank: int) -> list[Outcome]:
    """Return the outcomes of three calls of each algorithm through one CUDA graph, against ``reference``'s.

    The same tensors take fresh data each call: the first runs eagerly, the second is captured and
    replayed, the third only replays (``Executor.run(cuda_graph=True)``).
    """
    outcomes = []
    for algorithm in algorithms:
        collective = algorithm.collective
        shape = shape_of(collective, algorithm.num_ranks, NUMELS[0], algorithm.chunks_per_loop)
        executor = Executor(algorithm, transport.rank, torch.float32, shape.numel, transport.device)
        data = torch.empty(shape.input_numel, device=transport.device)
        in_place = collective is Collective.ALLREDUCE
        output = data if in_place else torch.empty(shape.output_numel, device=transport.device)
        op = ops_for(collective)[0]
        for call, how in enumerate(("eager", "captured", "replayed")):
            fresh = integer_data(shape.input_numel, torch.float32, 5000 + 10 * call + rank, transport.device)
            data.copy_(fresh)
            expected = reference_result(collective, fresh, shape.numel, op, reference)
            executor.run(output, data, transport, op=_EXECUTOR_OP.get(op, op), cuda_graph=True)
            failure = difference(output, expected)
            case = f"{algorithm.name} numel={shape.numel} call {call + 1} ({how})"
            outcomes.append(
                Outcome(collective.value, "float32", op, "Executor.run, CUDA graph", transport.name, case, failure)
            )
    return outcomes


def _communicator_call(comm: Communicator, collective: Collective, data: torch.Tensor, shape: Shape, op: str) -> Any:
    if collective is Collective.ALLREDUCE:
        output = data.clone()
        comm.all_reduce(output, op)
    elif collective is Collective.ALLGATHER:
        output = data.new_empty(shape.output_numel)
        comm.all_gather(output, data)
    elif collective is Collective.REDUCESCATTER:
        output = data.new_empty(shape.output_numel)
        comm.reduce_scatter(output, data, op)
    else:
        output = torch.empty_like(data)
        comm.all_to_all(output, data)
    return output


def check_communicator(comm: Communicator, choices: AlgorithmChoices, reference: Any, rank: int) -> list[Outcome]:
    """Return the outcomes of ``comm``'s collectives at a size in each routed band, every dtype and op.

    A call the Communicator would give to torch's own collective fails: the check is of our algorithms.
    """
    outcomes, device, seed = [], comm.transport.device, 0
    for collective in sorted(choices.collectives, key=list(Collective).index):
        for band in routed_bands(choices, collective):
            for dtype in DTYPES:
                numel = band_numel(band, dtype)
                if numel is None:
                    continue  # the band starts above the check's largest call: said under the table
                shape = shape_of(collective, comm.world_size, numel)
                runs = comm.algorithm_for(collective, shape.size_bytes(dtype))
                for op in ops_for(collective):
                    seed += 1
                    data = integer_data(shape.input_numel, dtype, 3000 + 100 * seed + rank, device, op)
                    expected = reference_result(collective, data, numel, op, reference)
                    failure = difference(_communicator_call(comm, collective, data, shape, op), expected)
                    if runs is None:
                        failure = f"ran torch's own collective, not {band.name}" + (f"; {failure}" if failure else "")
                    case = f"{band.name} numel={numel}"
                    entry = _COMMUNICATOR_ENTRY[collective]
                    outcomes.append(
                        Outcome(collective.value, dtype_name(dtype), op, entry, comm.transport.name, case, failure)
                    )
    return outcomes
