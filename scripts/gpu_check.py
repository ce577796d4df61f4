"""GPU check: our collectives over both NCCL transports against NCCL's own, then times, DDP and FSDP2.

    torchrun --nproc-per-node 8 scripts/gpu_check.py --library ndv2
    torchrun --nproc-per-node 4 scripts/gpu_check.py --share-gpu        # one GPU, 4 ranks

Every rank needs a CUDA device. Four parts, rank 0 prints each as a table:

1. exactness: every algorithm of ``--library`` (and rings for the world size) through the torch
   NCCL transport and the CuPy NCCL transport, on the current stream and on a side stream, in
   float32/float16/bfloat16 with sum (and max), against NCCL's own collective on the same
   integer-valued random data (so every order of summation gives the same bits); then each
   algorithm three times through one CUDA graph on the torch NCCL transport (eager, captured, replayed);
2. the ``taccl`` backend's all_reduce / all_gather_single / reduce_scatter_single, likewise;
3. times in the nccl-tests format (algbw, busbw) of our Communicator and of NCCL, alternated;
4. a DDP step with the hook and with the ``taccl`` backend, and an FSDP2 step on the ``taccl``
   backend, against default DDP on NCCL: the largest parameter difference after the steps.

``--share-gpu`` puts every rank on device 0 and gives each its own NCCL host id, so NCCL links
them through its socket transport over loopback (NCCL refuses two ranks of one host on one GPU).
That checks correctness and stream ordering; its times are loopback-socket times, not NVLink's.
Exit status 0 when everything agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ddp_example import init_taccl, make_model, resolve_library  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from taccl_py.ir.algorithm import Algorithm  # noqa: E402
from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.runtime.bench import BenchRow, bench_sizes  # noqa: E402
from taccl_py.runtime.communicator import Communicator  # noqa: E402
from taccl_py.runtime.ddp import register  # noqa: E402
from taccl_py.runtime.executor import Executor  # noqa: E402
from taccl_py.runtime.selection import collect_algorithms  # noqa: E402
from taccl_py.runtime.transports.cupy_nccl import CupyNcclTransport  # noqa: E402
from taccl_py.runtime.transports.torch_dist import TorchDistTransport  # noqa: E402

#: Shard lengths (elements) every algorithm is checked at: odd (padded chunks) and > 64 KiB of fp32.
NUMELS = (1001, 65539)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: nccl-tests' bus-bandwidth factor per collective, for n ranks.
BUS_FACTOR = {
    Collective.ALLGATHER: lambda n: (n - 1) / n,
    Collective.REDUCESCATTER: lambda n: (n - 1) / n,
    Collective.ALLREDUCE: lambda n: 2 * (n - 1) / n,
}
#: Parameters after training must agree with default DDP on NCCL within this (fp32, GPU sums).
AGREEMENT = 1e-5


def setup(share_gpu: bool, library_specs: Sequence[str], timeout_s: float) -> tuple[int, int, torch.device, Any]:
    """Initialise the default group as ``taccl`` over this rank's GPU; return (rank, world, device, library)."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if share_gpu:
        # NCCL matches a GPU to a host by host id: distinct ids make one GPU look like one per host.
        os.environ["NCCL_HOSTID"] = f"taccl-gpu-check-{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
    device = torch.device("cuda", 0 if share_gpu else local_rank)
    torch.cuda.set_device(device)
    world = int(os.environ["WORLD_SIZE"])
    library = [item for spec in library_specs for item in _as_list(resolve_library(spec, world))]
    init_taccl(library, timeout_s=timeout_s)
    return rank, world, device, library


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def integer_data(shape: int, dtype: torch.dtype, seed: int, device: torch.device) -> torch.Tensor:
    """Return small random integers (-4..4) as ``dtype``: exact under any order of summation."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-4, 5, (shape,), generator=generator, device=device).to(dtype)


def group_result(collective: Collective, data: torch.Tensor, numel: int, op: str, group: Any) -> torch.Tensor:
    """Return torch.distributed's ``collective`` of ``data`` on ``group`` (None: the default ``taccl`` group)."""
    reduce_op = getattr(dist.ReduceOp, op.upper())
    world = dist.get_world_size(group)
    if collective is Collective.ALLGATHER:
        out = torch.empty(world * numel, dtype=data.dtype, device=data.device)
        dist.all_gather_into_tensor(out, data, group=group)
    elif collective is Collective.REDUCESCATTER:
        out = torch.empty(numel, dtype=data.dtype, device=data.device)
        dist.reduce_scatter_tensor(out, data, op=reduce_op, group=group)
    else:
        out = data.clone()
        dist.all_reduce(out, op=reduce_op, group=group)
    return out


