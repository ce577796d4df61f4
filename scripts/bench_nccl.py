"""Shipped libraries against NCCL's algorithms on NVSwitch machines: per size, the band's time over NCCL's best.

For each machine, node count and collective with a shipped library (``algorithms/MACHINE/nN``),
at every power of two from 64 KiB to 1 GiB, the band the runtime picks is simulated
(``taccl_py.simulate.bands.simulate_library``, as ``taccl simulate MACHINE --nodes N --collective C``
prints it) and so is NCCL's fastest algorithm there (``taccl_py.baselines.nccl_best_times``: its
ring and tree simulated under the same execution model, NVLS, NVLS-Tree and PAT modelled from its
tuning). A native band runs NCCL's own collective: its time is NCCL's best, so it is 1.00x by
construction. ``vs nccl`` is NCCL's time over the library's (above 1: the library is faster);
``of bound`` is the lower bound that holds there over the library's time (AllReduce on a reducing
switch: the in-network reduction bound, which NCCL's NVLS is held to too).

    python scripts/bench_nccl.py                                  # the three machines; writes BENCHMARKS.md
    python scripts/bench_nccl.py --topologies dgx-h100 --nodes 1 --no-write
    python scripts/bench_nccl.py --topologies gb200-nvl72 --merge  # replace those rows, keep the others
    python scripts/bench_nccl.py --from-csv                       # re-render the CSV; simulates nothing
    python scripts/bench_nccl.py --algorithms /tmp/libs --sizes 1MiB-1GiB --csv /tmp/libs.csv  # built elsewhere

``--algorithms DIR`` reads libraries laid out as ``algorithms/`` (``DIR/MACHINE/nN/C.library.json``,
as ``taccl build -o DIR`` writes them), by default every machine and node count DIR holds; it
prints the tables and writes only ``--csv``, never BENCHMARKS.md or the shipped rows' CSV.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from bench_harness import (
    BENCHMARKS_PATH,
    DATA_DIR,
    add_collectives_argument,
    add_no_write_argument,
    add_nodes_argument,
    add_sizes_argument,
    add_topologies_argument,
    argument_parser,
    collective_order,
    command_line,
    csv_output,
    csv_pointer,
    group_records,
    log,
    print_table,
    read_csv,
    split_names,
    update_benchmarks_section,
    value_span,
    write_csv,
)

from taccl_py.baselines import nccl_best_times
from taccl_py.baselines.nvls import nvls_switch_rate
from taccl_py.bounds.reduction import in_network_reduction_bounds, reducing_switches
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.simulate import DEFAULT_MODEL
from taccl_py.simulate.bands import simulate_library
from taccl_py.topology import load_topology
from taccl_py.topology.model import Topology
from taccl_py.units import format_size, parse_sizes

REPO_ROOT = DATA_DIR.parents[1]
CSV_PATH = DATA_DIR / "vs_nccl.csv"
PLOT_PATH = REPO_ROOT / "docs" / "vs_nccl_allreduce.png"
SECTION = "vs-nccl"
TITLE = "Shipped libraries against NCCL's algorithms on NVSwitch machines"
#: The machines and node counts the issue's targets name (issue 44, "Done when").
DEFAULT_CASES = {"dgx-h100": (1, 2, 4, 8), "dgx-b200": (1, 2, 4, 8), "gb200-nvl72": (1, 2)}
#: Every power of two from 64 KiB to 1 GiB (``--sizes``: a range doubles).
DEFAULT_SIZES = "64KiB-1GiB"
#: From this size up the AllReduce target is a fraction of the bound (bytes).
LARGE_BYTES = 64 * 2**20
VS_TARGET = 1.0
BOUND_TARGET = 0.90
CSV_HEADER = (
    "machine",
    "nodes",
    "collective",
    "size",
    "size_bytes",
    "band",
    "algorithm",
    "native",
    "time_us",
    "bound_us",
    "of_bound",
    "nccl_algorithm",
    "nccl_us",
    "vs_nccl",
)
TABLE_HEADER = (
    "machine",
    "nodes",
    "collective",
    "min vs nccl",
    "sizes below 1.00x",
    "native sizes",
    "min of bound from 64 MiB",
)


BANDS_HEADER = ("machine", "nodes", "collective", "schedule sizes", "vs nccl min / median", "native sizes")


def _library_path(machine: str, nodes: int, collective: str, folder: Path | None = None) -> Path | None:
    """Return the ``collective`` library for ``nodes`` ``machine``s: shipped, or under ``folder`` (None where none)."""
    name = f"{collective}.library.json"
    if folder is not None:
        path = folder / machine / f"n{nodes}" / name
        return path if path.is_file() else None
    return next((path for path in shipped_library_paths(machine, nodes) if path.name == name), None)


def case_rows(
    machine: str, nodes: int, collective: str, sizes: Sequence[int], folder: Path | None = None
) -> list[tuple]:
    """Return the CSV rows (``CSV_HEADER``) of the ``collective`` library (``_library_path``) on ``nodes`` machines."""
    library = read_library(_library_path(machine, nodes, collective, folder))
    topology = load_topology(machine, nodes=nodes)
    runs = simulate_library(library, topology, sizes, model=DEFAULT_MODEL)
    nccl = nccl_best_times(topology, library.collective, sizes, model=DEFAULT_MODEL)
    rows = []
    for run, best in zip(runs, nccl):
        native = run.result is None
        time_us = best.time_us if native else run.result.time_us
        band = None if run.band is None else library.bands[run.band]
        rows.append(
            (
                machine,
                nodes,
                collective,
                format_size(run.size_bytes),
                run.size_bytes,
                run.band,
                "native" if band is None or band.algorithm is None else band.algorithm.name,
                native,
                time_us,
                run.bound.time_us,
                run.bound.time_us / time_us,
                best.name,
                best.time_us,
                best.time_us / time_us,
            )
        )
    return rows


def _row_key(row: Sequence) -> tuple:
    return (row[0], row[1], collective_order(row[2]), row[4])


def _native(row: dict) -> bool:
    return row["native"] in (True, "true")


def _below(group: Sequence[dict]) -> list[dict]:
    return [r for r in group if r["vs_nccl"] < VS_TARGET]


def _large(group: Sequence[dict]) -> list[dict]:
    return [r for r in group if r["size_bytes"] >= LARGE_BYTES]


def summary_rows(records: Sequence[dict]) -> list[tuple]:
    """Return one table row (``TABLE_HEADER``) per machine, node count and collective."""
    rows = []
    for (machine, nodes, collective), group in group_records(records, "machine", "nodes", "collective").items():
        below = ", ".join(f"{r['size']} ({r['vs_nccl']:.3f}x)" for r in _below(group)) or "none"
        large = _large(group)
        fraction = f"{min(r['of_bound'] for r in large):.3f}" if large else "-"
        native = sum(_native(r) for r in group)
        vs = min(r["vs_nccl"] for r in group)
        rows.append((machine, nodes, collective, f"{vs:.2f}x", below, f"{native} of {len(group)}", fraction))
    return rows


def _size_spans(group: Sequence[dict], picked: Sequence[dict]) -> str:
    """Return the sizes of ``picked`` as spans of neighbours in ``group`` ("1MiB-4MiB, 64MiB"; "-" for none)."""
    chosen = {r["size_bytes"] for r in picked}
    spans: list[list[str]] = []
    for index, row in enumerate(group):
        if row["size_bytes"] not in chosen:
            continue
        if index and group[index - 1]["size_bytes"] in chosen:
            spans[-1][1] = row["size"]
        else:
            spans.append([row["size"], row["size"]])
    return ", ".join(low if low == high else f"{low}-{high}" for low, high in spans) or "-"


def band_rows(records: Sequence[dict]) -> list[tuple]:
    """Return per case (``BANDS_HEADER``) where a schedule runs, its least and median ``vs nccl``, where native."""
    rows = []
    for key, group in group_records(records, "machine", "nodes", "collective").items():
        group = sorted(group, key=lambda r: r["size_bytes"])
        runs = [r for r in group if not _native(r)]
        ratios = sorted(r["vs_nccl"] for r in runs)
        # the median of an even count is the lower middle one: a ratio that was measured
        spread = f"{ratios[0]:.3f} / {ratios[(len(ratios) - 1) // 2]:.3f}" if ratios else "-"
        rows.append((*key, _size_spans(group, runs), spread, _size_spans(group, [r for r in group if _native(r)])))
    return rows


def switch_mix_limit(topology: Topology) -> tuple[float, float, float, float, float]:
    """Return the best per-port rate any mix of switch and point-to-point AllReduce traffic reaches on one machine.

    With G GPUs, a share s of the buffer M reduced in the switch moves (1 + 1/G) s M through each
    GPU's port, at most at the switch's reduction rate R (``nvls_switch_rate``), and the rest
    2(G-1)/G (1-s) M point to point; all of it shares the port's rate B. The time per byte
    max((1+1/G) s / R, ((1+1/G) s + 2(G-1)/G (1-s)) / B) is least at s = 0, s = 1 or where the two
    terms are equal. α is left out: this is the large-size limit.
    Returns (R, B in GB/s, the best s, M/time in GB/s, that rate over B: its fraction of the in-network bound M/B).
    """
    rate_GBps = nvls_switch_rate(topology)[0]
    (switch,) = reducing_switches(topology)
    gpu = topology.gpus[0].name
    port_GBps = min(topology.link(gpu, switch.name).bandwidth_GBps, topology.link(switch.name, gpu).bandwidth_GBps)
    g = topology.gpus_per_node
    via_switch, point_to_point = 1 + 1 / g, 2 * (g - 1) / g

    def per_byte(share: float) -> float:
        return max(via_switch * share / rate_GBps, (via_switch * share + point_to_point * (1 - share)) / port_GBps)

    # the two terms are equal where via_switch s (1/R - 1/B) = point_to_point (1 - s) / B
    equal = point_to_point / port_GBps / (via_switch / rate_GBps - via_switch / port_GBps + point_to_point / port_GBps)
    share = min((s for s in (0.0, 1.0, equal) if 0 <= s <= 1), key=per_byte)
    mixed_GBps = 1 / per_byte(share)
    return rate_GBps, port_GBps, share, mixed_GBps, mixed_GBps / port_GBps


def _case(machine: str, nodes: int) -> str:
    return f"{machine} x{nodes}"


def _mix_sentence(machine: str, measured: float | None) -> str:
    """Return the one-machine AllReduce limit on ``machine``, computed from its topology's figures."""
    topology = load_topology(machine)
    rate_GBps, port_GBps, share, mixed_GBps, fraction = switch_mix_limit(topology)
    g = topology.gpus_per_node
    reached = "" if measured is None else f"; the shipped library reaches {measured:.3f}"
    return (
        f"on {machine} the switch reduces at {rate_GBps:.1f} GB/s per port (NVLS rate, `topologies/{machine}.json`) "
        f"while the port carries {port_GBps:.1f} GB/s; with {g} GPUs a GPU's port moves {1 + 1 / g:.3f} M through "
        f"the switch or {2 * (g - 1) / g:.3f} M point to point, so no mix of the two beats a share s = {share:.3f} "
        f"through the switch, M/{mixed_GBps:.1f} GB/s: {fraction:.3f} of the in-network bound M/{port_GBps:.1f} "
        f"(the bound counts M per direction){reached}"
    )


