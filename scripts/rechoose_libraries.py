"""Choose shipped libraries' bands again with the switch designs and NCCL's modelled algorithms, and write them.

Where a machine's NVSwitch reduces (DGX-H100, DGX-B200, GB200 NVL72), NCCL runs NVLS (one machine)
or NVLS-Tree (several): ``taccl_py.synth.rechoose.rechoose_bands`` adds the switch designs to a
library's band algorithms and leaves to NCCL (native bands) every size where its modelled
algorithm is faster than anything a band may hold. ``--from`` takes the band algorithms of
another machine with the same GPU graph (DGX-H100's for DGX-B200, where a synthesis at 64 GPUs
runs for hours on two cores): its bands are chosen anew on the target's rates, and the library
records that it was derived so.

    python scripts/rechoose_libraries.py --topologies dgx-h100 --nodes 2,4,8
    python scripts/rechoose_libraries.py --topologies dgx-b200 --nodes 8 --from dgx-h100

It prints, per library and size, the band chosen, its time and NCCL's best modelled time there.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from bench_harness import (
    REPO_ROOT,
    add_collectives_argument,
    add_nodes_argument,
    add_topologies_argument,
    argument_parser,
    command_line,
    log,
    machine_cases,
    print_table,
    split_names,
)
from build_algorithms import source_commit

from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.simulate import DEFAULT_MODEL
from taccl_py.synth.bands import write_library
from taccl_py.synth.rechoose import rechoose_bands, refine_native_edges
from taccl_py.topology import load_topology

HEADERS = ("machine", "nodes", "collective", "size", "band", "time (us)", "baseline", "baseline (us)", "vs baseline")


def rechoose_one(
    machine: str, source: str, nodes: int, collective: str, command: str, refine_only: bool = False
) -> list[tuple]:
    """Choose one library again (from ``source``'s shipped one), write it under ``machine``; return table rows.

    ``refine_only`` keeps the bands and only moves the edges to native bands (``refine_native_edges``).
    """
    path = next(p for p in shipped_library_paths(source, nodes) if p.name == f"{collective}.library.json")
    library = read_library(path)
    topology = load_topology(machine, nodes)
    model = DEFAULT_MODEL
    if refine_only:
        rechosen, choices = library, ()
    else:
        rechosen, choices = rechoose_bands(library, topology, model=model, progress=log, machine=machine)
    rechosen = refine_native_edges(rechosen, topology, model=model)
    if refine_only:  # the bands are the recorded command's; only their edges moved
        note = "edges to native bands moved to powers of two where NCCL takes over (rechoose_libraries --refine-only)"
        earlier = rechosen.provenance.note
        noted = earlier if earlier and note in earlier else f"{earlier}; {note}" if earlier else note
        rechosen = replace(rechosen, provenance=replace(rechosen.provenance, note=noted))
    else:  # the commit whose code chose these bands, as build_algorithms records the one that synthesized them
        rechosen = replace(
            rechosen, provenance=replace(rechosen.provenance, command=command, source_commit=source_commit())
        )
    target = REPO_ROOT / "algorithms" / machine / f"n{nodes}" / f"{collective}.library.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    old_files = set(target.parent.glob(f"{collective}-*.json.xz"))
    write_library(rechosen, target, compress=True)
    written = {target.parent / f"{collective}-{i}.json.xz" for i, band in enumerate(rechosen.bands) if not band.native}
    for stale in old_files - written:
        stale.unlink()
    rows = []
    for choice in choices:
        band = next(i for i, b in enumerate(rechosen.bands) if b.covers(choice.size_bytes))
        ours = choice.runs_us
        label = f"{band} native" if choice.native else f"{band} {choice.chosen.name[:48]}"
        base = choice.baseline.time_us
        rows.append(
            (machine, nodes, collective, choice.size_bytes, label, ours, choice.baseline_name, base, base / ours)
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_topologies_argument(parser)
    add_nodes_argument(parser, "1,2,4,8")
    add_collectives_argument(parser, "allgather,reducescatter,allreduce")
    parser.add_argument("--from", dest="source", help="take the band algorithms of this machine (same GPU graph)")
    parser.add_argument(
        "--refine-only", action="store_true", help="keep the bands, only move their edges to native bands"
    )
    args = parser.parse_args(argv)
    rows: list[tuple] = []
    for machine, nodes in machine_cases(args.topologies, args.nodes):
        source = args.source or machine
        for collective in split_names(args.collectives):
            if not any(p.name == f"{collective}.library.json" for p in shipped_library_paths(source, nodes)):
                log(f"{source} x{nodes} {collective}: no shipped library, skipped")
                continue
            began = time.perf_counter()
            command = command_line(
                __file__,
                [
                    "--topologies",
                    machine,
                    "--nodes",
                    str(nodes),
                    "--collectives",
                    collective,
                    *(["--from", source] if args.source else []),
                    *(["--refine-only"] if args.refine_only else []),
                ],
            )
            rows += rechoose_one(machine, source, nodes, collective, command, args.refine_only)
            log(f"{machine} x{nodes} {collective}: {time.perf_counter() - began:.0f} s")
    print_table(HEADERS, [(*row[:5], f"{row[5]:.2f}", row[6], f"{row[7]:.2f}", f"{row[8]:.2f}x") for row in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
