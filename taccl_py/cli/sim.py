"""``taccl simulate`` and ``taccl baseline``: predict an algorithm's (or an MSCCL++ plan's) time, build a baseline."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from taccl_py._io import read_text
from taccl_py.baselines import BaselineKind, best_baselines, build_baseline
from taccl_py.baselines.nvls import NvlsTime, nvls_times_for
from taccl_py.baselines.ring import ring_steps_per_threadblock
from taccl_py.bounds import ALLREDUCE_BOUND_NOTE, bound_label, lower_bounds
from taccl_py.cli._model import add_model_option
from taccl_py.cli._output import (
    ALGORITHM_FILE_HELP,
    NVLS_HEADERS,
    format_ratio,
    format_table,
    nvls_cells,
    progress_to_stderr,
)
from taccl_py.cli._runtime import add_runtime_argument, xml_target
from taccl_py.cli._topology import add_topology_options, topology_from_args
from taccl_py.errors import ArgumentError
from taccl_py.files import algorithm_format, parse_any_algorithm, read_any_algorithm, write_any_algorithm
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.msccl.limits import RuntimeLimits, check_steps_per_threadblock
from taccl_py.mscclpp.parse import looks_like_mscclpp_plan, parse_mscclpp_plan
from taccl_py.mscclpp.plan import ExecutionPlan
from taccl_py.mscclpp.simulate import prepare_plan_simulation
from taccl_py.simulate import (
    SimulationPlan,
    SimulationResult,
    execution_model,
    prepare_simulation,
    simulate_plan,
    simulation_result_to_dict,
)
from taccl_py.simulate.plot import plot_format, plot_timeline
from taccl_py.topology.model import Topology
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_size, parse_sizes

__all__ = ["register", "format_simulation_table"]

_PROGRESS = progress_to_stderr()

DEFAULT_SIZES = "1KB,32KB,1MB,32MB,1GB"


def format_simulation_table(
    results: list[SimulationResult],
    baselines: list[tuple[str, float] | None],
    *,
    nvls: Sequence[NvlsTime] = (),
) -> str:
    """Return the table of ``taccl simulate``: one row per size, with the best baseline beside it.

    ``of bound`` is the lower bound over our time (AllReduce: the ReduceScatter+AllGather class
    bound, ``of RS+AG bound``). ``speedup`` is the baseline's time over ours (above 1:
    ours is faster). With ``nvls`` (AllReduce on an NVLink SHARP machine), NCCL's modelled NVLS
    time and its time over ours (``vs nvls``) close each row; AllReduce tables end with a note.
    """
    label = bound_label(results[0].collective) if results else "bound"
    headers = ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", f"of {label}")
    headers += ("best baseline", "baseline (us)", "speedup") + (NVLS_HEADERS if nvls else ())
    rows = []
    for index, (result, baseline) in enumerate(zip(results, baselines)):
        name, time_us = baseline if baseline is not None else ("-", None)
        row = (
            format_size(result.size_bytes),
            f"{result.time_us:.2f}",
            f"{result.algbw_GBps:.2f}",
            f"{result.busbw_GBps:.2f}",
            f"{result.fraction_of_bound:.3f}",
            name,
            "-" if time_us is None else f"{time_us:.2f}",
            "-" if time_us is None else format_ratio(time_us / result.time_us),
        )
        if nvls:
            row += nvls_cells(nvls[index].time_us, result.time_us)
        rows.append(row)
    table = format_table(headers, rows)
    if results and results[0].collective is Collective.ALLREDUCE:
        table += f"\nnote: {ALLREDUCE_BOUND_NOTE}"
    return table


def _read_program(args: argparse.Namespace) -> Algorithm | ExecutionPlan:
    """Return FILE as an MSCCL++ plan (JSON that looks like one) or else as an algorithm."""
    # an MSCCL++ plan is JSON: a .json file or stdin is looked at first (as ``taccl verify`` does)
    text = read_text(args.file) if args.file == "-" or str(args.file).endswith(".json") else None
    if text is not None and looks_like_mscclpp_plan(text):
        return parse_mscclpp_plan(text, str(args.file))
    return parse_any_algorithm(text, args.file) if args.file == "-" else read_any_algorithm(args.file)


def _prepared(args: argparse.Namespace, program: Algorithm | ExecutionPlan, topology: Topology) -> SimulationPlan:
    """Return the replay tables of ``program`` on ``topology`` under ``--model``."""
    model = execution_model(args.model)
    if isinstance(program, ExecutionPlan):
        if len(program.gpus) != topology.num_ranks:
            raise ArgumentError(
                args.file,
                "gpus",
                f"{len(program.gpus)} GPUs but topology {topology.name} has {topology.num_ranks}",
                "a plan for the topology's rank count (check --topology and --nodes)",
            )
        return prepare_plan_simulation(program, topology, model=model)
    if program.num_ranks != topology.num_ranks:
        raise ArgumentError(
            args.file,
            "num_ranks",
            f"{program.num_ranks} ranks but topology {topology.name} has {topology.num_ranks} GPUs",
            "an algorithm for the topology's rank count (check --topology and --nodes)",
        )
    return prepare_simulation(program, topology, model=model)


def _simulate(args: argparse.Namespace) -> int:
    if args.plot is not None:
        from taccl_py.simulate.plot import require_matplotlib

        plot_format(args.plot)
        require_matplotlib()
    sizes = parse_sizes(args.sizes, "--sizes")
    read = _read_program(args)
    topology = topology_from_args(args)
    prepared = _prepared(args, read, topology)
    program = prepared.algorithm
    bounds = lower_bounds(topology, program.collective, sizes)
    results = [simulate_plan(prepared, size, bound_time_us=bound.time_us) for size, bound in zip(sizes, bounds)]
    old_bounds = [bound.cut_only_time_us for bound in bounds]
    nvls = nvls_times_for(topology, program.collective, sizes)
    baselines: list[tuple[str, float] | None] = [None] * len(results)
    if not args.no_baselines:
        found = best_baselines(
            topology, program.collective, sizes, progress=_PROGRESS, model=execution_model(args.model)
        )
        baselines = [(base.name, result.time_us) for base, result in found]
    if args.plot is not None:
        largest = max(sizes)
        plot_timeline(simulate_plan(prepared, largest, record_timeline=True), args.plot)
        _PROGRESS(f"wrote {args.plot} (timeline at {format_size(largest)})")
    if args.json:
        out: list[dict[str, Any]] = []
        for index, (result, baseline) in enumerate(zip(results, baselines)):
            record = simulation_result_to_dict(result)
            record["cut_only_bound_time_us"] = old_bounds[index]
            record["fraction_of_cut_only_bound"] = old_bounds[index] / result.time_us if result.time_us > 0 else None
            record["nccl_nvls"] = (
                None
                if not nvls
                else {
                    "algorithm": nvls[index].algorithm,
                    "time_us": nvls[index].time_us,
                    "speedup": nvls[index].time_us / result.time_us,
                }
            )
            record["best_baseline"] = (
                None
                if baseline is None
                else {
                    "name": baseline[0],
                    "time_us": baseline[1],
                    "speedup": baseline[1] / result.time_us,
                }
            )
            out.append(record)
        print(json.dumps(out, indent=2))
    else:
        print(f"{program.name}: {program.collective.value}, {program.num_ranks} ranks on {topology.name}")
        print(format_simulation_table(results, baselines, nvls=nvls))
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
    """Add ``simulate`` and ``baseline`` to ``subparsers``."""
    sim = subparsers.add_parser(
        "simulate",
        description="Replay the algorithm in the alpha-beta model with fair link sharing; print time, bandwidths, "
        "the fraction of the lower bound reached and the fastest baseline at each size.",
    )
    sim.add_argument("file", metavar="FILE", help=ALGORITHM_FILE_HELP + "; or an MSCCL++ execution plan (.json)")
    add_topology_options(sim)
    sim.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"nccl-tests sizes, a list or a range LOW-HIGH (default {DEFAULT_SIZES}; {SIZE_SUFFIXES_HELP})",
    )
    sim.add_argument("--plot", metavar="IMAGE", help="also draw the timeline at the largest size (.png or .svg)")
    sim.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sim.add_argument("--no-baselines", action="store_true", help="skip simulating the baselines")
    add_model_option(sim)
    sim.set_defaults(func=_simulate)

    base = subparsers.add_parser(
        "baseline",
        description="Build the baseline for the topology, verify it and write it (.json or MSCCL-IR .xml).",
    )
    base.add_argument(
        "kind",
        choices=[k.value for k in BaselineKind],
        help="ring, tree (allreduce only), hierarchical or trees (spanning-tree packing); "
        "for alltoall direct or hierarchical",
    )
    add_topology_options(base)
    base.add_argument("--collective", "-c", required=True, choices=[c.value for c in Collective], help="the collective")
    base.add_argument(
        "--channels",
        type=int,
        help="rings or trees in parallel, or trees per rank for packed trees (default: as the topology suggests)",
    )
    base.add_argument(
        "--chunks",
        type=int,
        help="pieces per channel, the pipeline depth (default: 1; trees 4); hierarchical alltoall: messages per "
        "parcel of one machine's blocks",
    )
    base.add_argument(
        "--size", help=f"packed trees: the size their pipeline depth is tuned for (e.g. 64MB; {SIZE_SUFFIXES_HELP})"
    )
    base.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="output file: *.json or *.xml ('-' for JSON on stdout)"
    )
    add_runtime_argument(base)
    base.set_defaults(func=_baseline)