def _band_edge(group: Sequence[dict], below: Sequence[dict]) -> str:
    """Return why a band runs where NCCL is faster, where the rows show it: the band's edge sits below the crossover."""
    native = [r["size"] for r in group if _native(r)]
    parts = []
    for row in below:
        wins = [r["size"] for r in group if r["band"] == row["band"] and r["vs_nccl"] >= VS_TARGET]
        if wins:
            parts.append(
                f"band {row['band']} ({row['algorithm']}) runs {row['size']} but beats NCCL only at {', '.join(wins)}"
            )
    if not parts:
        return ""
    edge = "; ".join(parts) + ", so the band's edge sits below its crossover with NCCL's algorithm"
    if native:
        edge += f"; leaving those sizes to NCCL, as the library does at {native[-1]}, would make them 1.00x"
    return f": {edge}"


def _allreduce_misses(key: tuple, group: Sequence[dict]) -> list[str]:
    machine, nodes, _ = key
    out = []
    below = _below(group)
    if below:
        where = ", ".join(f"{r['size']} ({r['vs_nccl']:.3f}x against {r['nccl_algorithm']})" for r in below)
        out.append(f"{_case(machine, nodes)} AllReduce is below NCCL's best at {where}{_band_edge(group, below)}.")
    large = _large(group)
    low = [r for r in large if r["of_bound"] < BOUND_TARGET]
    if not low:
        return out
    worst = min(low, key=lambda r: r["of_bound"])
    native = [r for r in low if _native(r)]
    if nodes == 1 and reducing_switches(load_topology(machine)):
        out.append(
            f"{_case(machine, nodes)} AllReduce reaches {worst['of_bound']:.3f} of the in-network bound at "
            f"{worst['size']} (target {BOUND_TARGET:.2f}): {_mix_sentence(machine, worst['of_bound'])}."
        )
        return out
    (bound,) = in_network_reduction_bounds(load_topology(machine, nodes=nodes), [worst["size_bytes"]])
    binding = bound.description.split(": ", 1)[-1]
    setter = f"the NICs set it there ({binding})" if bound.cut_gpus > 1 else f"one GPU's links set it ({binding})"
    nccl_fraction = worst["bound_us"] / worst["nccl_us"]
    text = (
        f"{_case(machine, nodes)} AllReduce reaches {worst['of_bound']:.3f} of the in-network bound at "
        f"{worst['size']} (target {BOUND_TARGET:.2f}): {setter}; NCCL's best there ({worst['nccl_algorithm']}) "
        f"reaches {nccl_fraction:.3f}"
    )
    if native:
        fractions = [r["of_bound"] for r in native]
        text += (
            f"; {len(native)} of these {len(low)} sizes from 64 MiB are native bands, left to NCCL's "
            f"{native[0]['nccl_algorithm']} (1.00x by construction), which reaches {value_span(fractions, 3)} "
            "of the bound there"
        )
    out.append(text + ".")
    return out


