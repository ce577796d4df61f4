"""NCCL's NVLS AllReduce (NVLink SHARP), modelled: what NCCL runs on NVSwitch machines that reduce in the switch.

On DGX-H100 (NVSwitch 3) NCCL 2.17+ runs AllReduce as NVLS: every GPU owns 1/G of the buffer,
asks the switch for the sum of that slice over the machine's G GPUs (``multimem.ld_reduce``: the
switch reads the slice from every GPU and reduces it), then stores the sum to every GPU at once
(``multimem.st``: the switch multicasts it). Per GPU and direction that moves M (its share of every
slice, or every slice's result) plus M/G (its own slice): M (1 + 1/G) bytes, about once the
buffer where a ring moves it twice. Across machines (NCCL 2.18+, NVLS-Tree) each GPU sends its
machine's sum of its slice, M/G bytes, up a tree of machines over its NIC and takes the total
back down, between the two switch phases; NVLS proper across machines needs IB SHARP, which the
built-in machines do not model. The model, pipelined as NCCL pipelines its chunks::

    time = α_switch + 2 log2(machines) α_net + max(M (1 + 1/G) / B_switch, share · (M / G) / B_net)

with B_switch the switch's reduction rate per GPU port (``Vertex.reduce_bandwidth_GBps``, at most
the GPU's link to it), α_switch its ``reduce_alpha_us``, B_net and α_net the bandwidth and α of a
GPU's route to its peer on the next machine (the topology's own links: PCIe, NIC, network), and
share 2 above two machines (a tree's inner machines take in two children) else 1.

Sources: the switch figures are the topology's (``topologies/dgx-h100.json``: 308.6 GB/s from
NCCL's ~480 GB/s busbw on 8 H100s, S. Jeaugey in github.com/NVIDIA/nccl-tests/issues/212, and the
measured 258-273 GB/s algbw at 5-8 GPUs of github.com/NVIDIA/nccl/issues/1455, which this model
reproduces within 1%; 4.06 µs from NCCL's NVLS latency). NVIDIA/nccl ``src/graph/tuning.cc``
@b6475625 (v2.20.3): NVLS-Tree latency ``intraLat + 2 * log2i(nNodes) * interLat``, its network
bandwidth ``bwInter/2`` above two nodes, NVLS across nodes only with CollNet (IB SHARP) support,
Simple protocol only. Release notes: NVLS in NCCL 2.17, NVLS-Tree in 2.18.1
(docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-18-1.html).

Not an algorithm of our IR (it has no switch reduction, so no MSCCL export): a reported baseline,
shown beside AllReduce results on machines that have it, with the bound that holds for it
(``bounds_reduction``). NCCL itself picks rings or trees at small sizes, where NVLS's α loses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from taccl_py.bounds import LowerBound, checked_sizes
from taccl_py.bounds.reduction import in_network_reduction_bounds, reducing_switches
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.topology.model import Topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS

__all__ = [
    "NVLS",
    "NVLS_TREE",
    "NvlsTime",
    "has_nvls",
    "nvls_allreduce_times",
    "nvls_switch_rate",
    "nvls_times_for",
]

NVLS, NVLS_TREE = "nvls", "nvls-tree"  # NCCL's names (NCCL_ALGO=NVLS, NVLSTree)
# Above two machines NCCL halves NVLS-Tree's network bandwidth: the tree's inner machines take in two
# children's slices (NVIDIA/nccl src/graph/tuning.cc @b6475625, bwInter/2 when nNodes > 2).
_TREE_SHARE_ABOVE_TWO_MACHINES = 2


@dataclass(frozen=True)
class NvlsTime:
    """NCCL's NVLS (one machine) or NVLS-Tree (several) AllReduce of ``size_bytes``, modelled (µs).

    ``switch_time_us`` is a GPU's NVLink traffic at the switch's rate, ``network_time_us`` its
    slice's trip through the tree over the NICs (0 on one machine); ``bound_time_us`` is the
    in-network reduction bound at this size (``in_network_reduction_bounds``).
    """

    algorithm: str
    size_bytes: int
    num_ranks: int
    time_us: float
    alpha_us: float
    switch_time_us: float
    network_time_us: float
    bound_time_us: float

    @property
    def algbw_GBps(self) -> float:
        """Return size / time in GB/s, as nccl-tests reports it."""
        return self.size_bytes / (self.time_us * BYTES_PER_US_PER_GBPS)

    @property
    def busbw_GBps(self) -> float:
        """Return algbw x 2(N-1)/N in GB/s: nccl-tests' AllReduce convention, whatever the algorithm."""
        return self.algbw_GBps * 2 * (self.num_ranks - 1) / self.num_ranks

    @property
    def fraction_of_bound(self) -> float:
        """Return the in-network reduction bound over the modelled time (1.0: optimal)."""
        return self.bound_time_us / self.time_us


