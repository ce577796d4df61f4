"""The live cluster a Communicator runs on, and its fingerprint: which libraries were made for it.

A cluster is declared (``Communicator(cluster=...)``, ``register_backend(cluster=...)``, or the
environment, see below) as a ``taccl_py.topology.model.Topology``, a
``taccl_py.topology.cluster.Cluster``, a cluster shorthand (``"dgx-a100:2,dgx-h100:2"``) or a
``taccl-cluster/1`` file, with NICs down or at another speed on top. What the machines show can
refine it: each rank reads its node's NIC ports from sysfs (``/sys/class/infiniband``,
``/sys/class/net``), a port matched to a declared NIC by PCI bus id marks that NIC down when it is
not ACTIVE and sets its speed from the port's rate; the ranks exchange what they read, and node k
takes what its first rank (k * GPUs per node) read, so every rank computes one fingerprint.
NICs sysfs does not show, and machines whose NICs carry no PCI bus id, stay as declared.

Environment (read by ``Communicator.from_env`` and the ``taccl`` backend when no cluster is passed):

``TACCL_CLUSTER``
    The cluster: ``MACHINE[:COUNT],...`` in rank order, or a ``taccl-cluster/1`` file.
``TACCL_NIC_DOWN``
    NICs down, ``NODE:NIC`` comma-separated (``1:nic3,2:nic0``).
``TACCL_NIC_SPEED``
    NIC speeds, ``NODE:NIC:GBPS`` comma-separated (``1:nic0:4.76``; GB/s per direction).
``TACCL_SYSFS_ROOT``
    Where sysfs is mounted (default ``/``, e.g. a host's sysfs bound into a container).
``TACCL_NIC_PROBE``
    ``0`` / ``off``: take the declared cluster as it is, reading no sysfs.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taccl_py.errors import ArgumentError, FormatError, TopologyError
from taccl_py.runtime.communicator.group_log import group_warning_level
from taccl_py.topology.cluster import (
    Cluster,
    ClusterNode,
    cluster_topology,
    parse_cluster_spec,
    parse_nic_down,
    parse_nic_speed,
    with_overrides,
)
from taccl_py.topology.fingerprint import cluster_fingerprint
from taccl_py.topology.model import Topology

__all__ = [
    "ENV_CLUSTER",
    "ENV_NIC_DOWN",
    "ENV_NIC_PROBE",
    "ENV_NIC_SPEED",
    "ENV_SYSFS_ROOT",
    "DeclaredCluster",
    "LiveCluster",
    "NicPort",
    "declare_cluster",
    "declared_from_env",
    "live_cluster",
    "mismatch_warning",
    "warn_other_cluster",
    "nominal_rate_gbps",
    "observe_nics",
    "ports_from_json",
    "ports_to_json",
    "refine_cluster",
    "resolve_live_cluster",
    "sysfs_root_from_env",
]

logger = logging.getLogger(__name__)

ENV_CLUSTER = "TACCL_CLUSTER"
ENV_NIC_DOWN = "TACCL_NIC_DOWN"
ENV_NIC_SPEED = "TACCL_NIC_SPEED"
ENV_SYSFS_ROOT = "TACCL_SYSFS_ROOT"
ENV_NIC_PROBE = "TACCL_NIC_PROBE"
_OFF = ("0", "off", "no", "false")
# Signalling rates of InfiniBand and Ethernet ports (Gb/s): a machine file's NIC bandwidth (GB/s,
# an effective figure such as NDv2's 9.52 for 100 Gb/s EDR) is taken to be the port rate next above it.
_PORT_RATES_GBPS = (1.0, 2.5, 5.0, 10.0, 14.0, 20.0, 25.0, 40.0, 50.0, 56.0, 100.0, 200.0, 400.0, 800.0, 1600.0)
# Refined speeds are rounded to this many decimals (GB/s), as one would type them for --nic-speed.
_SPEED_DECIMALS = 2


@dataclass(frozen=True)
class DeclaredCluster:
    """A cluster as declared and its topology; ``cluster`` None: a topology given as it is, not refined."""

    cluster: Cluster | None
    topology: Topology
    origin: str


@dataclass(frozen=True)
class LiveCluster:
    """The cluster this job runs on: its name, fingerprint (None: no usable cluster) and how it was found."""

    name: str
    fingerprint: str | None
    num_ranks: int | None
    source: str

    def describe(self) -> str:
        """Return ``name (fingerprint F)`` for log lines."""
        return f"{self.name} (fingerprint {self.fingerprint or 'none: ' + self.source})"


@dataclass(frozen=True)
class NicPort:
    """One network port a rank saw in sysfs: its PCI function, state word and rate (Gb/s, None: unknown)."""

    bus_id: str
    state: str
    rate_gbps: float | None

    @property
    def up(self) -> bool:
        """Return True when the port is ACTIVE."""
        return self.state == "ACTIVE"


# -- declaring ----------------------------------------------------------------------------------------


def _override_texts(value: Any, field: str) -> tuple[str, ...]:
    """Return override texts from a comma-separated string or a sequence of strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ArgumentError("Communicator", field, f"{value!r}", "'NODE:NIC,...' or a list of such strings")


