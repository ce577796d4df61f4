"""``taccl bench``: time an algorithm or library against torch.distributed's own collectives.

Run it under ``torchrun --nproc-per-node N taccl bench ...`` (every rank runs, rank 0 prints), or
let it start N local gloo ranks itself with ``--nproc N``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from taccl_py.cli._output import format_ratio, format_table, progress_to_stderr
from taccl_py.cli._ranks import run_on_ranks, world_size_to_be
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_sizes

__all__ = ["register", "format_rows", "DEFAULT_SIZES"]

#: Sizes timed when --sizes is not given (nccl-tests convention: AG output, RS input, AR buffer).
DEFAULT_SIZES = "64KiB-64MiB"  # powers of two, as the calibration times, so each prints whole (1MiB)
_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")


def format_rows(rows: list) -> str:
    """Return the benchmark table: per size, our time and torch's (µs), algbw (GB/s) and speedup.

    Rows with predictions (``--topology``) also show each side's predicted time (µs) and
    measured / predicted (above 1x: slower than the model says).
    """
    predicted = any(r.ours_predicted_us is not None for r in rows)
    headers = ["collective", "size", "algorithm", "ours_us", "torch_us", "ours_GBps", "torch_GBps", "speedup"]
    if predicted:
        headers += ["ours_pred_us", "ours_meas/pred", "torch_pred_us", "torch_meas/pred"]
    body = []
    for r in rows:
        cells = [
            r.collective,
            format_size(r.size_bytes),
            r.algorithm,
            f"{r.ours_time_us:.0f}",
            f"{r.torch_time_us:.0f}",
            f"{r.ours_algbw_GBps:.3f}",
            f"{r.torch_algbw_GBps:.3f}",
            format_ratio(r.speedup),
        ]
        if predicted:
            cells += [
                f"{r.ours_predicted_us:.0f}",
                format_ratio(r.ours_time_us / r.ours_predicted_us),
                f"{r.torch_predicted_us:.0f}",
                format_ratio(r.torch_time_us / r.torch_predicted_us),
            ]
        body.append(cells)
    return format_table(headers, body)


def _spec(args: argparse.Namespace):
    from taccl_py.runtime.measure.bench import BenchSpec

    if args.iters < 1 or args.warmup < 0:
        raise ArgumentError(
            None,
            "--iters/--warmup",
            f"{args.iters}/{args.warmup}",
            "at least 1 timed iteration and 0 or more warm-up ones",
        )
    if args.cluster is None and (args.nic_down or args.nic_speed):
        option = "--nic-down" if args.nic_down else "--nic-speed"
        raise ArgumentError(None, option, "given without --cluster", "--cluster SPEC too")
    library = (args.algorithm,) if args.algorithm else tuple(args.library or ())
    collectives = tuple(Collective(c).value for c in args.collective) if args.collective else None
    return BenchSpec(
        library,
        collectives,
        parse_sizes(args.sizes, "--sizes"),
        args.dtype,
        args.iters,
        args.warmup,
        args.timeout_s,
        progress_to_stderr() if args.progress else None,
        args.calibration,
        args.cluster,
        tuple(args.nic_down),
        tuple(args.nic_speed),
        args.ring,
        args.topology,
    )


def _check_inputs(spec, world_size: int) -> None:
    """Fail before starting any process when the library cannot serve ``world_size`` ranks or the calibration is bad."""
    from taccl_py.runtime.communicator.selection import collect_algorithms

    if spec.library:
        collect_algorithms(list(spec.library), world_size)
    if spec.topology is not None:
        from taccl_py.runtime.measure.profile import check_topology_ranks
        from taccl_py.topology.builtins import load_topology

        check_topology_ranks(load_topology(spec.topology), world_size)
    if spec.cluster is not None:
        from taccl_py.runtime.communicator.live_cluster import declare_cluster

        topology = declare_cluster(spec.cluster, spec.nic_down, spec.nic_speed, origin="--cluster").topology
        if topology.num_ranks != world_size:
            raise ArgumentError(
                spec.cluster, "--cluster", f"{topology.num_ranks} GPUs", f"one GPU per rank ({world_size})"
            )
    if spec.calibration is not None and os.path.exists(spec.calibration):
        from taccl_py.runtime.communicator.calibration import read_calibration

        read_calibration(spec.calibration)


def _check_write_library(args: argparse.Namespace) -> None:
    """Fail before any measurement when ``--write-library`` cannot be honoured."""
    if args.write_library is None:
        return
    if args.calibration is None:
        raise ArgumentError(None, "--write-library", "given without --calibration", "--calibration FILE as well")
    if args.ring:
        raise ArgumentError(None, "--write-library", "given with --ring", "--library files only")
    not_libraries = [item for item in args.library or [args.algorithm] if not item.endswith(".library.json")]
    if not_libraries:
        raise ArgumentError(not_libraries[0], "--write-library", "not a *.library.json", "--library files only")


def _write_calibrated_libraries(args: argparse.Namespace) -> None:
    """Write each ``--library`` file with native bands where the calibration ran the group's own collective."""
    from taccl_py.ir.library import read_library
    from taccl_py.runtime.communicator.calibration import calibrated_library, read_calibration
    from taccl_py.synth.bands import write_library

    calibration = read_calibration(args.calibration)
    folder = Path(args.write_library)
    folder.mkdir(exist_ok=True)
    for source in args.library:
        library = read_library(source)
        compress = any(band.algorithm_file.endswith(".xz") for band in library.bands)
        calibrated, target = calibrated_library(library, calibration), folder / Path(source).name
        write_library(calibrated, target, compress=compress)
        print(f"wrote {target} ({sum(band.native for band in calibrated.bands)} native bands)", file=sys.stderr)