def run_ours(
    algorithm: Algorithm, transport: Any, data: torch.Tensor, numel: int, op: str, side: torch.cuda.Stream | None
) -> torch.Tensor:
    """Return ``algorithm``'s result on ``data`` through ``transport``, run on stream ``side`` (None: current).

    On a side stream the caller's stream is ordered after it by an event, as a user would do.
    """
    caller = torch.cuda.current_stream()
    stream = side or caller
    stream.wait_stream(caller)
    with torch.cuda.stream(stream):
        executor = Executor(algorithm, transport.rank, data.dtype, numel, transport.device)
        _inputs, outputs = executor.expected_numels()
        output = data.clone() if algorithm.collective is Collective.ALLREDUCE else data.new_empty(outputs)
        executor.run(output, output if algorithm.collective is Collective.ALLREDUCE else data, transport, op=op)
    if side is not None:
        caller.wait_stream(side)
        output.record_stream(caller)
        data.record_stream(side)
    return output


def check_algorithms(algorithms: Sequence[Algorithm], transports: dict[str, Any], reference: Any, rank: int) -> list:
    """Return rows (algorithm, transport, cases, failures) of every algorithm against NCCL's results."""
    rows = []
    side = torch.cuda.Stream()
    for algorithm in algorithms:
        world = algorithm.num_ranks
        ops = ("sum", "max") if algorithm.collective.reduces else ("sum",)
        for name, transport in transports.items():
            cases, failures = 0, []
            for seed, (numel, dtype, op, stream) in enumerate(
                (n, d, o, s) for n in NUMELS for d in DTYPES for o in ops for s in (None, side)
            ):
                if stream is side and dtype is not torch.float32:
                    continue
                length = numel * (world if algorithm.collective is Collective.REDUCESCATTER else 1)
                data = integer_data(length, dtype, 1000 * seed + rank, transport.device)
                expected = group_result(algorithm.collective, data, numel, op, reference)
                got = run_ours(algorithm, transport, data, numel, op, stream)
                cases += 1
                if not torch.equal(got, expected):
                    where = "side stream" if stream is side else "current stream"
                    failures.append(f"{numel} x {str(dtype)[6:]} {op} on the {where}")
            rows.append((algorithm.name, name, cases, failures))
    return rows


def check_graphs(algorithms: Sequence[Algorithm], transport: Any, reference: Any, rank: int) -> list:
    """Return rows (algorithm, transport, cases, failures) of three calls through one CUDA graph against NCCL.

    The same tensors take fresh data each call: the first runs eagerly, the second is captured and
    replayed, the third only replays (``Executor.run(cuda_graph=True)``).
    """
    rows = []
    for algorithm in algorithms:
        numel = NUMELS[0]
        executor = Executor(algorithm, transport.rank, torch.float32, numel, transport.device)
        inputs, outputs = executor.expected_numels()
        data = torch.empty(inputs, device=transport.device)
        in_place = algorithm.collective is Collective.ALLREDUCE
        output = data if in_place else torch.empty(outputs, device=transport.device)
        failures = []
        for call, how in enumerate(("eager", "captured", "replayed")):
            fresh = integer_data(inputs, torch.float32, 5000 + 10 * call + rank, transport.device)
            data.copy_(fresh)
            expected = group_result(algorithm.collective, fresh, numel, "sum", reference)
            executor.run(output, data, transport, cuda_graph=True)
            if not torch.equal(output, expected):
                failures.append(f"call {call + 1} ({how})")
        rows.append((algorithm.name, f"{transport.name} graph", 3, failures))
    return rows


def check_backend(world: int, rank: int, device: torch.device, reference: Any) -> list:
    """Return rows (collective, cases, failures) of the default ``taccl`` group against NCCL's own."""
    rows = []
    for collective in BUS_FACTOR:
        cases, failures = 0, []
        for seed, (numel, dtype) in enumerate((n, d) for n in NUMELS for d in DTYPES):
            length = numel * (world if collective is Collective.REDUCESCATTER else 1)
            data = integer_data(length, dtype, 7000 + 100 * seed + rank, device)
            expected = group_result(collective, data, numel, "sum", reference)
            cases += 1
            if not torch.equal(group_result(collective, data, numel, "sum", None), expected):
                failures.append(f"{numel} x {str(dtype)[6:]}")
        rows.append((collective.value, cases, failures))
    return rows


