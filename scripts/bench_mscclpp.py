"""Simulated time of every shipped band as an MSCCL++ plan against the same band as MSCCL XML.

For each built-in machine with shipped libraries, each band and placement that
``taccl_py.mscclpp.files.generate_library_plans`` exports is simulated twice under the same
execution model: the band's Algorithm as its MSCCL XML file runs it (``simulate``, in the protocol
``taccl export-msccl`` writes for the band) and the exported plan
(``taccl_py.mscclpp.simulate.simulate_mscclpp_plan``: puts, signals and waits on the same α-β
links, a signal behind its puts free, a Simple plan's entry handshake one α; an LL plan, which
export picks where it simulates faster, has no handshake), at the band's low and high end (an
open-ended band: its minimum and 16x, at most 1 GB). ``msccl`` is how MSCCL runs XML (2 MiB
slices); ``chunks`` (whole chunks) is how MSCCL++ runs a plan. plan/XML above 1: the plan is slower.
"of bound" (bound time over plan time) is at most 1 in either protocol: an LL packet pays at
least the wire's α, as Simple does.

    python scripts/bench_mscclpp.py                        # every machine with libraries, 1 node
    python scripts/bench_mscclpp.py --topologies ndv2,dgx-a100 --model chunks
"""

from __future__ import annotations

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

from taccl_py.ir.library import read_library, shipped_library_paths, shipped_node_counts
from taccl_py.msccl.protocol import band_protocols
from taccl_py.mscclpp import generate_library_plans, parse_mscclpp_plan
from taccl_py.mscclpp.files import library_plan_name
from taccl_py.mscclpp.simulate import simulate_mscclpp_plan
from taccl_py.simulate import execution_model, simulate_sizes
from taccl_py.topology import builtin_topology_names, load_topology
from taccl_py.units import format_size
from taccl_py.verify import exported_inplace_form

CSV_PATH = DATA_DIR / "mscclpp_plans.csv"
USAGE = "    python scripts/bench_mscclpp.py "
DEFAULT_MODELS = "msccl,chunks"
OPEN_BAND_FACTOR = 16  # an open-ended band is sampled at its minimum and this multiple of it
MAX_SAMPLE_BYTES = 1 << 30  # ... at most 1 GiB
MIN_SAMPLE_BYTES = 1024  # a band starting at 0 bytes is sampled from 1 KiB
CSV_HEADER = (
    "topology",
    "nodes",
    "collective",
    "band",
    "placement",
    "model",
    "xml_protocol",
    "plan_protocol",
    "size_bytes",
    "xml_us",
    "plan_us",
    "ratio",
    "plan_of_bound",
    "xml_of_bound",
)


def band_sizes(min_bytes: int, max_bytes: int | None) -> list[int]:
    """Return the band's sampled sizes (bytes): its low and high end."""
    low = max(min_bytes, MIN_SAMPLE_BYTES)
    high = min(OPEN_BAND_FACTOR * low, MAX_SAMPLE_BYTES) if max_bytes is None else max_bytes - 1
    return sorted({low, max(high, low)})


def library_rows(path, models: list[str]) -> list[tuple]:
    """Return one ``CSV_HEADER`` row per exported plan, model and sampled size of the library at ``path``."""
    library = read_library(path)
    topology = load_topology(library.topology, library.nodes)
    plans = generate_library_plans(library, topology)
    texts = dict(plans.files)
    xml_protocols = band_protocols(library)
    rows = []
    for index, band in enumerate(library.bands):
        for inplace in (False, True):
            name = library_plan_name(library, index, inplace)
            if name not in texts:
                continue
            plan = parse_mscclpp_plan(texts[name], name)
            algorithm = exported_inplace_form(band.algorithm)[0] if inplace else band.algorithm
            algorithm = replace(algorithm, protocol=xml_protocols[index])
            sizes = band_sizes(band.min_bytes, band.max_bytes)
            for model in models:
                xml = simulate_sizes(algorithm, topology, sizes, model=model)
                ours = simulate_mscclpp_plan(plan, topology, sizes, model=model)
                for size, by_xml, by_plan in zip(sizes, xml, ours):
                    rows.append(
                        (
                            library.topology,
                            library.nodes,
                            library.collective.value,
                            index,
                            "in place" if inplace else "out of place",
                            model,
                            algorithm.protocol,
                            plan.protocol.value,
                            size,
                            by_xml.time_us,
                            by_plan.time_us,
                            by_plan.time_us / by_xml.time_us,
                            by_plan.fraction_of_bound,
                            by_xml.fraction_of_bound,
                        )
                    )
    for index, why in plans.skipped:
        log(f"  {library.topology} n{library.nodes} {library.collective.value} band {index}: {why}")
    return rows


