"""The ``taccl`` process-group backend: routed collectives equal gloo's; DDP and FSDP2 run on it.

One launch of 4 ranks re-initialises torch.distributed with ``init_process_group("taccl")`` and
runs every scenario (see ``_backend_scenarios``), comparing with a plain gloo group of the same
ranks; the tests below read the per-rank results.
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from taccl_py.errors import ArgumentError

from ddp_helpers import (
    BUCKET_CAP_MB,
    WORLD_SIZE,
    init_taccl_group,
    make_mlp,
    max_difference,
    ring_library,
    run_on_shared_store,
    train,
)

torch = pytest.importorskip("torch", reason="the taccl backend needs torch")
dist = pytest.importorskip("torch.distributed", reason="the taccl backend needs torch.distributed")

FP32_TOLERANCE = 1e-6
FP16_TOLERANCE = 1e-3
#: The group timeout of the failure scenario: how long ranks wait for the rank that never comes.
SHORT_TIMEOUT_S = 2.0


# -- multi-process scenarios (run inside the ranks) -----------------------------------------------


def _init_taccl(rank: int, world_size: int, port: int) -> Any:
    """Replace the launcher's gloo group by a taccl one on the ring library; return the group."""
    return init_taccl_group(rank, world_size, port, ring_library(world_size))


