"""Benchmark the synthesizer on every built-in machine and write the ``synthesis`` section of BENCHMARKS.md.

For every built-in topology x {1, 2, 4} nodes x {allgather, reducescatter, allreduce} over sizes
1KB..1GB it reports the simulated time of ours (the size band's choice, and the best synthesized
candidate), of the best baseline, and the lower bound; the synthesis wall time and peak memory of
the instance (each runs in its own process, see ``build_algorithms.py``). It also compares the
2-node NDv2 AllGather in the TE-CCL model (built-in ``ndv2-teccl``) with TACCL's times as the
TE-CCL authors published them (``scripts/data/TACCL_NDv2_2_chassis_AllGather.csv``). The per-instance
and per-size rows go to ``scripts/data/synthesis_instances.csv`` and ``scripts/data/synthesis_per_size.csv``;
BENCHMARKS.md keeps a summary per machine computed from the first.

    python scripts/bench_synthesis.py --write-library --metrics /tmp/m.jsonl   # everything, hours
    python scripts/bench_synthesis.py --from-metrics /tmp/m.jsonl              # re-render only
    python scripts/bench_synthesis.py --from-metrics /tmp/m.jsonl --merge      # a partial rebuild's rows
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from bench_harness import (
    DATA_DIR,
    add_no_write_argument,
    argument_parser,
    collective_order,
    command_line,
    csv_output,
    csv_pointer,
    format_or_dash,
    group_records,
    of_bound,
    read_csv,
    speedup,
    text_table,
    update_benchmarks_section,
    write_csv,
)
from build_algorithms import add_sweep_arguments, library_path, sweep_instances

from taccl_py.ir.library import read_library
from taccl_py.simulate import simulate
from taccl_py.topology import load_topology
from taccl_py.units import format_size

TACCL_CSV = Path(__file__).resolve().parent / "data" / "TACCL_NDv2_2_chassis_AllGather.csv"
# Row order of the TE-CCL file (decimal sizes: algbw x time = size).
TACCL_SIZES = (
    10**9,
    256 * 10**6,
    64 * 10**6,
    16 * 10**6,
    4 * 10**6,
    10**6,
    256 * 10**3,
    64 * 10**3,
    16 * 10**3,
    4 * 10**3,
    10**3,
)
LARGE_BYTES = 16 * 10**6  # the ">= 16 MB" target: 0.90 of the bound
INSTANCES_CSV = DATA_DIR / "synthesis_instances.csv"
PER_SIZE_CSV = DATA_DIR / "synthesis_per_size.csv"
#: One row per instance (topology x nodes x collective); fractions of the bound are bound time / time.
INSTANCE_HEADER = (
    "topology",
    "nodes",
    "gpus",
    "collective",
    "synth_s",
    "peak_mb",
    "min_of_bound_ge16mb",
    "synth_only_min_of_bound_ge16mb",
    "of_bound_largest",
    "min_synth_speedup",
    "max_synth_speedup",
    "synth_bands",
    "bands",
    "greedy_bands",
)
#: One row per instance and size; synth_us / baseline_us / synth_speedup are empty where there is none.
PER_SIZE_HEADER = (
    "topology",
    "nodes",
    "gpus",
    "collective",
    "size",
    "size_bytes",
    "ours_us",
    "of_bound",
    "chosen",
    "synth_us",
    "baseline_us",
    "baseline",
    "bound_us",
    "synth_speedup",
)


def _instance_key(row: tuple) -> tuple:
    """CSV order of both files: topology, nodes, collective (allgather, reducescatter, allreduce)."""
    collective = row[3]
    return (
        row[0],
        row[1],
        *collective_order(collective),
    )


def _per_size_key(row: tuple) -> tuple:
    """Per-size CSV order: the instance, then size_bytes."""
    return (*_instance_key(row), row[5])


def instance_rows(metrics: list[dict]) -> list[tuple]:
    """Return the ``INSTANCE_HEADER`` rows (unformatted numbers) of the collected instance metrics."""
    out = []
    for m in metrics:
        large = [r for r in m["rows"] if r["size_bytes"] >= LARGE_BYTES]
        frac = [r["bound_us"] / r["chosen_us"] for r in large]
        syn_frac = [r["bound_us"] / r["synthesized_us"] for r in large if r["synthesized_us"]]
        speed = [speedup(r["baseline_us"], r["synthesized_us"]) for r in m["rows"]]
        speed = [s for s in speed if s is not None]
        top = m["rows"][-1]
        synthesized_bands = sum(1 for r in m["rows"] if r["chosen"].startswith("taccl-"))
        out.append(
            (
                m["topology"],
                m["nodes"],
                m["num_ranks"],
                m["collective"],
                m["wall_s"],
                # Older metrics lack the process tree's figure (forkserver workers included).
                m.get("peak_tree_MB", m["peak_rss_MB"]),
                min(frac) if frac else None,
                min(syn_frac) if syn_frac else None,
                top["bound_us"] / top["chosen_us"],
                min(speed) if speed else None,
                max(speed) if speed else None,
                synthesized_bands,
                len(m["rows"]),
                m.get("greedy_bands"),
            )
        )
    return out


def per_size_rows(metrics: list[dict]) -> list[tuple]:
    """Return the ``PER_SIZE_HEADER`` rows (unformatted numbers) of the collected instance metrics."""
    out = []
    for m in metrics:
        for r in m["rows"]:
            syn, base = r["synthesized_us"], r["baseline_us"]
            out.append(
                (
                    m["topology"],
                    m["nodes"],
                    m["num_ranks"],
                    m["collective"],
                    format_size(r["size_bytes"]),
                    r["size_bytes"],
                    r["chosen_us"],
                    of_bound(r["bound_us"], r["chosen_us"]),
                    r["chosen"],
                    syn,
                    base,
                    r["baseline"],
                    r["bound_us"],
                    speedup(base, syn),
                )
            )
    return out


def summary_table(instances: list[dict]) -> str:
    """Return the summary of ``INSTANCE_HEADER`` records (``read_csv`` of ``INSTANCES_CSV``): one row per machine.

    Over the machine's collectives: total synthesis time, largest peak memory, the worst fraction of the
    bound at >= 16MB (chosen, and synthesized alone) and at the largest size, the range of synth speedups,
    how many size bands the synthesized algorithms win, and how many of those have greedy routes.
    """

    def worst(group: list[dict], column: str, pick=min) -> float | None:
        values = [r[column] for r in group if r[column] is not None]
        return pick(values) if values else None

    rows = []
    for (topology, nodes), group in group_records(instances, "topology", "nodes").items():
        low, high = worst(group, "min_synth_speedup"), worst(group, "max_synth_speedup", max)
        rows.append(
            (
                topology,
                nodes,
                group[0]["gpus"],
                len(group),
                format_or_dash(sum(r["synth_s"] for r in group), ".1f"),
                format_or_dash(worst(group, "peak_mb", max), ".0f"),
                format_or_dash(worst(group, "min_of_bound_ge16mb"), ".3f"),
                format_or_dash(worst(group, "synth_only_min_of_bound_ge16mb"), ".3f"),
                format_or_dash(worst(group, "of_bound_largest"), ".3f"),
                "-" if low is None else f"{low:.2f}x-{high:.2f}x",
                f"{sum(r['synth_bands'] for r in group)}/{sum(r['bands'] for r in group)}",
                _greedy_total(group),
            )
        )
    headers = (
        "topology",
        "nodes",
        "GPUs",
        "collectives",
        "synth s (sum)",
        "peak MB (max)",
        "min of bound >=16MB",
        "synth only",
        "of bound 1GB",
        "synth speedup",
        "synth bands",
        "greedy",
    )
    return text_table(headers, rows)


def _greedy_total(group: list[dict]) -> str:
    """Return the sizes over ``group`` whose chosen algorithm has greedy routes ("-" if not recorded)."""
    counts = [r.get("greedy_bands") for r in group]
    return "-" if any(c is None for c in counts) else str(sum(counts))


def _teccl_section() -> str:
    """Return the side-by-side table of ours and TACCL's published times on ndv2-teccl, 2 nodes."""
    path = library_path("ndv2-teccl", 2, "allgather")
    if not path.exists():
        return "(no ndv2-teccl n2 allgather library built)"
    library = read_library(path)
    topology = load_topology("ndv2-teccl", nodes=2)
    with TACCL_CSV.open(encoding="utf-8") as handle:
        taccl = [row for row in csv.reader(handle)][1:]
    rows = []
    for size, (time_us, solver_s, _) in zip(TACCL_SIZES, taccl):
        result = simulate(library.select(size), topology, size)
        published = float(time_us)
        faster = "-" if published < 0 else f"{published / result.time_us:.2f}x"
        rows.append(
            (
                format_size(size),
                "-" if published < 0 else f"{published:.2f}",
                f"{result.time_us:.2f}",
                faster,
                f"{result.fraction_of_bound:.3f}",
                "-" if float(solver_s) < 0 else solver_s,
            )
        )
    return text_table(
        ("size", "TACCL us (published)", "ours us", "ours faster by", "ours of bound", "TACCL solver s"), rows
    )


