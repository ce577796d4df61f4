"""Check the cost model against the runtime: the simulator's prediction beside each measured bench row.

Our side is predicted by simulating the algorithm that ran, as our executor runs it (whole
chunks, serialized sends). torch's side (gloo's own collectives) by the schedule gloo runs
(:func:`native_model_algorithm`): one-channel rings in rank order, every pair at once for
all_to_all. Not modelled: reductions and copies
(0 µs in the simulator) and the executor's Python work per round, so a row whose collective
reduces is expected to read slower than predicted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm, Buffer
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import LocalCopy, Transfer, lower_plan
from taccl_py.runtime.communicator.timing import BenchRow
from taccl_py.simulate import simulate_sizes
from taccl_py.simulate.model import WHOLE_CHUNKS
from taccl_py.topology.model import Topology

__all__ = ["ModelError", "model_error", "native_model_algorithm", "predict_rows", "ring_algorithm"]

_RING_COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
_I, _O = Buffer.INPUT, Buffer.OUTPUT


@dataclass(frozen=True)
class ModelError:
    """The relative errors |predicted − measured| / measured over ``count`` predictions: median and worst."""

    median: float
    worst: float
    count: int

    def describe(self) -> str:
        """Return the summary line ``taccl bench --topology`` ends with."""
        return (
            f"model error: median {self.median:.0%}, worst {self.worst:.0%} "
            f"(|predicted - measured| / measured over {self.count} times, ours and torch's)"
        )


def ring_algorithm(collective: Collective, num_ranks: int, chunks_per_rank: int = 1) -> Algorithm:
    """Return a one-channel ring over ranks 0..N-1 in rank order (allreduce in place: RS then AG).

    Each rank's block is cut into ``chunks_per_rank`` chunks that travel as separate messages.

    >>> from taccl_py.verify import verify_algorithm
    >>> verify_algorithm(ring_algorithm(Collective.ALLREDUCE, 4, 2)).ok
    True
    """
    if collective not in _RING_COLLECTIVES:
        raise ArgumentError(None, "collective", f"{collective.value}", "allgather, reducescatter or allreduce")
    n, k = num_ranks, chunks_per_rank
    items: list[Transfer | LocalCopy] = []
    buffer = _O if collective is Collective.ALLGATHER else _I
    if collective is Collective.ALLGATHER:
        items += [LocalCopy(r, (_I, j), (_O, r * k + j)) for r in range(n) for j in range(k)]
    if collective in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        for step in range(n - 1):
            for r in range(n):
                block = (r - step - 1) % n
                items += [
                    Transfer(r, (r + 1) % n, (_I, block * k + j), (_I, block * k + j), reduce=True) for j in range(k)
                ]
    if collective in (Collective.ALLGATHER, Collective.ALLREDUCE):
        # rank r holds block r whole (its own, or the reduce-scatter's result) and passes it on
        for step in range(n - 1):
            for r in range(n):
                block = (r - step) % n
                items += [Transfer(r, (r + 1) % n, (buffer, block * k + j), (buffer, block * k + j)) for j in range(k)]
    if collective is Collective.REDUCESCATTER:
        items += [LocalCopy(r, (_I, r * k + j), (_O, j)) for r in range(n) for j in range(k)]
    inplace = collective is Collective.ALLREDUCE
    return lower_plan(f"ring-{collective.value}-{n}x{k}", collective, n, n * k, items, inplace=inplace)


def native_model_algorithm(collective: Collective, topology: Topology) -> Algorithm:
    """Return the schedule standing for torch's own ``collective`` over gloo on ``topology``, at the same size.

    gloo runs all_gather and all_reduce as rings in rank order and all_to_all as every pair at
    once; its reduce_scatter_tensor is an all_reduce of the whole input (a clone) followed by a
    copy of the rank's block (torch ``ProcessGroupGloo::reduce_scatter_tensor_coalesced``), so
    the ring all_reduce stands for it at the reduce-scatter's input size.
    """
    if collective is Collective.ALLTOALL:
        from taccl_py.baselines.alltoall import direct_alltoall_algorithm  # pulls in the synthesizer: only here

        return direct_alltoall_algorithm(topology)
    if collective is Collective.REDUCESCATTER:
        return ring_algorithm(Collective.ALLREDUCE, topology.num_ranks)
    return ring_algorithm(collective, topology.num_ranks)


def predict_rows(
    rows: Sequence[BenchRow], algorithms: Sequence[Algorithm | None], topology: Topology
) -> list[BenchRow]:
    """Return ``rows`` with the simulated times (µs) of ours and torch's on ``topology``.

    ``algorithms[i]`` is what ran as ours in ``rows[i]`` (None: torch's own ran on both sides).
    Raises ``ArgumentError`` when an algorithm's rank count differs from the topology's.
    """
    natives = {c: native_model_algorithm(c, topology) for c in {Collective(row.collective) for row in rows}}
    wanted: dict[int, tuple[Algorithm, set[int]]] = {}
    for row, algorithm in zip(rows, algorithms):
        for one in (algorithm or natives[Collective(row.collective)], natives[Collective(row.collective)]):
            wanted.setdefault(id(one), (one, set()))[1].add(row.size_bytes)
    times: dict[tuple[int, int], float] = {}
    for key, (algorithm, sizes) in wanted.items():
        ordered = sorted(sizes)
        for size, result in zip(ordered, simulate_sizes(algorithm, topology, ordered, model=WHOLE_CHUNKS)):
            times[(key, size)] = result.time_us
    predicted = []
    for row, algorithm in zip(rows, algorithms):
        native = natives[Collective(row.collective)]
        ours = times[(id(algorithm or native), row.size_bytes)]
        predicted.append(replace(row, ours_predicted_us=ours, torch_predicted_us=times[(id(native), row.size_bytes)]))
    return predicted


def model_error(rows: Sequence[BenchRow]) -> ModelError | None:
    """Return the model error over every predicted time in ``rows`` (None when nothing was predicted)."""
    errors = []
    for row in rows:
        for measured, predicted in (
            (row.ours_time_us, row.ours_predicted_us),
            (row.torch_time_us, row.torch_predicted_us),
        ):
            if predicted is not None:
                errors.append(abs(predicted - measured) / measured)
    if not errors:
        return None
    return ModelError(float(statistics.median(errors)), float(max(errors)), len(errors))
