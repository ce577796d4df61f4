"""The ``taccl`` group as a torch.distributed citizen: one issue order, honest Work, no pinned tensors.

In-process tests drive a one-rank group whose routed calls are stand-in jobs, with its inner
backend wrapped to record what reaches it and when; one launch of 2 gloo ranks checks that
tensors a caller drops are freed by the backend, the Communicator and the DDP hook, and that a
delegated call issued after a routed one sees its result.
"""

from __future__ import annotations

import datetime
import gc
import os
import threading
import weakref
from typing import Any

import pytest

from taccl_py.ir.collectives import Collective

from ddp_helpers import init_taccl_group, ring_library, run_on_shared_store

torch = pytest.importorskip("torch", reason="the taccl backend needs torch")
dist = pytest.importorskip("torch.distributed", reason="the taccl backend needs torch.distributed")

RANKS = 2


class RecordingInner:
    """An inner backend that logs each call's name in ``log`` and runs it on the real one."""

    def __init__(self, real: Any, log: list[str]) -> None:
        self._real, self._log = real, log

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._log.append(name)
            return method(*args, **kwargs)

        return call


@pytest.fixture
def group() -> Any:
    """A one-rank taccl group that believes it routes (its routed calls are the tests' jobs)."""
    from taccl_py.runtime.backend.group import TacclProcessGroup

    pg = TacclProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30), library=None)
    pg._has_algorithms = pg._order._routes = True
    pg.log = []
    real = pg._get_backend(torch.device("cpu"))
    pg._get_backend = lambda device: RecordingInner(real, pg.log)
    yield pg
    pg.shutdown()


def _blocked_routed_call(pg: Any, release: threading.Event) -> Any:
    """Queue a routed all-reduce that ends only once ``release`` is set; return its Work."""
    tensor = torch.ones(4)

    def job() -> list:
        release.wait(30)
        pg.log.append("routed all_reduce")
        return [tensor]

    return pg._submit(Collective.ALLREDUCE, job, (tensor,))


def test_a_delegated_collective_runs_after_the_routed_calls_issued_before_it(group: Any) -> None:
    release = threading.Event()
    routed = _blocked_routed_call(group, release)
    value = torch.full((3,), 5.0)
    broadcast = group.broadcast([value], dist.BroadcastOptions())  # returns at once: it is queued
    assert group.log == [] and not routed.is_completed() and not broadcast.is_completed()
    release.set()
    assert broadcast.wait() and routed.is_completed()
    assert group.log == ["routed all_reduce", "broadcast"]
    assert broadcast.get_future().value()[0] is value


def test_a_send_waits_on_the_host_for_the_routed_calls_before_it(group: Any) -> None:
    # The routed call's Work, not the worker's idle flag: the worker counts a job finished only
    # after its Future completed, so a waiter released by that Future may still see it busy.
    class Sender:  # a send to oneself would wait for its receive: record when the caller gets there
        def send(self, *args: Any) -> None:
            group.log.append(("send", "after the routed call" if routed.is_completed() else "before it"))

    release = threading.Event()
    routed = _blocked_routed_call(group, release)
    group._get_backend = lambda device: Sender()
    sender = threading.Thread(target=group.send, args=([torch.ones(1)], 0, 0))
    sender.start()
    sender.join(0.3)
    assert sender.is_alive() and group.log == []
    release.set()
    sender.join(30)
    assert group.log == ["routed all_reduce", ("send", "after the routed call")]


def test_a_delegated_call_that_fails_raises_from_its_work_and_spares_later_calls(group: Any) -> None:
    release = threading.Event()
    _blocked_routed_call(group, release)
    wrong = group.broadcast([torch.ones(2)], _options(dist.BroadcastOptions(), rootRank=3))  # no rank 3
    release.set()
    with pytest.raises(RuntimeError):
        wrong.wait()
    assert wrong.exception() is not None and not wrong.is_success()
    assert group.allreduce([torch.ones(2)]).wait()  # the worker did not take the caller's error as its own


