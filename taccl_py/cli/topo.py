"""``taccl topo``: list, show, import and draw topologies (``probe`` and ``export-nccl`` live in topo_probe)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from taccl_py.baselines.nvls import NvlsTime, has_nvls, nvls_allreduce_times
from taccl_py.bounds import ALLREDUCE_BOUND_NOTE, LowerBound, lower_bounds_by_collective
from taccl_py.bounds.cut import route_links
from taccl_py.bounds.reduction import in_network_reduction_bounds, reducing_switches
from taccl_py.cli import topo_probe
from taccl_py.cli._output import format_table
from taccl_py.cli._topology import add_topology_options, cluster_from_args, topology_from_args
from taccl_py.ir.collectives import Collective
from taccl_py.topology.builtins import ALIASES, builtin_topology_names, load_topology, nic_affinity
from taccl_py.topology.cluster import NodeStatus, cluster_topology, node_statuses
from taccl_py.topology.fingerprint import cluster_fingerprint
from taccl_py.topology.model import Topology
from taccl_py.topology.schema import write_topology
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_sizes

__all__ = ["register"]

_DEFAULT_SIZES = "1MB,64MB,1GB"
_BOUND_COLLECTIVES = tuple(Collective)
_DESCRIPTION_CHARS = 90  # `topo list` trims longer descriptions
# How the bound table names AllReduce's two bounds (by ``_bound_kind``).
_BOUND_LABELS = {
    "reducescatter+allgather class": "allreduce (RS+AG class)",
    "in-network reduction": "allreduce (in-network)",
}
# Under a link class table whose pair has a cheaper way back (a NIC and the network switch).
_ALPHA_BACK_NOTE = (
    "'A (B back)': alpha A one way, B on the way back; a NIC's link into the network switch carries "
    "the network's alpha, its link back 0, so a route pays it once"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taccl topo`` and its subcommands to ``subparsers``."""
    parser = subparsers.add_parser("topo", description="List, show, import and draw topologies.")
    topo_subparsers = parser.add_subparsers(dest="topo_command", required=True, metavar="SUBCOMMAND")

    listing = topo_subparsers.add_parser("list", help="list the built-in topologies")
    listing.set_defaults(func=_run_list)

    show = topo_subparsers.add_parser("show", help="show a topology's GPUs, NICs, link classes and lower bounds")
    add_topology_options(show, positional=True)
    show.add_argument(
        "--sizes",
        default=_DEFAULT_SIZES,
        help=f"sizes for the lower bounds (default {_DEFAULT_SIZES}; {SIZE_SUFFIXES_HELP})",
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of tables")
    show.set_defaults(func=_run_show)

    importer = topo_subparsers.add_parser(
        "import",
        help="convert nvidia-smi topo -m text, NCCL topology XML or a TACCL profile to taccl-topology/1 JSON "
        "(a taccl-topology/1 file is checked and rewritten)",
    )
    importer.add_argument("file", metavar="FILE", help="the file to import")
    importer.add_argument("-o", "--output", required=True, help="the JSON file to write (- for stdout)")
    importer.set_defaults(func=_run_import)

    draw = topo_subparsers.add_parser("draw", help="draw a topology to PNG or SVG")
    add_topology_options(draw, positional=True)
    draw.add_argument("-o", "--output", required=True, help="the image to write (.png or .svg)")
    draw.set_defaults(func=_run_draw)

    topo_probe.register(topo_subparsers)


def _run_list(args: argparse.Namespace) -> int:
    aliases: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        aliases.setdefault(name, []).append(alias)
    rows = []
    for name in builtin_topology_names():
        topology = load_topology(name)
        description = topology.description
        if len(description) > _DESCRIPTION_CHARS:
            description = description[: _DESCRIPTION_CHARS - 3] + "..."
        rows.append(
            (
                name,
                ",".join(sorted(aliases.get(name, []))) or "-",
                topology.num_ranks,
                len(topology.nics()),
                description,
            )
        )
    print(format_table(("name", "aliases", "GPUs", "NICs", "description"), rows))
    return 0


def _link_classes(topology: Topology) -> list[dict[str, object]]:
    """Return the links grouped by (kind, lanes, bandwidth, α, α of the way back), with how many directed links each.

    A link and its way back (same kind, lanes and bandwidth) make one class whatever their α:
    ``compose_nodes`` gives a NIC's link into ``netswitch`` the network's α and the link back
    α 0, so a route pays it once. ``alpha_us`` is the larger α, ``alpha_back_us`` the other
    (None for a link without a way back).
    """
    classes: dict[tuple, int] = {}
    for link in topology.links:
        back = topology.link(link.dst, link.src)
        shape = (link.kind, link.count, link.bandwidth_GBps)
        back_us = back.alpha_us if back is not None and (back.kind, back.count, back.bandwidth_GBps) == shape else None
        alphas = (link.alpha_us, back_us) if back_us is None else tuple(sorted((link.alpha_us, back_us), reverse=True))
        key = (link.kind.value, link.count, link.bandwidth_GBps, *alphas)
        classes[key] = classes.get(key, 0) + 1
    return [
        {
            "kind": kind,
            "lanes": lanes,
            "bandwidth_GBps": bandwidth_GBps,
            "alpha_us": alpha_us,
            "alpha_back_us": alpha_back_us,
            "directed_links": count,
        }
        for (kind, lanes, bandwidth_GBps, alpha_us, alpha_back_us), count in classes.items()
    ]


def _class_alpha(link_class: dict) -> str:
    """Return a class's α cell: ``0.3``, ``0.6 (0 back)`` for a pair whose way back costs less, or ``(one way)``."""
    alpha_us, back_us = link_class["alpha_us"], link_class["alpha_back_us"]
    if back_us is None:
        return f"{_number(alpha_us)} (one way)"
    return _number(alpha_us) if back_us == alpha_us else f"{_number(alpha_us)} ({_number(back_us)} back)"


def _format_time_us(time_us: float) -> str:
    if time_us >= 1e3:
        return f"{time_us / 1e3:.4g} ms"
    return f"{time_us:.4g} us"


def _bound_kind(bound: LowerBound) -> str:
    """Return what ``bound`` bounds: every algorithm (``cut``), or AllReduce's class bound."""
    if bound.description.startswith("in-network reduction"):
        return "in-network reduction"
    return "reducescatter+allgather class" if bound.collective is Collective.ALLREDUCE else "cut"


def _bound_record(bound: LowerBound) -> dict[str, object]:
    return {
        "collective": bound.collective.value,
        "kind": _bound_kind(bound),
        "size_bytes": bound.size_bytes,
        "time_us": bound.time_us,
        "cut_only_time_us": bound.cut_only_time_us,
        "bandwidth_time_us": bound.bandwidth_time_us,
        "cut_alpha_us": bound.cut_alpha_us,
        "latency_floor_us": bound.latency_floor_us,
        "cut": list(bound.cut),
        "cut_gpus": bound.cut_gpus,
        "cut_capacity_GBps": bound.cut_capacity_GBps,
        "description": bound.description,
    }


def _run_show(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.sizes, "--sizes")
    cluster = cluster_from_args(args)
    topology = cluster_topology(cluster)
    machines = node_statuses(topology, cluster)
    links = route_links(topology)  # computed once: every bound below reads it
    by_collective = lower_bounds_by_collective(topology, _BOUND_COLLECTIVES, sizes, links=links)
    bounds = [bound for collective in _BOUND_COLLECTIVES for bound in by_collective[collective]]
    in_network = in_network_reduction_bounds(topology, sizes, links=links) if has_nvls(topology) else ()
    nvls = nvls_allreduce_times(topology, sizes, bounds=in_network) if in_network else ()
    affinity = nic_affinity(topology)
    nics = [
        {
            "name": nic.name,
            "node": nic.node,
            "net_kind": nic.net_kind.value if nic.net_kind else None,
            "net_bandwidth_GBps": nic.net_bandwidth_GBps,
            "net_alpha_us": nic.net_alpha_us,
            "nearest_gpus": list(affinity[nic.name]),
        }
        for nic in topology.nics()
    ]
    if args.json:
        document = {
            "name": topology.name,
            "description": topology.description,
            "sources": list(topology.sources),
            "nodes": topology.nodes,
            "gpus": topology.num_ranks,
            "gpus_per_node": topology.gpus_per_node,
            "fingerprint": cluster_fingerprint(topology),
            "machines": [_machine_record(status) for status in machines],
            "nics": nics,
            "link_classes": _link_classes(topology),
            "lower_bounds": [_bound_record(bound) for bound in bounds],
            "in_network_reduction_bounds": [_bound_record(bound) for bound in in_network],
            "nccl_nvls": [_nvls_record(time) for time in nvls],
        }
        print(json.dumps(document, indent=2))
        return 0
    _print_show(topology, machines, nics, bounds + list(in_network))
    if nvls:
        print()
        _print_nvls(topology, nvls, by_collective[Collective.ALLREDUCE])
    return 0


def _nvls_record(time: NvlsTime) -> dict[str, object]:
    return {
        "algorithm": time.algorithm,
        "size_bytes": time.size_bytes,
        "time_us": time.time_us,
        "alpha_us": time.alpha_us,
        "switch_time_us": time.switch_time_us,
        "network_time_us": time.network_time_us,
        "in_network_bound_us": time.bound_time_us,
    }


def _print_nvls(topology: Topology, times: Sequence[NvlsTime], class_bounds: Sequence[LowerBound]) -> None:
    """Print NCCL's modelled NVLS AllReduce per size, against the in-network bound and the RS+AG class bound."""
    switch = reducing_switches(topology)[0]
    print(
        f"NCCL NVLS allreduce, modelled (NVLink SHARP on {switch.name}: {_number(switch.reduce_bandwidth_GBps)} GB/s "
        f"per GPU port, alpha {_number(switch.reduce_alpha_us)} us; taccl_py.baselines.nvls):"
    )
    rows = [
        (
            format_size(t.size_bytes),
            t.algorithm,
            _format_time_us(t.time_us),
            f"{t.algbw_GBps:.1f}",
            f"{t.busbw_GBps:.1f}",
            _format_time_us(t.bound_time_us),
            f"{t.fraction_of_bound:.3f}",
            _format_time_us(b.time_us),
        )
        for t, b in zip(times, class_bounds)
    ]
    headers = ("size", "algorithm", "time", "algbw GB/s", "busbw GB/s", "in-network bound", "of bound", "RS+AG bound")
    print(format_table(headers, rows))


def _machine_record(status: NodeStatus) -> dict[str, object]:
    return {
        "node": status.node,
        "machine": status.machine,
        "ranks": list(status.ranks),
        "nics_up": [{"name": name, "net_bandwidth_GBps": speed} for name, speed in status.nics_up],
        "nics_down": list(status.nics_down),
    }


def _nics_by_speed(nics: Sequence[tuple[str, float | None]]) -> str:
    """Return ``nic0,nic1 @25; nic2 @12.5``: the NICs grouped by network speed (GB/s), first seen first."""
    groups: dict[float | None, list[str]] = {}
    for name, speed in nics:
        groups.setdefault(speed, []).append(name)
    return "; ".join(",".join(names) + f" @{_number(speed)}" for speed, names in groups.items()) or "-"


def _print_show(
    topology: Topology, machines: Sequence[NodeStatus], nics: Sequence[dict], bounds: Sequence[LowerBound]
) -> None:
    print(f"{topology.name}: {topology.description}")
    print(f"GPUs: {topology.num_ranks} ({topology.nodes} node(s) x {topology.gpus_per_node}), NICs: {len(nics)}")
    print()
    if topology.nodes > 1 or any(status.nics_down for status in machines):
        machine_rows = [
            (
                status.node,
                status.machine,
                _ranks(status.ranks),
                _nics_by_speed(status.nics_up),
                ",".join(status.nics_down) or "-",
            )
            for status in machines
        ]
        print(_left_last(format_table(("node", "machine", "GPUs", "NICs up @GB/s", "NICs down"), machine_rows)))
        print()
    nic_rows = [
        (
            nic["name"],
            nic["net_kind"] or "-",
            _number(nic["net_bandwidth_GBps"]),
            _number(nic["net_alpha_us"]),
            _ranks(nic["nearest_gpus"]),
        )
        for nic in nics
    ]
    if nic_rows:
        print(format_table(("NIC", "kind", "GB/s", "alpha_us", "nearest GPUs"), nic_rows))
        print()
    classes = _link_classes(topology)
    class_rows = [
        (c["kind"], c["lanes"], _number(c["bandwidth_GBps"]), _class_alpha(c), c["directed_links"]) for c in classes
    ]
    print(format_table(("link class", "lanes", "GB/s", "alpha_us", "directed links"), class_rows))
    if any(c["alpha_back_us"] not in (None, c["alpha_us"]) for c in classes):
        print(f"note: {_ALPHA_BACK_NOTE}")
    print()
    bound_rows = [
        (
            _BOUND_LABELS.get(_bound_kind(b), b.collective.value),
            format_size(b.size_bytes),
            _format_time_us(b.time_us),
            _format_time_us(b.bandwidth_time_us),
            _format_time_us(b.cut_alpha_us),
            _format_time_us(b.latency_floor_us),
            b.description,
        )
        for b in bounds
    ]
    print("lower bounds (bound = max(cut bound + cut alpha, latency floor)):")
    headers = ("collective", "size", "bound", "cut bound", "cut alpha", "latency floor", "binding cut")
    print(_left_last(format_table(headers, bound_rows)))
    print(f"note: {ALLREDUCE_BOUND_NOTE}")


def _left_last(table: str) -> str:
    """Return the table with its last (text) column left-aligned."""
    lines = table.splitlines()
    start = lines[1].rfind(" ") + 1
    return "\n".join(line[:start] + line[start:].strip() for line in lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _ranks(ranks: Sequence[int]) -> str:
    """Return ranks as ``0-3`` runs: ``[0, 1, 2, 3, 8]`` -> ``0-3,8``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "-"


def _run_import(args: argparse.Namespace) -> int:
    from taccl_py.topology.importers import import_topology

    topology = import_topology(args.file)
    write_topology(topology, args.output)
    if args.output != "-":
        print(
            f"wrote {args.output}: {topology.name}, {topology.num_ranks} GPUs, {len(topology.nics())} NICs, "
            f"{len(topology.links)} links"
        )
    return 0


def _run_draw(args: argparse.Namespace) -> int:
    from taccl_py.topology.draw import draw_topology

    topology = topology_from_args(args)
    draw_topology(topology, args.output)
    print(f"wrote {args.output}")
    return 0
