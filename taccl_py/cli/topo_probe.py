"""``taccl topo probe`` (describe this machine) and ``taccl topo export-nccl`` (NCCL XML)."""

from __future__ import annotations

import argparse

from taccl_py.cli._output import progress_to_stderr
from taccl_py.topology.builtins import load_topology
from taccl_py.topology.model import VertexKind
from taccl_py.topology.nccl_export import write_nccl_topology_xml
from taccl_py.topology.probe import probe_topology
from taccl_py.topology.schema import write_topology

__all__ = ["register"]

_PROGRESS = progress_to_stderr()


def register(topo_subparsers: argparse._SubParsersAction) -> None:
    """Add ``probe`` and ``export-nccl`` to the ``taccl topo`` group."""
    probe = topo_subparsers.add_parser(
        "probe",
        help="discover this machine's GPUs, NVLinks, PCIe tree and NICs and write a topology file",
        description="Probe the GPUs (NVML via nvidia-ml-py, else nvidia-smi), their NVLinks and PCIe paths, "
        "and the NICs (/sys/class/infiniband, /sys/class/net); write a taccl-topology/1 JSON file.",
    )
    probe.add_argument("-o", "--output", default="-", help="topology file to write (default: stdout)")
    probe.add_argument("--name", default=None, help="topology name (default: probed-<hostname>)")
    probe.add_argument("--sysfs-root", default="/", help="directory whose sys/ is read (default: /)")
    probe.set_defaults(func=_probe)
    export = topo_subparsers.add_parser(
        "export-nccl",
        help="write a topology as NCCL topology XML for NCCL_TOPO_FILE",
        description="Write one machine as the XML NCCL reads from NCCL_TOPO_FILE.",
    )
    export.add_argument("topology", help="built-in name or topology file (one machine)")
    export.add_argument("-o", "--output", required=True, help="XML file to write (- for stdout)")
    export.add_argument(
        "--sm",
        type=int,
        default=None,
        help="NVIDIA GPUs' compute capability to write, e.g. 80 (default: guessed; AMD GPUs get RCCL's gcn arch)",
    )
    export.set_defaults(func=_export_nccl)


def _probe(args: argparse.Namespace) -> int:
    topology = probe_topology(root=args.sysfs_root, name=args.name, progress=_PROGRESS)
    write_topology(topology, args.output)
    if args.output != "-":
        kinds = [v.kind for v in topology.vertices]
        switched = "NVSwitch" if VertexKind.NVSWITCH in kinds else "no NVSwitch"
        print(f"wrote {args.output}: {topology.num_ranks} GPUs, {kinds.count(VertexKind.NIC)} NIC ports, {switched}")
    return 0


def _export_nccl(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    write_nccl_topology_xml(topology, args.output, sm=args.sm)
    if args.output != "-":
        print(
            f"wrote {args.output}: {topology.name}, {topology.num_ranks} GPUs; use it with NCCL_TOPO_FILE={args.output}"
        )
    return 0
