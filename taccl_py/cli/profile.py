"""``taccl profile``: measure α and bandwidth between ranks and write a topology with the measured links.

Run it under ``torchrun --nproc-per-node N -m taccl_py profile -o measured.json`` (rank 0
writes), or let it start N local gloo ranks with ``--nproc N``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from taccl_py.cli._output import format_table
from taccl_py.cli._ranks import run_on_ranks, world_size_to_be
from taccl_py.topology.measured import DEFAULT_PROFILE_REPEATS
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_sizes

if TYPE_CHECKING:  # the runtime imports torch; the CLI loads it only to run
    from taccl_py.runtime.measure.profile import ProfileOutcome

__all__ = ["DEFAULT_PROFILE_SIZES", "format_fits", "register"]

#: Sizes timed by default: from where α dominates to where bandwidth does (grows x4, keeps 32 MiB);
#: powers of two, as nccl-tests times, so every size prints whole (1MiB, not 1024KB).
DEFAULT_PROFILE_SIZES = "4KiB-32MiB"


def format_fits(outcome: ProfileOutcome) -> str:
    """Return one row per measured pattern or link class: α (µs), bandwidth (GB/s), residual and spread."""
    if outcome.host is not None:
        host = outcome.host
        rows = [("lone pair", "0->1", host.pair), (f"ring shift x{host.concurrent}", "r->r+1", host.ring)]
    else:
        rows = [(f"class {c.kind.value}", f"{c.src}->{c.dst}", c.fit) for c in outcome.classes]
    body = [
        [
            name,
            pair,
            f"{fit.alpha_us:.1f}",
            f"{fit.bandwidth_GBps:.4g}",
            f"{fit.max_residual:.0%}",
            f"{fit.repeat_spread:.0%}",
        ]
        for name, pair, fit in rows
    ]
    table = format_table(["measured", "ranks", "alpha_us", "GBps", "max_residual", "repeat_spread"], body)
    if outcome.host is not None:
        table += (
            f"\nshared by {outcome.host.concurrent} transfers at once: {outcome.host.shared_bandwidth_GBps:.4g} GB/s"
        )
    return table


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _profile(args: argparse.Namespace) -> int:
    from taccl_py.runtime.measure.profile import (
        ProfileSpec,
        check_topology_ranks,
        fit_profile,
        measured_topology,
        profile_worker,
        run_profile,
    )
    from taccl_py.topology.builtins import load_topology
    from taccl_py.topology.schema import write_topology

    spec = ProfileSpec(
        parse_sizes(args.sizes, "--sizes"),
        args.repeats,
        args.warmup,
        args.topology,
        args.timeout_s,
        date=args.date or "",
        rounds=args.rounds,
    )
    world_size = world_size_to_be("profile", args.nproc)
    if args.topology is not None:
        check_topology_ranks(load_topology(args.topology), world_size)
    reports, samples = run_on_ranks(profile_worker, run_profile, spec, args.nproc, args.join_timeout_s)
    if not reports:
        return 0
    outcome = fit_profile(samples, warn=_warn)
    topology = measured_topology(outcome, args.topology, args.name)
    write_topology(topology, args.output)
    table = sys.stdout if args.output != "-" else sys.stderr
    print(format_fits(outcome), file=table)
    sizes = ",".join(format_size(s) for s in spec.sizes)
    print(f"wrote {args.output}: {topology.num_ranks} ranks, {outcome.provenance.backend}, sizes {sizes}", file=table)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``profile`` to ``subparsers``."""
    profile = subparsers.add_parser(
        "profile",
        description="Run under torchrun (rank 0 writes) or with --nproc N local gloo ranks. Without --topology the "
        "ranks are one host: a lone pair 0->1 and a ring shift (every rank to the next at once) give a star model "
        "(rank -> host_tx -> host_rx -> rank) whose shared link carries what concurrent transfers reach together. "
        "With --topology, one pair per link class of it is timed alone and its links of that class take the "
        "measured figures. Each size: the median over repeats of the slowest rank; alpha and bandwidth by "
        "least squares on relative residuals.",
    )
    profile.add_argument("-o", "--output", required=True, help="topology file to write ('-' for stdout)")
    profile.add_argument(
        "--sizes",
        default=DEFAULT_PROFILE_SIZES,
        help=f"message sizes (default {DEFAULT_PROFILE_SIZES}, growing x4; {SIZE_SUFFIXES_HELP})",
    )
    profile.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_PROFILE_REPEATS,
        help=f"timed repeats per size (default {DEFAULT_PROFILE_REPEATS})",
    )
    profile.add_argument(
        "--rounds",
        type=int,
        help="rounds of transfers back to back in one timed sample (default: ranks - 1, a ring's steps; "
        "with --topology 1)",
    )
    profile.add_argument("--warmup", type=int, default=1, help="untimed rounds per size (default 1)")
    profile.add_argument(
        "--topology",
        "-t",
        metavar="TOPO",
        help="a probed topology file or built-in name: time one pair per link class and merge into it",
    )
    profile.add_argument("--name", help="name of the written topology (default: measured, or TOPO's)")
    profile.add_argument("--date", help="date to record in the provenance (default: today, UTC)")
    profile.add_argument(
        "--nproc", type=int, metavar="N", help="start N local gloo ranks instead of running under torchrun"
    )
    profile.add_argument(
        "--timeout-s", type=float, default=60.0, help="longest wait for one message, seconds (default 60)"
    )
    profile.add_argument(
        "--join-timeout-s", type=float, default=600.0, help="with --nproc: deadline for all ranks, seconds"
    )
    profile.set_defaults(func=_profile)
