"""Benchmark ``taccl synthesize`` at several full-collection intervals and print CPU, peak memory and output bytes.

Each run is a fresh process running the CLI with ``taccl_py.gc_tuning.FULL_COLLECTION_EVERY`` set
to one interval (10 is CPython's default, what the command did before it tuned the collector); the
intervals alternate so that a change in the machine's speed spreads over all of them.

    python scripts/bench_gc.py --instances dgx-h100:16 --collectives allgather --sizes 64MB --repeat 2
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_harness import (
    add_collectives_argument,
    add_instances_argument,
    add_sizes_argument,
    argument_parser,
    command_line,
    log,
    parse_instances,
    print_table,
    speedup,
    split_names,
)

from taccl_py.gc_tuning import FULL_COLLECTION_EVERY

DEFAULT_EVERY = 10  # CPython's own third threshold

_CHILD = """
import json, resource, sys
import taccl_py.gc_tuning as tuning
tuning.FULL_COLLECTION_EVERY = int(sys.argv[1])
from taccl_py.cli import main
status = main(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}), file=sys.stderr)
sys.exit(status)
"""


def run_once(every: int, argv: list[str]) -> dict:
    """Return the CPU seconds, peak MB and output digest of one synthesis at interval ``every``."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(every), *argv, "-o", "out.json"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        )
        measured = json.loads(done.stderr.strip().splitlines()[-1])
        measured["digest"] = hashlib.sha256((Path(folder) / "out.json").read_bytes()).hexdigest()[:12]
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__, full_doc=True)
    add_instances_argument(parser, "dgx-h100:16")
    add_collectives_argument(parser, "allgather")
    add_sizes_argument(parser, "64MB", what="message sizes, one synthesis each")
    parser.add_argument("--every", default=f"{DEFAULT_EVERY},{FULL_COLLECTION_EVERY},1000", help="intervals to run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per interval (default 2; medians shown)")
    args = parser.parse_args(argv)
    intervals = [int(every) for every in split_names(args.every)]
    print(f"{command_line(__file__, argv)}  ({args.repeat} runs per interval, median CPU, highest peak)")
    rows = []
    for (topology, nodes), collective, size in itertools.product(
        parse_instances(args.instances), split_names(args.collectives), split_names(args.sizes)
    ):
        argv_cli = ["synthesize", "--topology", topology, "--nodes", str(nodes), "--collective", collective]
        argv_cli += ["--size", size, "--jobs", "1"]
        runs: dict[int, list[dict]] = {every: [] for every in intervals}
        for repeat in range(args.repeat):
            for every in intervals:
                log(f"{topology} x{nodes} {collective} {size}: every {every}, run {repeat + 1}")
                runs[every].append(run_once(every, argv_cli))
        first = statistics.median(run["cpu_s"] for run in runs[intervals[0]])
        for every, measured in runs.items():
            cpu = statistics.median(run["cpu_s"] for run in measured)
            digests = ", ".join(sorted({run["digest"] for run in measured}))
            peak = max(run["peak_mb"] for run in measured)
            instance = f"{topology} x{nodes} {collective} {size}"
            rows.append([instance, every, f"{cpu:.1f}", f"{speedup(first, cpu):.2f}x", f"{peak:.0f}", digests])
    headers = ["instance", "full collection every", "CPU s", "vs the first", "peak MB", "output sha256"]
    print_table(headers, rows, markdown=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
