"""``taccl simulate`` and ``taccl baseline``: predict an algorithm's (or an MSCCL++ plan's) time, build a baseline."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taccl_py._io import read_text
from taccl_py.baselines import best_baselines, nccl_best_times
from taccl_py.baselines.nvls import NvlsTime, nvls_times_for
from taccl_py.bounds import ALLREDUCE_BOUND_NOTE, IN_NETWORK_BOUND_NOTE, bound_label, lower_bounds
from taccl_py.cli._output import (
    ALGORITHM_FILE_HELP,
    NVLS_HEADERS,
    format_ratio,
    format_table,
    nvls_cells,
    progress_to_stderr,
)
from taccl_py.cli._topology import add_model_option, add_topology_options, topology_from_args, topology_name
from taccl_py.errors import ArgumentError
from taccl_py.files import parse_any_algorithm, read_any_algorithm
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import AlgorithmLibrary, read_library, shipped_library_paths, shipped_node_counts
from taccl_py.mscclpp.parse import looks_like_mscclpp_plan, parse_mscclpp_plan
from taccl_py.mscclpp.plan import ExecutionPlan
from taccl_py.mscclpp.simulate import prepare_plan_simulation
from taccl_py.placement.groups import library_topology
from taccl_py.simulate import (
    SimulationPlan,
    SimulationResult,
    execution_model,
    prepare_simulation,
    simulate_plan,
    simulation_result_to_dict,
)
from taccl_py.simulate.bands import BandRun, library_bound_label, simulate_library
from taccl_py.simulate.plot import plot_format, plot_timeline
from taccl_py.topology.builtins import builtin_topology_name, builtin_topology_names
from taccl_py.topology.model import Topology
from taccl_py.units import SIZE_SUFFIXES_HELP, format_size, parse_sizes

__all__ = ["register", "format_simulation_table"]

_PROGRESS = progress_to_stderr()

DEFAULT_SIZES = "1KB,32KB,1MB,32MB,1GB"
LIBRARY_SUFFIX = ".library.json"
LIBRARY_HEADERS = ("size", "band", "time (us)")
NCCL_HEADERS = ("nccl best", "nccl (us)", "vs nccl")
NATIVE_NOTE = "native: the backend's own collective (NCCL) runs there; its time is NCCL's best modelled"


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


def _shipped_library(source: str, machine: str, nodes: int, collective: str | None) -> AlgorithmLibrary:
    """Return built-in ``machine``'s shipped library of ``collective`` at ``nodes`` nodes."""
    if collective is None:
        raise ArgumentError(source, "--collective", "not given with a machine name", "--collective to pick its library")
    counts = shipped_node_counts(machine)
    paths = shipped_library_paths(machine, nodes)
    if not paths:
        shipped = [name for name in builtin_topology_names() if shipped_node_counts(name)]
        expected = f"one of {', '.join(map(str, counts))} nodes" if counts else "a machine among " + ", ".join(shipped)
        raise ArgumentError(source, "--nodes", f"no shipped library at {nodes} nodes", expected)
    found = [path for path in paths if path.name == f"{collective}{LIBRARY_SUFFIX}"]
    if not found:
        names = ", ".join(path.name.removesuffix(LIBRARY_SUFFIX) for path in paths)
        raise ArgumentError(source, "--collective", f"no shipped {collective} library at {nodes} nodes", names)
    return read_library(found[0])


def _library_source(args: argparse.Namespace) -> tuple[AlgorithmLibrary, Topology] | None:
    """Return the library FILE names (a ``*.library.json``, or a built-in machine's shipped one) and the topology
    to run it on; None when FILE is an algorithm or a plan.

    A machine name runs on that machine at ``--nodes`` (``--nic-down``, ``--nic-speed`` apply); a
    library file on ``--topology``/``--cluster`` where given, else on the machine it names. A
    process group's library (``--parallel``, ``--ranks``) runs on its group's part of that machine
    set, its links shared as when it was made.
    """
    source = str(args.file)
    machine = None if Path(source).exists() else builtin_topology_name(source)
    if not source.endswith(LIBRARY_SUFFIX) and machine is None:
        if args.collective is not None:
            raise ArgumentError(source, "--collective", "given with an algorithm file", "a library or a machine name")
        return None
    if args.plot is not None:
        raise ArgumentError(source, "--plot", "given with a library", "an algorithm file to draw")
    chosen = topology_name(args) is not None or args.cluster is not None
    if machine is not None:
        if chosen:
            raise ArgumentError(source, "--topology", "given with a machine name", "a library file to run elsewhere")
        library = _shipped_library(source, machine, args.nodes, args.collective)
        return library, topology_from_args(argparse.Namespace(**{**vars(args), "topology": machine}))
    library = read_library(source)
    if args.collective not in (None, library.collective.value):
        fault, expected = f"{args.collective} for a library of {library.collective.value}", "no --collective"
        raise ArgumentError(source, "--collective", fault, expected)
    if chosen:
        return library, library_topology(topology_from_args(args), library)
    if builtin_topology_name(library.topology) is None:
        raise ArgumentError(source, "topology", f"{library.topology!r} is no built-in machine", "--topology for it")
    if args.nodes not in (1, library.nodes):
        expected = f"--nodes {library.nodes}, or --topology to run it elsewhere"
        raise ArgumentError(source, "--nodes", f"{args.nodes} for a library of {library.nodes} nodes", expected)
    named = argparse.Namespace(**{**vars(args), "topology": library.topology})
    return library, library_topology(topology_from_args(named, nodes=library.nodes), library)