def _gather_scatter_misses(key: tuple, group: Sequence[dict]) -> list[str]:
    machine, nodes, collective = key
    below = _below(group)
    if not below:
        return []
    where = ", ".join(
        f"{r['size']} ({r['vs_nccl']:.3f}x against {r['nccl_algorithm']}, band {r['band']} {r['algorithm']})"
        for r in below
    )
    return [f"{_case(machine, nodes)} {collective} is below NCCL's best at {where}."]


def missed_targets(records: Sequence[dict]) -> str:
    """Return the paragraph "Where a target is missed, why", computed from the rows."""
    lines, met = [], []
    for key, group in group_records(records, "machine", "nodes", "collective").items():
        found = _allreduce_misses(key, group) if key[2] == "allreduce" else _gather_scatter_misses(key, group)
        lines += found
        if not found:
            met.append(f"{_case(key[0], key[1])} {key[2]}")
    native = []
    for (machine, nodes, collective), group in group_records(records, "machine", "nodes", "collective").items():
        left = [r for r in group if _native(r)]
        if left:
            names = "/".join(dict.fromkeys(r["nccl_algorithm"] for r in left))
            native.append(f"{_case(machine, nodes)} {collective} {len(left)} of {len(group)} ({names})")
    parts = [
        f"Targets (issue 44): AllReduce at least {VS_TARGET:.2f}x NCCL's best at every size and at least "
        f"{BOUND_TARGET:.2f} of the in-network bound from 64 MiB; AllGather and ReduceScatter at least "
        f"{VS_TARGET:.2f}x. Met: " + (", ".join(met) if met else "none") + "."
    ]
    parts += [f"- {line}" for line in lines]
    if native:
        parts.append(
            "- Sizes left to NCCL (native bands: " + "; ".join(native) + ") run NCCL's own algorithm, whose time "
            "the row takes: 1.00x by construction, not a measured win. The library leaves a size to NCCL where "
            "NCCL's modelled algorithm beats every schedule a band may hold."
        )
    return "\n".join(parts) + "\n"