def _data(rank: int, shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed * 131 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(-50, 50, shape, generator=generator, dtype=dtype)


def _close(ours: Any, reference: Any) -> bool:
    if ours.dtype.is_floating_point:
        tolerance = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(ours.dtype, 1e-6)
        return bool(torch.allclose(ours.double(), reference.double(), rtol=tolerance, atol=tolerance))
    return bool(torch.equal(ours, reference))


def _reduce_cases(rank: int, gloo: Any, world: int) -> list[str]:
    """all_reduce and both reduce_scatter forms against gloo, on random data of odd sizes."""
    problems = []
    ops = [
        ("sum", torch.float32, 1001),
        ("avg", torch.float32, 64),
        ("max", torch.int64, 37),
        ("min", torch.float64, 9),
        ("sum", torch.float16, 300),
        ("sum", torch.bfloat16, 77),
    ]
    for seed, (op, dtype, numel) in enumerate(ops):
        data = _data(rank, (numel,), dtype, seed)
        ours, reference = data.clone(), data.clone()
        work = dist.all_reduce(ours, op=getattr(dist.ReduceOp, op.upper()), async_op=True)
        work.wait()
        dist.all_reduce(
            reference, op=dist.ReduceOp.SUM if op == "avg" else getattr(dist.ReduceOp, op.upper()), group=gloo
        )
        reference = reference / world if op == "avg" else reference
        if not _close(ours, reference):
            problems.append(
                f"all_reduce {op} {dtype} numel={numel}: max error {max_difference(ours.double(), reference.double())}"
            )
    data = _data(rank, (world * 250,), torch.float32, 20)
    ours, reference = torch.empty(250), torch.empty(250)
    dist.reduce_scatter_tensor(ours, data)  # the group's _reduce_scatter_base: reduce_scatter_single
    dist.reduce_scatter_tensor(reference, data, group=gloo)
    if not _close(ours, reference):
        problems.append("reduce_scatter_single float32 sum")
    inputs = [_data(rank, (3, 5), torch.float32, 30 + r) for r in range(world)]
    ours, reference = torch.empty(3, 5), torch.empty(3, 5)
    dist.reduce_scatter(ours, inputs, op=dist.ReduceOp.MAX)
    dist.reduce_scatter(reference, inputs, op=dist.ReduceOp.MAX, group=gloo)
    if not _close(ours, reference):
        problems.append("reduce_scatter (list) float32 max")
    return problems


def _gather_cases(rank: int, gloo: Any, world: int) -> list[str]:
    """Both all_gather forms against gloo."""
    problems = []
    data = _data(rank, (1001,), torch.float32, 40)
    ours, reference = torch.empty(world * 1001), torch.empty(world * 1001)
    dist.all_gather_into_tensor(ours, data)  # the group's _allgather_base: all_gather_single
    dist.all_gather_into_tensor(reference, data, group=gloo)
    if not torch.equal(ours, reference):
        problems.append("all_gather_single float32")
    data = _data(rank, (5, 7), torch.int32, 41)
    ours, reference = (
        [torch.empty(5, 7, dtype=torch.int32) for _ in range(world)],
        [torch.empty(5, 7, dtype=torch.int32) for _ in range(world)],
    )
    dist.all_gather(ours, data)
    dist.all_gather(reference, data, group=gloo)
    if not all(torch.equal(a, b) for a, b in zip(ours, reference)):
        problems.append("all_gather (list) int32")
    return problems


def _delegated_cases(rank: int, world: int) -> list[str]:
    """Operations the backend hands to its inner gloo backend."""
    problems = []
    value = torch.full((4,), float(rank))
    dist.broadcast(value, src=2)
    if not torch.equal(value, torch.full((4,), 2.0)):
        problems.append(f"broadcast: {value.tolist()}")
    product = torch.full((3,), float(rank + 1))
    dist.all_reduce(product, op=dist.ReduceOp.PRODUCT)
    if not torch.equal(product, torch.full((3,), 24.0)):
        problems.append(f"all_reduce product: {product.tolist()}")
    received = torch.empty(2)
    send = dist.isend(torch.tensor([float(rank), 7.0]), (rank + 1) % world)
    dist.recv(received, (rank - 1) % world)
    send.wait()
    if received.tolist() != [float((rank - 1) % world), 7.0]:
        problems.append(f"send/recv: {received.tolist()}")
    swapped = torch.empty(world)
    dist.all_to_all_single(swapped, torch.arange(world, dtype=torch.float32) + 10 * rank)
    if swapped.tolist() != [10.0 * r + rank for r in range(world)]:
        problems.append(f"all_to_all_single: {swapped.tolist()}")
    dist.barrier()
    return problems


def _functional_cases(rank: int, gloo: Any, world: int) -> list[str]:
    """Functional collectives (what DTensor and FSDP2's ``full_tensor`` use) against gloo's."""
    import torch.distributed._functional_collectives as funcol

    problems = []
    taccl = dist.group.WORLD
    data = _data(rank, (world * 96,), torch.float32, 50)
    cases = (
        ("all_gather_tensor", lambda g: funcol.all_gather_tensor(data, 0, g)),
        ("reduce_scatter_tensor", lambda g: funcol.reduce_scatter_tensor(data, "sum", 0, g)),
        ("all_reduce", lambda g: funcol.all_reduce(data, "sum", g)),
    )
    for name, call in cases:
        ours, reference = funcol.wait_tensor(call(taccl)), funcol.wait_tensor(call(gloo))
        if not _close(ours, reference):
            problems.append(f"functional {name}: max error {max_difference(ours, reference)}")
    pair = [data, _data(rank, (40,), torch.float32, 51)]  # two all-gathers under one Work
    ours = [funcol.wait_tensor(t) for t in funcol.all_gather_into_tensor_coalesced(pair, taccl)]
    reference = [funcol.wait_tensor(t) for t in funcol.all_gather_into_tensor_coalesced(pair, gloo)]
    if not all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True)):
        problems.append("functional all_gather_into_tensor_coalesced (two tensors)")
    return problems