def time_collectives(comm: Communicator, sizes: Sequence[int], iters: int) -> list[BenchRow]:
    """Return ``taccl bench``'s rows for every collective: ours against NCCL's own on ``comm``'s group."""
    return [row for collective in BUS_FACTOR for row in bench_sizes(comm, collective, sizes, iters=iters)]


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


def print_report(world: int, share_gpu: bool, exact: list, backend: list, times: list, training: dict) -> bool:
    """Print the four tables on rank 0; return True when everything agreed."""
    gpus = "one GPU shared (NCCL over loopback sockets)" if share_gpu else "one GPU per rank"
    print(f"# gpu_check: {world} ranks, {gpus}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("\n## exactness against NCCL's own collective")
    print(f"{'algorithm':<44} {'transport':<11} {'cases':>5}  result")
    for name, transport, cases, failures in exact:
        print(f"{name:<44} {transport:<11} {cases:>5}  {'exact' if not failures else 'DIFFER: ' + '; '.join(failures)}")
    print("\n## taccl backend (default group) against NCCL's own")
    for call, cases, failures in backend:
        print(f"{call:<44} {cases:>5}  {'exact' if not failures else 'DIFFER: ' + '; '.join(failures)}")
    print("\n## times: median of the slowest rank; algbw = size / time, busbw as nccl-tests")
    header = ("collective", "size", "algorithm", "ours us", "NCCL us", "ours busbw", "NCCL busbw", "x")
    print("{:<14} {:>10} {:<36} {:>9} {:>9} {:>10} {:>10} {:>6}".format(*header))
    for row in times:
        factor = BUS_FACTOR[Collective(row.collective)](world)
        print(
            f"{row.collective:<14} {row.size_bytes:>10} {row.algorithm[:36]:<36} {row.ours_time_us:>9.1f} "
            f"{row.torch_time_us:>9.1f} {row.ours_algbw_GBps * factor:>10.2f} {row.torch_algbw_GBps * factor:>10.2f} "
            f"{row.speedup:>6.2f}"
        )
    print(f"\n## training: largest |param - default DDP on NCCL| after the steps (agree within {AGREEMENT:g})")
    for name, difference in training.items():
        print(f"{name:<44} {difference:.2e}  {'agree' if difference <= AGREEMENT else 'DIFFER'}")
    return (
        not any(row[3] for row in exact)
        and not any(row[2] for row in backend)
        and all(d <= AGREEMENT for d in training.values())
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library",
        action="append",
        default=None,
        help="'ring', a *.library.json, an algorithm file or a topology name; repeatable (default: ring)",
    )
    parser.add_argument("--share-gpu", action="store_true", help="every rank on device 0 (see the module notes)")
    parser.add_argument("--sizes", default="1048576,4194304,16777216,67108864", help="bytes per timed call")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per size and side (default 10)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for one message (seconds)")
    args = parser.parse_args(argv)
    if "WORLD_SIZE" not in os.environ or not torch.cuda.is_available():
        parser.error("run under torchrun on CUDA, e.g. torchrun --nproc-per-node 2 scripts/gpu_check.py")
    rank, world, device, library = setup(args.share_gpu, args.library or ["ring"], args.timeout_s)
    reference = dist.new_group(backend="nccl")
    dist.all_reduce(torch.ones(1, device=device), group=reference)  # NCCL's first call is a collective
    transports = {
        "torch-nccl": TorchDistTransport(dist.new_group(backend="nccl"), device),
        "cupy-nccl": CupyNcclTransport(dist.new_group(backend="nccl"), device.index),
    }
    algorithms = {id(c.algorithm): c.algorithm for c in collect_algorithms(library, world).candidates}
    exact = check_algorithms(list(algorithms.values()), transports, reference, rank)
    exact += check_graphs(list(algorithms.values()), transports["torch-nccl"], reference, rank)
    backend = check_backend(world, rank, device, reference)
    comm = Communicator(dist.new_group(backend="nccl"), library)
    times = time_collectives(comm, [int(s) for s in args.sizes.split(",")], args.iters)
    training = train_step_check(rank, device, library, reference)
    ok = print_report(world, args.share_gpu, exact, backend, times, training) if rank == 0 else True
    for transport in transports.values():
        transport.close()
    dist.barrier(group=reference)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