def declare_cluster(
    cluster: Any, nic_down: Any = (), nic_speed: Any = (), *, origin: str = "cluster="
) -> DeclaredCluster:
    """Return the declared cluster of ``cluster`` (Topology, Cluster, shorthand or file) with the overrides.

    ``nic_down`` holds ``NODE:NIC`` texts, ``nic_speed`` ``NODE:NIC:GBPS`` texts (a list, or one
    comma-separated string). A Topology is taken as it is and takes no overrides.
    """
    downs, speeds = _override_texts(nic_down, "nic_down"), _override_texts(nic_speed, "nic_speed")
    if isinstance(cluster, DeclaredCluster):
        if not (downs or speeds):
            return cluster
        cluster = cluster.cluster if cluster.cluster is not None else cluster.topology
    if isinstance(cluster, Topology):
        if downs or speeds:
            raise ArgumentError(
                origin, "nic_down" if downs else "nic_speed", "given with a Topology", "a cluster spec or Cluster"
            )
        return DeclaredCluster(None, cluster, origin)
    if isinstance(cluster, (str, os.PathLike)):
        cluster = parse_cluster_spec(os.fspath(cluster), option=origin)
    if not isinstance(cluster, Cluster):
        raise ArgumentError(
            "Communicator",
            "cluster",
            f"{type(cluster).__name__} {cluster!r}",
            "a Topology, a Cluster, 'MACHINE[:COUNT],...' or a taccl-cluster/1 file",
        )
    cluster = with_overrides(
        cluster, [parse_nic_down(text, "nic_down") for text in downs], [parse_nic_speed(t, "nic_speed") for t in speeds]
    )
    # a bad machine or NIC name fails here, before any rank waits on another
    return DeclaredCluster(cluster, cluster_topology(cluster), origin)


def declared_from_env(environ: Mapping[str, str]) -> DeclaredCluster | None:
    """Return the cluster TACCL_CLUSTER, TACCL_NIC_DOWN and TACCL_NIC_SPEED declare; None without TACCL_CLUSTER."""
    spec = environ.get(ENV_CLUSTER, "").strip()
    if not spec:
        for name in (ENV_NIC_DOWN, ENV_NIC_SPEED):
            if environ.get(name, "").strip():
                raise ArgumentError("environment", name, "set without TACCL_CLUSTER", "TACCL_CLUSTER too")
        return None
    return declare_cluster(spec, environ.get(ENV_NIC_DOWN, ""), environ.get(ENV_NIC_SPEED, ""), origin=ENV_CLUSTER)


def sysfs_root_from_env(environ: Mapping[str, str]) -> str | None:
    """Return where to read NIC ports (TACCL_SYSFS_ROOT, default ``/``); None when TACCL_NIC_PROBE turns it off."""
    if environ.get(ENV_NIC_PROBE, "").strip().lower() in _OFF:
        return None
    return environ.get(ENV_SYSFS_ROOT, "").strip() or "/"


# -- observing ----------------------------------------------------------------------------------------


def observe_nics(root: str | os.PathLike | None) -> tuple[NicPort, ...]:
    """Return the network ports sysfs under ``root`` shows (None: read nothing); unreadable sysfs shows none."""
    if root is None:
        return ()
    from taccl_py.topology.probe.sources import read_sysfs_nics

    try:
        found = read_sysfs_nics(Path(root))
    except (OSError, ValueError, FormatError) as error:  # a half-readable sysfs must not stop the job
        logger.info("NIC ports under %s unreadable (%s); the declared cluster stands", root, error)
        return ()
    return tuple(
        NicPort(nic.device.bus_id, nic.state, None if math.isnan(nic.rate_gbps) else nic.rate_gbps) for nic in found
    )