def _inplace_cases(rank: int, gloo: Any, world: int) -> list[str]:
    """In-place all_reduce, all_gather_into_tensor and reduce_scatter_tensor (FSDP2's forms) against gloo's.

    AllReduce and AllGather must run the ring's in-place variant on the caller's buffer, with no
    copy of the rank's block; ReduceScatter runs on a copy and leaves the input's other blocks as gloo does.
    """
    import logging

    from helpers import LogLines

    lines = LogLines()
    lines.setLevel(logging.DEBUG)
    loggers = [logging.getLogger(f"taccl_py.runtime.{name}") for name in ("communicator", "executor")]
    for logger in loggers:
        logger.addHandler(lines)
        logger.setLevel(logging.DEBUG)
    problems = []
    for seed, (dtype, numel) in enumerate(((torch.float32, 1000), (torch.bfloat16, 96))):
        for collective in ("allreduce", "allgather", "reducescatter"):
            lines.messages.clear()
            ours, theirs = (
                _data(rank, (numel,) if collective == "allgather" else (world * numel,), dtype, 60 + seed)
                for _ in range(2)
            )
            if collective == "allreduce":
                dist.all_reduce(ours)
                dist.all_reduce(theirs, group=gloo)
                blocks = (ours, theirs)
            elif collective == "allgather":
                ours, theirs = (torch.cat([t] * world) for t in (ours, theirs))  # block `rank` is this rank's data
                dist.all_gather_into_tensor(ours, ours.chunk(world)[rank])
                dist.all_gather_into_tensor(theirs, theirs.chunk(world)[rank], group=gloo)
                blocks = (ours, theirs)
            else:
                dist.reduce_scatter_tensor(ours.chunk(world)[rank], ours)
                dist.reduce_scatter_tensor(theirs.chunk(world)[rank], theirs, group=gloo)
                blocks = (ours, theirs)
            label = f"in-place {collective} {dtype} numel={numel}"
            if not _close(*blocks):
                problems.append(f"{label}: max error {max_difference(blocks[0].double(), blocks[1].double())}")
            if collective == "reducescatter":
                if any("in-place variant" in m for m in lines.messages):
                    problems.append(f"{label}: ran an in-place variant, which writes the input's other blocks")
                continue
            if not any(f"runs in-place variant of ring_{collective}_{world}" in m for m in lines.messages):
                problems.append(f"{label}: the in-place variant did not run; log: {lines.messages}")
            if not any("caller's one buffer with 0 copies in and 0 out" in m for m in lines.messages):
                problems.append(f"{label}: the rank's block was copied; log: {lines.messages}")
    for logger in loggers:
        logger.removeHandler(lines)
    return problems


def _ddp_cases(rank: int, gloo: Any) -> dict[str, float]:
    """DDP on the taccl default group against DDP on a gloo group, same seed and data."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    found = {}
    for name, unused, dtype in (("fp32", False, None), ("unused", True, None), ("fp16", False, torch.float16)):
        options = {"bucket_cap_mb": BUCKET_CAP_MB, "find_unused_parameters": unused}
        reference = train(DDP(make_mlp(unused=unused, dtype=dtype), process_group=gloo, **options), rank, dtype=dtype)
        ours = train(DDP(make_mlp(unused=unused, dtype=dtype), **options), rank, dtype=dtype)
        found[name] = max_difference(reference, ours)
    return found


def _fsdp_case(rank: int, gloo: Any) -> float:
    """FSDP2 (fully_shard per layer) on the taccl group against DDP on gloo."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    reference = train(DDP(make_mlp(), process_group=gloo), rank)
    model = make_mlp()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # FSDP2 would pick CUDA wherever it is present
    for layer in model.layers:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return max_difference(reference, train(model, rank))


def _subgroup_case(rank: int) -> dict[str, Any]:
    """A 2-rank taccl sub-group has no 4-rank algorithm: it must still reduce, on the inner gloo."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = pairs[rank // 2]
    value = torch.full((5,), float(rank))
    dist.all_reduce(value, group=group)
    expected = float(sum(r for r in range(4) if r // 2 == rank // 2))
    return {
        "ok": bool(torch.equal(value, torch.full((5,), expected))),
        "routed": dict(group.routed),
        "delegated": dict(group.delegated),
    }


def _failure_case(rank: int, world: int) -> dict[str, str]:
    """Rank 3 skips an all-reduce on a short-timeout taccl group: the others' Work must raise."""
    group = dist.new_group(backend="taccl", timeout=datetime.timedelta(seconds=SHORT_TIMEOUT_S))
    outcome = {"first": "skipped", "later": "skipped"}
    if rank != world - 1:
        for key in ("first", "later"):
            try:
                dist.all_reduce(torch.ones(64), group=group)
                outcome[key] = "completed"
            except RuntimeError as error:
                outcome[key] = str(error).splitlines()[0]
    dist.barrier()
    return outcome


