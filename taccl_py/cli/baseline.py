"""``taccl baseline``: write a baseline schedule, or print NCCL's modelled NVLS or PAT times (no schedule exists).

The schedule kinds (ring, tree, hierarchical, trees, direct) are built, verified and written as
taccl JSON or MSCCL-IR XML. ``nvls`` and ``pat`` are NCCL's own algorithms that no schedule of
ours expresses (``taccl_py.baselines.nccl``): the command prints their modelled time per size with
the bandwidths and the fraction of the bound that holds for them, and refuses ``-o``.
"""

from __future__ import annotations

import argparse

from taccl_py.baselines import BaselineKind, build_baseline, nccl_modelled_times
from taccl_py.baselines.nccl import NCCL_NVLS, NCCL_NVLS_TREE, NCCL_PAT, ModelledTime
from taccl_py.baselines.ring import ring_steps_per_threadblock
from taccl_py.bounds import bound_label
from taccl_py.cli._output import format_table, progress_to_stderr
from taccl_py.cli._runtime import add_runtime_argument, xml_target
from taccl_py.cli._topology import add_topology_options, topology_from_args
from taccl_py.errors import ArgumentError
from taccl_py.files import algorithm_format, write_any_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.msccl.limits import RuntimeLimits, check_steps_per_threadblock
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_size, parse_sizes

__all__ = ["register", "format_modelled_table", "MODELLED_KINDS"]

_PROGRESS = progress_to_stderr()

#: NCCL's algorithms that no schedule expresses, by the CLI's kind: the names they print as, the collective by default.
MODELLED_KINDS = {"nvls": ((NCCL_NVLS, NCCL_NVLS_TREE), "allreduce"), "pat": ((NCCL_PAT,), "allgather")}
_WHERE = {
    "nvls": "a machine whose NVSwitch reduces (dgx-h100); allreduce on several machines, any on one",
    "pat": "one GPU per machine on several machines, allgather or reducescatter",
}
DEFAULT_SIZES = "64KB,1MB,16MB,64MB,256MB,1GB"
IN_NETWORK_LABEL = "in-network bound"


def format_modelled_table(times: tuple[ModelledTime, ...]) -> str:
    """Return one row per size: the modelled algorithm, its time, algbw, busbw and fraction of its bound.

    AllReduce's bound is the in-network reduction bound (``bounds.reduction``), the others' the cut bound.
    """
    collective = times[0].collective if times else Collective.ALLREDUCE
    label = IN_NETWORK_LABEL if collective is Collective.ALLREDUCE else bound_label(collective)
    headers = ("size", "algorithm", "time (us)", "algbw (GB/s)", "busbw (GB/s)", f"of {label}")
    rows = [
        (
            format_size(t.size_bytes),
            t.algorithm,
            f"{t.time_us:.2f}",
            f"{t.algbw_GBps:.2f}",
            f"{t.busbw_GBps:.2f}",
            f"{t.fraction_of_bound:.3f}",
        )
        for t in times
    ]
    return format_table(headers, rows)


def _modelled(args: argparse.Namespace) -> int:
    names, default_collective = MODELLED_KINDS[args.kind]
    collective = args.collective or default_collective
    if args.output is not None:
        raise ArgumentError(
            args.output,
            "-o",
            f"{args.kind} is NCCL's own algorithm, modelled: no schedule of ours expresses it",
            "no -o (the command prints its modelled times)",
        )
    for option, value in (("--channels", args.channels), ("--chunks", args.chunks), ("--size", args.size)):
        if value is not None:
            raise ArgumentError(None, option, f"given with {args.kind}", "--sizes for the modelled times")
    topology = topology_from_args(args)
    sizes = parse_sizes(args.sizes or DEFAULT_SIZES, "--sizes")
    found = {n: t for n, t in nccl_modelled_times(topology, collective, sizes).items() if n in names}
    if not found:
        fault = f"NCCL runs no {args.kind} {collective} on {topology.name} ({topology.num_ranks} GPUs)"
        raise ArgumentError(topology.name, "--topology", fault, _WHERE[args.kind])
    ((name, times),) = found.items()
    print(f"{name}: {collective}, {topology.num_ranks} GPUs on {topology.name}, modelled from NCCL's tuning")
    print(format_modelled_table(times))
    print(f"note: {name} cannot be written as a schedule (no switch or PAT steps in our IR); -o is refused")
    return 0