def test_the_gpu_link_warms_up_at_the_first_routed_gpu_call_and_the_cpu_link_never(
    group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taccl_py.runtime.backend import group as group_module

    made: list[Any] = []
    monkeypatch.setattr(group_module, "Communicator", lambda *args, **kw: made.append(kw["transport"]) or object())

    class Link:
        def __init__(self, device: str) -> None:
            self.device, self.warm_ups = torch.device(device), 0

        def warm_up(self) -> None:
            self.warm_ups += 1

    gpu, cpu = Link("cuda"), Link("cpu")
    for _ in range(3):
        group._communicator_on(gpu)
        group._communicator_on(cpu)
    assert (gpu.warm_ups, cpu.warm_ups) == (1, 0) and made == [gpu, cpu]


def test_barrier_waits_for_the_queued_calls_and_runs_on_the_gpus_where_the_group_has_them(group: Any) -> None:
    release = threading.Event()
    _blocked_routed_call(group, release)
    devices: list[str] = []
    real = group._get_backend
    group._get_backend = lambda device: devices.append(device.type) or real(device)
    group._has_cuda_backend = False  # as on a machine without CUDA, where the group has gloo alone
    threading.Timer(0.2, release.set).start()
    group.barrier().wait()
    assert group.log == ["routed all_reduce", "barrier"] and devices == ["cpu"]
    group._has_cuda_backend = True  # no GPU here: what matters is which inner backend is asked
    group.barrier().wait()
    assert devices[-1] == "cuda"


def test_a_routed_work_on_cpu_completes_when_its_job_ran_and_reports_a_timeout(group: Any) -> None:
    from taccl_py.errors import TransportError

    release = threading.Event()
    work = _blocked_routed_call(group, release)
    with pytest.raises(TransportError, match="did not finish within 0.1 s"):
        work.wait(datetime.timedelta(seconds=0.1))
    assert isinstance(work.exception(), TransportError) and not work.is_completed() and not work.is_success()
    release.set()
    assert work.wait() and work.is_completed()


def test_a_call_during_cuda_graph_capture_runs_on_the_inner_backend(
    group: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cuda = torch.device("cuda", 0)

    class FakeCudaTensor:  # no GPU here: the decision reads only these attributes
        device, layout, dtype = cuda, torch.strided, torch.float32

        def is_contiguous(self) -> bool:
            return True

    class FakeCommunicator:
        automatic_calibration = None

        def algorithm_for(self, collective: Collective, size_bytes: int) -> Any:
            return type("Algorithm", (), {"name": "ring"})()

    group._links = {"cuda": type("Link", (), {"device": cuda})()}
    group._communicator_on = lambda link: FakeCommunicator()
    tensors = (FakeCudaTensor(),)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert isinstance(group._communicator(Collective.ALLREDUCE, tensors, 1024), FakeCommunicator)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with caplog.at_level("INFO", logger="taccl_py.runtime.backend"):
        assert group._communicator(Collective.ALLREDUCE, tensors, 1024) is None
        assert group._communicator(Collective.ALLREDUCE, tensors, 1024) is None
    assert sum("CUDA graph is captured" in r.message for r in caplog.records) == 1
    group._links = {}


def test_a_communicator_call_during_cuda_graph_capture_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from taccl_py.errors import ArgumentError
    from taccl_py.runtime.communicator.checks import check_tensors

    tensor = torch.ones(4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ArgumentError, match="all_reduce: called while this thread captures a CUDA graph"):
        check_tensors("all_reduce", tensor, tensor, torch.device("cuda", 0), "torch-nccl")
    check_tensors("all_reduce", tensor, tensor, torch.device("cpu"), "torch-gloo")  # CPU: nothing captured


def test_a_routed_work_on_a_gpu_waits_on_the_stream_not_the_host() -> None:
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: a stream-ordered Work needs a GPU")
    from taccl_py.runtime.backend.work import StreamWork

    stream = torch.cuda.Stream()
    # Made before the sleep: the first launch of a kernel loads its module (CUDA's lazy loading),
    # which waits for the device, so a fill kernel issued behind the sleep would wait out the sleep.
    output = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time
        work = StreamWork([output], stream)
    assert not work.is_completed() and work.wait()  # the host did not wait
    torch.cuda.synchronize()
    assert work.is_completed() and work.get_future().value()[0].item() == 1.0


def _options(options: Any, **values: Any) -> Any:
    for name, value in values.items():
        setattr(options, name, value)
    return options


# -- multi-process: freed tensors, issue order with real collectives -----------------------------


def _storage_refs(*tensors: Any) -> list[Any]:
    return [weakref.ref(t.untyped_storage()) for t in tensors]


def _alive(refs: list[Any]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


def _backend_frees(pg: Any) -> dict[str, Any]:
    """Routed calls through dist.*, sync and async; then the caller drops its tensors."""
    before = sum(pg.routed.values())
    t, x = torch.randn(4096), torch.randn(2048)
    o, r = torch.empty(2048 * RANKS), torch.empty(2048 // RANKS)
    dist.all_reduce(t)
    dist.all_gather_single(o, x)
    dist.reduce_scatter_single(r, x)
    a = torch.randn(1000)
    dist.all_reduce(a, async_op=True).wait()
    # the worker lets go of a call's tensors just after its Work completes: the barrier waits for that
    dist.barrier()
    refs = _storage_refs(t, x, o, r, a)
    del t, x, o, r, a
    return {"routed": sum(pg.routed.values()) - before, "alive": _alive(refs), "of": len(refs)}


def _communicator_frees() -> dict[str, Any]:
    from taccl_py.runtime.communicator import Communicator

    comm = Communicator(dist.new_group(backend="gloo"), ring_library(RANKS), calibration=False)
    t, x, o = torch.randn(3000), torch.randn(1500), torch.empty(1500 * RANKS)
    comm.all_reduce(t)
    comm.all_gather(o, x)
    refs = _storage_refs(t, x, o)
    del t, x, o
    return {"executors": len(comm._executors), "alive": _alive(refs), "of": len(refs)}


def _hook_frees() -> dict[str, Any]:
    from taccl_py.runtime.communicator import Communicator
    from taccl_py.runtime.ddp import HookState

    state = HookState(Communicator(dist.new_group(backend="gloo"), ring_library(RANKS), calibration=False))
    buckets = [torch.randn(2500), torch.randn(700)]
    for bucket in buckets:
        state.average_async(bucket).wait()
    refs = _storage_refs(*buckets)
    del buckets, bucket
    state.close()  # its worker has let go of the last bucket; the Communicator and its executors stay
    return {"alive": _alive(refs), "of": len(refs)}


def _delegated_after_routed(rank: int) -> bool:
    """all_reduce(async) then broadcast of the same tensor: every rank ends with the sum."""
    values = torch.arange(200_000, dtype=torch.float32) * (rank + 1)
    work = dist.all_reduce(values, async_op=True)
    dist.broadcast(values, src=0)
    work.wait()
    expected = torch.arange(200_000, dtype=torch.float32) * sum(range(1, RANKS + 1))
    return bool(torch.equal(values, expected))


def _calibrating_group(rank: int, folder: str) -> dict[str, Any]:
    """A taccl group left at its default calibrates on its first routed call; a size it gives gloo goes there."""
    from dataclasses import replace

    from taccl_py.runtime.communicator import calibration_cache

    os.environ.pop("TACCL_CALIBRATION")  # the suite's "off" (tests/conftest.py), for this group only
    os.environ["TACCL_CACHE_DIR"] = folder
    calibration_cache.LAZY_CALIBRATION_SIZES, calibration_cache.LAZY_CALIBRATION_ITERS = (4096, 65536), 2
    group, gloo = dist.new_group(backend="taccl"), dist.new_group(backend="gloo")
    try:
        dist.all_reduce(torch.randn(1024), group=group)
        automatic = group._communicators["cpu"]._lazy
        measured = automatic.calibration
        # whatever this machine measured: from now on gloo is ten times faster at every size
        slower = tuple(replace(p, ours_us=10 * p.native_us) for p in measured.points)
        automatic.calibration = replace(measured, points=slower)
        before = (group.routed["allreduce"], group.delegated["allreduce"])
        ours = torch.randn(4096, generator=torch.Generator().manual_seed(rank))
        reference = ours.clone()
        dist.all_reduce(ours, group=group)
        dist.all_reduce(reference, group=gloo)
        return {
            "measured": sorted(p.size_bytes for p in measured.points),
            "then": (group.routed["allreduce"] - before[0], group.delegated["allreduce"] - before[1]),
            "equal": bool(torch.equal(ours, reference)),
        }
    finally:
        os.environ["TACCL_CALIBRATION"] = "off"


def _scenarios(rank: int, world_size: int, port: int, folder: str) -> dict[str, Any]:
    pg = init_taccl_group(rank, world_size, port, ring_library(world_size))
    return {
        "backend": _backend_frees(pg),
        "communicator": _communicator_frees(),
        "hook": _hook_frees(),
        "ordered": _delegated_after_routed(rank),
        "calibrating": _calibrating_group(rank, folder),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_on_shared_store(_scenarios, RANKS, str(tmp_path_factory.mktemp("calibration")))


@pytest.mark.multiprocess
@pytest.mark.parametrize("holder", ["backend", "communicator", "hook"])
def test_tensors_the_caller_drops_are_freed(results: list[dict[str, Any]], holder: str) -> None:
    for found in results:
        assert found[holder]["alive"] == 0, f"{holder}: {found[holder]['alive']} of {found[holder]['of']} kept"
    if holder == "backend":
        assert all(found["backend"]["routed"] == 4 for found in results)
    if holder == "communicator":
        assert all(found["communicator"]["executors"] == 2 for found in results)  # the cache is still there


@pytest.mark.multiprocess
def test_a_broadcast_after_an_async_all_reduce_sees_its_result(results: list[dict[str, Any]]) -> None:
    assert [found["ordered"] for found in results] == [True] * RANKS


@pytest.mark.multiprocess
def test_a_default_group_calibrates_and_sends_what_gloo_won_straight_to_gloo(results: list[dict[str, Any]]) -> None:
    for found in results:
        assert found["calibrating"] == {"measured": [4096, 65536], "then": (0, 1), "equal": True}


def test_a_synchronous_nccl_call_without_work_is_ordered_on_the_current_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.11's ProcessGroupNCCL returns None for a call with asyncOp False (seen on an H200):
    # the call ran on the current stream, so that stream's event marks its end
    from taccl_py.runtime.backend import issue_order

    class FakeStream:
        def record_event(self) -> str:
            return "after the call"

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "Stream", lambda **kwargs: pytest.fail("no side stream for a call without Work"))
    assert issue_order._event_after(None, torch.device("cuda", 0)) == "after the call"