def _calibration_case(rank: int, gloo: Any, folder: str) -> dict[str, Any]:
    """The group calibrates once and caches it; sizes calibrated to gloo go to the inner backend."""
    from taccl_py.errors import FormatError
    from taccl_py.runtime.communicator.calibration import CalibrationPoint, write_calibration

    pg, path = dist.group.WORLD, Path(folder) / "measured.json"
    measured = pg.calibrate(path, sizes=[4096], collectives=["allreduce"], iters=2, warmup=0)
    result: dict[str, Any] = {"measured": len(measured.points), "read_back": pg.calibrate(path) == measured}
    ring = measured.points[0].algorithm
    verdicts = (
        CalibrationPoint("allreduce", 4096, ring, 1e6, 1.0),
        CalibrationPoint("allreduce", 65536, ring, 1.0, 1e6),
    )
    if rank == 0:
        write_calibration(replace(measured, points=verdicts), Path(folder) / "forced.json")
        (Path(folder) / "bad.json").write_text("{ not json")
    dist.barrier(gloo)
    pg.calibrate(Path(folder) / "forced.json")
    try:
        pg.calibrate(Path(folder) / "bad.json")  # only rank 0 reads it; every rank must raise
        result["bad"] = "accepted"
    except FormatError as error:
        result["bad"] = str(error)
    before = (Counter(pg.routed), Counter(pg.delegated))
    result["equal"] = []
    for seed, numel in enumerate((1024, 16384)):  # 4 KB: gloo won; 64 KB: the ring won
        ours = _data(rank, (numel,), torch.float32, 40 + seed)
        reference = ours.clone()
        dist.all_reduce(ours)
        dist.all_reduce(reference, group=gloo)
        result["equal"].append(_close(ours, reference))
    result["routed"], result["delegated"] = dict(pg.routed - before[0]), dict(pg.delegated - before[1])
    return result


def _backend_scenarios(rank: int, world_size: int, port: int, folder: str) -> dict[str, Any]:
    pg = _init_taccl(rank, world_size, port)
    gloo = dist.new_group(backend="gloo")
    results: dict[str, Any] = {"name": dist.get_backend(), "type": type(pg).__name__}
    results["problems"] = _reduce_cases(rank, gloo, world_size) + _gather_cases(rank, gloo, world_size)
    results["counts"] = (dict(pg.routed), dict(pg.delegated))
    results["delegated_problems"] = _delegated_cases(rank, world_size)
    results["counts_after_delegated"] = (dict(pg.routed), dict(pg.delegated))
    results["functional_problems"] = _functional_cases(rank, gloo, world_size)
    results["functional_routed"] = dict(pg.routed - Counter(results["counts_after_delegated"][0]))
    results["inplace_problems"] = _inplace_cases(rank, gloo, world_size)
    before = pg.routed["allreduce"]
    results["ddp"] = _ddp_cases(rank, gloo)
    results["ddp_allreduces"] = pg.routed["allreduce"] - before
    before = (pg.routed["allgather"], pg.routed["reducescatter"])
    results["fsdp"] = _fsdp_case(rank, gloo)
    results["fsdp_routed"] = (pg.routed["allgather"] - before[0], pg.routed["reducescatter"] - before[1])
    results["calibration"] = _calibration_case(rank, gloo, folder)
    results["subgroup"] = _subgroup_case(rank)
    results["failure"] = _failure_case(rank, world_size)
    return results


@pytest.fixture(scope="module")
def backend_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_on_shared_store(_backend_scenarios, WORLD_SIZE, str(tmp_path_factory.mktemp("backend")))


# -- multi-process tests --------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.multiprocess
def test_init_process_group_taccl_makes_a_taccl_group(backend_results: list[dict[str, Any]]) -> None:
    assert all(r["name"] == "taccl" and r["type"] == "TacclProcessGroup" for r in backend_results)


