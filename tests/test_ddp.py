"""The DDP communication hook: same training as default DDP, any bucket layout, failures surface.

One launch of 4 gloo ranks runs every multi-process scenario (see ``_hook_scenarios``); the tests
below read its per-rank results. The in-process tests cover the ordered worker and argument checks.
"""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import pytest

from taccl_py.errors import ArgumentError, TransportError

from ddp_helpers import BUCKET_CAP_MB, STEPS, WORLD_SIZE, make_mlp, max_difference, ring_library, train
from mp_utils import run_ranks

torch = pytest.importorskip("torch", reason="the DDP hook needs torch")

#: fp32 agreement with default DDP after 20 steps (the issue's bar).
FP32_TOLERANCE = 1e-6
#: fp16/bf16: 2-4 units in the last place of parameters below 1 after 20 steps (measured: 1).
HALF_TOLERANCE = {"float16": 1e-3, "bfloat16": 8e-3}


# -- multi-process scenarios (run inside the ranks) -----------------------------------------------


class _Recorder:
    """DDP hook state that notes each bucket's length and dtype, then calls the real hook."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.buckets: list[tuple[int, str]] = []
        self.pending_at_return = 0


def _recording_hook(recorder, bucket):  # noqa: ANN001, ANN201 - DDP checks annotations as objects
    from taccl_py.runtime.ddp import allreduce_hook

    buffer = bucket.buffer()
    recorder.buckets.append((buffer.numel(), str(buffer.dtype).removeprefix("torch.")))
    future = allreduce_hook(recorder.state, bucket)
    recorder.pending_at_return += not future.done()  # still running while backward goes on
    return future


def _uneven_buckets(rank: int, library: list[Any]) -> dict[str, Any]:
    """fp32, small bucket cap: record every bucket and compare with default DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from taccl_py.runtime.communicator import Communicator
    from taccl_py.runtime.ddp import HookState

    reference = train(DDP(make_mlp(), bucket_cap_mb=BUCKET_CAP_MB), rank)
    model = DDP(make_mlp(), bucket_cap_mb=BUCKET_CAP_MB)
    with HookState(Communicator(dist.new_group(backend="gloo"), library)) as state:
        recorder = _Recorder(state)
        model.register_comm_hook(recorder, _recording_hook)
        hooked = train(model, rank)
        sizes = sorted({n for n, _ in recorder.buckets})
        runs_taccl = all(state.communicator.algorithm_for("allreduce", n * 4) is not None for n in sizes)
        try:
            pickle.dumps(state)
            pickled = "pickled"
        except TypeError as error:
            pickled = str(error)
    return {
        "diff": max_difference(reference, hooked),
        "sizes": sizes,
        "calls": len(recorder.buckets),
        "pending": recorder.pending_at_return,
        "reduced": state.buckets_reduced,
        "runs_taccl": runs_taccl,
        "pickle": pickled,
    }


def _register_scenario(
    rank: int,
    library: list[Any],
    *,
    unused: bool = False,
    dtype: Any = None,
    background: bool = True,
    calibration: str | None = None,
) -> dict[str, Any]:
    """Train with register() and with default DDP from the same seed; return the difference."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from taccl_py.runtime.ddp import register

    options = {"bucket_cap_mb": BUCKET_CAP_MB, "find_unused_parameters": unused}
    reference = train(DDP(make_mlp(unused=unused, dtype=dtype), **options), rank, dtype=dtype)
    model = DDP(make_mlp(unused=unused, dtype=dtype), **options)
    state = register(model, library=library, background=background, calibration=calibration)
    start = time.perf_counter()
    hooked = train(model, rank, dtype=dtype)
    elapsed_s = time.perf_counter() - start
    state.close()
    single = train(make_mlp(unused=unused), rank, steps=0)  # the untrained start, fp32
    return {
        "diff": max_difference(reference, hooked),
        "moved": max_difference(single, hooked),
        "reduced": state.buckets_reduced,
        "elapsed_s": elapsed_s,
        "calibration": state.communicator.calibration,
        "native": state.buckets_native,
    }


def _failure_scenario(rank: int) -> dict[str, Any]:
    """A collective that fails on every rank must raise from backward, then fail fast, then close."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from taccl_py.runtime.communicator import Communicator
    from taccl_py.runtime.ddp import HookState, allreduce_hook

    class _FailingCommunicator(Communicator):
        """Fails its third all-reduce, before sending anything, on every rank alike."""

        def all_reduce(self, tensor: Any, op: Any = "sum") -> None:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 3:
                raise TransportError("injected failure of the third bucket")
            super().all_reduce(tensor, op)

    model = DDP(make_mlp(), bucket_cap_mb=BUCKET_CAP_MB)
    state = HookState(_FailingCommunicator(dist.new_group(backend="gloo")))
    model.register_comm_hook(state, allreduce_hook)
    raised = "nothing"
    try:
        train(model, rank, steps=3)
    except Exception as error:  # DDP re-raises the future's exception from backward
        raised = f"{type(error).__name__}: {error}"
    later = state.average_async(torch.ones(3))
    try:
        later.wait()
        after = "nothing"
    except RuntimeError as error:  # torch names the TransportError the future failed with
        after = str(error)
    start = time.perf_counter()
    state.close()
    return {
        "raised": raised,
        "after": after,
        "close_s": time.perf_counter() - start,
        "alive": any(t.name.startswith("taccl-ddp") for t in threading.enumerate()),
    }