def has_nvls(topology: Topology) -> bool:
    """Return True when NCCL would run NVLS there: more than two GPUs per machine on a switch that reduces.

    NCCL turns NVLS off for a communicator with two GPUs or fewer in a machine (NVIDIA/nccl
    ``src/transport/nvls.cc`` @5067397c, ``ncclNvlsInit``: ``gpuCount <= 2``), so a process group
    with one or two GPUs per machine (a data-parallel rail, tp=2) runs none.

    >>> from taccl_py.topology import load_topology
    >>> has_nvls(load_topology("dgx-h100", nodes=2)), has_nvls(load_topology("dgx-a100"))
    (True, False)
    """
    return topology.gpus_per_node > 2 and bool(reducing_switches(topology))


def nvls_allreduce_times(
    topology: Topology, sizes_bytes: Iterable[int], *, bounds: Sequence[LowerBound] | None = None
) -> tuple[NvlsTime, ...]:
    """Return NCCL's NVLS (NVLS-Tree across machines) AllReduce time (µs) at each size, modelled.

    Parameters
    ----------
    topology : Topology
        A machine, or machines, whose GPUs each hang off a reducing switch (``has_nvls``).
    sizes_bytes : iterable of int
        AllReduce buffer sizes M (bytes).
    bounds : sequence of LowerBound, optional
        ``in_network_reduction_bounds(topology, sizes_bytes)`` when the caller has them already
        (``taccl topo show`` prints them too); computed here otherwise.

    Returns
    -------
    tuple of NvlsTime
        Per size: the time, its α and bandwidth terms, and the in-network reduction bound.

    Raises
    ------
    ArgumentError
        When the topology has no reducing switch on some machine, or a size is below 1 byte.

    Examples
    --------
    >>> from taccl_py.topology import load_topology
    >>> (one,) = nvls_allreduce_times(load_topology("dgx-h100"), [2**30])
    >>> one.algorithm, round(one.algbw_GBps, 1), round(one.busbw_GBps)  # NCCL: ~274 and ~480 GB/s
    ('nvls', 274.0, 480)
    """
    sizes = checked_sizes(topology, sizes_bytes)
    if not has_nvls(topology):
        raise ArgumentError(
            topology.name, "topology", "no switch that reduces in the network", "an NVLink SHARP machine (dgx-h100)"
        )
    switch_GBps, switch_alpha_us = nvls_switch_rate(topology)
    net_GBps, net_alpha_us = _network_route(topology)
    per_node = topology.gpus_per_node
    share = _TREE_SHARE_ABOVE_TWO_MACHINES if topology.nodes > 2 else 1
    levels = topology.nodes.bit_length() - 1  # NCCL's log2i: the depth of a binary tree of the machines
    alpha_us = switch_alpha_us + 2 * levels * net_alpha_us
    bounds = in_network_reduction_bounds(topology, sizes) if bounds is None else tuple(bounds)
    if len(bounds) != len(sizes):
        raise ArgumentError(topology.name, "bounds", f"{len(bounds)} bounds for {len(sizes)} sizes", "one per size")
    times = []
    for size, bound in zip(sizes, bounds):
        switch_us = size * (1 + 1 / per_node) / (switch_GBps * BYTES_PER_US_PER_GBPS)
        network_us = share * size / per_node / (net_GBps * BYTES_PER_US_PER_GBPS) if topology.nodes > 1 else 0.0
        times.append(
            NvlsTime(
                NVLS if topology.nodes == 1 else NVLS_TREE,
                size,
                topology.num_ranks,
                float(alpha_us + max(switch_us, network_us)),
                float(alpha_us),
                float(switch_us),
                float(network_us),
                bound.time_us,
            )
        )
    return tuple(times)


def nvls_times_for(
    topology: Topology, collective: Collective | str, sizes_bytes: Iterable[int]
) -> tuple[NvlsTime, ...]:
    """Return ``nvls_allreduce_times`` where NCCL would run NVLS (an AllReduce on a ``has_nvls`` machine), else ()."""
    if Collective(collective) is not Collective.ALLREDUCE or not has_nvls(topology):
        return ()
    return nvls_allreduce_times(topology, sizes_bytes)


def nvls_switch_rate(topology: Topology) -> tuple[float, float]:
    """Return the slowest GPU port's NVLS rate (GB/s: the switch's, capped by its links) and the largest α (µs)."""
    rates, alphas = [], []
    for switch in reducing_switches(topology):
        alphas.append(switch.reduce_alpha_us or 0.0)
        for gpu in topology.gpus:
            if gpu.node == switch.node:
                up, down = topology.link(gpu.name, switch.name), topology.link(switch.name, gpu.name)
                rates.append(min(switch.reduce_bandwidth_GBps, up.bandwidth_GBps, down.bandwidth_GBps))
    return min(rates), max(alphas)


def _network_route(topology: Topology) -> tuple[float, float]:
    """Return the narrowest bandwidth (GB/s) and the largest α (µs) of a GPU's route to its peer on the next machine.

    NVLS-Tree sends GPU i's slice over GPU i's own NIC to GPU i of the other machines. (inf, 0) on one machine.
    """
    if topology.nodes == 1:
        return float("inf"), 0.0
    per_node = topology.gpus_per_node
    routes = [route(topology, rank, (rank + per_node) % topology.num_ranks) for rank in range(topology.num_ranks)]
    return min(r.bandwidth_GBps for r in routes), max(r.alpha_us for r in routes)
