"""Simulated time of every shipped band's MSCCL++ plan against the plan of the best baseline for the band.

For each built-in machine with shipped libraries and each band, the plan ``taccl export-mscclpp``
would write from the band's algorithm (out of place) and the plans of the baselines fastest at the
band's sample sizes among those with a plan within MSCCL++'s limits (``best_baselines_by_band``),
each in the protocol export picks for it, are simulated as MSCCL++ runs them (whole chunks), summed
over the band's sample sizes (its edges and their geometric middle). plan/baseline above 1.01:
export writes the baseline's plan instead (``faster_rival_plan``). "of bound" is the lower bound's
time over the plan's, at most 1 in either protocol (an LL packet pays at least the wire's α).

    python scripts/bench_mscclpp_baselines.py                  # every machine with libraries, 1 node
    python scripts/bench_mscclpp_baselines.py --topologies ndv2 --nodes 2
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from dataclasses import replace

from bench_harness import (
    DATA_DIR,
    add_nodes_argument,
    add_topologies_argument,
    add_write_argument,
    argument_parser,
    collective_order,
    command_line,
    csv_output,
    csv_pointer,
    doc_prose,
    group_records,
    log,
    markdown_table,
    print_table,
    split_names,
    update_benchmarks_section,
)

from taccl_py.baselines import best_baselines_by_band
from taccl_py.bounds import lower_bounds
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.library import read_library, shipped_library_paths, shipped_node_counts
from taccl_py.mscclpp import parse_mscclpp_plan
from taccl_py.mscclpp.files import choose_plan_protocol, faster_rival_plan, fits_mscclpp, library_plan_name
from taccl_py.mscclpp.simulate import simulate_mscclpp_plan
from taccl_py.simulate import WHOLE_CHUNKS
from taccl_py.simulate.protocol import band_sample_sizes
from taccl_py.topology import builtin_topology_names, load_topology

CSV_PATH = DATA_DIR / "mscclpp_baselines.csv"
USAGE = "    python scripts/bench_mscclpp_baselines.py "
CSV_HEADER = (
    "topology",
    "nodes",
    "collective",
    "band",
    "protocol",
    "plan_us",
    "baseline",
    "baseline_us",
    "ratio",
    "plan_of_bound",
    "written",
)


def _plan_us(text: str, topology, sizes) -> float:
    plan = parse_mscclpp_plan(text, "plan")
    return sum(result.time_us for result in simulate_mscclpp_plan(plan, topology, sizes, model=WHOLE_CHUNKS))


def library_rows(path) -> list[tuple]:
    """Return one ``CSV_HEADER`` row per band of the library at ``path`` that has an exported plan."""
    library = read_library(path)
    topology = load_topology(library.topology, library.nodes)
    rivals = best_baselines_by_band(
        library, topology, WHOLE_CHUNKS, keep=functools.partial(fits_mscclpp, topology=topology)
    )
    rows = []
    for index, band in enumerate(library.bands):
        if band.native:
            continue
        name = library_plan_name(library, index).removesuffix(".json")
        algorithm = replace(band.algorithm, name=name, min_bytes=band.min_bytes, max_bytes=band.max_bytes)
        sizes = band_sample_sizes(band.min_bytes, band.max_bytes)
        try:
            text, choice = choose_plan_protocol(algorithm, topology)
        except (ArgumentError, VerificationError) as error:
            log(f"  {name}: no plan: {error}")
            continue
        ours = _plan_us(text, topology, sizes)
        theirs = []
        for rival in rivals[index]:
            rival = replace(rival, min_bytes=band.min_bytes, max_bytes=band.max_bytes)
            try:
                rival_text, rival_choice = choose_plan_protocol(rival, topology)
            except ArgumentError:
                continue
            theirs.append((_plan_us(rival_text, topology, sizes), f"{rival.name} {rival_choice.protocol}"))
        best_us, best_name = min(theirs)
        bound = sum(bound.time_us for bound in lower_bounds(topology, library.collective, sizes))
        written = faster_rival_plan(text, algorithm, topology, rivals[index])
        rows.append(
            (
                library.topology,
                library.nodes,
                library.collective.value,
                index,
                choice.protocol,
                ours,
                best_name,
                best_us,
                ours / best_us,
                bound / ours,
                "band" if written is None else json.loads(written[0])["name"].removeprefix(name + "-"),
            )
        )
    return rows


def summary_table(records: list[dict]) -> list[tuple]:
    """Return one row per machine and node count: bands, bands a baseline's plan wins, plan/baseline, of bound."""
    rows = []
    for (topology, nodes), group in group_records(records, "topology", "nodes").items():
        ratios = [r["ratio"] for r in group]
        won = [f"{r['collective']} {r['band']} ({r['ratio']:.2f})" for r in group if r["written"] != "band"]
        rows.append(
            (
                f"{topology} x{nodes}",
                len(group),
                f"{statistics.median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                f"{min(r['plan_of_bound'] for r in group):.3f}-{max(r['plan_of_bound'] for r in group):.3f}",
                ", ".join(won) or "-",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the per-band table and the summary; with ``--write``, write the CSV and the BENCHMARKS.md section."""
    parser = argument_parser(__doc__)
    add_topologies_argument(parser, unset="every machine with shipped libraries")
    add_nodes_argument(parser, "1")
    add_write_argument(parser, "mscclpp-baselines")
    args = parser.parse_args(argv)
    nodes = [int(count) for count in split_names(args.nodes)]
    shipped = [name for name in builtin_topology_names() if shipped_node_counts(name)]
    topologies = split_names(args.topologies) or shipped
    paths = [path for name in topologies for count in nodes for path in shipped_library_paths(name, count)]
    start, rows = time.perf_counter(), []
    for number, path in enumerate(paths, 1):
        began = time.perf_counter()
        rows.extend(library_rows(path))
        where = f"{path.parent.parent.name}/{path.parent.name}/{path.name}"
        log(f"[{number}/{len(paths)}] {where}: {time.perf_counter() - began:.1f} s")
    elapsed_s = time.perf_counter() - start

    def key(row):
        return (row[0], row[1], *collective_order(row[2]), row[3])

    records = csv_output(CSV_PATH, CSV_HEADER, rows, key, write=args.write)
    headers = ("machine", "collective", "band", "protocol", "plan (us)", "best baseline", "baseline (us)")
    table = [
        (
            f"{r['topology']} x{r['nodes']}",
            r["collective"],
            r["band"],
            r["protocol"],
            f"{r['plan_us']:.2f}",
            r["baseline"],
            f"{r['baseline_us']:.2f}",
            f"{r['ratio']:.3f}",
            f"{r['plan_of_bound']:.3f}",
            r["written"],
        )
        for r in records
    ]
    print_table((*headers, "plan/baseline", "plan of bound", "written"), table)
    summary_headers = ("machine", "bands", "median plan/baseline", "plan/baseline", "plan of bound")
    summary = markdown_table((*summary_headers, "baseline's plan written (plan/baseline)"), summary_table(records))
    print(f"\n{summary}\n\n{len(rows)} bands in {elapsed_s:.0f} s")
    if args.write:
        body = (
            f"{doc_prose(__doc__, USAGE)}\n\n"
            f"Per machine: bands with a plan, plan/baseline over them, the plan's fraction of the lower bound, "
            f"and the bands whose plan export replaces with a baseline's ({len(rows)} bands, {elapsed_s:.0f} s):"
            f"\n\n{summary}\n\n{csv_pointer(CSV_PATH, len(records), 'Every band')}\n"
        )
        title = "MSCCL++ plans against the best baseline's plans (simulated)"
        update_benchmarks_section("mscclpp-baselines", title, command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