def _library_record(library: AlgorithmLibrary, run: BandRun, nccl: Any) -> dict[str, Any]:
    """Return one size of ``taccl simulate LIBRARY``: the band, its time (µs), its fraction of the bound, NCCL's best.

    A native band (or a size no band covers) runs NCCL's own collective: its time is NCCL's.
    """
    band = None if run.band is None else library.bands[run.band]
    time_us = run.result.time_us if run.result is not None else (None if nccl is None else nccl.time_us)
    return {
        "size_bytes": run.size_bytes,
        "band": run.band,
        "band_algorithm": None if band is None else band.algorithm_file,
        "native": run.result is None,
        "time_us": time_us,
        "bound_time_us": run.bound.time_us,
        "fraction_of_bound": None if time_us is None else run.bound.time_us / time_us,
        "nccl_best": None if nccl is None else {"algorithm": nccl.name, "time_us": nccl.time_us},
        "vs_nccl": None if nccl is None or time_us is None else nccl.time_us / time_us,
    }


def _library_row(record: dict[str, Any]) -> tuple[str, ...]:
    """Return the table cells of one ``_library_record``."""
    band = "-" if record["band"] is None else str(record["band"])
    time_us, fraction = record["time_us"], record["fraction_of_bound"]
    row = (
        format_size(record["size_bytes"]),
        f"{band} native" if record["native"] else band,
        "-" if time_us is None else f"{time_us:.2f}",
        "-" if fraction is None else f"{fraction:.3f}",
    )
    nccl = record["nccl_best"]
    if nccl is None:
        return row
    return row + (nccl["algorithm"], f"{nccl['time_us']:.2f}", format_ratio(record["vs_nccl"]))


def _simulate_library(
    args: argparse.Namespace, sizes: tuple[int, ...], library: AlgorithmLibrary, topology: Topology
) -> int:
    """Print, per size, the band ``library`` runs on ``topology``, its time, fraction of the bound and NCCL's best."""
    if library.num_ranks != topology.num_ranks:
        fault = f"{library.num_ranks} ranks but topology {topology.name} has {topology.num_ranks} GPUs"
        raise ArgumentError(str(args.file), "num_ranks", fault, "a library for the topology's rank count")
    model = execution_model(args.model)
    runs = simulate_library(library, topology, sizes, model=model)
    nccl: list[Any] = [None] * len(runs)
    if not args.no_baselines:  # a minute or more across 8 machines: NCCL's ring and tree are built and simulated
        _PROGRESS(f"modelling NCCL's algorithms on {topology.name} at {len(sizes)} sizes")
        nccl = list(nccl_best_times(topology, library.collective, sizes, model=model))
    records = [_library_record(library, run, best) for run, best in zip(runs, nccl)]
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    label = library_bound_label(topology, library.collective)
    headers = LIBRARY_HEADERS + (f"of {label}",) + (() if args.no_baselines else NCCL_HEADERS)
    print(
        f"{library.topology} n{library.nodes} {library.collective.value} library: {len(library.bands)} bands, "
        f"{topology.num_ranks} ranks on {topology.name} ({model.name} model)"
    )
    print(format_table(headers, [_library_row(record) for record in records]))
    if any(record["native"] for record in records):
        print(f"note: {NATIVE_NOTE}")
    if library.collective is Collective.ALLREDUCE:
        print(f"note: {IN_NETWORK_BOUND_NOTE if label != bound_label(library.collective) else ALLREDUCE_BOUND_NOTE}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.sizes, "--sizes")
    library = _library_source(args)
    if library is not None:
        return _simulate_library(args, sizes, *library)
    if args.plot is not None:
        from taccl_py.simulate.plot import require_matplotlib

        plot_format(args.plot)
        require_matplotlib()
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``simulate`` to ``subparsers``."""
    sim = subparsers.add_parser(
        "simulate",
        description="Replay the algorithm in the alpha-beta model with fair link sharing; print time, bandwidths, "
        "the fraction of the lower bound reached and the fastest baseline at each size.",
    )
    sim.add_argument(
        "file",
        metavar="FILE",
        help=ALGORITHM_FILE_HELP + "; an MSCCL++ execution plan (.json); a *.library.json; or a built-in machine "
        "name with --collective (its shipped library at --nodes): per size, the band run against NCCL's best",
    )
    add_topology_options(sim)
    sim.add_argument("--collective", "-c", choices=[c.value for c in Collective], help="with a machine name")
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
