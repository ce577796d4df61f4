"""Choose the shipped libraries' bands again under MSCCL's slice loop, and compare every band with the baselines.

The shipped bands were chosen under the whole-chunk model. MSCCL runs a program once per 2 MiB
slice of its chunks (``taccl_py.simulate.model``), which costs schedules with many pipelined
pieces and deep dependency chains a fill and drain per pass. For every shipped library this
script simulates its band algorithms and the loadable baselines under the chosen model at the
library's sizes, keeps the fastest per size (``taccl_py.synth.rechoose``), writes the library
back (``--write``) and reports, per size from 1 MB up, the chosen band against the best of all
our baselines (ring, trees, hierarchical, packed trees: loadable or not) simulated the same way.

    python scripts/rechoose_bands.py --write                    # every shipped library, default model
    python scripts/rechoose_bands.py --topologies ndv2 --nodes 1 --collectives allgather
    python scripts/rechoose_bands.py --from-csv                 # only render the CSV into BENCHMARKS.md
    python scripts/rechoose_bands.py --write --previous /tmp/old/algorithms   # choose from an older checkout's bands

``--previous`` names the algorithms/ folder of the libraries to choose from and compare with (default:
the shipped ones), so a rerun after ``--write`` starts again from the same band algorithms.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

from bench_harness import (
    DATA_DIR,
    add_collectives_argument,
    add_csv_argument,
    add_nodes_argument,
    add_topologies_argument,
    argument_parser,
    collective_order,
    command_line,
    csv_pointer,
    group_records,
    log,
    machine_cases,
    markdown_table,
    read_csv,
    row_bound_us,
    split_names,
    update_benchmarks_section,
    write_csv,
)

from taccl_py.baselines import best_baselines
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.simulate import DEFAULT_MODEL, WHOLE_CHUNKS, execution_model, simulate
from taccl_py.synth.bands import write_library
from taccl_py.synth.candidates import exportable
from taccl_py.synth.rechoose import rechoose_bands
from taccl_py.topology import load_topology

REPO = Path(__file__).resolve().parents[1]
CSV_PATH = DATA_DIR / "slice_model.csv"
CSV_HEADER = (
    "topology",
    "nodes",
    "collective",
    "size_bytes",
    "old_band",
    "old_chunks_us",
    "old_us",
    "band",
    "ours_us",
    "best_baseline",
    "baseline_us",
    "vs_best_baseline",
)
REPORT_FROM_BYTES = 1_000_000


def instance_rows(
    name: str, nodes: int, collective: str, model_name: str, write: bool, previous: Path | None
) -> list[tuple]:
    """Re-choose one library (from ``previous``, else the shipped one); return its CSV rows, one per size."""
    if previous is not None:
        path = previous / name / f"n{nodes}" / f"{collective}.library.json"
    else:
        path = next(p for p in shipped_library_paths(name, nodes) if p.name == f"{collective}.library.json")
    library = read_library(path)
    topology = load_topology(name, nodes)
    model = execution_model(model_name)
    rechosen, choices = rechoose_bands(library, topology, model=model, progress=None)
    sizes = [choice.size_bytes for choice in choices]
    all_baselines = best_baselines(topology, Collective(collective), sizes, model=model)
    rows = []
    for choice, baseline in zip(choices, all_baselines):
        old = library.select(choice.size_bytes)
        old_chunks = simulate(old, topology, choice.size_bytes, model=WHOLE_CHUNKS) if old is not None else None
        old_now = simulate(old, topology, choice.size_bytes, model=model) if old is not None else None
        band = next(i for i, b in enumerate(rechosen.bands) if b.covers(choice.size_bytes))
        # what runs there: NCCL's own algorithm where the size is left to it (a native band)
        label = "native" if rechosen.bands[band].native else choice.chosen.name
        rows.append(
            (
                name,
                nodes,
                collective,
                choice.size_bytes,
                (old.meta("source_algorithm") or old.name) if old is not None else "native",
                old_chunks.time_us if old_chunks else None,
                old_now.time_us if old_now else None,
                f"{collective}-{band}:{label}",
                choice.runs_us,
                baseline[0].name if baseline else None,
                baseline[1].time_us if baseline else None,
                baseline[1].time_us / choice.runs_us if baseline else None,
            )
        )
    if write:
        target = REPO / "algorithms" / name / f"n{nodes}" / f"{collective}.library.json"
        old_files = set(target.parent.glob(f"{collective}-*.json.xz"))
        write_library(rechosen, target, compress=True)
        kept = {target.parent / f"{collective}-{i}.json.xz" for i, b in enumerate(rechosen.bands) if not b.native}
        for stale in old_files - kept:
            stale.unlink()
    return rows


def _shipped_band_count(name: str, nodes: int, collective: str) -> int:
    """Return how many bands the shipped library of one instance has now."""
    path = next(p for p in shipped_library_paths(name, nodes) if p.name == f"{collective}.library.json")
    return len(json.loads(path.read_text(encoding="utf-8"))["bands"])


def render(
    records: list[dict], elapsed_s: float | None, model: str = DEFAULT_MODEL.name, csv_path: Path = CSV_PATH
) -> str:
    """Return the section: per library, bands before and after, and the worst band against the best baseline.

    Fractions of the bound are computed here (the CSV holds times), so they follow the current bounds.
    ``model`` names the execution model the CSV's rows were chosen under (the CSV does not say).
    """
    # msccl in the words BENCHMARKS' section already has, so a rerender changes no byte
    how = "2 MiB Simple slices, serialized sends" if model == "msccl" else execution_model(model).description
    bounds: dict = {}
    by_instance = group_records(records, "topology", "nodes", "collective")
    rows = []
    slower = 0
    for (name, nodes, collective), group in sorted(
        by_instance.items(), key=lambda item: (item[0][0], item[0][1], collective_order(item[0][2]))
    ):
        large = [r for r in group if r["size_bytes"] >= REPORT_FROM_BYTES and r["vs_best_baseline"] is not None]
        worst = min(large, key=lambda r: r["vs_best_baseline"], default=None)
        old_worst = min(
            (r["baseline_us"] / r["old_us"] for r in large if r["old_us"]),
            default=None,
        )
        slower += sum(r["vs_best_baseline"] < 1 - 1e-9 for r in large)
        changed = sum(r["old_band"] != r["band"].split(":", 1)[1] for r in group)
        rows.append(
            (
                f"{name} ×{nodes}",
                collective,
                len({r["old_band"] for r in group}),
                _shipped_band_count(name, nodes, collective),
                changed,
                f"{old_worst:.3f}" if old_worst is not None else "",
                f"{worst['vs_best_baseline']:.3f}" if worst else "",
                worst["best_baseline"] if worst else "",
                f"{min(row_bound_us(r, bounds) / r['ours_us'] for r in large):.3f}" if large else "",
            )
        )
    headers = (
        "machine",
        "collective",
        "bands before",
        "bands after",
        "sizes re-chosen",
        "worst ≥1 MB before (baseline/ours)",
        "worst ≥1 MB after",
        "baseline there",
        "min of bound ≥1 MB",
    )
    lines = [
        f"Every shipped library's bands chosen again under MSCCL's slice loop (`{model}` model: {how}) "
        "from its own band algorithms and the loadable baselines, simulated at the "
        "library's sizes, from the first size at which the library's own band runs more than one pass; below "
        "it the model changes no band's time and the synthesis's bands stand (`taccl_py.synth.rechoose`: "
        "merging them would lose the LL protocol of the smallest). `sizes re-chosen` counts the sizes whose "
        "band changed. `worst … (baseline/ours)` is the best of all our baselines (ring, trees, "
        "hierarchical, packed trees, loadable or not) over our band at the size where ours does worst, from "
        "1 MB up, both simulated under the same model: 1.000 or more means no band is slower than any "
        "baseline; `before` is the band shipped before this choice, simulated the same way.",
        "",
        markdown_table(headers, rows),
        "",
        f"Sizes from 1 MB where a band is slower than the best baseline: **{slower}**"
        + (f"; {_unloadable_note(records)}" if slower else "."),
    ]
    if elapsed_s is not None:
        lines.append(f"Run time: {elapsed_s:.0f} s on 2 cores.")
    # a CSV outside the repository (``--csv``) gets no link: BENCHMARKS.md never shows it
    pointer = csv_pointer(CSV_PATH, len(records)) if csv_path == CSV_PATH else f"Full table: {csv_path}."
    lines.append(pointer)
    return "\n".join(lines)


def _unloadable_note(records: list[dict]) -> str:
    """Return which of the baselines that beat a band from 1 MB up MSCCL cannot load or select, by name."""
    losing: dict[tuple, list[int]] = {}
    for r in records:
        if r["size_bytes"] >= REPORT_FROM_BYTES and r["vs_best_baseline"] is not None and r["vs_best_baseline"] < 1:
            losing.setdefault((r["topology"], r["nodes"], r["collective"]), []).append(r["size_bytes"])
    loadable, unloadable = 0, Counter()
    for (name, nodes, collective), sizes in losing.items():
        for baseline in best_baselines(load_topology(name, nodes), Collective(collective), sizes):
            if exportable(baseline[0]):
                loadable += 1
            else:
                unloadable[baseline[0].name] += 1
    names = ", ".join(f"{name} ({count})" for name, count in sorted(unloadable.items()))
    return (
        f"{sum(unloadable.values())} of them against a baseline MSCCL cannot load or select ({names}: a 6- or "
        f"7-channel loop divides no power-of-two count; the others need more than MSCCL's 64 threadblocks per "
        f"GPU), **{loadable}** against one it can."
    )


def main(argv: list[str] | None = None) -> int:
    """Re-choose the libraries named, write the CSV and BENCHMARKS.md section (``--from-csv``: only render)."""
    parser = argument_parser(__doc__)
    add_topologies_argument(parser)
    add_nodes_argument(parser, "1,2,4,8", what="machine counts with shipped libraries")
    add_collectives_argument(parser, "allgather,reducescatter,allreduce,alltoall")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL.name, help=f"execution model to choose under (default {DEFAULT_MODEL.name})"
    )
    parser.add_argument("--write", action="store_true", help="write the re-chosen libraries into algorithms/")
    parser.add_argument("--from-csv", action="store_true", help="render the existing CSV; choose nothing")
    parser.add_argument("from_csv_files", nargs="*", type=Path, help="with --from-csv: the CSVs to merge")
    parser.add_argument("--no-report", action="store_true", help="leave BENCHMARKS.md alone")
    add_csv_argument(parser, CSV_PATH)
    parser.add_argument("--previous", type=Path, default=None, help="an older algorithms/ folder to choose from")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    if args.from_csv:
        body = render([r for path in args.from_csv_files or [args.csv] for r in read_csv(path)], None, args.model)
    else:
        rows: list[tuple] = []
        for name, nodes in machine_cases(args.topologies, args.nodes):
            if args.previous is None:  # a machine without libraries at this node count has nothing to choose
                names = {p.name for p in shipped_library_paths(name, nodes)}
            else:
                names = {p.name for p in (args.previous / name / f"n{nodes}").glob("*.library.json")}
            for collective in split_names(args.collectives):
                if f"{collective}.library.json" not in names:
                    continue
                start = time.perf_counter()
                rows += instance_rows(name, nodes, collective, args.model, args.write, args.previous)
                # written after every library: a whole run takes most of an hour, and a crash kept nothing
                write_csv(args.csv, CSV_HEADER, rows)
                log(f"{name} x{nodes} {collective}: {time.perf_counter() - start:.0f} s")
        records = write_csv(args.csv, CSV_HEADER, rows)
        body = render(records, time.perf_counter() - began, args.model, args.csv)
    print(body)
    if args.csv == CSV_PATH and not args.no_report:
        title = "Shipped bands under MSCCL's slice loop"
        update_benchmarks_section("slice-model", title, command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
