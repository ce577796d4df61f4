"""GPU overlap in the ``taccl`` group and the DDP hook: routed calls on an internal stream, as ProcessGroupNCCL's.

No GPU is needed for most of it: stand-ins for torch.cuda's streams, events and tensors record
who waits for whom, so the tests check that a routed call's internal stream waits for the
caller's, that the caller's stream waits only when the Work is waited on, that its tensors are
marked used on the internal stream, and that delegated calls stay in issue order. The tests at
the end run on a real GPU and skip with a reason where there is none.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from taccl_py.runtime.backend import issue_order
from taccl_py.runtime.backend.issue_order import IssueOrder

torch = pytest.importorskip("torch", reason="the taccl backend needs torch")

CUDA0 = torch.device("cuda", 0)
NO_CUDA = "CUDA not available: this checks real CUDA streams and the caching allocator"


class FakeStream:
    """A CUDA stream stand-in that logs each wait and event it is asked for."""

    def __init__(self, name: str, log: list[tuple]) -> None:
        self.name, self.device, self._log = name, CUDA0, log

    def wait_stream(self, other: FakeStream) -> None:
        self._log.append((self.name, "waits for stream", other.name))

    def wait_event(self, event: str) -> None:
        self._log.append((self.name, "waits for", event))

    def record_event(self) -> str:
        return f"event on {self.name}"


class FakeTensor:
    """A CUDA tensor stand-in: a device, a gradient dtype, ``record_stream`` and ``div_`` logged."""

    dtype = torch.float32

    def __init__(self, name: str, log: list[tuple]) -> None:
        self.name, self.device, self._log = name, CUDA0, log

    def record_stream(self, stream: FakeStream) -> None:
        self._log.append((self.name, "record_stream", stream.name))

    def div_(self, divisor: int) -> FakeTensor:
        self._log.append((self.name, f"div_ {divisor}"))
        return self


class FakeCuda:
    """The torch.cuda calls IssueOrder makes, on stand-ins: ``current`` is the thread's stream stack."""

    def __init__(self, log: list[tuple]) -> None:
        self.log = log
        self.caller = FakeStream("caller", log)
        self.current = [self.caller]
        self.capturing = False
        self.made = 0

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current[-1]

    def new_stream(self, device: Any = None, **kwargs: Any) -> FakeStream:
        self.made += 1
        return FakeStream("internal" if self.made == 1 else f"side{self.made - 1}", self.log)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        self.log.append(("enter", stream.name))
        self.current.append(stream)
        try:
            yield
        finally:
            self.current.pop()
            self.log.append(("exit", stream.name))


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda([])
    monkeypatch.setattr(torch.cuda, "current_stream", fake.current_stream)
    monkeypatch.setattr(torch.cuda, "Stream", fake.new_stream)
    monkeypatch.setattr(torch.cuda, "stream", fake.stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: fake.capturing)
    monkeypatch.setattr(issue_order, "StreamWork", lambda outputs, stream: ("StreamWork", outputs, stream.name))
    monkeypatch.setattr(
        issue_order, "_event_after", lambda work, device: f"event after {work} on {fake.current[-1].name}"
    )
    return fake


@pytest.fixture
def order() -> Iterator[IssueOrder]:
    made = IssueOrder("test-streams", routes=True)
    yield made
    made.close()


def _job(cuda: FakeCuda, order: IssueOrder, outputs: list) -> Any:
    def job() -> list:
        cuda.log.append(("job runs on", cuda.current[-1].name, order.in_routed_call()))
        return outputs

    return job


def _caller_waits(log: list[tuple]) -> list[tuple]:
    return [entry for entry in log if entry[0] == "caller" and "waits" in entry[1]]


def test_a_routed_call_runs_on_the_internal_stream_after_the_callers_and_the_caller_goes_on(
    cuda: FakeCuda, order: IssueOrder
) -> None:
    source, result = FakeTensor("input", cuda.log), FakeTensor("output", cuda.log)
    work = order.routed(_job(cuda, order, [result]), (result, source))
    assert work == ("StreamWork", [result], "internal")
    assert cuda.log == [
        ("internal", "waits for stream", "caller"),
        ("output", "record_stream", "internal"),
        ("input", "record_stream", "internal"),
        ("enter", "internal"),
        ("job runs on", "internal", True),
        ("exit", "internal"),
    ]
    assert cuda.current == [cuda.caller] and not order.in_routed_call() and order.worker.idle()
    order.routed(_job(cuda, order, [result]), (result,))
    assert cuda.made == 1  # one internal stream per device, kept
    assert _caller_waits(cuda.log) == []  # never at issue: only a Work's wait makes the caller's stream wait


