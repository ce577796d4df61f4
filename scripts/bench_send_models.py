"""Serialized against pipelined sends: the shipped bands under both models, and what synthesis chooses under each.

Two parts, each writing its CSV under ``scripts/data/`` (``--part``), and one BENCHMARKS.md section
rendered from both (``--render``):

* ``shipped``: every shipped library's band at each size from 1 MB to 1 GB, simulated under MSCCL's
  slice loop with serialized sends (``msccl``) and with pipelined sends (``pipelined``), as a
  fraction of the lower bound (α-aware where ``taccl_py.bounds`` is).
* ``synthesis``: every built-in machine at 4 nodes, synthesized at 16 MB and 64 MB under each model
  (``synthesize(..., model=...)``); which candidate wins, its fraction of the bound, and the best
  baseline, simulated under the same model.

    python scripts/bench_send_models.py --part shipped
    python scripts/bench_send_models.py --part synthesis --topologies dgx-h100,dgx2
    python scripts/bench_send_models.py --render
"""

from __future__ import annotations

import sys
import time

from bench_harness import (
    COLLECTIVES,
    DATA_DIR,
    add_collectives_argument,
    add_csv_argument,
    add_nodes_argument,
    add_topologies_argument,
    argument_parser,
    collective_order,
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

from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.simulate import MSCCL_LOOP, MSCCL_PIPELINED, simulate
from taccl_py.synth import synthesize
from taccl_py.topology import load_topology
from taccl_py.units import format_size

SHIPPED_CSV = DATA_DIR / "send_models_shipped.csv"
SYNTHESIS_CSV = DATA_DIR / "send_models_synthesis.csv"
SHIPPED_HEADER = ("topology", "nodes", "collective", "size_bytes", "band", "msccl_us", "pipelined_us")
SYNTHESIS_HEADER = (
    "topology",
    "nodes",
    "collective",
    "size_bytes",
    "model",
    "chosen",
    "ours_us",
    "baseline",
    "baseline_us",
    "synth_s",
)
SHIPPED_SIZES = tuple(2**20 * 4**k for k in range(6))  # 1 MiB to 1 GiB
SYNTHESIS_SIZES = (16_000_000, 64_000_000)
SYNTHESIS_NODES = 4
MODELS = (MSCCL_LOOP, MSCCL_PIPELINED)


def shipped_rows(name: str, nodes: int) -> list[tuple]:
    """Return the shipped bands of one machine and node count at ``SHIPPED_SIZES`` under both models."""
    topology = load_topology(name, nodes)
    rows = []
    for path in shipped_library_paths(name, nodes):
        library = read_library(path)
        if library.collective.value not in COLLECTIVES:
            continue
        for size in SHIPPED_SIZES:
            algorithm = library.select(size)
            if algorithm is None:
                continue
            serial, piped = (simulate(algorithm, topology, size, model=model, bound_time_us=0.0) for model in MODELS)
            rows.append((name, nodes, library.collective.value, size, algorithm.name, serial.time_us, piped.time_us))
    return rows


def synthesis_rows(name: str, collective: str) -> list[tuple]:
    """Return what synthesis chooses at ``SYNTHESIS_SIZES`` on ``name`` x4 under each model."""
    topology = load_topology(name, SYNTHESIS_NODES)
    rows = []
    for model in MODELS:
        began = time.perf_counter()
        result = synthesize(topology, collective, sizes=SYNTHESIS_SIZES, model=model, jobs=1)
        elapsed = time.perf_counter() - began
        for choice in result.choices:
            rows.append(
                (
                    name,
                    SYNTHESIS_NODES,
                    collective,
                    choice.size_bytes,
                    model.name,
                    choice.chosen.name,
                    choice.chosen_result.time_us,
                    choice.baseline_name,
                    choice.baseline.time_us if choice.baseline is not None else None,
                    elapsed,
                )
            )
    return rows


def _chosen_label(name: str) -> str:
    """Return the candidate's chunking (``c1p2``) or the baseline's name from an algorithm name."""
    parts = name.split("-")
    labels = [part for part in parts if part.startswith("c") and "p" in part and part[1].isdigit()]
    return "+".join(labels) + ("-barrier" if "barrier" in parts else "") if labels else name


def render(shipped: list[dict], synthesized: list[dict]) -> str:
    """Return the section: shipped bands under both models, and the 4-node syntheses under each.

    Fractions of the bound are computed here, so the CSVs hold only simulated times.
    """
    bounds: dict = {}
    for row in shipped + synthesized:
        row["bound_us"] = row_bound_us(row, bounds)
    for row in synthesized:
        row["of_bound"] = row["bound_us"] / row["ours_us"]
    lines = [
        "Parts, each writing its CSV before `--render`: `python scripts/bench_send_models.py --part shipped`, and "
        "`--part synthesis --topologies T [--collectives C,...]` one process per machine (the synthesis table "
        "shows which collectives each machine ran).",
        "",
        "Shipped bands (`msccl`: MSCCL's 2 MiB slice loop with serialized sends; `pipelined`: the same "
        "loop with a connection's sends overlapping their α through 2 slots), as the fraction of the "
        "lower bound over 16 MB–1 GiB (min / median over the sizes and collectives):",
        "",
    ]
    table = []
    for (name, nodes), group in sorted(group_records(shipped, "topology", "nodes").items()):
        large = [r for r in group if r["size_bytes"] >= 16 * 2**20]
        serial = sorted(r["bound_us"] / r["msccl_us"] for r in large)
        piped = sorted(r["bound_us"] / r["pipelined_us"] for r in large)
        if not serial:
            continue
        gain = max(r["msccl_us"] / r["pipelined_us"] for r in large)
        table.append(
            (
                f"{name} ×{nodes}",
                f"{serial[0]:.3f} / {serial[len(serial) // 2]:.3f}",
                f"{piped[0]:.3f} / {piped[len(piped) // 2]:.3f}",
                f"{gain:.2f}×",
            )
        )
    lines += [
        markdown_table(("machine", "msccl (serialized)", "pipelined", "largest speed-up pipelined"), table),
        "",
        "Pipelined sends are not faster everywhere: a connection holds 2 slices, so a sender waits for its "
        "receiver's RECV of two sends back, which buffered serialized sends never do.",
        "",
        f"The shipped bands at {SYNTHESIS_NODES} nodes, 16 MiB and 64 MiB, as the fraction of the bound under "
        "each model (AllReduce: of the RS+AG class bound):",
        "",
        markdown_table(
            ("machine", "collective", "16 MiB msccl", "16 MiB pipelined", "64 MiB msccl", "64 MiB pipelined"),
            _four_node_rows(shipped),
        ),
        "",
        csv_pointer(SHIPPED_CSV, len(shipped)),
        "",
    ]
    if synthesized:
        lines += [
            f"Synthesis at {SYNTHESIS_NODES} nodes, 16 MB and 64 MB, under each model: the chosen candidate "
            "(chunks per rank `c`, pieces per chunk `p`; a baseline by name), its fraction of the bound, and the "
            "best baseline's time over ours, all simulated under that model.",
            "",
        ]
        rows = []
        keyed = {(r["topology"], r["collective"], r["size_bytes"], r["model"]): r for r in synthesized}
        for (name, collective, size, model), serial in sorted(
            keyed.items(), key=lambda item: (item[0][0], collective_order(item[0][1]), item[0][2])
        ):
            if model != MSCCL_LOOP.name:
                continue
            piped = keyed.get((name, collective, size, MSCCL_PIPELINED.name))
            if piped is None:
                continue
            rows.append(
                (
                    f"{name} ×{SYNTHESIS_NODES}",
                    collective,
                    format_size(size),
                    _chosen_label(serial["chosen"]),
                    f"{serial['of_bound']:.3f}",
                    _vs(serial),
                    _chosen_label(piped["chosen"]),
                    f"{piped['of_bound']:.3f}",
                    _vs(piped),
                    "same" if _chosen_label(serial["chosen"]) == _chosen_label(piped["chosen"]) else "**differs**",
                )
            )
        headers = (
            "machine",
            "collective",
            "size",
            "msccl: chosen",
            "of bound",
            "baseline/ours",
            "pipelined: chosen",
            "of bound",
            "baseline/ours",
            "choice",
        )
        lines += [markdown_table(headers, rows), "", csv_pointer(SYNTHESIS_CSV, len(synthesized))]
    return "\n".join(lines)


def _four_node_rows(shipped: list[dict]) -> list[tuple]:
    """Return per machine and collective at 4 nodes the bound fractions at 16 and 64 MiB under both models."""
    cells: dict[tuple, dict[int, dict]] = {}
    for row in shipped:
        if row["nodes"] == SYNTHESIS_NODES and row["size_bytes"] in (16 * 2**20, 64 * 2**20):
            cells.setdefault((row["topology"], row["collective"]), {})[row["size_bytes"]] = row
    out = []
    for (name, collective), by_size in sorted(
        cells.items(), key=lambda item: (item[0][0], collective_order(item[0][1]))
    ):
        values = []
        for size in (16 * 2**20, 64 * 2**20):
            row = by_size.get(size)
            values += [f"{row['bound_us'] / row[key]:.3f}" if row else "" for key in ("msccl_us", "pipelined_us")]
        out.append((f"{name} ×{SYNTHESIS_NODES}", collective, *values))
    return out


def _vs(row: dict) -> str:
    return f"{row['baseline_us'] / row['ours_us']:.3f}" if row["baseline_us"] else ""


def main(argv: list[str] | None = None) -> int:
    """Run one part (writing its CSV) or render the section from both CSVs."""
    parser = argument_parser(__doc__)
    parser.add_argument("--part", choices=("shipped", "synthesis"), help="which part to run")
    parser.add_argument("--render", action="store_true", help="write the BENCHMARKS.md section from the CSVs")
    add_topologies_argument(parser)
    add_nodes_argument(parser, "1,2,4,8", what="machine counts for --part shipped")
    add_collectives_argument(parser, what="collectives for --part synthesis")
    add_csv_argument(parser, None, rows="the part's rows")
    args = parser.parse_args(argv)
    if args.part == "shipped":
        rows = []
        for name, nodes in machine_cases(args.topologies, args.nodes):
            if shipped_library_paths(name, nodes):
                log(f"{name} x{nodes}")
                rows += shipped_rows(name, nodes)
        write_csv(args.csv or SHIPPED_CSV, SHIPPED_HEADER, rows)
    elif args.part == "synthesis":
        rows = []
        for name in split_names(args.topologies):
            for collective in split_names(args.collectives):
                log(f"{name} x{SYNTHESIS_NODES} {collective}")
                rows += synthesis_rows(name, Collective(collective).value)
        write_csv(args.csv or SYNTHESIS_CSV, SYNTHESIS_HEADER, rows)
    if args.render:
        synthesized = read_csv(SYNTHESIS_CSV) if SYNTHESIS_CSV.exists() else []
        body = render(read_csv(SHIPPED_CSV), synthesized)
        print(body)
        update_benchmarks_section(
            "send-models",
            "Serialized and pipelined sends (simulated)",
            "python scripts/bench_send_models.py --render",
            body,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
