"""DDP step time with the taccl_py hook and on the taccl backend against default DDP (gloo, 4 CPU ranks).

Writes the ``ddp`` section of BENCHMARKS.md with ``--write``. Run: ``python scripts/bench_ddp.py``.
Each row trains the MLP of ``scripts/ddp_example.py`` at one width with all five variants from the
same seed, their steps alternating (20 timed steps after 3 warm-up steps), and reports the slowest
rank's median step time of default DDP, each variant's ratio to it measured in the same run, and the largest
parameter difference from it.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Sequence

from bench_harness import add_write_argument, argument_parser, print_table, update_benchmarks_section
from ddp_example import VARIANTS, init_taccl, make_model, resolve_library, run_variants

from taccl_py.runtime.launch import run_local
from taccl_py.units import format_size

WORLD_SIZE = 4
WIDTHS = (256, 1024, 2048)
STEPS = 20
COMMAND = "python scripts/bench_ddp.py"
#: Join deadline for the 4 ranks (seconds): three widths, five variants (two calibrating first), on 2 slow cores.
JOIN_TIMEOUT_S = 600.0


def _rank_main(
    rank: int, world_size: int, port: int, widths: Sequence[int], steps: int, library_spec: str
) -> list[dict[str, tuple[float, float]]]:
    import torch.distributed as dist

    dist.destroy_process_group()  # the launcher's gloo group; the benchmark runs on a taccl one
    store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=datetime.timedelta(seconds=120))
    library = resolve_library(library_spec, world_size)
    init_taccl(library, store=store, rank=rank, world_size=world_size)
    gloo = dist.new_group(backend="gloo")
    return [run_variants(rank, width, steps, library, gloo) for width in widths]


def run_benchmark(widths: Sequence[int], steps: int, library_spec: str) -> list[tuple]:
    """Return one table row per width: size, the four step times, the ratios and the differences."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, WORLD_SIZE + 1, True, wait_for_workers=False)
    per_rank = run_local(
        _rank_main, WORLD_SIZE, (store.port, tuple(widths), steps, library_spec), timeout_s=JOIN_TIMEOUT_S
    )
    del store
    rows = []
    for width, found in zip(widths, per_rank[0]):  # every rank holds the all-reduced maxima
        size_bytes = sum(p.numel() for p in make_model(width).parameters()) * 4
        base_ms = found[VARIANTS[0]][1]
        ratios = [f"{found[name][1] / base_ms:.2f}x" for name in VARIANTS[1:]]
        worst = max(found[name][0] for name in VARIANTS[1:])
        rows.append((width, format_size(size_bytes), f"{base_ms:.2f}", *ratios, f"{worst:.1e}"))
    return rows


#: The step-time columns are ratios to default DDP's step in the same run (see ``VARIANTS``).
HEADERS = ("width", "gradients", "default ms", *(f"{name}/default" for name in VARIANTS[1:]), "max |dparam|")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    add_write_argument(parser, "ddp")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"timed steps per variant (default {STEPS})")
    parser.add_argument("--library", default="ring", help="'ring' (default), a *.library.json or a topology name")
    args = parser.parse_args(argv)
    table = print_table(HEADERS, run_benchmark(WIDTHS, args.steps, args.library))
    if args.write:
        cores, load = os.cpu_count(), os.getloadavg()[0]
        body = (
            f"DDP on {WORLD_SIZE} gloo ranks on one machine ({cores} CPU cores, load average {load:.1f} after the "
            "run:\n"
            "a shared machine, so expect ±30% between runs), the MLP of `scripts/ddp_example.py`\n"
            f"(64-width-width-10, batch 32, SGD), {args.steps} timed steps after 3 warm-up steps, the five variants'\n"
            "steps alternating (so load changes hit all alike), default bucket cap.\n"
            f"Library: `{args.library}` (ring all-reduce run by taccl_py's executor over gloo point-to-point).\n"
            "Columns: slowest rank's median step time for default DDP (gloo all-reduce); the ratio to it, from the\n"
            'same run, of DDP with the taccl_py comm hook, of DDP on `init_process_group("taccl")`, of the hook\n'
            "with `calibration=` and of a taccl group after `group.calibrate(...)` (their all-reduce timed against\n"
            "gloo's own on their group before training; gloo's own runs unless ours measured > 5% faster);\n"
            "the largest parameter difference from default DDP after training (fp32).\n\n"
            f"```\n{table}\n```\n"
        )
        update_benchmarks_section(
            "ddp",
            "DDP step time: taccl_py hook and backend against default DDP (gloo, 4 ranks)",
            COMMAND + " --write",
            body,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
