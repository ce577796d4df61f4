"""What a user of a degraded or mixed cluster already has: the shipped algorithms of its healthy machines.

A cluster whose machines are built-in kinds (the same GPUs and links, whatever their NICs) can run
the shipped library of such a kind at the same node count unchanged: an algorithm names ranks,
not links, so it stays correct, and the simulator routes its sends around a NIC that is down.
Synthesis for the cluster compares against it, so re-synthesizing never loses to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths, shipped_node_counts
from taccl_py.simulate import DEFAULT_MODEL, ExecutionModel, SimulationResult, simulate
from taccl_py.topology.builtins import builtin_topology_names, load_topology
from taccl_py.topology.fingerprint import cluster_fingerprint, machine_kind
from taccl_py.topology.model import Topology

__all__ = ["healthy_machines", "shipped_alternatives"]

logger = logging.getLogger(__name__)


def healthy_machines(topology: Topology) -> tuple[str, ...]:
    """Return the built-in machines with shipped libraries that ``topology``'s machines are copies of, NICs aside.

    None when ``topology`` is itself a healthy built-in cluster: its shipped library is what
    synthesis rebuilds, not an alternative to it.
    """
    kinds = {machine_kind(topology, node) for node in range(topology.nodes)}
    names = []
    for name in builtin_topology_names():
        if topology.nodes not in shipped_node_counts(name):
            continue
        machine = load_topology(name)
        if machine.num_ranks * topology.nodes != topology.num_ranks or machine_kind(machine, 0) not in kinds:
            continue
        if cluster_fingerprint(load_topology(name, topology.nodes)) == cluster_fingerprint(topology):
            return ()
        names.append(name)
    return tuple(names)


def shipped_alternatives(
    topology: Topology, collective: Collective, sizes: Sequence[int], model: ExecutionModel = DEFAULT_MODEL
) -> tuple[tuple[Algorithm, SimulationResult] | None, ...]:
    """Return, per size, the fastest of the healthy machines' shipped band algorithms, simulated on ``topology``
    under ``model``.

    Each library contributes the algorithm of the band covering the size (the one its runtime
    would run there); None where no library covers the size with an algorithm of its own.
    """
    libraries = []
    for name in healthy_machines(topology):
        for path in shipped_library_paths(name, topology.nodes):
            if path.name == f"{collective.value}.library.json":
                libraries.append(read_library(path))
    best: list[tuple[Algorithm, SimulationResult] | None] = []
    for size in sizes:
        found = None
        for library in libraries:
            algorithm = library.select(size)
            if algorithm is None:
                continue
            result = simulate(algorithm, topology, size, model=model)
            if found is None or result.time_us < found[1].time_us:
                # Named by where it comes from: band files are named only by their position.
                found = (
                    replace(algorithm, name=f"shipped-{library.topology}x{library.nodes}-{algorithm.name}"),
                    result,
                )
        best.append(found)
    if libraries:
        names = ", ".join(library.topology for library in libraries)
        logger.info("compared with the shipped %s of %s", collective.value, names)
    return tuple(best)