def draw_allreduce(records: Sequence[dict], path: Path) -> bool:
    """Draw AllReduce's ``vs nccl`` against size, one line per machine and node count, to ``path`` (PNG).

    Returns False (and draws nothing) where matplotlib is not installed: the picture is optional.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        log("matplotlib is not installed: no picture (pip install taccl-py[plot])")
        return False
    figure = Figure(figsize=(9.0, 5.0), dpi=110, layout="constrained")
    axes = figure.add_subplot()
    groups = group_records([r for r in records if r["collective"] == "allreduce"], "machine", "nodes")
    for (machine, nodes), group in groups.items():
        axes.plot(
            [r["size_bytes"] for r in group],
            [r["vs_nccl"] for r in group],
            marker="o",
            markersize=3,
            label=_case(machine, nodes),
        )
    axes.axhline(VS_TARGET, color="black", linewidth=0.8, linestyle="--")
    axes.set_xscale("log", base=2)
    sizes = sorted({r["size_bytes"] for r in records})
    axes.set_xticks(sizes[::2], [format_size(s) for s in sizes[::2]])
    axes.set_xlabel("AllReduce size")
    axes.set_ylabel("vs nccl (NCCL's best time / shipped library's)")
    axes.set_title("Shipped AllReduce against NCCL's best modelled algorithm (simulated, msccl model)")
    axes.legend(fontsize="small", ncols=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    figure.savefig(tmp, format="png")
    tmp.replace(path)
    return True


def _body(records: Sequence[dict], table: str, picture: bool, merged: bool = False) -> str:
    models = DEFAULT_MODEL.name
    relative = PLOT_PATH.relative_to(REPO_ROOT).as_posix()
    image = f"\n\n![AllReduce vs nccl by size]({relative})" if picture else ""
    return f"""Simulated (α-β, max-min fair sharing, execution model `{models}`): at each power of two from 64 KiB
