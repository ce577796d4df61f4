"""CUDA graphs of whole collective calls: run once, capture on the next call, replay after that.

For a given pair of tensors an executor's run is a fixed sequence of copies, reductions and NCCL
point-to-point calls (the plan has no branch on data), and NCCL calls can be captured into a
CUDA graph (NCCL 2.9.6 and later, through torch's ProcessGroupNCCL). A :class:`GraphedCalls`
holds one graph per call key: the first call runs eagerly, which also sets up anything lazily
made (NCCL communicators, the binding's views); the second captures the call on a side stream
and replays it; later calls only replay, with no Python per round.

Whether graphs can be used at all is decided up front (:func:`graph_support`): a capture that
failed half-way would leave NCCL's per-peer sequence out of step with the other ranks, so it is
an error, not a fallback. Where graphs cannot be used, calls run eagerly and the reason is
logged once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

from taccl_py.errors import TransportError

__all__ = ["GraphedCalls", "MAX_GRAPHS", "MIN_NCCL_FOR_CAPTURE", "capture_cuda_graph", "graph_support"]

logger = logging.getLogger(__name__)

#: Graphs kept per holder (an executor's binding of one pair of tensors, which dies with them);
#: each holds its share of the graph memory pool.
MAX_GRAPHS = 8
#: The first NCCL release whose point-to-point calls can be captured.
MIN_NCCL_FOR_CAPTURE = (2, 9, 6)


def graph_support(device: Any, transport: Any) -> str | None:
    """Return why calls on ``device`` over ``transport`` cannot be captured, or None when they can."""
    if torch.device(device).type != "cuda":
        return f"tensors on {torch.device(device)}: CUDA graphs need CUDA tensors"
    if not getattr(transport, "graph_capturable", False):
        return f"the {transport.name} transport cannot be captured into a CUDA graph"
    version = tuple(torch.cuda.nccl.version())
    if version < MIN_NCCL_FOR_CAPTURE:
        found, want = ".".join(map(str, version)), ".".join(map(str, MIN_NCCL_FOR_CAPTURE))
        return f"NCCL {found} cannot capture point-to-point calls (needs {want})"
    return None


def capture_cuda_graph(call: Callable[[], None]) -> Any:
    """Return a ``torch.cuda.CUDAGraph`` of ``call``, captured on a side stream ordered after the current one."""
    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream(device=current.device)
    side.wait_stream(current)
    # thread_local: NCCL's watchdog thread keeps querying its events while this thread captures
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        call()
    current.wait_stream(side)
    return graph


class GraphedCalls:
    """Run calls through CUDA graphs, one per key, captured on the second call of that key.

    ``capture`` turns a call into an object with ``replay()`` (default :func:`capture_cuda_graph`);
    ``limit`` bounds the graphs kept (least recently used dropped first). A call's key must name
    everything the captured work depends on: the tensors' addresses, the op, the executor.
    """

    __slots__ = ("_capture", "_limit", "_seen", "_graphs")

    def __init__(self, capture: Callable[[Callable[[], None]], Any] = capture_cuda_graph, limit: int = MAX_GRAPHS):
        self._capture = capture
        self._limit = limit
        self._seen: OrderedDict[Hashable, None] = OrderedDict()  # keys run eagerly once, not captured yet
        self._graphs: OrderedDict[Hashable, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, call: Callable[[], None]) -> None:
        """Run ``call`` for ``key``: eagerly the first time, captured and replayed the second, replayed after.

        Raises TransportError, naming the cause, when a capture fails.
        """
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            graph.replay()
            return
        if key not in self._seen:
            self._seen[key] = None
            _drop_oldest(self._seen, self._limit)
            call()
            return
        del self._seen[key]
        try:
            graph = self._capture(call)
        except RuntimeError as error:
            raise TransportError(f"capturing a CUDA graph failed: {str(error).splitlines()[0]}") from error
        self._graphs[key] = graph
        _drop_oldest(self._graphs, self._limit)
        logger.debug("captured a CUDA graph for %s (%d held)", key, len(self._graphs))
        graph.replay()


def _drop_oldest(found: OrderedDict, limit: int) -> None:
    while len(found) > limit:
        found.popitem(last=False)