def test_a_delegated_call_follows_the_routed_ones_and_the_next_routed_call_follows_it(
    cuda: FakeCuda, order: IssueOrder
) -> None:
    tensor = FakeTensor("tensor", cuda.log)
    order.routed(_job(cuda, order, [tensor]), (tensor,))
    cuda.log.clear()

    def broadcast(*args: Any) -> str:
        cuda.log.append(("broadcast issued on", cuda.current[-1].name))
        return "broadcast work"

    assert order.inner(broadcast, "broadcast", CUDA0, (), {}) == "broadcast work"
    order.routed(_job(cuda, order, [tensor]), (tensor,))
    assert cuda.log == [
        ("internal", "waits for stream", "caller"),
        ("enter", "internal"),
        ("broadcast issued on", "internal"),  # NCCL's stream waits for the current one: after the routed call
        ("exit", "internal"),
        ("internal", "waits for stream", "caller"),
        ("internal", "waits for", "event after broadcast work on internal"),
        ("tensor", "record_stream", "internal"),
        ("enter", "internal"),
        ("job runs on", "internal", True),
        ("exit", "internal"),
    ]
    assert _caller_waits(cuda.log) == []  # an async delegated call does not hold the caller back either


def test_a_synchronous_nccl_call_without_work_makes_the_callers_stream_follow_it(
    cuda: FakeCuda, order: IssueOrder
) -> None:
    assert order.inner(lambda: None, "broadcast", CUDA0, (), {}) is None
    assert cuda.log[-1] == ("caller", "waits for stream", "internal")


@pytest.mark.parametrize("routes", [True, False], ids=["routing group", "group that routes nothing"])
def test_calls_while_capturing_or_in_a_group_that_routes_nothing_run_on_the_callers_stream(
    cuda: FakeCuda, routes: bool
) -> None:
    cuda.capturing = routes
    order = IssueOrder("test-capture", routes=routes)
    try:
        issued_on = []
        order.inner(lambda: issued_on.append(cuda.current[-1].name) or "work", "broadcast", CUDA0, (), {})
        assert issued_on == ["caller"] and cuda.log == [] and cuda.made == 0
        assert order._after_inner is None  # no event recorded: it would fork a captured stream
    finally:
        order.close()


def test_a_call_made_inside_a_routed_call_goes_to_the_inner_backend_on_the_internal_stream(
    cuda: FakeCuda, order: IssueOrder
) -> None:
    tensor, nested = FakeTensor("tensor", cuda.log), []

    def job() -> list:
        nested.append(order.inner(lambda: cuda.current[-1].name, "allreduce", CUDA0, (), {}))
        return [tensor]

    order.routed(job, (tensor,))
    assert nested == ["internal"]
    assert cuda.log.count(("enter", "internal")) == 1  # already current: not entered again


def test_a_joined_work_waits_on_the_internal_stream_not_the_callers(cuda: FakeCuda, order: IssueOrder) -> None:
    class Work:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait(self) -> bool:
            cuda.log.append((cuda.current[-1].name, "waits for work", self.name))
            return True

    outputs = [FakeTensor("a", cuda.log), FakeTensor("b", cuda.log)]
    assert order.joined([Work("a"), Work("b")], outputs) == ("StreamWork", outputs, "internal")
    assert cuda.log == [
        ("enter", "internal"),
        ("internal", "waits for work", "a"),
        ("internal", "waits for work", "b"),
        ("exit", "internal"),
    ]


def test_flush_makes_the_callers_stream_follow_the_internal_one(cuda: FakeCuda, order: IssueOrder) -> None:
    order.flush()
    assert cuda.log == []  # no routed call yet: no internal stream to wait for
    tensor = FakeTensor("tensor", cuda.log)
    order.routed(_job(cuda, order, [tensor]), (tensor,))
    order.flush()
    assert cuda.log[-1] == ("caller", "waits for stream", "internal")


