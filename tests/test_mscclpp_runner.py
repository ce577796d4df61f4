"""The ``mscclpp`` transport (issue 45): plans exported once, MSCCL++'s call shapes, fallbacks; on GPUs, against NCCL.

The CPU tests drive the glue against a fake module with MSCCL++'s documented call shapes
(microsoft/mscclpp @1f5f065d: python/csrc/executor_py.cpp for ``ExecutionPlan(planPath, rank)`` and
``Executor(comm).execute(rank, send_buff, recv_buff, send_buff_size, recv_buff_size, data_type,
plan, stream, packet_type)``, python/csrc/core_py.cpp for ``DataType`` and ``TcpBootstrap``); its
``execute`` takes exactly those keywords, so a misnamed or missing argument fails.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.inplace import inplace_variant
from taccl_py.mscclpp.files import mscclpp_plan_text
from taccl_py.mscclpp.parse import parse_mscclpp_plan
from taccl_py.runtime.communicator.mscclpp_runner import PlanRunner, require_mscclpp
from taccl_py.runtime.communicator.selection import Candidate, MadeFor
from taccl_py.topology import load_topology

from helpers import ring_algorithm
from mp_utils import Case, compare, random_input, run_ranks, torch_collective

STREAM = 1234


class FakeDataType(enum.Enum):
    int32 = 0
    uint32 = 1
    float16 = 2
    float32 = 3
    bfloat16 = 4


class FakePacketType(enum.Enum):
    LL8 = 0
    LL16 = 1


class FakeExecutionPlan:
    """``mscclpp.ExecutionPlan(planPath, rank)``: reads the file as MSCCL++ does, at construction."""

    def __init__(self, planPath: str, rank: int) -> None:
        self.path = planPath
        self.rank = rank
        self.collective = json.loads(Path(planPath).read_text())["collective"]


class FakeExecutor:
    """``mscclpp.Executor(comm)``; ``execute`` records its arguments and, given tensors by address, runs the call."""

    def __init__(self, comm: object) -> None:
        self.comm = comm
        self.calls: list[dict] = []
        self.tensors: dict[int, torch.Tensor] = {}  # data_ptr -> tensor, for the calls run over gloo

    def execute(
        self,
        rank,
        send_buff,
        recv_buff,
        send_buff_size,
        recv_buff_size,
        data_type,
        plan,
        stream,
        packet_type=FakePacketType.LL16,
    ) -> None:
        call = dict(rank=rank, send=send_buff, recv=recv_buff, send_size=send_buff_size, recv_size=recv_buff_size)
        self.calls.append({**call, "data_type": data_type, "plan": plan, "stream": stream, "packet_type": packet_type})
        if send_buff in self.tensors and recv_buff in self.tensors:
            _run_as_mscclpp(plan.collective, self.tensors[send_buff], self.tensors[recv_buff], call)


def _run_as_mscclpp(collective: str, send: torch.Tensor, recv: torch.Tensor, call: dict) -> None:
    """Do what the plan does (always a sum), over gloo, from the buffers at the given addresses and sizes."""
    import torch.distributed as dist

    from taccl_py.runtime.executor.native import native_collective

    send_view = send.view(torch.uint8)[: call["send_size"]].view(send.dtype)
    recv_view = recv.view(torch.uint8)[: call["recv_size"]].view(recv.dtype)
    if collective == "allreduce":
        if call["send"] != call["recv"]:
            recv_view.copy_(send_view)
        dist.all_reduce(recv_view)
    else:
        native_collective(Collective(collective), recv_view, send_view.clone(), "sum", None)


class FakeBootstrap:
    """``mscclpp.TcpBootstrap``: ``create(rank, nRanks)``, ``create_unique_id()``, ``initialize(unique_id)``."""

    def __init__(self, rank: int, n_ranks: int) -> None:
        self.rank, self.n_ranks, self.unique_id = rank, n_ranks, None

    @staticmethod
    def create(rank: int, nRanks: int) -> FakeBootstrap:
        return FakeBootstrap(rank, nRanks)

    @staticmethod
    def create_unique_id() -> bytes:
        return os.urandom(16)

    def initialize(self, unique_id: bytes, timeout_sec: int = 30) -> None:
        self.unique_id = unique_id

    def get_n_ranks_per_node(self) -> int:
        return self.n_ranks


def fake_mscclpp() -> SimpleNamespace:
    """Return a stand-in for the ``mscclpp`` module: its classes, enums and a count of plans loaded."""
    loaded: list[FakeExecutionPlan] = []

    def execution_plan(planPath: str, rank: int) -> FakeExecutionPlan:
        loaded.append(FakeExecutionPlan(planPath, rank))
        return loaded[-1]

    return SimpleNamespace(
        DataType=FakeDataType,
        PacketType=FakePacketType,
        ExecutionPlan=execution_plan,
        Executor=FakeExecutor,
        TcpBootstrap=FakeBootstrap,
        Communicator=lambda bootstrap: SimpleNamespace(bootstrap=bootstrap),
        loaded=loaded,
    )


def make_runner(tmp_path: Path, rank: int = 1, world_size: int = 4, ranks_per_node: int = 4) -> PlanRunner:
    return PlanRunner(
        fake_mscclpp(), "comm", rank, world_size, ranks_per_node, tmp_path, stream_handle=lambda device: STREAM
    )


def ints(numel: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randint(-8, 9, (numel,), generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- binding and errors ----------------------------------------------------------------------------


def test_missing_bindings_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mscclpp", None)  # import mscclpp raises ImportError
    with pytest.raises(ArgumentError, match=r"transport: 'mscclpp': MSCCL\+\+'s Python bindings are not importable"):
        require_mscclpp(cuda_available=True)


def test_missing_cuda_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mscclpp", fake_mscclpp())
    with pytest.raises(ArgumentError, match=r"transport: 'mscclpp': CUDA is not available"):
        require_mscclpp(cuda_available=False)
    assert require_mscclpp(cuda_available=True) is sys.modules["mscclpp"]


# -- calls served: argument order, sizes, dtypes, plan export and cache ---------------------------------


def test_allgather_runs_one_execute_with_per_rank_sizes_and_exports_the_plan_once(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    algorithm = ring_algorithm(Collective.ALLGATHER, 4)
    input, output = ints(16), torch.zeros(64)
    for _ in range(2):
        assert runner.run(Collective.ALLGATHER, output, input, "sum", algorithm, None)
    calls = runner.executor.calls
    assert len(calls) == 2
    assert calls[0] == {
        "rank": 1,
        "send": input.data_ptr(),
        "recv": output.data_ptr(),
        "send_size": 64,
        "recv_size": 256,
        "data_type": FakeDataType.float32,
        "plan": runner.module.loaded[0],
        "stream": STREAM,
        "packet_type": FakePacketType.LL16,
    }
    assert calls[1]["plan"] is calls[0]["plan"]
    assert len(runner.module.loaded) == 1 and runner.module.loaded[0].rank == 1
    files = sorted(tmp_path.iterdir())
    assert [str(f) for f in files] == [runner.module.loaded[0].path]
    assert files[0].read_text() == mscclpp_plan_text(algorithm)


def test_reducescatter_sends_the_whole_input_and_receives_one_block(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    input, output = ints(64), torch.zeros(16)
    assert runner.run(Collective.REDUCESCATTER, output, input, "sum", ring_algorithm(Collective.REDUCESCATTER, 4), None)
    call = runner.executor.calls[0]
    assert (call["send"], call["recv"], call["send_size"], call["recv_size"]) == (
        input.data_ptr(),
        output.data_ptr(),
        256,
        64,
    )
    assert runner.module.loaded[0].collective == "reducescatter"


def test_inplace_allreduce_passes_one_buffer_and_avg_divides_after_the_sum(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    algorithm = ring_algorithm(Collective.ALLREDUCE, 4, inplace=True)
    tensor = ints(32) * 4
    before = tensor.clone()
    assert runner.run(Collective.ALLREDUCE, tensor, tensor, "avg", algorithm, None)
    call = runner.executor.calls[0]
    assert call["send"] == call["recv"] == tensor.data_ptr() and call["send_size"] == call["recv_size"] == 128
    # the fake executor left the data alone, so what changed is the divide for avg
    assert torch.equal(tensor, before / 4)
    assert parse_mscclpp_plan(Path(runner.module.loaded[0].path).read_text()).inplace


@pytest.mark.parametrize(
    ("dtype", "member"),
    [(torch.float16, "float16"), (torch.bfloat16, "bfloat16"), (torch.int32, "int32"), (torch.float32, "float32")],
    ids=str,
)
def test_dtypes_map_to_mscclpp_data_types(tmp_path: Path, dtype: torch.dtype, member: str) -> None:
    runner = make_runner(tmp_path)
    input, output = ints(32, dtype), torch.zeros(128, dtype=dtype)
    assert runner.run(Collective.ALLGATHER, output, input, "sum", ring_algorithm(Collective.ALLGATHER, 4), None)
    call = runner.executor.calls[0]
    assert call["data_type"] is FakeDataType[member]
    assert (call["send_size"], call["recv_size"]) == (32 * input.element_size(), 128 * input.element_size())


def test_the_plan_takes_the_band_range_of_its_candidate(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    algorithm = ring_algorithm(Collective.ALLGATHER, 4)
    candidate = Candidate(algorithm, 128, 1024, "test", Collective.ALLGATHER, 4)
    assert runner.run(Collective.ALLGATHER, torch.zeros(64), ints(16), "sum", algorithm, candidate)
    plan = parse_mscclpp_plan(Path(runner.module.loaded[0].path).read_text())
    assert (plan.min_message_size, plan.max_message_size) == (128, 1023)
    # 2048 bytes lie outside the band's plan: MSCCL++ would throw, so the call falls back
    assert not runner.run(Collective.ALLGATHER, torch.zeros(512), ints(128), "sum", algorithm, candidate)
    assert len(runner.executor.calls) == 1


def test_a_band_made_for_a_builtin_machine_exports_with_its_topology(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, rank=0, world_size=8, ranks_per_node=8)
    algorithm = ring_algorithm(Collective.ALLGATHER, 8)
    candidate = Candidate(algorithm, 0, None, "test", Collective.ALLGATHER, 8, MadeFor(None, "ndv2", 1))
    assert runner.run(Collective.ALLGATHER, torch.zeros(128), ints(16), "sum", algorithm, candidate)
    assert Path(runner.module.loaded[0].path).read_text() == mscclpp_plan_text(algorithm, load_topology("ndv2"))
    # the same band where the bootstrap counts 4 ranks per machine: ndv2's 8 GPUs per machine do not fit
    runner = make_runner(tmp_path, rank=0, world_size=8, ranks_per_node=4)
    assert not runner.run(Collective.ALLGATHER, torch.zeros(128), ints(16), "sum", algorithm, candidate)


def test_a_band_for_an_unknown_machine_runs_on_one_machine_without_a_topology(tmp_path: Path) -> None:
    runner = make_runner(tmp_path)
    algorithm = ring_algorithm(Collective.ALLGATHER, 4)
    candidate = Candidate(algorithm, 0, None, "test", Collective.ALLGATHER, 4, MadeFor(None, "no-such-machine", 1))
    assert runner.run(Collective.ALLGATHER, torch.zeros(64), ints(16), "sum", algorithm, candidate)
    assert Path(runner.module.loaded[0].path).read_text() == mscclpp_plan_text(algorithm)


# -- calls left to torch rounds, each said once -------------------------------------------------------


def refusal_cases() -> list:
    allreduce = ring_algorithm(Collective.ALLREDUCE, 4, inplace=True)
    reducescatter = ring_algorithm(Collective.REDUCESCATTER, 4)
    t32, t64, t24 = ints(32), ints(32, torch.int64), ints(24)
    shared = ints(64)
    allgather_inplace = inplace_variant(ring_algorithm(Collective.ALLGATHER, 4))
    return [
        pytest.param(Collective.ALLREDUCE, t32, t32, "max", allreduce, 4, "op 'max'", id="max"),
        pytest.param(Collective.ALLREDUCE, t64, t64, "sum", allreduce, 4, "dtype torch.int64", id="int64"),
        # 96 bytes are 6 units of 16 B, which 4 chunks do not divide (execution_plan.cc:299-311)
        pytest.param(
            Collective.ALLREDUCE, t24, t24, "sum", allreduce, 4, "96 bytes, a size the plan refuses", id="size"
        ),
        pytest.param(
            Collective.REDUCESCATTER, shared[16:32], shared, "sum", reducescatter, 4, "aliased tensors", id="aliased"
        ),
        pytest.param(Collective.ALLREDUCE, t32, t32, "sum", allreduce, 2, "spans machines", id="two-machines"),
        pytest.param(
            Collective.ALLGATHER, torch.zeros(128), t32, "sum", allgather_inplace, 4, "do not alias", id="inplace-plan"
        ),
    ]


@pytest.mark.parametrize(("collective", "output", "input", "op", "algorithm", "per_node", "why"), refusal_cases())
def test_calls_no_plan_serves_fall_back_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, collective, output, input, op, algorithm, per_node, why
) -> None:
    runner = make_runner(tmp_path, ranks_per_node=per_node)
    with caplog.at_level(logging.INFO, logger="taccl_py.runtime.communicator.mscclpp_runner"):
        results = [runner.run(collective, output, input, op, algorithm, None) for _ in range(3)]
    assert results == [False] * 3 and runner.executor.calls == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and why in lines[0] and "torch rounds" in lines[0], lines


# -- through the Communicator, 2 gloo ranks ------------------------------------------------------------


def communicator_worker(rank: int, world: int, plan_dir: str) -> list[str]:
    """Check construction errors, then run each collective through the fake executor and torch rounds."""
    from unittest import mock

    from taccl_py.runtime.communicator import Communicator
    from taccl_py.runtime.communicator.mscclpp_runner import MscclppTransport

    library = [ring_algorithm(c, world) for c in (Collective.ALLGATHER, Collective.REDUCESCATTER)]
    library.append(ring_algorithm(Collective.ALLREDUCE, world, inplace=True))
    problems = []
    with mock.patch.dict(sys.modules, {"mscclpp": None}):
        try:
            Communicator(None, library, transport="mscclpp", calibration=False)
            problems.append("no error without mscclpp")
        except ArgumentError as error:
            if "MSCCL++'s Python bindings are not importable" not in str(error) or "\n" in str(error):
                problems.append(f"without mscclpp: {error}")
    with (
        mock.patch.dict(sys.modules, {"mscclpp": fake_mscclpp()}),
        mock.patch("torch.cuda.is_available", lambda: False),
    ):
        try:
            Communicator(None, library, transport="mscclpp", calibration=False)
            problems.append("no error without CUDA")
        except ArgumentError as error:
            if "CUDA is not available" not in str(error):
                problems.append(f"without CUDA: {error}")
    module = fake_mscclpp()
    transport = MscclppTransport(None, module=module, plan_dir=plan_dir, device="cpu")
    runner = transport.plan_runner
    runner.stream_handle = lambda device: 0
    comm = Communicator(None, library, transport=transport, calibration=False)
    ids = [None] * world
    torch.distributed.all_gather_object(ids, runner.executor.comm.bootstrap.unique_id)
    if len(set(ids)) != 1 or ids[0] is None:
        problems.append(f"ranks initialised with different ids: {ids}")
    served = 0
    for collective, op, dtype, numel in [
        ("allgather", "sum", "float32", 32),
        ("reducescatter", "sum", "float32", 64),
        ("allreduce", "sum", "float32", 64),
        ("allreduce", "avg", "float32", 64),
        ("allreduce", "max", "float32", 64),  # torch rounds
        ("allreduce", "sum", "int64", 64),  # torch rounds
        ("allreduce", "sum", "float32", 6),  # 24 bytes: not a multiple of 16, torch rounds
    ]:
        case = Case(collective, dtype, numel, op)
        input = random_input(case, rank, numel)
        reference = torch_collective(collective, input.clone(), op, world)
        if collective == "allgather":
            output = torch.zeros(numel * world, dtype=input.dtype)
            runner.executor.tensors = {t.data_ptr(): t for t in (input, output)}
            comm.all_gather(output, input)
        elif collective == "reducescatter":
            output = torch.zeros(numel // world, dtype=input.dtype)
            runner.executor.tensors = {t.data_ptr(): t for t in (input, output)}
            comm.reduce_scatter(output, input, op)
        else:
            output = input
            runner.executor.tensors = {input.data_ptr(): input}
            comm.all_reduce(input, op)
        problem = compare(case, output, reference)
        if problem:
            problems.append(problem)
        served += op in ("sum", "avg") and dtype == "float32" and numel != 6
        if len(runner.executor.calls) != served:
            problems.append(f"{case.label()}: {len(runner.executor.calls)} executor calls, expected {served}")
    return problems


@pytest.mark.multiprocess
def test_communicator_runs_plans_through_the_executor_and_the_rest_over_rounds(tmp_path: Path) -> None:
    per_rank = run_ranks(communicator_worker, 2, str(tmp_path))
    assert per_rank == [[], []]
    assert len(list(tmp_path.glob("*.json"))) == 3  # one plan per algorithm, shared by both ranks


# -- on GPUs with MSCCL++ ------------------------------------------------------------------------------


class CountingExecutor:
    """Wraps MSCCL++'s executor to count the calls it serves."""

    def __init__(self, inner: object) -> None:
        self.inner, self.calls = inner, 0

    def execute(self, **arguments: object) -> None:
        self.calls += 1
        self.inner.execute(**arguments)


