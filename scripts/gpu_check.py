"""GPU check: every collective of a library, bit for bit against NCCL's own, then times, DDP and FSDP2.

    torchrun --nproc-per-node 8 scripts/gpu_check.py --library ndv2
    torchrun --nproc-per-node 4 scripts/gpu_check.py --share-gpu        # one GPU, 4 ranks
    torchrun --nproc-per-node 2 scripts/gpu_check.py --device cpu       # gloo, no GPU: the correctness parts

Rank 0 prints Markdown tables to paste into BENCHMARKS.md (collective, dtype, op, entry point,
transport, result). Every collective the library holds is checked (allgather, reducescatter,
allreduce, alltoall), each with tensors shaped by ``block_layout``, in float32, float16,
bfloat16, float64, int32 and int64, reducing ones with sum, avg, max and min, on small random
integers so that every order of reduction gives the same bits:

1. executor: each algorithm through its own Executor on the torch NCCL and CuPy NCCL transports
   (gloo on CPU); on CUDA also on a side stream and three calls through one CUDA graph;
2. communicator: a Communicator (no calibration) at a size in each band of the library, so every
   band's algorithm answers a real ``all_gather`` / ``reduce_scatter`` / ``all_reduce`` / ``all_to_all``;
3. backend: the ``taccl`` torch.distributed group: the single-tensor calls per band, all_reduce
   with PRODUCT (delegated to the inner backend), the list calls (``all_gather``,
   ``reduce_scatter``, ``all_to_all``), two calls coalesced in ``_coalescing_manager``, and an
   async mix of routed and delegated calls; then a table of the group's routed / delegated counters
   (a call the library has an algorithm for must have been routed, and no other);
4. overlap (CUDA only): compute issued after an async all_reduce on the ``taccl`` group must start
   before the all_reduce ends (routed calls run on the group's internal stream), timed with CUDA
   events against the same steps serialized; a BENCHMARKS line sums it up;
5. times in the nccl-tests format (algbw, busbw) of our Communicator and of NCCL, alternated;
6. training (CUDA only): a DDP step with the hook and with the ``taccl`` backend, and an FSDP2
   step on the ``taccl`` backend, against default DDP on NCCL: the largest parameter difference.

The reference is the same collective on a plain NCCL group (gloo with ``--device cpu``); avg is
compared with its sum divided by the rank count, the executor's rule (integers truncate toward
zero, as NCCL's ncclAvg does). ``--share-gpu`` puts every rank on device 0 and gives each its own
NCCL host id, so NCCL links them through its socket transport over loopback (NCCL refuses two
ranks of one host on one GPU): that checks correctness and stream ordering; its times are
loopback-socket times. Without CUDA (``--device cpu``) the CUDA-only parts are listed as skipped.
Exit status 0 when everything agrees, 1 when anything differs or was not routed as expected.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ddp_example import make_model, ring_library  # noqa: E402
from gpu_check_backend import check_backend  # noqa: E402
from gpu_check_cases import MAX_CHECK_BYTES  # noqa: E402
from gpu_check_exact import check_algorithms, check_communicator, check_graphs  # noqa: E402
from gpu_check_overlap import check_overlap, overlap_lines  # noqa: E402
from gpu_check_report import all_exact, merge_ranks, report_lines, routing_lines, summarize  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from taccl_py.baselines.alltoall import direct_alltoall_algorithm  # noqa: E402
from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.runtime.backend import register_backend  # noqa: E402
from taccl_py.runtime.communicator import Communicator  # noqa: E402
from taccl_py.runtime.communicator.selection import AlgorithmChoices, collect_algorithms  # noqa: E402
from taccl_py.runtime.ddp import register  # noqa: E402
from taccl_py.runtime.measure.bench import BenchRow, bench_sizes  # noqa: E402
from taccl_py.runtime.transports.torch_dist import TorchDistTransport  # noqa: E402
from taccl_py.topology.model import Link, LinkKind, Vertex, VertexKind, make_topology  # noqa: E402

#: The parts ``--parts`` picks from, in the order they run.
PARTS = ("executor", "communicator", "backend", "overlap", "times", "training")
#: nccl-tests' bus-bandwidth factor per collective, for n ranks.
BUS_FACTOR = MappingProxyType(
    {
        Collective.ALLGATHER: lambda n: (n - 1) / n,
        Collective.REDUCESCATTER: lambda n: (n - 1) / n,
        Collective.ALLREDUCE: lambda n: 2 * (n - 1) / n,
        Collective.ALLTOALL: lambda n: (n - 1) / n,
    }
)
#: Parameters after training must agree with default DDP on NCCL within this (fp32, GPU sums).
AGREEMENT = 1e-5


def check_library(spec: str, world: int) -> list[Any]:
    """Return what ``--library`` names: ``ring`` is the rank-order rings and the direct alltoall; else the spec."""
    if spec != "ring":
        return [spec]
    gpus = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(world)]
    links = [
        Link(f"gpu{a}", f"gpu{b}", LinkKind.ETHERNET, 10.0, 1.0) for a in range(world) for b in range(world) if a != b
    ]
    mesh = make_topology(f"loopback{world}", gpus, links, description="uniform full mesh for the direct alltoall")
    return [*ring_library(world), direct_alltoall_algorithm(mesh)]


def setup(device_kind: str, share_gpu: bool, specs: Sequence[str], timeout_s: float) -> tuple[int, int, Any, list]:
    """Make the default group ``taccl`` on this rank's device; return (rank, world, device, library)."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if device_kind == "cuda":
        if share_gpu:
            # NCCL matches a GPU to a host by host id: distinct ids make one GPU look like one per host.
            os.environ["NCCL_HOSTID"] = f"taccl-gpu-check-{rank}"
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
            os.environ.setdefault("NCCL_IB_DISABLE", "1")
        device = torch.device("cuda", 0 if share_gpu else local_rank)
        torch.cuda.set_device(device)
    world = int(os.environ["WORLD_SIZE"])
    library = [item for spec in specs for item in check_library(spec, world)]
    # The check is of our algorithms: no calibration may send a size to the group's own collective.
    register_backend(library, calibration=False)
    dist.init_process_group("taccl", timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world, device, library


def plain_communicator(group: Any, library: Any, timeout_s: float) -> Communicator:
    """Return a Communicator on ``group`` that runs the library's algorithm wherever a band has one: no calibration."""
    return Communicator(group, library, timeout_s=timeout_s, calibration=False)


def make_transports(device: torch.device) -> tuple[dict[str, Any], list[str]]:
    """Return the executor check's transports by name, and a note on each one skipped, with the reason."""
    if device.type != "cuda":
        return {"torch-gloo": TorchDistTransport(dist.new_group(backend="gloo"))}, []
    transports: dict[str, Any] = {"torch-nccl": TorchDistTransport(dist.new_group(backend="nccl"), device)}
    if importlib.util.find_spec("cupy") is None:  # every rank alike: one environment
        return transports, ["skipped: the cupy-nccl transport: CuPy is not installed"]
    from taccl_py.runtime.transports.cupy_nccl import CupyNcclTransport

    transports["cupy-nccl"] = CupyNcclTransport(dist.new_group(backend="nccl"), device.index)
    return transports, []


def time_collectives(comm: Communicator, choices: AlgorithmChoices, sizes: Sequence[int], iters: int) -> list[BenchRow]:
    """Return ``taccl bench``'s rows for every collective of the library: ours against the group's own."""
    collectives = sorted(choices.collectives, key=list(Collective).index)
    return [row for collective in collectives for row in bench_sizes(comm, collective, sizes, iters=iters)]


def train_step_check(rank: int, device: torch.device, library: Any, reference: Any, steps: int = 5) -> dict:
    """Return variant -> largest |param - default DDP's| over ranks after ``steps`` SGD steps."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def model() -> torch.nn.Module:
        return make_model(256).to(device)

    def sharded(mesh: Any) -> torch.nn.Module:
        built = model()
        for layer in built:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(built, mesh=mesh)

    baseline = DDP(model(), device_ids=[device], process_group=reference)
    hooked = DDP(model(), device_ids=[device], process_group=reference)
    variants = {
        "DDP + taccl hook": hooked,
        "DDP on taccl backend": DDP(model(), device_ids=[device]),  # the default group: taccl
        "FSDP2 on NCCL (control)": sharded(DeviceMesh.from_group(reference, "cuda")),
        "FSDP2 on taccl backend": sharded(None),
    }
    models = [baseline, *variants.values()]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    generator = torch.Generator(device=device).manual_seed(1000 + rank)
    with register(hooked, library=library):
        for _ in range(steps):
            x = torch.randn(32, 64, generator=generator, device=device)
            y = torch.randint(0, 10, (32,), generator=generator, device=device)
            for m, optimizer in zip(models, optimizers):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(m(x), y).backward()
                optimizer.step()
        torch.cuda.synchronize()
    flat = [torch.cat([_full(p).reshape(-1) for p in m.parameters()]) for m in models]
    found = {}
    for name, params in zip(variants, flat[1:]):
        worst = (params - flat[0]).abs().max().reshape(1)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=reference)
        found[name] = float(worst.item())
    return found


def _full(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.full_tensor().detach() if hasattr(parameter, "full_tensor") else parameter.detach()


def print_report(
    header: str, outcomes: list, routing: list, times: list, training: dict, notes: list, overlap: list
) -> bool:
    """Print the tables on rank 0 (Markdown); return True when everything agreed."""
    print(header)
    print("\n## exactness against the reference group's own collective\n")
    rows = summarize(outcomes)
    print("\n".join(report_lines(rows)))
    ok = all_exact(rows)
    if routing:
        lines, routed_ok = routing_lines(routing)
        print("\n## taccl backend: calls routed to our algorithms (every rank)\n")
        print("\n".join(lines))
        ok = ok and routed_ok
    if overlap:
        lines, overlaps = overlap_lines(overlap, int(os.environ["WORLD_SIZE"]))
        print("\n## overlap: compute after an async all_reduce on the taccl group (medians, ms after the issue)\n")
        print("\n".join(lines))
        ok = ok and overlaps
    if times:
        world = int(os.environ["WORLD_SIZE"])
        print("\n## times: median of the slowest rank; algbw = size / time, busbw as nccl-tests\n")
        print("| collective | size B | algorithm | ours us | reference us | ours busbw | reference busbw | x |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for row in times:
            factor = BUS_FACTOR[Collective(row.collective)](world)
            print(
                f"| {row.collective} | {row.size_bytes} | {row.algorithm} | {row.ours_time_us:.1f} "
                f"| {row.torch_time_us:.1f} | {row.ours_algbw_GBps * factor:.2f} | {row.torch_algbw_GBps * factor:.2f} "
                f"| {row.speedup:.2f} |"
            )
    if training:
        print(f"\n## training: largest |param - default DDP on NCCL| after the steps (agree within {AGREEMENT:g})\n")
        print("| variant | difference | result |\n|---|---:|---|")
        for name, difference in training.items():
            print(f"| {name} | {difference:.2e} | {'agree' if difference <= AGREEMENT else 'DIFFER'} |")
        ok = ok and all(d <= AGREEMENT for d in training.values())
    print()
    for note in notes:
        print(f"- {note}")
    print(f"\nresult: {'everything agrees' if ok else 'MISMATCH'}")
    return ok


def _gather(value: Any, rank: int, world: int, group: Any) -> list[Any]:
    """Return every rank's ``value`` on rank 0 (an empty list elsewhere)."""
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(value, gathered if rank == 0 else None, dst=0, group=group)
    return gathered


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--library",
        action="append",
        default=None,
        help="'ring' (rings and the direct alltoall for the world size), a *.library.json, an algorithm file "
        "or a topology name; repeatable (default: ring)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="cuda: NCCL, every part; cpu: gloo alone, the correctness parts (default: cuda where available)",
    )
    parser.add_argument("--share-gpu", action="store_true", help="every rank on device 0 (see the notes above)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)} (default: all)"
    )
    parser.add_argument("--sizes", default="1048576,4194304,16777216,67108864", help="bytes per timed call")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per size and side (default 10)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for one message (seconds)")
    return parser