def _bench(args: argparse.Namespace) -> int:
    spec = _spec(args)
    _check_write_library(args)
    _check_inputs(spec, world_size_to_be("bench", args.nproc))
    from taccl_py.runtime.measure.bench import bench_worker, run_bench

    reports, rows = run_on_ranks(bench_worker, run_bench, spec, args.nproc, args.join_timeout_s)
    if not reports:
        return 0
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    else:
        print(format_rows(rows))
    if spec.topology is not None:
        from taccl_py.runtime.measure.profile_model import model_error

        error = model_error(rows)
        print(error.describe(), file=sys.stderr if args.json else sys.stdout)
    if args.write_library is not None:
        _write_calibrated_libraries(args)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` to ``subparsers``."""
    bench = subparsers.add_parser(
        "bench",
        description="Run under torchrun (every rank runs, rank 0 prints) or with --nproc N local gloo ranks. "
        "Each size reports the median over iterations of the slowest rank's time, ours and torch's timed alternately.",
    )
    source = bench.add_mutually_exclusive_group(required=True)
    source.add_argument("--algorithm", metavar="FILE", help="one algorithm file (taccl JSON or MSCCL-IR XML)")
    source.add_argument(
        "--library", metavar="L", nargs="+", help="a built-in topology name, a *.library.json, or algorithm files"
    )
    source.add_argument(
        "--ring", action="store_true", help="one-channel rings in rank order (allgather, reducescatter, allreduce)"
    )
    bench.add_argument(
        "--collective",
        action="append",
        choices=[c.value for c in Collective],
        help="collective to time (repeatable; default: those the library has)",
    )
    bench.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"sizes: a list '1MB,4MB' or a range growing x4 (default {DEFAULT_SIZES}; {SIZE_SUFFIXES_HELP})",
    )
    bench.add_argument("--dtype", default="float32", choices=_DTYPES, help="element type (default float32)")
    bench.add_argument("--iters", type=int, default=10, help="timed iterations per size (default 10)")
    bench.add_argument("--warmup", type=int, default=2, help="untimed iterations per size (default 2)")
    bench.add_argument(
        "--nproc", type=int, metavar="N", help="start N local gloo ranks instead of running under torchrun"
    )
    bench.add_argument(
        "--timeout-s", type=float, default=60.0, help="longest wait for one message, seconds (default 60)"
    )
    bench.add_argument(
        "--join-timeout-s", type=float, default=1800.0, help="with --nproc: deadline for all ranks, seconds"
    )
    bench.add_argument(
        "--calibration",
        metavar="FILE",
        help="time the Communicator's choice with this calibration: read when it fits the group and library, "
        "else measured first at --sizes and written; where the group's own collective measured faster, it runs",
    )
    bench.add_argument(
        "--write-library",
        metavar="FOLDER",
        help="with --calibration and --library files: write each library there with 'native' bands where the "
        "group's own collective measured faster (the runtime then runs it there without a calibration)",
    )
    bench.add_argument(
        "--cluster",
        metavar="SPEC",
        help="the live cluster, MACHINE[:COUNT],... or a taccl-cluster/1 file (default: TACCL_CLUSTER): only "
        "algorithms made for it run, elsewhere the group's own collective (with one warning per collective)",
    )
    bench.add_argument(
        "--nic-down", metavar="NODE:NIC", action="append", default=[], help="with --cluster: a NIC down, e.g. 1:nic3"
    )
    bench.add_argument(
        "--nic-speed",
        metavar="NODE:NIC:GBPS",
        action="append",
        default=[],
        help="with --cluster: a NIC's speed in GB/s per direction, e.g. 0:nic0:12.5",
    )
    bench.add_argument(
        "--topology",
        "-t",
        metavar="TOPO",
        help="also print each time the simulator predicts on this topology (e.g. from taccl profile; one GPU per "
        "rank), measured / predicted, and the model error: ours as our executor runs it (whole chunks), torch's as "
        "gloo's rank-order ring (alltoall: every pair at once); reductions and per-round Python work cost 0 there",
    )
    bench.add_argument("--json", action="store_true", help="print the rows as JSON")
    bench.add_argument("--progress", action="store_true", help="report each size on stderr as it finishes (rank 0)")
    bench.set_defaults(func=_bench, output_folders=("write_library",))