def _hook_scenarios(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    library = ring_library(world_size)
    return {
        "uneven": _uneven_buckets(rank, library),
        "unused": _register_scenario(rank, library, unused=True),
        "float16": _register_scenario(rank, library, dtype=torch.float16),
        "bfloat16": _register_scenario(rank, library, dtype=torch.bfloat16),
        "foreground": _register_scenario(rank, library, background=False),
        "calibrated": _register_scenario(rank, library, calibration=f"{folder}/ddp.calibration.json"),
        "native": _register_scenario(rank, []),  # no algorithm at all: every bucket goes to DDP's own group
        "failure": _failure_scenario(rank),
    }


@pytest.fixture(scope="module")
def hook_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(_hook_scenarios, WORLD_SIZE, str(tmp_path_factory.mktemp("ddp")))


# -- multi-process tests --------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.multiprocess
def test_hook_matches_default_ddp_with_uneven_buckets(hook_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(hook_results):
        uneven = result["uneven"]
        assert uneven["diff"] <= FP32_TOLERANCE, f"rank {rank}: parameters differ by {uneven['diff']}"
        assert len(uneven["sizes"]) >= 3, f"rank {rank}: bucket lengths {uneven['sizes']}"
        assert any(n % WORLD_SIZE for n in uneven["sizes"]), (
            f"rank {rank}: every bucket divides evenly: {uneven['sizes']}"
        )
        assert uneven["calls"] == uneven["reduced"] > STEPS, (  # more buckets than steps
            f"rank {rank}: {uneven['calls']} hook calls, {uneven['reduced']} reduced"
        )
        assert uneven["runs_taccl"], f"rank {rank}: some bucket fell back to torch's all-reduce"
        assert uneven["pending"] > 0, f"rank {rank}: every bucket was reduced before the hook returned"


@pytest.mark.multiprocess
def test_hook_with_unused_parameters_matches_default_ddp(hook_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(hook_results):
        assert result["unused"]["diff"] <= FP32_TOLERANCE, f"rank {rank}: {result['unused']}"
        assert result["unused"]["moved"] > 1e-3, f"rank {rank}: training did not move the parameters"


@pytest.mark.multiprocess
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_hook_with_half_gradients_matches_default_ddp(hook_results: list[dict[str, Any]], dtype: str) -> None:
    for rank, result in enumerate(hook_results):
        half = result[dtype]
        assert half["diff"] <= HALF_TOLERANCE[dtype], f"rank {rank}: {dtype} parameters differ by {half['diff']}"
        assert half["moved"] > 1e-2 and half["reduced"] > STEPS, f"rank {rank}: {half}"


@pytest.mark.multiprocess
def test_hook_with_a_calibration_matches_default_ddp_and_measured_the_hook_group(
    hook_results: list[dict[str, Any]],
) -> None:
    for result in hook_results:
        calibrated = result["calibrated"]
        # which buckets the calibration gives to gloo's own depends on the machine: count both paths
        assert calibrated["diff"] < 1e-6 and calibrated["moved"] > 1e-3
        assert calibrated["reduced"] + calibrated["native"] > 0
        measured = calibrated["calibration"]
        assert measured.key.transport == "taccl-gloo" and measured.key.world_size == WORLD_SIZE
        # the model's largest bucket (1 kB cap + a 2.8 kB gradient) fits the smallest default size
        assert {p.collective for p in measured.points} == {"allreduce"}
        assert [p.size_bytes for p in measured.points] == [65536]
    assert len({result["calibrated"]["calibration"] for result in hook_results}) == 1  # every rank chose alike


@pytest.mark.multiprocess
def test_buckets_without_an_algorithm_go_straight_to_ddps_group(hook_results: list[dict[str, Any]]) -> None:
    for result in hook_results:
        native = result["native"]
        assert native["diff"] < 1e-6 and native["moved"] > 1e-3
        assert native["reduced"] == 0 and native["native"] > 0  # none through the Communicator
        assert result["unused"]["native"] == 0  # the ring serves every size there


@pytest.mark.multiprocess
def test_hook_on_the_calling_thread_matches_default_ddp(hook_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(hook_results):
        assert result["foreground"]["diff"] <= FP32_TOLERANCE, f"rank {rank}: {result['foreground']}"


@pytest.mark.multiprocess
def test_failed_collective_raises_from_backward_and_closes(hook_results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(hook_results):
        failure = result["failure"]
        assert "injected failure of the third bucket" in failure["raised"], f"rank {rank}: {failure['raised']}"
        assert "TransportError: taccl-ddp-rank" in failure["after"], f"rank {rank}: {failure['after']}"
        assert "not run: an earlier collective failed" in failure["after"], f"rank {rank}: {failure['after']}"
        assert failure["close_s"] < 5 and not failure["alive"], f"rank {rank}: {failure}"


@pytest.mark.multiprocess
def test_hook_state_refuses_pickling(hook_results: list[dict[str, Any]]) -> None:
    assert all("cannot be pickled" in result["uneven"]["pickle"] for result in hook_results)


# -- in-process tests -----------------------------------------------------------------------------


def test_ordered_worker_keeps_submission_order() -> None:
    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    done: list[int] = []

    def job(index: int) -> int:
        time.sleep(0.002 * ((index * 7) % 3))
        done.append(index)
        return index * index

    worker = OrderedWorker("test-order")
    futures = [worker.submit(lambda i=i: job(i)) for i in range(30)]
    worker.flush().wait()
    assert done == list(range(30))
    assert [f.value() for f in futures] == [i * i for i in range(30)]
    worker.close()
    assert worker.closed and not any(t.name == "test-order" for t in threading.enumerate())


def test_ordered_worker_failure_reaches_later_jobs() -> None:
    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    def fail() -> None:
        raise ValueError("peer vanished")

    worker = OrderedWorker("test-failure")
    first, second = worker.submit(fail), worker.submit(lambda: 1)
    with pytest.raises(
        RuntimeError, match="TransportError: test-failure: collective failed: ValueError: peer vanished"
    ):
        first.wait()
    with pytest.raises(RuntimeError, match="TransportError: test-failure: not run: an earlier collective failed"):
        second.wait()
    with pytest.raises(RuntimeError, match="earlier collective failed"):
        worker.submit(lambda: 2).wait()
    assert isinstance(worker.failure, TransportError)
    worker.close()
    worker.close()  # twice is harmless
    with pytest.raises(ArgumentError, match="the worker is closed"):
        worker.submit(lambda: 3)


def test_ordered_worker_runs_a_job_inside_its_context() -> None:
    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    seen: list[tuple[str, str]] = []

    class Recorder:
        def __enter__(self) -> None:
            seen.append(("enter", threading.current_thread().name))

        def __exit__(self, *exc_info: object) -> None:
            seen.append(("exit", threading.current_thread().name))

    worker = OrderedWorker("test-context")
    result = worker.submit(lambda: seen.append(("job", threading.current_thread().name)) or 5, Recorder()).wait()
    worker.submit(lambda: seen.append(("bare job", threading.current_thread().name))).wait()
    worker.close()
    assert result == 5
    assert seen == [
        ("enter", "test-context"),
        ("job", "test-context"),
        ("exit", "test-context"),
        ("bare job", "test-context"),
    ]


def test_a_job_runs_on_the_stream_its_caller_was_on() -> None:
    """The worker thread's own current stream is the default one; the job must see the caller's."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: CUDA streams need a GPU")
    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    side = torch.cuda.Stream()
    worker = OrderedWorker("test-stream")
    with torch.cuda.stream(side):
        captured = torch.cuda.current_stream()
        job_stream = worker.submit(torch.cuda.current_stream, torch.cuda.stream(captured)).wait()
    bare_stream = worker.submit(torch.cuda.current_stream).wait()
    worker.close()
    assert captured == side and job_stream == side
    assert bare_stream == torch.cuda.default_stream()


def test_a_job_result_is_set_inside_its_context() -> None:
    """A CUDA-aware future records the stream current at set_result: it must be the job's."""
    import contextlib

    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    inside = []

    @contextlib.contextmanager
    def around():
        inside.append(True)
        yield
        inside.append(False)

    # The job holds until the callback is attached: a callback attached to a completed future
    # runs at once on the caller's thread, outside any context.
    attached = threading.Event()
    worker = OrderedWorker("test-context")
    future = worker.submit(lambda: attached.wait(60) and 5, around())
    seen_future = future.then(lambda future: (future.value(), inside[-1]))
    attached.set()
    seen = seen_future.wait()
    worker.close()
    assert seen == (5, True) and inside == [True, False]


def test_a_cuda_job_future_orders_the_waiters_stream() -> None:
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: CUDA-aware futures need a GPU")
    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    side, device = torch.cuda.Stream(), torch.device("cuda", torch.cuda.current_device())
    out = torch.zeros(1 << 20, device=device)
    torch.cuda.synchronize()

    def slow_fill() -> torch.Tensor:
        torch.cuda._sleep(200_000_000)  # the host returns at once; the GPU is busy for a while
        return out.fill_(7.0)

    worker = OrderedWorker("test-cuda-future")
    result = worker.submit(slow_fill, torch.cuda.stream(side), [device]).wait().clone()  # on the default stream
    worker.close()
    assert bool((result == 7.0).all())


def test_ordered_worker_refuses_pickling() -> None:
    from taccl_py.runtime.backend.ordered_worker import OrderedWorker

    worker = OrderedWorker("test-pickle")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(worker)
    worker.close()


def test_register_rejects_a_plain_module() -> None:
    from taccl_py.runtime.ddp import register

    with pytest.raises(
        ArgumentError,
        match="taccl_py.runtime.ddp: model: got Linear; expected a torch.nn.parallel.DistributedDataParallel",
    ):
        register(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("cap_mb", "largest_numel", "sizes_kib"),
    [
        (25, 10, [64, 256, 1024, 4096, 16384, 65536]),  # DDP's default cap: every default size
        (1, 768 * 1024, [64, 256, 1024, 4096]),  # 1 MiB + a 3 MiB gradient: up to 4 MiB
        (0.001, 703, [64]),  # test_ddp's models: the smallest size holds every bucket
        (100, 10, [64, 256, 1024, 4096, 16384, 65536]),  # past the defaults: all of them, none added
    ],
)
def test_a_calibration_file_is_measured_at_the_sizes_ddp_buckets_take(
    cap_mb: float, largest_numel: int, sizes_kib: list[int]
) -> None:
    from types import SimpleNamespace

    from taccl_py.runtime.ddp import bucket_sizes

    frozen = torch.zeros(10**5, requires_grad=False)  # 400 kB, no gradient: no bucket
    parameters = [torch.zeros(largest_numel, requires_grad=True), torch.zeros(3, requires_grad=True), frozen]
    model = SimpleNamespace(bucket_bytes_cap=int(cap_mb * 2**20), parameters=lambda: iter(parameters))
    assert bucket_sizes(model) == tuple(size * 1024 for size in sizes_kib)


def test_hook_state_needs_a_communicator() -> None:
    from taccl_py.runtime.ddp import HookState

    with pytest.raises(ArgumentError, match="communicator: got str; expected a Communicator"):
        HookState("gloo")
