"""The runtime: run Algorithms on tensors over torch.distributed, CuPy NCCL or in-process threads.

:class:`Executor` replays one rank's part of an algorithm over a :class:`Transport`;
:class:`Communicator` chooses algorithms from a library and offers all_gather, reduce_scatter,
all_reduce and all_to_all on a torch.distributed process group. Importing this package imports torch.
"""

from __future__ import annotations

from taccl_py.runtime.communicator import Communicator
from taccl_py.runtime.executor import REDUCE_OPS, SUPPORTED_DTYPES, Executor
from taccl_py.runtime.executor.rank_plan import RankPlan, compile_rank_plan
from taccl_py.runtime.transports import CupyNcclTransport, LocalHub, LocalTransport, TorchDistTransport
from taccl_py.runtime.transports.interface import DEFAULT_TIMEOUT_S, Message, Pending, Transport

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "REDUCE_OPS",
    "SUPPORTED_DTYPES",
    "Communicator",
    "CupyNcclTransport",
    "Executor",
    "LocalHub",
    "LocalTransport",
    "Message",
    "Pending",
    "RankPlan",
    "TorchDistTransport",
    "Transport",
    "compile_rank_plan",
]
