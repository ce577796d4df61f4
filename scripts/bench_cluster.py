"""Benchmark synthesis on heterogeneous and degraded clusters (issue 15) against baselines and the bound.

For each cluster and collective the synthesizer runs once over all sizes (``--jobs`` workers);
per size the table gives the chosen algorithm's simulated time, its fraction of the cut bound and
its speed-up over the best baseline built for the same cluster in the same run. For a degraded
cluster (a NIC down, a NIC slower) it also simulates, on the degraded cluster, the algorithm a
user of the healthy cluster already has (the shipped library's band for that size) and reports
how much re-synthesis buys (``resynth gain``: that algorithm's time over ours).

    python scripts/bench_cluster.py                                   # the three target clusters
    python scripts/bench_cluster.py --clusters slownic --collectives allgather --sizes 16MB --no-write

A run of some clusters or collectives keeps the CSV's rows of the others (the table shows both).

    python scripts/bench_cluster.py --explain --sizes 64MB                # what bounds AllGather, no synthesis
    python scripts/bench_cluster.py --sizes 64MB --model msccl --no-write  # under another model

The CSV and the BENCHMARKS section hold the default model's (``msccl-net``) figures, so a run under
another model writes neither.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from bench_harness import (
    COLLECTIVES,
    DATA_DIR,
    add_collectives_argument,
    add_jobs_argument,
    add_no_write_argument,
    add_sizes_argument,
    argument_parser,
    command_line,
    csv_output,
    csv_pointer,
    log,
    markdown_table,
    read_csv,
    speedup,
    split_names,
    update_benchmarks_section,
)

from taccl_py.baselines.shipped import shipped_alternatives
from taccl_py.bounds import lower_bound
from taccl_py.ir.collectives import Collective
from taccl_py.simulate import DEFAULT_MODEL, EXECUTION_MODELS, ExecutionModel, execution_model, simulate
from taccl_py.solvers import SolverOptions
from taccl_py.stages.logical import build_logical_graph
from taccl_py.stages.lower_schedule import lower_schedule
from taccl_py.stages.ordering import order_sends
from taccl_py.stages.scheduling import schedule_sends
from taccl_py.stages.sketch import auto_sketch
from taccl_py.stages.tree_packing import pack_trees, packed_routing
from taccl_py.synth import synthesize
from taccl_py.topology.cluster import load_cluster
from taccl_py.units import format_size, parse_sizes
from taccl_py.verify import check_algorithm


@dataclass(frozen=True)
class ClusterCase:
    """A benchmarked cluster: the ``load_cluster`` options, and whether it degrades one healthy machine kind."""

    key: str
    label: str
    options: dict
    degraded: bool


CASES = (
    ClusterCase("mixed", "dgx-a100 x2 + dgx-h100 x2", {"cluster": "dgx-a100:2,dgx-h100:2"}, False),
    ClusterCase(
        "nicdown",
        "dgx-a100 x4, n1.nic3 down",
        {"topology": "dgx-a100", "nodes": 4, "nics_down": ["1:nic3"]},
        True,
    ),
    ClusterCase(
        "slownic",
        "ndv2 x2, n1.nic0 at half speed",
        {"topology": "ndv2", "nodes": 2, "nic_speeds": ["1:nic0:4.76"]},
        True,
    ),
)
DEFAULT_SIZES = "1MB,4MB,16MB,64MB,256MB,1GB"
#: Sizes from which the issue's target of 0.9 of the bound applies (bytes).
TARGET_FROM_BYTES = 16_000_000
TARGET_FRACTION = 0.9
CSV_PATH = DATA_DIR / "cluster_per_size.csv"
CSV_HEADER = (
    "cluster",
    "collective",
    "size",
    "size_bytes",
    "chosen",
    "ours_us",
    "of_bound",
    "synth_us",
    "baseline",
    "baseline_us",
    "vs_baseline",
    "healthy_alg_us",
    "resynth_gain",
    "synth_wall_s",
)


def _cell(value: object) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def bench_case(
    case: ClusterCase, collective: Collective, sizes: tuple[int, ...], jobs: int, model: ExecutionModel = DEFAULT_MODEL
) -> list[tuple]:
    """Return the CSV rows of one cluster and collective: synthesize, compare, and time the healthy algorithm."""
    topology = load_cluster(**case.options)
    start = time.perf_counter()
    result = synthesize(topology, collective, sizes=sizes, jobs=jobs, progress=None, model=model)
    wall_s = time.perf_counter() - start
    # The healthy cluster's shipped band for each size, run on the degraded one (what its users have).
    shipped = shipped_alternatives(topology, collective, sizes, model) if case.degraded else (None,) * len(sizes)
    healthy = [None if found is None else found[1].time_us for found in shipped]
    rows = []
    for choice, healthy_us in zip(result.choices, healthy):
        ours = choice.chosen_result
        baseline_us = choice.baseline.time_us if choice.baseline else None
        rows.append(
            (
                case.key,
                collective.value,
                format_size(choice.size_bytes),
                choice.size_bytes,
                choice.baseline_name if choice.baseline_chosen else "synthesized",
                ours.time_us,
                ours.fraction_of_bound,
                choice.synthesized.time_us if choice.synthesized else None,
                choice.baseline_name,
                baseline_us,
                speedup(baseline_us, ours.time_us),
                healthy_us,
                speedup(healthy_us, ours.time_us),
                round(wall_s, 1),
            )
        )
    return rows


def summary_rows(records: list[dict]) -> list[tuple]:
    """Return one row per cluster and collective: worst fraction of bound from 16 MB, speed-ups, wall time."""
    rows = []
    for case in CASES:
        for collective in COLLECTIVES:
            mine = [r for r in records if r["cluster"] == case.key and r["collective"] == collective]
            if not mine:
                continue
            large = [r["of_bound"] for r in mine if r["size_bytes"] >= TARGET_FROM_BYTES]
            versus = [r["vs_baseline"] for r in mine if r["vs_baseline"] is not None]
            gains = [r["resynth_gain"] for r in mine if r["resynth_gain"] is not None]
            rows.append(
                (
                    case.label,
                    collective,
                    f"{min(large):.3f}" if large else "-",
                    "yes" if large and min(large) >= TARGET_FRACTION else "no",
                    f"{min(versus):.3f}x-{max(versus):.2f}x" if versus else "-",
                    f"{min(gains):.2f}x-{max(gains):.2f}x" if gains else "-",
                    f"{mine[0]['synth_wall_s']:.0f}",
                )
            )
    return rows


def explain(case: ClusterCase, size_bytes: int, pieces: int = 4) -> tuple:
    """Return one row of what bounds AllGather on ``case`` at ``size_bytes`` (µs): the bound and what reaches it.

    The cut bound, the tree packing's busiest resource (the fluid optimum of the routes: equal to the
    bound's bandwidth term, no bandwidth bound is tighter), and the packing's routes ordered with
    unchained NIC queues (c1, ``pieces`` pieces), simulated: when its last byte between machines
    arrives, and its whole time (the rest forwards inside the machines).
    """
    topology = load_cluster(**case.options)
    graph = build_logical_graph(topology, auto_sketch(topology))
    bound = lower_bound(topology, Collective.ALLGATHER, size_bytes)
    packing = pack_trees(graph)
    shard = size_bytes / graph.num_ranks
    routing = packed_routing(packing, 1, shard, shard / pieces)
    ordering = order_sends(routing, pieces, shard / pieces, chain_hops=False)
    schedule = schedule_sends(ordering, SolverOptions(), milp=False)
    algorithm = lower_schedule("explain", Collective.ALLGATHER, [schedule])
    check_algorithm(algorithm)
    run = simulate(algorithm, topology, size_bytes, record_timeline=True, bound_time_us=bound.time_us)
    gpn = topology.gpus_per_node
    crossing = max(r.end_us for r in run.timeline if r.src_rank // gpn != r.dst_rank // gpn)
    return (
        case.label,
        format_size(size_bytes),
        f"{bound.time_us:.1f}",
        f"{packing.load_us_per_byte * shard:.1f}",
        f"{crossing:.1f}",
        f"{run.time_us:.1f}",
        f"{run.fraction_of_bound:.3f}",
    )


def _kept_rows(rows: list[tuple]) -> list[tuple]:
    """Return the CSV's rows of the clusters and collectives this run did not redo (a partial run keeps the rest)."""
    done = {(row[0], row[1]) for row in rows}
    if not CSV_PATH.exists():
        return []
    return [
        tuple(record[column] for column in CSV_HEADER)
        for record in read_csv(CSV_PATH)
        if (record["cluster"], record["collective"]) not in done
    ]