def gpu_worker(rank: int, world: int, plan_dir: str) -> list[str]:
    """Run each collective through MSCCL++ plans on an NCCL group and compare with NCCL's own."""
    import torch.distributed as dist

    from taccl_py.runtime.communicator import Communicator
    from taccl_py.runtime.executor.native import native_collective

    os.environ["TACCL_CACHE_DIR"] = plan_dir
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="env://")
    try:
        library = [ring_algorithm(c, world) for c in (Collective.ALLGATHER, Collective.REDUCESCATTER)]
        library.append(ring_algorithm(Collective.ALLREDUCE, world, inplace=True))
        comm = Communicator(None, library, transport="mscclpp", calibration=False)
        runner = comm.transport.plan_runner
        runner.executor = CountingExecutor(runner.executor)
        problems = []
        for collective, numel, out_numel in [
            (Collective.ALLGATHER, 1 << 14, world << 14),
            (Collective.REDUCESCATTER, 1 << 16, (1 << 16) // world),
            (Collective.ALLREDUCE, 1 << 16, 1 << 16),
        ]:
            case = Case(collective.value, "float32", numel, real=True)
            input = random_input(case, rank, numel).cuda()
            reference = input.clone() if collective is Collective.ALLREDUCE else torch.empty(out_numel, device="cuda")
            native_collective(collective, reference, input.clone(), "sum", None)
            if collective is Collective.ALLGATHER:
                output = torch.empty(out_numel, device="cuda")
                comm.all_gather(output, input)
            elif collective is Collective.REDUCESCATTER:
                output = torch.empty(out_numel, device="cuda")
                comm.reduce_scatter(output, input)
            else:
                output = input.clone()
                comm.all_reduce(output)
            torch.cuda.synchronize()
            problem = compare(case, output.cpu(), reference.cpu())
            if problem:
                problems.append(problem)
        if runner.executor.calls != 3:
            problems.append(f"{runner.executor.calls} calls ran as MSCCL++ plans, expected 3")
        return problems
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_plans_run_on_gpus_as_nccl_does(tmp_path: Path) -> None:
    if importlib.util.find_spec("mscclpp") is None:
        pytest.skip("mscclpp's Python bindings are not importable")
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs, one per rank")
    assert run_ranks(gpu_worker, 2, str(tmp_path), backend=None) == [[], []]