def _libraries(topologies: list[str], nodes: list[int]) -> list:
    return [path for name in topologies for count in nodes for path in shipped_library_paths(name, count)]


def row_table(records: list[dict]) -> list[tuple]:
    """Return one printed row per record: machine, collective, band, placement, model, size, times, ratio, bound."""
    return [
        (
            f"{r['topology']} x{r['nodes']}",
            r["collective"],
            r["band"],
            r["placement"],
            r["model"],
            f"{r['xml_protocol']}/{r['plan_protocol']}",
            format_size(r["size_bytes"]),
            f"{r['xml_us']:.2f}",
            f"{r['plan_us']:.2f}",
            f"{r['ratio']:.3f}",
            f"{r['plan_of_bound']:.3f}",
        )
        for r in records
    ]


def summary_table(records: list[dict]) -> list[tuple]:
    """Return one row per machine, node count and model: plans, LL plans, plan/XML (median, least, most), bound."""
    rows = []
    for (topology, nodes, model), group in group_records(records, "topology", "nodes", "model").items():
        ratios = [r["ratio"] for r in group]
        large = [r["ratio"] for r in group if r["size_bytes"] >= 1 << 20]
        plans = {(r["collective"], r["band"], r["placement"]): r["plan_protocol"] for r in group}
        rows.append(
            (
                f"{topology} x{nodes}",
                model,
                len(plans),
                list(plans.values()).count("LL"),
                f"{statistics.median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                f"{max(large):.3f}" if large else "-",
                f"{min(r['plan_of_bound'] for r in group):.3f}-{max(r['plan_of_bound'] for r in group):.3f}",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the per-plan table and the summary; with ``--write``, write the CSV and the BENCHMARKS.md section."""
    parser = argument_parser(__doc__)
    add_topologies_argument(parser, unset="every machine with shipped libraries")
    add_nodes_argument(parser, "1")
    parser.add_argument(
        "--model", default=DEFAULT_MODELS, help=f"comma-separated execution models (default {DEFAULT_MODELS})"
    )
    add_write_argument(parser, "mscclpp")
    args = parser.parse_args(argv)
    models = [execution_model(name).name for name in split_names(args.model)]
    nodes = [int(count) for count in split_names(args.nodes)]
    shipped = [name for name in builtin_topology_names() if shipped_node_counts(name)]
    topologies = split_names(args.topologies) or shipped
    paths = _libraries(topologies, nodes)
    start, rows = time.perf_counter(), []
    for number, path in enumerate(paths, 1):
        began = time.perf_counter()
        new = library_rows(path, models)
        rows.extend(new)
        log(
            f"[{number}/{len(paths)}] {path.parent.parent.name}/{path.parent.name}/{path.name}: {len(new)} rows, "
            f"{time.perf_counter() - began:.1f} s"
        )
    elapsed_s = time.perf_counter() - start

    def key(row):
        return (row[0], row[1], models.index(row[5]), *collective_order(row[2]), row[3], row[4], row[8])

    records = csv_output(CSV_PATH, CSV_HEADER, rows, key, write=args.write)
    headers = ("machine", "collective", "band", "placement", "model", "XML/plan protocol", "size", "XML (us)")
    print_table((*headers, "plan (us)", "plan/XML", "plan of bound"), row_table(records))
    summary_headers = ("machine", "model", "plans", "LL plans", "median plan/XML", "plan/XML", "worst at >= 1 MiB")
    summary_headers += ("of bound",)
    summary = markdown_table(summary_headers, summary_table(records))
    print(f"\n{summary}\n\n{len(rows)} rows in {elapsed_s:.0f} s")
    if args.write:
        unshipped = sorted(set(builtin_topology_names()) - set(shipped))
        body = (
            f"{doc_prose(__doc__, USAGE)}\n\n"
            f"Per machine and model: exported plans (those in LL), plan/XML over their sampled sizes, the worst at "
            f"1 MiB and above, and the plan's fraction of the lower bound ({len(rows)} rows, {elapsed_s:.0f} s"
            + (f"; no shipped libraries for {', '.join(unshipped)}" if unshipped else "")
            + f"):\n\n{summary}\n\n{csv_pointer(CSV_PATH, len(records), 'Every plan, model and size')}\n"
        )
        title = "MSCCL++ plans against MSCCL XML (simulated)"
        update_benchmarks_section("mscclpp", title, command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
