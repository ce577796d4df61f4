"""``taccl place``: put pipeline stages on the GPUs with the cheapest stage-to-stage transfers."""

from __future__ import annotations

import argparse
import json
import sys

from taccl_py.cli._output import format_ratio, format_table
from taccl_py.cli._topology import add_topology_options, topology_from_args
from taccl_py.placement import DEFAULT_ACTIVATION_BYTES, PlacementResult, place_pipeline
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_size

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``place`` to the ``taccl`` command line."""
    parser = subparsers.add_parser(
        "place",
        description="Assign S pipeline stages to GPUs so the activation transfers stage k -> k+1 are cheapest "
        "under the alpha-beta model; print the order and its modelled p2p time against the naive order.",
    )
    add_topology_options(parser)
    parser.add_argument("--stages", type=int, required=True, help="number of pipeline stages (<= GPUs)")
    parser.add_argument(
        "--activation-size",
        default=format_size(DEFAULT_ACTIVATION_BYTES),
        help=f"bytes sent between stages per microbatch (default 16MB; {SIZE_SUFFIXES_HELP})",
    )
    parser.add_argument(
        "--method", choices=("auto", "exact", "heuristic"), default="auto", help="exact up to 16 GPUs per node (auto)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=_place)


def _place(args: argparse.Namespace) -> int:
    size = parse_size(args.activation_size, "--activation-size")
    topology = topology_from_args(args)
    progress = None if args.json else (lambda message: print(message, file=sys.stderr))
    result = place_pipeline(topology, args.stages, activation_bytes=size, method=args.method, progress=progress)
    print(json.dumps(result.to_json_dict(), indent=2) if args.json else _report(result))
    return 0


def _report(result: PlacementResult) -> str:
    rows = []
    for stage, (rank, node, local) in enumerate(zip(result.stage_ranks, result.rank_nodes, result.rank_local_indices)):
        hop = result.hops[stage] if stage < len(result.hops) else None
        rows.append(
            (stage, rank, node, local, f"{hop.time_us:.1f}" if hop else "-", "+".join(hop.link_kinds) if hop else "-")
        )
    lines = [
        f"{result.topology}: {len(result.stage_ranks)} stages, {format_size(result.activation_bytes)} activations, "
        f"{result.method}",
        format_table(("stage", "rank", "node", "gpu", "to next (us)", "via"), rows),
        "",
    ]
    lines += [
        f"CUDA_VISIBLE_DEVICES (node {node}): {devices}" for node, devices in result.cuda_visible_devices().items()
    ]
    lines.append(f"rank list: {result.rank_list()}")
    lines.append(
        f"p2p per microbatch: placed {result.time_us:.1f} us, naive {result.naive_time_us:.1f} us, gain "
        f"{format_ratio(result.gain)}"
    )
    return "\n".join(lines)
