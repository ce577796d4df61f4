"""CUDA graphs of collective calls: when they are used, the eager-capture-replay cycle, the CPU fallback."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from taccl_py.errors import ArgumentError, TransportError

torch = pytest.importorskip("torch", reason="the runtime needs torch")

from taccl_py.ir.collectives import Collective  # noqa: E402
from taccl_py.runtime.executor import Executor  # noqa: E402
from taccl_py.runtime.executor.graphs import GraphedCalls, graph_support  # noqa: E402

from helpers import LogLines, ring_algorithm  # noqa: E402
from mp_utils import assert_no_mismatches, run_ranks  # noqa: E402


class _FakeGraph:
    """Records replays; capturing runs nothing, as a CUDA graph capture launches no work."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def replay(self) -> None:
        self.log.append("replay")


def _fake_capture(log: list[str], fail: bool = False) -> Any:
    def capture(call: Any) -> _FakeGraph:
        log.append("capture")
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing\nmore C++ context")
        return _FakeGraph(log)

    return capture


def test_a_key_runs_eagerly_then_is_captured_and_replayed() -> None:
    log: list[str] = []
    graphs = GraphedCalls(_fake_capture(log))
    for _ in range(4):
        graphs.run("a", lambda: log.append("eager"))
    assert log == ["eager", "capture", "replay", "replay", "replay"] and len(graphs) == 1


def test_graphs_beyond_the_limit_are_dropped_oldest_first() -> None:
    log: list[str] = []
    graphs = GraphedCalls(_fake_capture(log), limit=2)
    for key in ("a", "a", "b", "b", "c", "c"):
        graphs.run(key, lambda: log.append("eager"))
    assert len(graphs) == 2
    log.clear()
    graphs.run("a", lambda: log.append("eager"))  # "a" was dropped: it starts over
    assert log == ["eager"]


def test_a_failed_capture_is_one_transport_error() -> None:
    graphs = GraphedCalls(_fake_capture([], fail=True))
    graphs.run("a", lambda: None)
    with pytest.raises(TransportError, match="capturing a CUDA graph failed: operation not permitted") as raised:
        graphs.run("a", lambda: None)
    assert "C++ context" not in str(raised.value)


class _Transport:
    name, graph_capturable = "fake", True


def test_graph_support_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "need CUDA tensors" in graph_support("cpu", _Transport())
    unable = type("Gloo", (), {"name": "torch-gloo"})()
    assert graph_support("cuda:0", unable) == "the torch-gloo transport cannot be captured into a CUDA graph"
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 8, 4))
    assert graph_support("cuda:0", _Transport()) == "NCCL 2.8.4 cannot capture point-to-point calls (needs 2.9.6)"
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    assert graph_support("cuda:0", _Transport()) is None


def test_an_executor_refuses_a_graph_of_cpu_tensors() -> None:
    from taccl_py.runtime.transports.local import LocalHub

    executor = Executor(ring_algorithm(Collective.ALLREDUCE, 2, inplace=True), 0, torch.float32, 8)
    with pytest.raises(ArgumentError, match="cuda_graph: tensors on cpu; expected CUDA tensors"):
        tensor = torch.ones(8)
        executor.run(tensor, tensor, LocalHub(2).transport(0), cuda_graph=True)


def cpu_fallback_worker(rank: int, world: int) -> list[str]:
    """Worker: cuda_graphs=True on gloo warns once and still equals torch's all_reduce."""
    from taccl_py.runtime.communicator import Communicator

    handler = LogLines()
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(handler)
    try:
        comm = Communicator(None, [ring_algorithm(Collective.ALLREDUCE, world, inplace=True)], cuda_graphs=True)
    finally:
        logger.removeHandler(handler)
    problems = []
    warnings = handler.messages
    if comm.cuda_graphs or warnings != [
        "CUDA graphs are off: tensors on cpu: CUDA graphs need CUDA tensors; every call runs eagerly"
    ]:
        problems.append(f"graphs {comm.cuda_graphs}, warnings {warnings}")
    for seed in range(3):  # the calls a graph would capture and replay run eagerly, each right
        data = torch.randn(1001, generator=torch.Generator().manual_seed(seed * 10 + rank))
        want = data.clone()
        torch.distributed.all_reduce(want)
        comm.all_reduce(data)
        if not torch.allclose(data, want, rtol=1e-5, atol=1e-5):
            problems.append(f"call {seed} differs from torch's all_reduce")
    return problems


@pytest.mark.multiprocess
def test_cuda_graphs_on_cpu_fall_back_with_one_warning() -> None:
    assert_no_mismatches(run_ranks(cpu_fallback_worker, 2))
