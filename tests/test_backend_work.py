"""The ``taccl`` backend's pieces in one process: its Work, its message transport over an inner backend, its methods.

Recording stand-ins for a c10d Backend and Work show what the pieces call; the multi-process
scenarios of the group are in ``test_backend.py``.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the taccl backend needs torch")
dist = pytest.importorskip("torch.distributed", reason="the taccl backend needs torch.distributed")


class RecordingWork:
    """Stands in for a c10d Work: records the arguments of each ``wait``."""

    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls

    def wait(self, *args: Any) -> bool:
        self.calls.append(("wait", *args))
        return True


class RecordingBackend:
    """Stands in for a ProcessGroupNCCL backend object: records the calls a BackendTransport makes."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 2

    def name(self) -> str:
        return "NCCL"

    def _start_coalescing(self) -> None:  # the binding of a Backend takes no device (torch 2.11, 2.13)
        self.calls.append(("start",))

    def _end_coalescing(self) -> RecordingWork:
        self.calls.append(("end",))
        return RecordingWork(self.calls)

    def send(self, tensors: list, peer: int, tag: int) -> None:
        self.calls.append(("send", peer, tag))

    def recv(self, tensors: list, peer: int, tag: int) -> None:
        self.calls.append(("recv", peer, tag))

    def allreduce(self, tensors: list) -> RecordingWork:
        self.calls.append(("allreduce", tensors[0].numel()))
        return RecordingWork(self.calls)


def test_a_link_warms_up_with_one_collective_on_every_rank() -> None:
    from taccl_py.runtime.backend.work import BackendTransport

    backend = RecordingBackend()
    BackendTransport(backend, torch.device("cpu")).warm_up()
    assert backend.calls == [("allreduce", 1), ("wait",)]


def test_an_nccl_round_goes_out_as_one_coalesced_group() -> None:
    from taccl_py.runtime.backend.work import BackendTransport
    from taccl_py.runtime.transports.interface import Message

    backend = RecordingBackend()
    link = BackendTransport(backend, torch.device("cuda", 0))  # only the device type matters here
    sends, recvs = link.post(
        [Message(1, 7, torch.ones(2))], [Message(1, 7, torch.ones(2)), Message(1, 8, torch.ones(1))]
    )
    assert backend.calls == [("start",), ("send", 1, 7), ("recv", 1, 7), ("recv", 1, 8), ("end",)]
    assert len(sends) == 1 and len(recvs) == 2 and len({id(p) for p in [*sends, *recvs]}) == 1
    assert not link.independent_messages
    backend.calls.clear()
    assert link.post([], []) == ([], []) and backend.calls == []
    recvs[0].wait(30.0)  # NCCL: the stream waits, the host does not (no timeout reaches Work.wait)
    assert backend.calls == [("wait",)]


def test_a_gloo_message_is_waited_on_the_host_with_the_timeout() -> None:
    from taccl_py.runtime.transports.torch_dist import WorkPending

    calls: list[tuple] = []
    WorkPending(RecordingWork(calls)).wait(2.5)
    assert calls == [("wait", datetime.timedelta(seconds=2.5))]


def test_a_routed_work_honours_its_wait_timeout_and_its_error() -> None:
    import time

    from taccl_py.errors import TransportError
    from taccl_py.runtime.backend.work import FutureWork

    pending = torch.futures.Future()
    work = FutureWork(pending)
    start = time.perf_counter()
    with pytest.raises(TransportError, match=r"did not finish within 0.2 s"):
        work.wait(datetime.timedelta(seconds=0.2))
    assert 0.15 < time.perf_counter() - start < 5 and not work.is_completed()
    pending.set_result([torch.ones(1)])
    assert work.wait(datetime.timedelta(seconds=0.2)) and work.wait(datetime.timedelta(0)) and work.wait()
    failed = torch.futures.Future()
    failed.set_exception(TransportError("rank 1 went silent"))
    with pytest.raises(TransportError, match="rank 1 went silent"):
        FutureWork(failed).wait(datetime.timedelta(seconds=1))


def test_every_collective_of_a_process_group_is_a_python_method() -> None:
    # torch runs an inherited collective of a Python process group with the GIL held; gloo can
    # then deadlock the process (see the module notes of taccl_py.runtime.backend).
    from taccl_py.runtime.backend import TacclProcessGroup

    collectives = [
        name
        for name in dir(dist.ProcessGroup)
        if not name.startswith("__")
        and name != "_end_coalescing"  # coalescing manager, not a collective
        and "-> c10d::Work" in (getattr(dist.ProcessGroup, name).__doc__ or "")
    ]
    assert {"allreduce", "_allgather_base", "broadcast"} <= set(collectives)  # the names every torch has
    # Defined on TacclProcessGroup or a taccl_py base of it (its entry points live in runtime/backend/collectives.py).
    owners = {name: next(cls for cls in TacclProcessGroup.__mro__ if name in vars(cls)) for name in collectives}
    inherited = [name for name, owner in owners.items() if not owner.__module__.startswith("taccl_py.")]
    assert inherited == [], f"collectives TacclProcessGroup inherits from torch: {inherited}"


# torch.distributed names that only a CUDA build of torch has (used on the NCCL paths alone).
CUDA_BUILD_ONLY = {"ProcessGroupNCCL"}


def test_every_torch_distributed_name_the_runtime_uses_exists() -> None:
    # the backend builds default options only on some paths (an NCCL coalescing manager passes none):
    # dist.AllgatherOptions, which torch.distributed does not export, broke them on a GPU only
    import ast
    from pathlib import Path

    import taccl_py.runtime

    missing = []
    for path in sorted(Path(taccl_py.runtime.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            is_dist = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "dist"
            if is_dist and not hasattr(dist, node.attr) and node.attr not in CUDA_BUILD_ONLY:
                missing.append(f"{path.name}:{node.lineno} dist.{node.attr}")
    assert not missing
