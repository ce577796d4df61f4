"""Synthesize AlltoAll on built-in machines and compare it with the baselines under the simulator.

One row per machine x nodes x size: the best synthesized algorithm's time (µs; every synthesized
candidate fits the MSCCL limits) and fraction of the AlltoAll bound, the best baseline overall and
the best baseline that fits the MSCCL limits (direct does not beyond 32 GPUs), and the synthesis
wall time (s, one job: LP, lowering, verification and simulation of the candidates at these sizes;
the baselines' simulation is included).

    python scripts/bench_alltoall.py
    python scripts/bench_alltoall.py --topologies ndv2,dgx2 --nodes 2,4 --sizes 1MB,16MB,1GB
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from taccl_py.baselines.alltoall import direct_alltoall_algorithm, hierarchical_alltoall_algorithm
from taccl_py.synth import synthesize
from taccl_py.synth.candidates import exportable, simulate_at
from taccl_py.topology import load_topology
from taccl_py.topology.bounds import lower_bounds
from taccl_py.units import format_size, parse_sizes

DEFAULT_TOPOLOGIES = "ndv2,dgx2,dgx-a100,dgx-h100"
DEFAULT_NODES = "2,4"
DEFAULT_SIZES = "1MB,16MB,1GB"
HEADER = (
    "machine",
    "nodes",
    "GPUs",
    "size",
    "synth us",
    "synth/bound",
    "synth label",
    "best baseline",
    "baseline us",
    "best exportable baseline",
    "exportable us",
    "synth wall s",
)


def _baselines(topology, sizes, bounds) -> list[tuple[str, bool, tuple]]:
    """Return (name, exportable, results per size) for each AlltoAll baseline."""
    builders = [direct_alltoall_algorithm] + ([hierarchical_alltoall_algorithm] if topology.nodes > 1 else [])
    out = []
    for build in builders:
        algorithm = build(topology)
        out.append((algorithm.name, exportable(algorithm), simulate_at(algorithm, topology, sizes, bounds)))
    return out


def _rows(machine: str, nodes: int, sizes: Sequence[int]) -> list[tuple[str, ...]]:
    topology = load_topology(machine, nodes)
    began = time.perf_counter()
    result = synthesize(topology, "alltoall", sizes=sizes)
    wall_s = time.perf_counter() - began
    bounds = lower_bounds(topology, "alltoall", sizes)
    baselines = _baselines(topology, sizes, bounds)
    rows = []
    for index, choice in enumerate(result.choices):
        best = min(baselines, key=lambda b: b[2][index].time_us)
        fitting = [b for b in baselines if b[1]]
        best_fit = min(fitting, key=lambda b: b[2][index].time_us) if fitting else None
        syn = choice.synthesized
        rows.append(
            (
                machine,
                str(nodes),
                str(topology.num_ranks),
                format_size(choice.size_bytes),
                f"{syn.time_us:.1f}",
                f"{syn.fraction_of_bound:.3f}",
                syn.algorithm.split(f"{topology.name}-", 1)[-1],
                best[0],
                f"{best[2][index].time_us:.1f}",
                "-" if best_fit is None else best_fit[0],
                "-" if best_fit is None else f"{best_fit[2][index].time_us:.1f}",
                f"{wall_s:.1f}",
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", default=DEFAULT_TOPOLOGIES)
    parser.add_argument("--nodes", default=DEFAULT_NODES)
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    print(" | ".join(HEADER))
    for machine in args.topologies.split(","):
        for nodes in (int(n) for n in args.nodes.split(",")):
            for row in _rows(machine, nodes, sizes):
                print(" | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