to 1 GiB, the band the shipped library (`algorithms/MACHINE/nN/COLLECTIVE.library.json`) runs there,
as `taccl simulate MACHINE --nodes N --collective C --sizes ...` prints it, against NCCL's fastest
algorithm at that size (`nccl_best_times`: ring and tree simulated the same way; NVLS, NVLS-Tree and
PAT modelled from NCCL's tuning). `vs nccl` = NCCL's time / the library's (above 1: the library is
faster). A native band runs NCCL's own collective, so its time is NCCL's best (1.00x). `of bound`:
the lower bound there over the library's time; AllReduce on a reducing switch: the in-network
reduction bound, which holds for NVLS too.

{table}

{csv_pointer(CSV_PATH, len(records), "Every size")}{MERGED_NOTE if merged else ""}{image}

**Where a target is missed, why.** {missed_targets(records)}"""


MERGED_NOTE = " Rows of cases the command does not name come from earlier runs of this script (`--merge`)."


def _earlier_rows() -> list[tuple]:
    """Return the CSV's rows as tuples in ``CSV_HEADER`` order ([] where there is no CSV yet)."""
    if not CSV_PATH.exists():
        return []
    return [tuple(record[column] for column in CSV_HEADER) for record in read_csv(CSV_PATH)]


def _recorded_run() -> tuple[str | None, str | None]:
    """Return the command and date the section states now (None where it has none): ``--from-csv`` keeps them."""
    text = BENCHMARKS_PATH.read_text(encoding="utf-8") if BENCHMARKS_PATH.exists() else ""
    found = re.search(rf"<!-- bench:{SECTION} -->\n## .*?\n\nCommand: `(.*?)`  \nDate: (\S+)", text)
    return (found.group(1), found.group(2)) if found else (None, None)


