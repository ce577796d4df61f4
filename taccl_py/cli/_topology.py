"""The options every command that takes a topology shares: a machine, copies of it, or a cluster; and ``--model``."""

from __future__ import annotations

import argparse

from taccl_py.errors import ArgumentError
from taccl_py.simulate import DEFAULT_MODEL, EXECUTION_MODELS
from taccl_py.topology.cluster import Cluster, cluster_topology, describe_cluster
from taccl_py.topology.model import Topology

__all__ = ["add_model_option", "add_topology_options", "cluster_from_args", "topology_from_args", "topology_name"]

TOPOLOGY_HELP = "a built-in name (see `taccl topo list`), a taccl-topology JSON file or a file to import"
CLUSTER_HELP = (
    "machines in rank order instead of --topology/--nodes: MACHINE[:COUNT],... (e.g. dgx-a100:2,dgx-h100:2) "
    "or a taccl-cluster/1 file"
)


def add_topology_options(parser: argparse.ArgumentParser, *, positional: bool = False, nodes_default: int | None = 1):
    """Add the topology (``TOPO`` or ``--topology/-t``), ``--nodes``, ``--cluster``, ``--nic-down``, ``--nic-speed``."""
    if positional:
        parser.add_argument("topology", metavar="TOPO", nargs="?", help=TOPOLOGY_HELP + " (or give --cluster)")
        # the option every other command takes, here beside the positional (topology_name reads both)
        parser.add_argument("--topology", "-t", dest="topology_option", metavar="TOPO", help="the same as TOPO")
    else:
        parser.add_argument("--topology", "-t", metavar="TOPO", help=TOPOLOGY_HELP)
    default_text = "1" if nodes_default == 1 else "the sketch's nnodes, else 1"
    nodes_help = f"join this many copies of the machine (default {default_text})"
    parser.add_argument("--nodes", type=int, default=nodes_default, help=nodes_help)
    parser.add_argument("--cluster", metavar="SPEC", help=CLUSTER_HELP)
    parser.add_argument(
        "--nic-down",
        metavar="NODE:NIC",
        action="append",
        default=[],
        help="a NIC that is down, e.g. 1:nic3 (node index, NIC name; repeatable)",
    )
    parser.add_argument(
        "--nic-speed",
        metavar="NODE:NIC:GBPS",
        action="append",
        default=[],
        help="a NIC's network speed in GB/s per direction, e.g. 0:nic0:12.5 (repeatable)",
    )


def cluster_from_args(args: argparse.Namespace, nodes: int | None = None) -> Cluster:
    """Return the cluster the options describe; ``nodes`` overrides ``args.nodes`` (e.g. from a sketch)."""
    count = nodes if nodes is not None else (args.nodes if args.nodes is not None else 1)
    topology = topology_name(args)
    if args.cluster is not None and (topology is not None or args.nodes not in (None, 1)):
        given = "--topology" if topology is not None else "--nodes"
        raise ArgumentError(args.cluster, "--cluster", f"given with {given}", "either --cluster or --topology/--nodes")
    if args.cluster is None and topology is None:
        raise ArgumentError(None, "--topology", "no topology given", "--topology TOPO (with --nodes) or --cluster SPEC")
    return describe_cluster(
        args.cluster, topology=topology, nodes=count, nics_down=args.nic_down, nic_speeds=args.nic_speed
    )


def topology_name(args: argparse.Namespace) -> str | None:
    """Return the topology the options name: ``--topology``, or the positional ``TOPO`` where a command has one.

    Raises ``ArgumentError`` when both are given.
    """
    option = getattr(args, "topology_option", None)
    if option is None:
        return args.topology
    if args.topology is not None:
        raise ArgumentError(
            option, "--topology", f"given with TOPO {args.topology!r}", "either TOPO or --topology TOPO"
        )
    return option


def topology_from_args(args: argparse.Namespace, nodes: int | None = None) -> Topology:
    """Return the topology the options name; ``nodes`` overrides ``args.nodes`` (e.g. from a sketch)."""
    return cluster_topology(cluster_from_args(args, nodes))


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--model {chunks,msccl,pipelined,msccl-net}`` (default msccl-net): the execution model of a schedule."""
    described = "; ".join(f"{name}: {model.description}" for name, model in EXECUTION_MODELS.items())
    parser.add_argument(
        "--model",
        choices=tuple(EXECUTION_MODELS),
        default=DEFAULT_MODEL.name,
        help=f"how the runtime runs the program (default {DEFAULT_MODEL.name}; {described})",
    )