@dataclass
class Findings:
    """What this rank found: outcomes of the exactness cases, routing counts, times, training, notes (skipped parts)."""

    outcomes: list = field(default_factory=list)
    routing: list = field(default_factory=list)  # every rank's counts, on rank 0
    times: list = field(default_factory=list)
    training: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    overlap: list = field(default_factory=list)  # every rank's OverlapTimes, on rank 0


def run_parts(parts: Sequence[str], args: argparse.Namespace, device: torch.device, library: list) -> Findings:
    """Run the chosen parts on this rank (every rank alike); return what it found."""
    rank, world, cuda = dist.get_rank(), dist.get_world_size(), device.type == "cuda"
    reference = dist.new_group(backend="nccl" if cuda else "gloo")
    dist.all_reduce(torch.ones(1, device=device), group=reference)  # NCCL's first call is a collective
    choices = collect_algorithms(library, world)
    algorithms = list({id(c.algorithm): c.algorithm for c in choices.candidates if c.algorithm}.values())
    comm = plain_communicator(dist.new_group(backend="nccl" if cuda else "gloo"), library, args.timeout_s)
    found = Findings()
    if "executor" in parts:
        transports, found.notes = make_transports(device)
        found.outcomes += check_algorithms(algorithms, transports, reference, rank)
        if cuda:
            found.outcomes += check_graphs(algorithms, transports["torch-nccl"], reference, rank)
        for transport in transports.values():
            transport.close()
    if "communicator" in parts:
        found.outcomes += check_communicator(comm, choices, reference, rank)
    if "backend" in parts:
        outcomes, counts = check_backend(choices, rank, device, reference)
        found.outcomes += outcomes
        found.routing = _gather(counts, rank, world, reference)
    if "overlap" in parts and cuda:
        sizes = [int(s) for s in args.sizes.split(",")]
        found.overlap = [
            t
            for times in _gather(check_overlap(choices, sizes, device, reference), rank, world, reference)
            for t in times
        ]
        if not found.overlap and rank == 0:
            found.notes.append("skipped: the overlap check: the library routes no all_reduce size it tries")
    if "times" in parts:
        found.times = time_collectives(comm, choices, [int(s) for s in args.sizes.split(",")], args.iters)
    if "training" in parts and cuda:
        found.training = train_step_check(rank, device, library, reference)
    if not cuda:
        found.notes.append("skipped: side streams, CUDA graphs, the CuPy transport and training: they need CUDA")
        found.notes.append("skipped: the overlap check: it needs CUDA")
    if any(c.algorithm is not None and c.min_bytes > MAX_CHECK_BYTES for c in choices.candidates):
        found.notes.append(f"skipped: bands that start above {MAX_CHECK_BYTES} B, the check's largest call")
    found.outcomes = _gather(found.outcomes, rank, world, reference)
    names = ", ".join(f"{a.collective.value} {a.name}" for a in algorithms)
    found.notes.insert(0, f"algorithms checked ({len(algorithms)}): {names}")
    return found


