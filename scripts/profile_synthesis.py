"""Time the synthesizer's pure-Python stages on greedy routes, deterministically (no MILP).

For each machine, collective and chunking it runs what ``taccl_py.synth.compose`` runs after
routing, with the greedy routing in place of the routing MILP (whose result depends on time
limits) and the contiguity stage's list scheduler (``schedule_sends(..., milp=False)``):
``order_sends`` -> ``schedule_sends`` -> ``lower_schedule`` -> ``check_algorithm`` ->
``prepare_simulation`` / ``simulate_plan`` at a few sizes, and prints one row per instance with
the seconds each stage took. AllReduce is the reduce phase on the reversed graph plus the gather
phase, as in ``compose``.

``--save DIR`` writes every instance's outputs (algorithm JSON, schedule and simulated times as
``repr`` floats) to DIR; ``--compare DIR`` checks them against a saved run byte for byte, so
a speed-up can be shown to change nothing. ``--profile FILE`` also writes cProfile statistics
of all stages together and prints the top functions.

    python scripts/profile_synthesis.py --save /tmp/before
    python scripts/profile_synthesis.py --compare /tmp/before --profile /tmp/after.prof
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench_harness import add_collectives_argument, add_sizes_argument, argument_parser, parse_instances, split_names

from taccl_py.ir.algorithm_json import generate_algorithm_json
from taccl_py.ir.collectives import Collective
from taccl_py.simulate import prepare_simulation, simulate_plan
from taccl_py.solvers import SolverOptions
from taccl_py.stages.logical import build_logical_graph, phase_graphs
from taccl_py.stages.lower_schedule import lower_schedule
from taccl_py.stages.ordering import order_sends
from taccl_py.stages.routing import greedy_routing
from taccl_py.stages.scheduling import schedule_sends
from taccl_py.stages.sketch import auto_sketch
from taccl_py.synth.compose import Chunking
from taccl_py.topology import load_topology
from taccl_py.units import format_size, parse_size, parse_sizes
from taccl_py.verify import check_algorithm

# (built-in machine, nodes): the 64-GPU case the issue names, a 32-GPU one and a small one.
DEFAULT_MACHINES = ("dgx2:4", "dgx-a100:4", "ndv2:2")
DEFAULT_COLLECTIVES = ("allgather", "allreduce")
# (chunkup, pieces): the bandwidth regime's largest chunkings within the routed-chunk cap at 64 GPUs.
DEFAULT_CHUNKINGS = ("1x4", "2x4")
DEFAULT_DESIGN = "64MB"
DEFAULT_SIM_SIZES = "1MB,64MB,1GB"
STAGES = ("routing", "ordering", "scheduling", "lowering", "verify", "simulate")
# Stages whose total the speed-up is judged on (routing is the MILP's stand-in, not among them).
TIMED_STAGES = STAGES[1:]


# The clocks a stage can be timed by: this process's CPU time is steadier on a shared machine.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


@dataclass
class InstanceRun:
    """The outputs and stage times (s) of one machine x collective x chunking."""

    label: str
    clock: Callable[[], float] = time.process_time
    seconds: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)


def _timed(run: InstanceRun, stage: str, func, *args, **kwargs):
    began = run.clock()
    value = func(*args, **kwargs)
    run.seconds[stage] = run.seconds.get(stage, 0.0) + run.clock() - began
    return value


def _schedule_text(schedules) -> str:
    """Return the sends, groups and exact times of ``schedules`` as text (floats by ``repr``)."""
    lines = []
    for schedule in schedules:
        lines.append(f"groups {schedule.groups!r}")
        lines.append(f"status {schedule.status}")
        for index, send in enumerate(schedule.ordering.sends):
            times = (send.start_us, send.end_us, schedule.start_us[index], schedule.end_us[index])
            lines.append(f"{index} {send.chunk} {send.piece} {send.link} {send.parent} {send.batch} {times!r}")
    return "\n".join(lines) + "\n"


def run_instance(
    machine: str, nodes: int, collective: Collective, chunking: Chunking, sizes, clock: str = "cpu"
) -> InstanceRun:
    """Return the stage times (s by ``clock``) and outputs of one instance (see the module docstring)."""
    topology = load_topology(machine, nodes=nodes)
    run = InstanceRun(f"{topology.name} {collective.value} {chunking.label}", CLOCKS[clock])
    graph = build_logical_graph(topology, auto_sketch(topology))
    chunk_bytes = chunking.design_bytes / (graph.num_ranks * chunking.chunkup)
    piece_bytes = chunk_bytes / chunking.pieces
    schedules = []
    for phase in phase_graphs(graph, collective):
        routing = _timed(run, "routing", greedy_routing, phase, chunking.chunkup, chunk_bytes, piece_bytes)
        ordering = _timed(run, "ordering", order_sends, routing, chunking.pieces, piece_bytes)
        schedules.append(_timed(run, "scheduling", schedule_sends, ordering, SolverOptions(), milp=False))
    name = f"profile-{collective.value}-{topology.name}-{chunking.label}"
    algorithm = _timed(run, "lowering", lower_schedule, name, collective, schedules)
    _timed(run, "verify", check_algorithm, algorithm)
    plan = _timed(run, "simulate", prepare_simulation, algorithm, topology)
    times = {format_size(size): _timed(run, "simulate", simulate_plan, plan, size, bound_time_us=0.0) for size in sizes}
    run.outputs["algorithm.json"] = generate_algorithm_json(algorithm)
    run.outputs["schedule.txt"] = _schedule_text(schedules)
    run.outputs["simulated.json"] = json.dumps(
        {size: repr(result.time_us) for size, result in times.items()}, indent=1, sort_keys=True
    )
    return run


def _compare(run: InstanceRun, directory: Path) -> list[str]:
    """Return the names of the outputs of ``run`` that differ from those saved in ``directory``."""
    differ = []
    for name, text in run.outputs.items():
        path = directory / run.label.replace(" ", "_") / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            differ.append(name)
    return differ


def _save(run: InstanceRun, directory: Path) -> None:
    folder = directory / run.label.replace(" ", "_")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in run.outputs.items():
        (folder / name).write_text(text, encoding="utf-8")


def _parse_args(argv):
    parser = argument_parser(__doc__)
    parser.add_argument("--machines", default=",".join(DEFAULT_MACHINES), help="NAME:NODES list")
    add_collectives_argument(parser, ",".join(DEFAULT_COLLECTIVES))
    parser.add_argument("--chunkings", default=",".join(DEFAULT_CHUNKINGS), help="CHUNKUPxPIECES list")
    parser.add_argument("--design", default=DEFAULT_DESIGN, help="size the routes and orders are tuned for")
    add_sizes_argument(parser, DEFAULT_SIM_SIZES, what="sizes to simulate at")
    parser.add_argument("--save", type=Path, help="write every instance's outputs under this folder")
    parser.add_argument("--compare", type=Path, help="compare every instance's outputs with this folder")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics of all instances here")
    parser.add_argument("--top", type=int, default=25, help="functions to print from the profile")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="time stages by CPU or wall time")
    return parser.parse_args(argv)


def _row(label: str, seconds: dict[str, float], note: str) -> str:
    cells = "".join(f"{seconds.get(stage, 0.0):>11.2f}" for stage in STAGES)
    total = sum(seconds.get(stage, 0.0) for stage in TIMED_STAGES)
    return f"{label:<36}{cells}{total:>11.2f}  {note}"


def main(argv=None) -> int:
    """Run the instances, print the table of stage seconds; return 1 when a comparison fails."""
    args = _parse_args(argv)
    design = parse_size(args.design)
    sizes = parse_sizes(args.sizes)
    chunkings = [Chunking(*map(int, text.split("x")), design) for text in args.chunkings.split(",")]
    profiler = cProfile.Profile() if args.profile else None
    print(f"{'instance':<36}" + "".join(f"{stage:>11}" for stage in STAGES) + f"{'total':>11}  outputs")
    failed = False
    totals: dict[str, float] = {}
    for name, nodes in parse_instances(args.machines):
        for collective in split_names(args.collectives):
            for chunking in chunkings:
                if profiler is not None:
                    profiler.enable()
                run = run_instance(name, nodes, Collective(collective), chunking, sizes, args.clock)
                if profiler is not None:
                    profiler.disable()
                note = ""
                if args.compare:
                    differ = _compare(run, args.compare)
                    failed = failed or bool(differ)
                    note = "identical" if not differ else "DIFFER: " + ",".join(differ)
                if args.save:
                    _save(run, args.save)
                for stage, seconds in run.seconds.items():
                    totals[stage] = totals.get(stage, 0.0) + seconds
                print(_row(run.label, run.seconds, note), flush=True)
    print(_row("all", totals, f"({args.clock} s; total = {'+'.join(TIMED_STAGES)}; sizes {args.sizes})"))
    if profiler is not None:
        profiler.dump_stats(args.profile)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
