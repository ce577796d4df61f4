"""CuPy NCCL transport: the watchdog never aborts inside a post's groupStart…groupEnd (on CPU, with a fake CuPy)."""

from __future__ import annotations

import logging
import sys
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

from taccl_py.errors import TransportError
from taccl_py.runtime.transports import cupy_nccl
from taccl_py.runtime.transports.cupy_nccl import CupyNcclTransport
from taccl_py.runtime.transports.interface import Message


class FakeNccl:
    """Stands in for ``cupy.cuda.nccl``: counts how deep the calling code is inside groupStart…groupEnd."""

    NCCL_FLOAT32 = 7

    class NcclError(Exception):
        pass

    def __init__(self) -> None:
        self.inside = 0
        self.comm: FakeComm | None = None

    def get_unique_id(self) -> bytes:
        return bytes(128)

    def NcclCommunicator(self, world_size: int, uid: object, rank: int) -> FakeComm:  # noqa: N802 - CuPy's name
        self.comm = FakeComm(self)
        return self.comm

    def groupStart(self) -> None:  # noqa: N802 - CuPy's name
        self.inside += 1

    def groupEnd(self) -> None:  # noqa: N802 - CuPy's name
        self.inside -= 1


class FakeComm:
    """A communicator whose ``send`` can be held inside the group; ``abort`` records where it found the poster."""

    def __init__(self, nccl: FakeNccl) -> None:
        self.nccl = nccl
        self.hold = threading.Event()  # set: the next send waits for ``release``
        self.entered = threading.Event()
        self.release = threading.Event()
        self.aborted_inside: list[int] = []

    def send(self, ptr: int, count: int, dtype: int, peer: int, stream: int) -> None:
        if self.hold.is_set():
            self.entered.set()
            self.release.wait(30)

    def recv(self, ptr: int, count: int, dtype: int, peer: int, stream: int) -> None:
        pass

    def abort(self) -> None:
        self.aborted_inside.append(self.nccl.inside)

    def destroy(self) -> None:
        pass


class FakeEvent:
    """A CUDA event that never completes: every watched round misses its deadline."""

    done = False

    def __init__(self, disable_timing: bool = False) -> None:
        pass

    def record(self, stream: object) -> None:
        pass


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def add(self, key: str, amount: int) -> int:
        return 1

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key]


@pytest.fixture
def fake_transport(monkeypatch: pytest.MonkeyPatch):
    """Return a CupyNcclTransport (rank 0 of 2) built on a fake CuPy, CUDA and torch.distributed."""
    nccl = FakeNccl()
    cuda = types.SimpleNamespace(
        nccl=nccl, Event=FakeEvent, ExternalStream=lambda ptr: ptr, Device=lambda index: _NoContext()
    )
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: [0, 1])
    transport = CupyNcclTransport(store=FakeStore())
    yield transport, nccl.comm
    nccl.comm.release.set()
    transport.close()


class _NoContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


def _one_send() -> list[Message]:
    return [Message(1, 0, torch.ones(4))]


def _wait_until(condition, limit_s: float = 10.0) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and not condition():
        time.sleep(0.01)
    return condition()


def _post_in_thread(transport: CupyNcclTransport) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def post() -> None:
        try:
            transport.post(_one_send(), [])
        except BaseException as error:  # reported to the test
            errors.append(error)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread, errors


def test_the_watchdog_aborts_only_after_the_post_in_flight_left_its_group(fake_transport) -> None:
    transport, comm = fake_transport
    sends, _ = transport.post(_one_send(), [])  # round 1: its event never completes
    comm.hold.set()
    poster, errors = _post_in_thread(transport)  # round 2: held inside groupStart…groupEnd
    assert comm.entered.wait(10)
    sends[0].wait(0.05)  # round 1's deadline passes while round 2 is inside its group
    time.sleep(0.3)  # time for the watchdog to expire; before the lock it aborted here, inside the group
    assert comm.aborted_inside == []
    comm.release.set()
    poster.join(10)
    assert _wait_until(lambda: comm.aborted_inside == [0])
    assert errors == []  # the post in flight finished; the next one raises
    with pytest.raises(TransportError, match="NCCL round 1 .* not complete after 0.05 s"):
        transport.post(_one_send(), [])


def test_an_abort_waits_only_so_long_for_a_post_stuck_in_its_group(
    fake_transport, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    transport, comm = fake_transport
    monkeypatch.setattr(cupy_nccl, "ABORT_LOCK_WAIT_S", 0.2)
    sends, _ = transport.post(_one_send(), [])
    comm.hold.set()
    poster, _ = _post_in_thread(transport)  # stuck in its group until the test releases it
    assert comm.entered.wait(10)
    with caplog.at_level(logging.ERROR, logger=cupy_nccl.__name__):
        sends[0].wait(0.05)
        assert _wait_until(lambda: comm.aborted_inside == [1])  # aborted under the stuck post, not never
    assert any("inside NCCL's groupStart/groupEnd for 0.2 s" in r.getMessage() for r in caplog.records)
    comm.release.set()
    poster.join(10)