def merge_rows(path: Path, header: tuple[str, ...], rows: list[tuple]) -> list[tuple]:
    """Return ``rows`` plus the rows of ``path`` for instances (topology, nodes, collective) that ``rows`` lack.

    For a partial rebuild: the instances it did not synthesize keep their earlier figures.
    """
    fresh = {(row[0], row[1], row[3]) for row in rows}
    kept = [
        tuple(record.get(name) for name in header)
        for record in (read_csv(path) if path.exists() else [])
        if (record["topology"], record["nodes"], record["collective"]) not in fresh
    ]
    return kept + rows


def render(instances: list[dict], per_size_count: int) -> str:
    """Return the BENCHMARKS.md body for the instance records (as ``read_csv`` returns them).

    ``per_size_count`` is the number of rows of the per-size CSV, named in the pointer to it.
    """
    return (
        "Simulated (α-β, max-min fair sharing) time of the size-band choice (`ours`: the fastest of the synthesized "
        "candidates and the baselines), of the best synthesized candidate alone (`synth`), of the best baseline "
        "(ring, tree, hierarchical), and the cut lower bound. `synth speedup` = best baseline time / best synthesized "
        "time (below 1: a baseline is faster there and the band keeps it; `-`: no synthesized candidate fit the "
        "MSCCL limits at that size). Synthesis wall time and peak memory per "
        "instance on this 2-core machine (one process per instance, all sizes 1KB-1GB, default budgets; peak: the "
        "largest total resident set of the instance and its worker processes, sampled from /proc).\n\n"
        "### Summary\n\n"
        "One row per machine over its collectives (allgather, reducescatter, allreduce): synthesis time summed, "
        "peak memory the largest, fractions of the bound the worst (`synth only`: the best synthesized candidate "
        "alone), the range of synth speedups over all sizes, the size bands a synthesized algorithm wins, and "
        "how many of those use greedy routes (`greedy`: the routing MILP found nothing better within its node "
        "budget, or a greedy routing ordered faster than the MILP's; `scripts/build_algorithms.py` metrics split "
        "the two).\n\n"
        "```\n"
        + summary_table(instances)
        + "\n```\n\n"
        + csv_pointer(INSTANCES_CSV, len(instances), "Per instance")
        + " "
        + csv_pointer(
            PER_SIZE_CSV, per_size_count, "Per instance and size (ours, synth, best baseline, bound, chosen algorithm)"
        )
        + "\n\n"
        "### NDv2 x2 AllGather in the TE-CCL model (`ndv2-teccl`) against TACCL's published times\n\n"
        "TACCL's times are from the TE-CCL authors' measurements (scripts/data/README.md); ours are simulated "
        "in the same model's figures.\n\n```\n" + _teccl_section() + "\n```\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_sweep_arguments(parser)
    parser.add_argument("--write-library", action="store_true", help="also write the shipped libraries")
    parser.add_argument("--from-metrics", type=Path, help="render from a metrics file instead of synthesizing")
    add_no_write_argument(parser, "BENCHMARKS.md and the CSVs")
    parser.add_argument(
        "--merge", action="store_true", help="keep the CSV rows of instances the metrics do not cover (partial rebuild)"
    )
    parser.add_argument(
        "--metrics-command", help="with --from-metrics: the command that wrote the metrics (recorded in BENCHMARKS.md)"
    )
    args = parser.parse_args(argv)
    if args.from_metrics is not None:
        metrics = [
            json.loads(line) for line in args.from_metrics.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    else:
        run_args = argparse.Namespace(
            sizes=args.sizes, time_limit=args.time_limit, jobs=args.jobs, no_write=not args.write_library
        )
        metrics, _failures = sweep_instances(args, run_args)
    instances, per_size = instance_rows(metrics), per_size_rows(metrics)
    if args.merge:
        instances = merge_rows(INSTANCES_CSV, INSTANCE_HEADER, instances)
        per_size = merge_rows(PER_SIZE_CSV, PER_SIZE_HEADER, per_size)
    instance_records = csv_output(INSTANCES_CSV, INSTANCE_HEADER, instances, key=_instance_key, write=not args.no_write)
    if not args.no_write:
        write_csv(PER_SIZE_CSV, PER_SIZE_HEADER, per_size, key=_per_size_key)
    body = render(instance_records, len(per_size))
    print(body)
    if not args.no_write:
        if args.from_metrics is not None:
            merge = " --merge" if args.merge else ""
            command = f"python scripts/bench_synthesis.py --from-metrics {args.from_metrics.name}{merge}"
            if args.metrics_command:
                command = f"{args.metrics_command} && {command}"
        else:
            command = command_line(__file__, argv)
        update_benchmarks_section(
            "synthesis", "Synthesized algorithms against baselines and the lower bound", command, body
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