def _cases(args) -> list[tuple[str, int, str]]:
    cases = []
    for machine in split_names(args.topologies):
        if args.nodes is not None:
            counts = [int(n) for n in split_names(args.nodes)]
        elif args.algorithms is not None:  # every nN folder it holds
            counts = sorted(int(p.name[1:]) for p in (args.algorithms / machine).glob("n*") if p.name[1:].isdigit())
        else:
            counts = DEFAULT_CASES.get(machine, (1,))
        for nodes in counts:
            for collective in split_names(args.collectives):
                if _library_path(machine, nodes, collective, args.algorithms) is None:
                    log(f"{_case(machine, nodes)} {collective}: no library, skipped")
                    continue
                cases.append((machine, nodes, collective))
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__, full_doc=True)
    add_topologies_argument(parser, unset=", ".join(DEFAULT_CASES))
    add_nodes_argument(parser, None, unset="1,2,4,8 (gb200-nvl72: 1,2)")
    add_collectives_argument(parser, "allreduce,allgather,reducescatter")
    add_no_write_argument(parser, kept="BENCHMARKS.md, the CSV and the picture")
    parser.add_argument("--from-csv", action="store_true", help="render scripts/data/vs_nccl.csv; simulate nothing")
    parser.add_argument(
        "--merge", action="store_true", help="keep the CSV's rows of the cases not run (written after each case)"
    )
    add_sizes_argument(parser, DEFAULT_SIZES, what="sizes; a range doubles")
    parser.add_argument("--algorithms", type=Path, metavar="DIR", help="libraries under DIR/MACHINE/nN, not shipped")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="with --algorithms: write the rows to FILE")
    args = parser.parse_args(argv)
    elsewhere = args.algorithms is not None
    if elsewhere and not args.algorithms.is_dir():
        parser.error(f"--algorithms {args.algorithms}: not a folder")
    if elsewhere and (args.from_csv or args.merge):
        parser.error("--algorithms: --from-csv and --merge are for the shipped libraries")
    if args.csv is not None and not elsewhere:
        parser.error("--csv: only with --algorithms (the shipped libraries' rows go to scripts/data/vs_nccl.csv)")
    held = ",".join(sorted(path.name for path in args.algorithms.iterdir() if path.is_dir())) if elsewhere else ""
    args.topologies = args.topologies or held or ",".join(DEFAULT_CASES)
    if args.from_csv:
        records = read_csv(CSV_PATH)
    else:
        kept = _earlier_rows() if args.merge else []
        rows: list[tuple] = []
        for machine, nodes, collective in _cases(args):
            began = time.perf_counter()
            rows += case_rows(machine, nodes, collective, parse_sizes(args.sizes, factor=2), args.algorithms)
            log(f"{_case(machine, nodes)} {collective}: {time.perf_counter() - began:.0f} s")
            kept = [row for row in kept if tuple(row[:3]) != (machine, nodes, collective)]
            if args.merge and not args.no_write:  # a long sweep keeps what it has done so far
                write_csv(CSV_PATH, CSV_HEADER, kept + rows, _row_key)
        write = args.csv is not None if elsewhere else not args.no_write
        records = csv_output(args.csv or CSV_PATH, CSV_HEADER, kept + rows, _row_key, write=write)
    table = print_table(TABLE_HEADER, summary_rows(records), markdown=True)
    if elsewhere:  # the shipped libraries' section and picture are not these libraries'
        print()
        print_table(BANDS_HEADER, band_rows(records), markdown=True)
        return 0
    if args.no_write:
        print()
        print(missed_targets(records))
        return 0
    picture = draw_allreduce(records, PLOT_PATH)
    command, date = _recorded_run() if args.from_csv else (None, None)
    command = command or command_line(__file__, argv)
    update_benchmarks_section(SECTION, TITLE, command, _body(records, table, picture, "--merge" in command), date=date)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