@pytest.mark.smoke
@pytest.mark.multiprocess
def test_routed_collectives_equal_gloo(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        assert result["problems"] == [], f"rank {rank}: {result['problems']}"
        routed, delegated = result["counts"]
        assert routed == {"allreduce": 6, "reducescatter": 2, "allgather": 2}, f"rank {rank}: routed {routed}"
        assert delegated == {}, f"rank {rank}: delegated {delegated}"


@pytest.mark.multiprocess
def test_other_operations_go_to_the_inner_backend(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        assert result["delegated_problems"] == [], f"rank {rank}: {result['delegated_problems']}"
        routed, delegated = result["counts_after_delegated"]
        assert delegated == {"allreduce": 1, "alltoall": 1}, (
            f"rank {rank}: the PRODUCT all-reduce and the all-to-all (no algorithm) are delegated: {delegated}"
        )
        assert routed == result["counts"][0], f"rank {rank}: {routed}"


@pytest.mark.multiprocess
def test_functional_collectives_are_routed_and_equal_gloo(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        assert result["functional_problems"] == [], f"rank {rank}: {result['functional_problems']}"
        routed = result["functional_routed"]
        assert routed == {"allgather": 3, "reducescatter": 1, "allreduce": 1}, f"rank {rank}: routed {routed}"


@pytest.mark.multiprocess
def test_inplace_calls_run_the_inplace_variant_and_equal_gloo(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        assert result["inplace_problems"] == [], f"rank {rank}: {result['inplace_problems']}"


@pytest.mark.smoke
@pytest.mark.multiprocess
@pytest.mark.parametrize("case", ["fp32", "unused"])
def test_ddp_on_taccl_matches_ddp_on_gloo(backend_results: list[dict[str, Any]], case: str) -> None:
    for rank, result in enumerate(backend_results):
        assert result["ddp"][case] <= FP32_TOLERANCE, f"rank {rank}: {case} parameters differ by {result['ddp'][case]}"
        assert result["ddp_allreduces"] > 3 * 20, (
            f"rank {rank}: only {result['ddp_allreduces']} routed bucket all-reduces"
        )


@pytest.mark.multiprocess
def test_ddp_on_taccl_with_fp16_gradients(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        assert result["ddp"]["fp16"] <= FP16_TOLERANCE, (
            f"rank {rank}: fp16 parameters differ by {result['ddp']['fp16']}"
        )


@pytest.mark.multiprocess
def test_fsdp2_on_taccl_matches_ddp_on_gloo(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        assert result["fsdp"] <= FP32_TOLERANCE, f"rank {rank}: FSDP2 parameters differ by {result['fsdp']}"
        gathers, scatters = result["fsdp_routed"]
        assert gathers >= 20 and scatters >= 20, (
            f"rank {rank}: routed {gathers} all-gathers, {scatters} reduce-scatters"
        )


@pytest.mark.multiprocess
def test_a_calibrated_group_runs_gloo_where_gloo_measured_faster(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        cal = result["calibration"]
        assert cal["measured"] == 1 and cal["read_back"], f"rank {rank}: {cal}"
        assert "bad.json" in cal["bad"] and "invalid JSON" in cal["bad"], f"rank {rank}: {cal['bad']}"
        assert cal["equal"] == [True, True], f"rank {rank}: {cal}"
        # 4 KB on the inner gloo (no worker), 64 KB through the ring: the group still works after the bad file
        assert cal["routed"] == {"allreduce": 1} and cal["delegated"] == {"allreduce": 1}, f"rank {rank}: {cal}"


@pytest.mark.multiprocess
def test_subgroup_without_algorithms_uses_the_inner_backend(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results):
        sub = result["subgroup"]
        assert sub["ok"] and sub["routed"] == {} and sub["delegated"] == {"allreduce": 1}, f"rank {rank}: {sub}"


@pytest.mark.multiprocess
def test_missing_peer_fails_the_work_instead_of_hanging(backend_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(backend_results[:-1]):
        failure = result["failure"]
        assert "TransportError" in failure["first"], f"rank {rank}: {failure['first']}"
        assert "earlier collective failed" in failure["later"], f"rank {rank}: {failure['later']}"


# -- in-process tests -----------------------------------------------------------------------------


def test_unreadable_library_fails_init_process_group() -> None:
    from taccl_py.runtime.backend import register_backend

    register_backend("no-such-topology-or-file")
    try:
        with pytest.raises(
            ArgumentError, match="no-such-topology-or-file: library: neither a file nor a built-in topology"
        ):
            dist.init_process_group("taccl", store=dist.HashStore(), rank=0, world_size=1)
        assert not dist.is_initialized()
    finally:
        register_backend()
