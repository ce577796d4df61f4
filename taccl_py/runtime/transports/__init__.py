"""Transports the executor runs over: torch.distributed (gloo, NCCL), CuPy NCCL, in-process threads.

``interface`` is what every transport offers the executor (``Transport``, ``Pending``, ``Message``);
``watchdog`` gives the CuPy transport its deadlines. Each module imports its GPU library only when
a transport of that kind is built.
"""

from __future__ import annotations

from taccl_py.runtime.transports.cupy_nccl import CupyNcclTransport
from taccl_py.runtime.transports.local import LocalHub, LocalTransport
from taccl_py.runtime.transports.torch_dist import TorchDistTransport

__all__ = ["CupyNcclTransport", "LocalHub", "LocalTransport", "TorchDistTransport"]