def ports_to_json(ports: Sequence[NicPort]) -> str:
    """Return ``ports`` as JSON text, to hand to the other ranks."""
    return json.dumps([[port.bus_id, port.state, port.rate_gbps] for port in ports])


def ports_from_json(text: str | bytes) -> tuple[NicPort, ...]:
    """Return the ports :func:`ports_to_json` wrote."""
    return tuple(NicPort(str(bus), str(state), rate) for bus, state, rate in json.loads(text))


def nominal_rate_gbps(bandwidth_GBps: float) -> float:
    """Return the port rate (Gb/s) a machine file's NIC bandwidth (GB/s per direction) stands for.

    >>> nominal_rate_gbps(25.0), nominal_rate_gbps(9.523809523809524), nominal_rate_gbps(50.0)
    (200.0, 100.0, 400.0)
    """
    bits = bandwidth_GBps * 8.0
    return next((rate for rate in _PORT_RATES_GBPS if rate >= bits * (1 - 1e-9)), bits)


def _normalized(bus_id: str | None) -> str | None:
    from taccl_py.topology.probe.sources import normalize_pci_bus_id

    if not bus_id:
        return None
    try:
        return normalize_pci_bus_id(bus_id)
    except FormatError:
        return None


def _refine_node(node: ClusterNode, machine: Topology, ports: Sequence[NicPort]) -> tuple[ClusterNode, list[str]]:
    """Return ``node`` with its matched NICs set as ``ports`` show them, and what changed."""
    by_bus: dict[str, list[NicPort]] = {}
    for port in ports:
        by_bus.setdefault(port.bus_id, []).append(port)
    down, speeds, changes = list(node.nics_down), dict(node.nic_speeds), []
    for nic in machine.nics():
        seen = by_bus.get(_normalized(nic.pci_bus_id) or "", [])
        if not seen:
            continue
        active = [port for port in seen if port.up]
        if not active:
            if nic.name not in down:
                down.append(nic.name)
                changes.append(f"{nic.name} down ({seen[0].state})")
            continue
        if nic.name in down:
            down.remove(nic.name)
            changes.append(f"{nic.name} up")
        rates = [port.rate_gbps for port in active if port.rate_gbps is not None]
        if not rates or nic.net_bandwidth_GBps is None:
            continue
        nominal = nominal_rate_gbps(nic.net_bandwidth_GBps)
        if max(rates) == nominal:
            if speeds.pop(nic.name, None) is not None:
                changes.append(f"{nic.name} at its full {nominal:g} Gb/s")
            continue
        speed = round(nic.net_bandwidth_GBps * max(rates) / nominal, _SPEED_DECIMALS)
        if speeds.get(nic.name) != speed:
            speeds[nic.name] = speed
            changes.append(f"{nic.name} at {max(rates):g} Gb/s = {speed:g} GB/s")
    return replace(node, nics_down=tuple(down), nic_speeds=tuple(speeds.items())), changes


def refine_cluster(
    cluster: Cluster, ports_by_node: Sequence[Sequence[NicPort]], gpus_per_node: int
) -> tuple[Cluster, tuple[str, ...]]:
    """Return ``cluster`` with each node's NICs as ``ports_by_node[k]`` shows them, and one note per changed node.

    A declared NIC whose PCI bus id no port has keeps its declared state.
    """
    from taccl_py.topology.builtins import load_topology

    machines: dict[str, Topology] = {}
    nodes, notes = [], []
    for index, (node, ports) in enumerate(zip(cluster.nodes, ports_by_node, strict=True)):
        if node.machine not in machines:
            machines[node.machine] = load_topology(node.machine)
        refined, changes = _refine_node(node, machines[node.machine], ports)
        nodes.append(refined)
        if changes:
            first, last = index * gpus_per_node, (index + 1) * gpus_per_node - 1
            ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
            notes.append(f"node {index} ({ranks}): " + ", ".join(changes))
    return replace(cluster, nodes=tuple(nodes)), tuple(notes)