def _row_order(row: tuple) -> tuple:
    """Return the CSV order: cluster and collective as in ``CASES`` and ``COLLECTIVES``, then size."""
    keys = [case.key for case in CASES]
    return (keys.index(row[0]), list(COLLECTIVES).index(row[1]), row[3])


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--clusters", default=",".join(case.key for case in CASES), help="comma-separated keys")
    add_collectives_argument(parser)
    add_sizes_argument(parser, DEFAULT_SIZES)
    add_jobs_argument(parser)
    add_no_write_argument(parser)
    parser.add_argument(
        "--model",
        choices=tuple(EXECUTION_MODELS),
        default=DEFAULT_MODEL.name,
        help=f"execution model (default {DEFAULT_MODEL.name})",
    )
    parser.add_argument(
        "--explain", action="store_true", help="print what bounds AllGather at each size (explain); synthesize nothing"
    )
    args = parser.parse_args(argv)
    model = execution_model(args.model)
    if model is not DEFAULT_MODEL and not args.no_write:
        parser.error(
            f"--model {args.model} needs --no-write: the CSV and BENCHMARKS hold {DEFAULT_MODEL.name}'s figures"
        )
    sizes = tuple(parse_sizes(args.sizes))
    wanted = args.clusters.split(",")
    if args.explain:
        headers = ("cluster", "size", "bound us", "packing us", "last between machines us", "unchained us", "of bound")
        print(markdown_table(headers, [explain(c, size) for c in CASES if c.key in wanted for size in sizes]))
        return 0
    rows = []
    for case in (c for c in CASES if c.key in wanted):
        for name in split_names(args.collectives):
            log(f"== {case.label} {name} {args.sizes} ({model.name})")
            case_rows = bench_case(case, Collective(name), sizes, args.jobs, model)
            for row in case_rows:
                log("   " + " | ".join(_cell(value) for value in row))
            rows.extend(case_rows)
    rows = _kept_rows(rows) + rows
    records = csv_output(CSV_PATH, CSV_HEADER, rows, key=_row_order, write=not args.no_write)
    headers = ("cluster", "collective", "min of bound >=16MB", ">= 0.9", "vs best baseline", "resynth gain", "synth s")
    body = markdown_table(headers, summary_rows(records))
    if not args.no_write:
        body += "\n\n" + csv_pointer(CSV_PATH, len(records), "Per size")
    print(body)
    if not args.no_write:
        title = "Heterogeneous and degraded clusters (simulated)"
        update_benchmarks_section("cluster", title, command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