def _header(args: argparse.Namespace, world: int, cuda: bool) -> str:
    where = f"{torch.cuda.get_device_name()}, " if cuda else ""
    gpus = ("one GPU shared (NCCL over loopback)" if args.share_gpu else "one GPU per rank") if cuda else "gloo"
    named = ", ".join(args.library or ["ring"])
    return f"# gpu_check: {world} ranks, {gpus}, {where}torch {torch.__version__}, library {named}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if "WORLD_SIZE" not in os.environ:
        parser.error("run under torchrun, e.g. torchrun --nproc-per-node 2 scripts/gpu_check.py")
    if args.device == "cpu":
        # As on a machine without GPUs, before anything starts CUDA: ranks left on one GPU could
        # not make the NCCL side of the taccl group (its barrier runs there).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available (use --device cpu for the correctness parts)")
    if args.share_gpu and args.device != "cuda" or not set(parts) <= set(PARTS) or args.iters < 1:
        parser.error(f"--share-gpu needs --device cuda; --parts takes {', '.join(PARTS)}; --iters at least 1")
    rank, world, device, library = setup(args.device, args.share_gpu, args.library or ["ring"], args.timeout_s)
    found = run_parts(parts, args, device, library)
    ok = True
    if rank == 0:
        header = _header(args, world, device.type == "cuda")
        merged = merge_ranks(found.outcomes)
        ok = print_report(header, merged, found.routing, found.times, found.training, found.notes, found.overlap)
    verdict = torch.tensor([int(ok)], device=device)
    dist.broadcast(verdict, src=0)  # every rank exits alike
    dist.barrier()
    dist.destroy_process_group()
    return 0 if int(verdict.item()) else 1


if __name__ == "__main__":
    sys.exit(main())
