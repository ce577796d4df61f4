"""Protocol per size band (Simple, LL or LL128), chosen by simulation, and what it gains over Simple.

Every shipped library (each built-in machine at 1, 2 and 4 nodes; allgather, reducescatter,
allreduce and alltoall) is taken band by band: the band's algorithm is simulated at the band's
sample sizes (its edges and their geometric middle; an open-ended band at its minimum, 4x and 16x,
at most 1 GB) under each protocol a runtime may use there, and the protocol of smallest total
time is chosen, Simple on a near-tie within 1% (``taccl_py.msccl.protocol.choose_protocols``).
Runtimes: portable (the export default; Simple and LL, RCCL's smaller LL buffer), msccl-executor-nccl
(LL128 too, NCCL's buffers) and rccl on gfx942 (LL128 with 64-byte lines and RCCL's buffers). LL and
LL128 are offered only where every chunk of the band's largest size fits one pass of the protocol's
buffer, and LL128 only where NCCL enables it (NVLink inside a machine, NICs off the CPU). gain =
Simple's total time over the chosen protocol's, in the same run. LL and LL128 pay at least the
wire's α and carry fewer data bytes per byte sent (``taccl_py.simulate.protocol``); Simple here pays
the wire's α alone, without NCCL's per-step Simple synchronisation: in this model no protocol beats it.

    python scripts/bench_protocols.py                          # every shipped library
    python scripts/bench_protocols.py --topologies ndv2 --nodes 1 --no-write
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from bench_harness import (
    DATA_DIR,
    add_no_write_argument,
    add_nodes_argument,
    add_topologies_argument,
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

from taccl_py.ir.library import read_library
from taccl_py.msccl.limits import protocol_limits
from taccl_py.msccl.protocol import choose_protocols
from taccl_py.topology import builtin_topology_names, load_topology
from taccl_py.units import format_size

REPO = Path(__file__).resolve().parents[1]
CSV_PATH = DATA_DIR / "protocols.csv"
USAGE = "    python scripts/bench_protocols.py "
DEFAULT_NODES = "1,2,4"
# (column label, runtime, rccl_gpu_arch): the runtimes compared, portable first.
RUNTIMES = (
    ("portable", "portable", None),
    ("executor", "msccl-executor-nccl", None),
    ("rccl gfx942", "rccl", "gfx942"),
)
CSV_HEADER = (
    "topology",
    "nodes",
    "collective",
    "band",
    "min_bytes",
    "max_bytes",
    "chunks",
    "runtime",
    "protocol",
    "sizes_bytes",
    "chosen_us",
    "simple_us",
    "chosen_total_us",
    "simple_total_us",
    "gain",
    "refused",
)


def _joined(values) -> str:
    return ";".join(f"{value:.4f}" if isinstance(value, float) else str(value) for value in values)


def library_rows(path: Path) -> list[tuple]:
    """Return one ``CSV_HEADER`` row per band and runtime of the library at ``path``."""
    library = read_library(path)
    topology = load_topology(library.topology, library.nodes)
    limits = [protocol_limits(runtime, rccl_gpu_arch=arch) for _, runtime, arch in RUNTIMES]
    rows = []
    for index, band in enumerate(library.bands):
        if band.native:
            continue
        choices = choose_protocols(
            band.algorithm, topology, band.min_bytes, band.max_bytes, limits, simulate_simple_alone=True
        )
        for (label, _, _), choice in zip(RUNTIMES, choices):
            chosen = dict(choice.times_us)[choice.protocol]
            simple = dict(choice.times_us)["Simple"]
            rows.append(
                (
                    library.topology,
                    library.nodes,
                    library.collective.value,
                    index,
                    band.min_bytes,
                    band.max_bytes,
                    band.algorithm.chunks_per_loop,
                    label,
                    choice.protocol,
                    _joined(choice.sizes_bytes),
                    _joined(chosen),
                    _joined(simple),
                    sum(chosen),
                    sum(simple),
                    choice.speedup,
                    ";".join(name for name, _ in choice.refused),
                )
            )
    return rows


def _libraries(topologies: set[str] | None, nodes: set[int]) -> list[Path]:
    paths = []
    for path in sorted((REPO / "algorithms").glob("*/n*/*.library.json")):
        topology, node_count = path.parent.parent.name, int(path.parent.name[1:])
        if (topologies is None or topology in topologies) and node_count in nodes:
            paths.append(path)
    return paths


def _band_label(record: dict) -> str:
    high = "inf" if record["max_bytes"] is None else format_size(record["max_bytes"])
    return f"{format_size(record['min_bytes'])}-{high}"


def band_table(records: list[dict]) -> list[tuple]:
    """Return one printed row per band: its range and chunks, then each runtime's protocol and gain."""
    bands: dict[tuple, dict[str, dict]] = {}
    for record in records:
        key = (record["topology"], record["nodes"], record["collective"], record["band"])
        bands.setdefault(key, {})[record["runtime"]] = record
    rows = []
    for (topology, nodes, collective, _), by_runtime in bands.items():
        first = by_runtime[RUNTIMES[0][0]]
        cells = [f"{by_runtime[label]['protocol']} {by_runtime[label]['gain']:.2f}x" for label, _, _ in RUNTIMES]
        rows.append((f"{topology} x{nodes}", collective, _band_label(first), first["chunks"], *cells))
    return rows