def test_a_stream_work_orders_the_waiters_stream_and_never_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from taccl_py.runtime.backend import work as work_module

    log: list[tuple] = []
    internal, waiter = FakeStream("internal", log), FakeStream("waiter", log)

    class Event:
        done = False

        def query(self) -> bool:
            return self.done

        def synchronize(self) -> None:
            pytest.fail("StreamWork made the host wait")

    event = Event()
    internal.record_event = lambda: event

    class Future:
        def __init__(self, devices: list) -> None:
            log.append(("future on", tuple(devices)))

        def set_result(self, value: Any) -> None:
            log.append(("future set", value))

    monkeypatch.setattr(work_module.torch.futures, "Future", Future)
    monkeypatch.setattr(torch.cuda, "stream", contextlib.nullcontext)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: waiter)
    work = work_module.StreamWork(["out"], internal)
    assert not work.is_completed() and work.exception() is None
    assert work.wait()
    assert log == [("future on", (CUDA0,)), ("future set", ["out"]), ("waiter", "waits for", event)]
    event.done = True
    assert work.is_completed() and work.is_success()


def test_a_gpu_bucket_is_issued_on_the_hooks_thread_on_its_internal_stream(
    cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taccl_py.runtime.ddp import HookState

    hook_thread = threading.current_thread()

    class Communicator:
        def all_reduce(self, tensor: FakeTensor, op: str) -> None:
            on = threading.current_thread() is hook_thread
            cuda.log.append(("all_reduce", op, cuda.current[-1].name, "caller thread" if on else "other thread"))

    state = object.__new__(HookState)  # no process group here: the fields the hook reads
    state.communicator, state.world_size, state.background = Communicator(), 2, True
    state.buckets_reduced = state.buckets_native = 0
    state.native_group = state._owned_group = None
    state._order = IssueOrder("test-ddp-streams", routes=True)
    returned = {}

    class Work:
        def __init__(self, outputs: Any, stream: FakeStream) -> None:
            returned.update(outputs=outputs, stream=stream.name)

        def get_future(self) -> str:
            return "the work's future"

    monkeypatch.setattr(issue_order, "StreamWork", Work)
    try:
        bucket = FakeTensor("bucket", cuda.log)
        assert state.average_async(bucket) == "the work's future"
    finally:
        state.close()
    assert returned == {"outputs": bucket, "stream": "internal"} and state.buckets_reduced == 1
    assert cuda.log == [
        ("internal", "waits for stream", "caller"),
        ("bucket", "record_stream", "internal"),
        ("enter", "internal"),
        ("bucket", "div_ 2"),
        ("all_reduce", "sum", "internal", "caller thread"),
        ("exit", "internal"),
    ]


# -- on a real GPU -----------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_on_a_gpu_the_callers_stream_runs_on_while_a_routed_call_is_busy() -> None:
    order = IssueOrder("test-gpu-overlap", routes=True)
    out = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()

    def slow_fill() -> list:
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time on the internal stream
        return [out.fill_(7.0)]

    try:
        work = order.routed(slow_fill, (out,))
        marker = torch.cuda.current_stream().record_event()
        marker.synchronize()  # the caller's stream got past the issue point
        assert not work.is_completed()  # while the routed call still runs
        work.wait()
        seen = out.clone()  # on the caller's stream, after the wait
        torch.cuda.synchronize()
        assert work.is_completed() and bool((seen == 7.0).all())
        assert work.get_future().wait()[0] is out
    finally:
        order.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_on_a_gpu_a_dropped_input_is_not_handed_out_while_the_routed_call_reads_it() -> None:
    order = IssueOrder("test-gpu-record-stream", routes=True)
    numel = 1 << 20
    source, out = torch.ones(numel, device="cuda"), torch.zeros(numel, device="cuda")
    address = source.data_ptr()
    torch.cuda.synchronize()

    def slow_copy(source: torch.Tensor = source) -> list:
        torch.cuda._sleep(200_000_000)
        return [out.copy_(source)]

    try:
        work = order.routed(slow_copy, (out, source))
        del source, slow_copy  # the caller drops its input while the internal stream still needs it
        again = torch.empty(numel, device="cuda")  # allocated on the caller's stream
        assert again.data_ptr() != address
        work.wait()
        torch.cuda.synchronize()
        assert bool((out == 1.0).all())
    finally:
        order.close()