def _check_ring_fits(args: argparse.Namespace, topology_name: str, num_ranks: int, limits: RuntimeLimits) -> None:
    """Raise ``ArgumentError`` before building when a ring's threadblocks need more steps than ``limits`` allow."""
    if args.kind != BaselineKind.RING.value or (args.chunks is not None and args.chunks < 1):
        return  # other kinds' step counts are known once built; a bad --chunks is the builder's to refuse
    chunks = 1 if args.chunks is None else args.chunks
    steps = ring_steps_per_threadblock(args.collective, num_ranks, chunks)
    fault = (
        f"at least {steps} steps per threadblock ({num_ranks} ranks, {chunks} chunk{'s' * (chunks > 1)} per channel)"
    )
    check_steps_per_threadblock(topology_name, f"ring {args.collective}", steps, fault, limits)


def _baseline(args: argparse.Namespace) -> int:
    if args.kind in MODELLED_KINDS:
        return _modelled(args)
    if args.collective is None:
        raise ArgumentError(None, "--collective", f"missing for {args.kind}", "the collective to build")
    if args.output is None:
        raise ArgumentError(None, "-o", f"missing for {args.kind}", "an output file: *.json or *.xml ('-' for stdout)")
    if args.sizes is not None:
        raise ArgumentError(None, "--sizes", f"given with {args.kind}", "nvls or pat (modelled times)")
    fmt = algorithm_format(args.output)
    limits = xml_target(args.runtime, None, xml=fmt == "xml", path=args.output)
    topology = topology_from_args(args)
    size = parse_size(args.size, "--size") if args.size is not None else None
    if fmt == "xml":
        _check_ring_fits(args, topology.name, topology.num_ranks, limits)
    algorithm = build_baseline(
        args.kind, topology, args.collective, args.chunks, channels=args.channels, size_bytes=size
    )
    write_any_algorithm(algorithm, args.output, limits.dialect if fmt == "xml" else None, runtime=limits.runtime)
    if args.output != "-":
        _PROGRESS(
            f"wrote {args.output} ({algorithm.name}: {algorithm.collective.value}, {algorithm.num_ranks} ranks, "
            f"{algorithm.chunks_per_loop} chunks, {algorithm.num_channels} channels)"
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``baseline`` to ``subparsers``."""
    base = subparsers.add_parser(
        "baseline",
        description="Build the baseline for the topology, verify it and write it (.json or MSCCL-IR .xml); "
        "for nvls or pat (NCCL's own algorithms, which no schedule expresses) print their modelled times.",
    )
    base.add_argument(
        "kind",
        choices=[k.value for k in BaselineKind] + list(MODELLED_KINDS),
        help="ring, tree (allreduce only), hierarchical, trees (spanning-tree packing) or doubling (Bruck's doubling "
        "per rail, two or more machines); for alltoall direct or "
        "hierarchical; nvls (NCCL's NVLS, NVLS-Tree across machines) or pat (one GPU per machine): times only",
    )
    add_topology_options(base)
    base.add_argument(
        "--collective",
        "-c",
        choices=[c.value for c in Collective],
        help="the collective (required but for nvls: allreduce, and pat: allgather)",
    )
    base.add_argument(
        "--channels",
        type=int,
        help="rings or trees in parallel, or trees per rank for packed trees (default: as the topology suggests)",
    )
    base.add_argument(
        "--chunks",
        type=int,
        help="pieces per channel, the pipeline depth (default: 1; trees 4); hierarchical alltoall: messages per "
        "parcel of one machine's blocks; doubling: blocks per network send (default: one send per earlier step)",
    )
    base.add_argument(
        "--size", help=f"packed trees: the size their pipeline depth is tuned for (e.g. 64MB; {SIZE_SUFFIXES_HELP})"
    )
    base.add_argument("--sizes", help=f"nvls and pat: the sizes to model, a list or a range (default {DEFAULT_SIZES})")
    base.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output file: *.json or *.xml ('-' for JSON on stdout); required but for nvls and pat, which refuse it",
    )
    add_runtime_argument(base)
    base.set_defaults(func=_baseline)