def summary_table(records: list[dict]) -> list[tuple]:
    """Return one row per machine and node count: bands, protocol counts per runtime, best gain per runtime."""
    rows = []
    for (topology, nodes), group in group_records(records, "topology", "nodes").items():
        cells = []
        for label, _, _ in RUNTIMES:
            mine = [r for r in group if r["runtime"] == label]
            counts = Counter(r["protocol"] for r in mine)
            best = max(r["gain"] for r in mine)
            cells.append(f"{counts['LL']} / {counts['LL128']} / {counts['Simple']} (best {best:.2f}x)")
        bands = len({(r["collective"], r["band"]) for r in group})
        rows.append((f"{topology} x{nodes}", bands, *cells))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the per-band table; unless ``--no-write``, write the CSV and the BENCHMARKS.md section."""
    parser = argument_parser(__doc__)
    add_topologies_argument(parser, unset="every shipped one")
    add_nodes_argument(parser, DEFAULT_NODES)
    add_no_write_argument(parser)
    args = parser.parse_args(argv)
    topologies = set(split_names(args.topologies)) or None
    nodes = {int(n) for n in split_names(args.nodes)}
    paths = _libraries(topologies, nodes)
    start = time.perf_counter()
    rows = []
    for index, path in enumerate(paths, 1):
        began = time.perf_counter()
        new = library_rows(path)
        rows.extend(new)
        log(
            f"[{index}/{len(paths)}] {path.relative_to(REPO)}: {len(new) // len(RUNTIMES)} bands, "
            f"{time.perf_counter() - began:.1f} s"
        )
    elapsed_s = time.perf_counter() - start

    def key(row):
        return (row[0], row[1], *collective_order(row[2]), row[3], [r[0] for r in RUNTIMES].index(row[7]))

    records = csv_output(CSV_PATH, CSV_HEADER, rows, key, write=not args.no_write)
    labels = [label for label, _, _ in RUNTIMES]
    print_table(("instance", "collective", "band", "chunks", *labels), band_table(records))
    summary = markdown_table(
        ("instance", "bands", *(f"{label}: LL / LL128 / Simple" for label in labels)), summary_table(records)
    )
    print(f"\n{summary}\n\n{len(rows) // len(RUNTIMES)} bands in {elapsed_s:.0f} s")
    shipped = {path.parent.parent.name for path in _libraries(None, nodes)}
    unshipped = sorted(set(builtin_topology_names()) - shipped)
    if not args.no_write:
        body = (
            f"{doc_prose(__doc__, USAGE)}\n\n"
            f"Bands per machine and runtime that take LL / LL128 / Simple, and the largest gain of any band "
            f"({len(rows) // len(RUNTIMES)} bands, {elapsed_s:.0f} s on one core"
            + (f"; no shipped libraries for {', '.join(unshipped)}" if unshipped else "")
            + f"):\n\n{summary}\n\n{csv_pointer(CSV_PATH, len(records), 'Every band and runtime')}\n"
        )
        title = "Wire protocol per size band (simulated)"
        update_benchmarks_section("protocols", title, command_line(__file__, argv), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