def live_cluster(declared: DeclaredCluster, ports_by_rank: Sequence[Sequence[NicPort]] | None) -> LiveCluster:
    """Return the live cluster: ``declared`` refined by the ports each rank saw (None: not observed).

    Node k takes the ports its first rank saw. Where refinement leaves a node with no NIC up, the
    live cluster has no fingerprint (no library fits it) and ``source`` says why.
    """
    cluster, topology = declared.cluster, declared.topology
    if cluster is None:
        return LiveCluster(
            topology.name, cluster_fingerprint(topology), topology.num_ranks, f"given by {declared.origin}"
        )
    source = f"declared by {declared.origin}"
    if ports_by_rank is None:
        source += "; NIC ports not read"
    elif not any(ports_by_rank):
        source += "; no NIC port found in sysfs, the declaration stands"
    else:
        per_node = topology.gpus_per_node
        firsts = [
            ports_by_rank[k * per_node] if k * per_node < len(ports_by_rank) else () for k in range(len(cluster.nodes))
        ]
        refined, notes = refine_cluster(cluster, firsts, per_node)
        if not notes:
            source += "; sysfs agrees"
        else:
            source += "; refined by sysfs: " + "; ".join(notes)
            try:
                topology = cluster_topology(refined)
            except TopologyError as error:
                return LiveCluster(topology.name, None, topology.num_ranks, f"{source}: {error}")
    return LiveCluster(topology.name, cluster_fingerprint(topology), topology.num_ranks, source)


def resolve_live_cluster(
    cluster: Any,
    nic_down: Any,
    nic_speed: Any,
    sysfs_root: str | os.PathLike | None,
    world_size: int,
    exchange: Callable[[str], Sequence[str]],
) -> LiveCluster:
    """Return the live cluster of a group of ``world_size`` ranks; every rank calls it alike.

    ``cluster`` is a LiveCluster (returned as it is), a DeclaredCluster, or what
    :func:`declare_cluster` takes. ``exchange`` hands this rank's text to every rank of the group
    and returns all ranks' texts in rank order; it runs only when sysfs is read (``sysfs_root``).

    Raises
    ------
    ArgumentError
        The cluster has another number of GPUs than the group has ranks, or an override is malformed.
    TopologyError
        A machine or NIC of the declaration does not exist, or a declared node has every NIC down.
    """
    if isinstance(cluster, LiveCluster):
        return cluster
    declared = cluster if isinstance(cluster, DeclaredCluster) else declare_cluster(cluster, nic_down, nic_speed)
    if declared.topology.num_ranks != world_size:
        raise ArgumentError(
            declared.origin,
            "world_size",
            f"{declared.topology.name} has {declared.topology.num_ranks} GPUs, the group {world_size} ranks",
            "one rank per GPU of the cluster",
        )
    ports = None
    if declared.cluster is not None and sysfs_root is not None:
        ports = [ports_from_json(text) for text in exchange(ports_to_json(observe_nics(sysfs_root)))]
    live = live_cluster(declared, ports)
    logger.info("live cluster %s: %s", live.describe(), live.source)
    return live


def mismatch_warning(collective: str, size_bytes: int, live: LiveCluster, made_for: Sequence[str]) -> str:
    """Return the one-line warning for a collective that runs natively because no library fits the live cluster."""
    return (
        f"no taccl library for {collective} of {size_bytes} bytes was made for the live cluster {live.describe()}, "
        f"{live.source}; the libraries were made for {', '.join(sorted(set(made_for)))}; using the backend's own "
        f"{collective} (logged once per collective)"
    )


def warn_other_cluster(
    log: logging.Logger, choices: Any, live: LiveCluster, collective: Any, size_bytes: int, warned: set, rank: int
) -> bool:
    """Return True when ``choices`` rejected algorithms for this call as made for another cluster than ``live``.

    The first such call of each collective logs ``mismatch_warning`` on ``log``, a WARNING on the
    group's rank 0 and DEBUG on the others (``rank``: this process's rank in the group); ``warned``
    holds the collectives already warned of (the caller's, so the warning is once per communicator).
    """
    rejected = choices.rejected_for(collective, size_bytes)
    if not rejected:
        return False
    if ("cluster", collective) not in warned:
        warned.add(("cluster", collective))
        made_for = [candidate.made_for.describe() for candidate in rejected]
        log.log(group_warning_level(rank), "%s", mismatch_warning(collective.value, size_bytes, live, made_for))
    return True
