"""A library's run by size: the band its runtime picks at each size, simulated, against the bound that holds there.

``taccl simulate LIBRARY`` prints this beside NCCL's best modelled algorithm. Each band's
algorithm is prepared once (``prepare_simulation``) and replayed at every size it covers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from taccl_py.bounds import LowerBound, bound_label, lower_bounds
from taccl_py.bounds.reduction import in_network_reduction_bounds, reducing_switches
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary
from taccl_py.simulate import (
    DEFAULT_MODEL,
    NCCL_PROTOCOL_COSTS,
    ExecutionModel,
    ProtocolCost,
    SimulationPlan,
    SimulationResult,
    execution_model,
    prepare_simulation,
    simulate_plan,
)
from taccl_py.topology.model import Topology

__all__ = [
    "BandRun",
    "IN_NETWORK_BOUND_LABEL",
    "band_index",
    "library_bound_label",
    "library_bounds",
    "simulate_library",
]

#: The short name, for table headers, of the AllReduce bound that holds for in-network reduction too.
IN_NETWORK_BOUND_LABEL = "in-network bound"


@dataclass(frozen=True)
class BandRun:
    """What a library runs at ``size_bytes``: band ``band`` (None: no band covers it) and its simulated run.

    ``result`` is None where the runtime runs its backend's own collective: a ``"native"`` band,
    or a size no band covers. ``bound`` is the lower bound that holds at this size (``library_bounds``).
    """

    size_bytes: int
    band: int | None
    result: SimulationResult | None
    bound: LowerBound


def band_index(library: AlgorithmLibrary, size_bytes: int) -> int | None:
    """Return the index of the band ``AlgorithmLibrary.select`` takes at ``size_bytes`` (the first covering it).

    None when no band covers the size.
    """
    return next((index for index, band in enumerate(library.bands) if band.covers(size_bytes)), None)


def _in_network(topology: Topology, collective: Collective) -> bool:
    """Return True when an AllReduce on ``topology`` may reduce in a switch (every machine has a reducing one)."""
    return collective is Collective.ALLREDUCE and bool(reducing_switches(topology))


def library_bounds(topology: Topology, collective: Collective, sizes_bytes: Iterable[int]) -> tuple[LowerBound, ...]:
    """Return, per size, the lower bound (µs) that holds for any algorithm of ``collective`` on ``topology``.

    AllReduce on a machine whose GPUs hang off a reducing switch: the in-network reduction bound
    (``in_network_reduction_bounds``; the ReduceScatter+AllGather class bound does not hold for
    switch reduction). Otherwise ``lower_bounds``.
    """
    if _in_network(topology, collective):
        return in_network_reduction_bounds(topology, sizes_bytes)
    return lower_bounds(topology, collective, sizes_bytes)


def library_bound_label(topology: Topology, collective: Collective) -> str:
    """Return the short name of ``library_bounds``' bound for table headers."""
    return IN_NETWORK_BOUND_LABEL if _in_network(topology, collective) else bound_label(collective)


def simulate_library(
    library: AlgorithmLibrary,
    topology: Topology,
    sizes_bytes: Iterable[int],
    *,
    model: ExecutionModel | str = DEFAULT_MODEL,
    protocol_costs: Mapping[str, ProtocolCost] = NCCL_PROTOCOL_COSTS,
) -> tuple[BandRun, ...]:
    """Return, per size, the band ``library`` runs there and its simulated time on ``topology``.

    Parameters
    ----------
    library : AlgorithmLibrary
        The size bands; its rank count must equal the topology's GPU count.
    topology : Topology
        The machine(s) to simulate on (the library's own, or the user's).
    sizes_bytes : iterable of int
        nccl-tests sizes (bytes).
    model, protocol_costs
        As ``simulate``.

    Returns
    -------
    tuple of BandRun
        One per size, in order: the band ``AlgorithmLibrary.select`` picks, its run under
        ``model`` with ``fraction_of_bound`` against ``library_bounds`` (None for a native band).

    Raises
    ------
    ArgumentError
        When the rank counts differ or a size is below 1 byte.

    Notes
    -----
    Each band's algorithm is prepared once and replayed at each of its sizes.
    """
    if library.num_ranks != topology.num_ranks:
        raise ArgumentError(
            None,
            "num_ranks",
            f"a library for {library.num_ranks} ranks but topology {topology.name} has {topology.num_ranks} GPUs",
            "a library for the topology's rank count (check --topology and --nodes)",
        )
    sizes = tuple(sizes_bytes)
    bounds = library_bounds(topology, library.collective, sizes)
    chosen_model = execution_model(model)
    plans: dict[int, SimulationPlan] = {}
    runs = []
    for size, bound in zip(sizes, bounds):
        index = band_index(library, size)
        algorithm = None if index is None else library.bands[index].algorithm
        result = None
        if index is not None and algorithm is not None:
            if index not in plans:
                plans[index] = prepare_simulation(
                    algorithm, topology, protocol_costs=protocol_costs, model=chosen_model
                )
            result = simulate_plan(plans[index], size, bound_time_us=bound.time_us)
        runs.append(BandRun(size, index, result, bound))
    return tuple(runs)
