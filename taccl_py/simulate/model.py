"""How a runtime runs an algorithm's program: whole chunks or MSCCL's slices, serialized or pipelined sends.

Two questions decide what a schedule costs beyond its links' α and β:

* **Slices.** MSCCL's kernel does not run the program once over whole chunks. It loops over each
  chunk in slices of ``stepSize × MSCCL_CHUNKSTEPS`` bytes (Simple) or ``stepSize`` (LL, LL128),
  running every step of every threadblock, dependencies and all, once per slice; the last slice is
  shorter. So a chunk of 8 MiB is four passes of the program over 2 MiB, and a long dependency
  chain pays its latency once per pass. Our own executor (``taccl_py.runtime``) runs whole chunks.
* **Sends.** With serialized sends a threadblock's step after a send
  starts when the send's bytes have arrived, so consecutive sends each pay their α. NCCL's and
  MSCCL's connections hold ``NCCL_STEPS`` slots: a sender posts into a free slot and goes on, so
  the α of consecutive sends overlaps, until the slots are full and it waits for the receiver to
  free one. Pipelined sends model that: a send occupies its links for its bytes, the receiver has
  them α later, and the sender may be up to ``send_slots`` sends ahead of its receiver per connection.

The figures, from NCCL as Azure/msccl-executor-nccl carries it (``src/init.cc`` ``DEFAULT_BUFFSIZE``
``1 << 22``, ``DEFAULT_LL_BUFFSIZE`` and ``DEFAULT_LL128_BUFFSIZE``; ``src/include/device.h``
``NCCL_STEPS 8``, ``NCCL_LL_LINES_PER_THREAD 8``, ``NCCL_LL_MAX_NTHREADS 512``,
``NCCL_LL128_ELEMS_PER_THREAD 120``, ``NCCL_LL128_MAX_NTHREADS 640``; ``src/include/msccl/msccl_struct.h``
``MSCCL_CHUNKSTEPS (NCCL_STEPS/2)``; ``src/device/msccl_kernel.cu`` the loop over ``gridOffset`` with
``chunkSize = calcBytePerStep() × (Simple ? MSCCL_CHUNKSTEPS : 1)``)::

    protocol  buffer (bytes)           step = buffer / 8   data per step        slice
    Simple    4 MiB                    512 KiB             512 KiB              × 4 = 2 MiB
    LL        8·512·8·16 = 512 KiB     64 KiB of lines     half: 32 KiB         32 KiB
    LL128     120·640·8·8 = 4800 KiB   600 KiB of lines    15/16: 562.5 KiB     562.5 KiB

A Simple slice spans ``MSCCL_CHUNKSTEPS`` = 4 of a connection's 8 steps, so 2 slices fit in its
FIFO: ``send_slots`` 2 for MSCCL's pipelined model.

Which sends MSCCL pipelines depends on the connection (Azure/msccl-executor-nccl
``src/device/prims_simple.h`` at 3b40a2a): a Simple send step waits in ``waitPeer`` only until the
connection's FIFO has a free slot (``connStepCache + NCCL_STEPS < step + StepPerSlice``), copies
the slice into ``connEltsFifo + (step % NCCL_STEPS) * connStepSize`` and publishes the step in
``postPeer``; it never waits for the bytes to reach the receiver. Between GPUs of one machine
with direct NVLink or PCIe writes that copy is the transfer, so the threadblock pays the bytes
(serialized sends); over a network connection the FIFO is local and NCCL's proxy thread moves
the bytes afterwards, so the threadblock goes on while they travel (pipelined sends). The
``msccl-net`` model says that: serialized inside a machine, pipelined between machines. On Ampere
GPUs joined by NVLink NCCL reads instead of writing (NVIDIA/nccl ``src/transport/p2p.cc``
``p2pGetInfo`` at 5067397c: "if so we enable P2P Read by default"): the bytes then move when the
receiver's step reads them, and the sender's threadblock is free as soon as it has posted, which
no model here follows (DGX-A100 machines are timed as if they wrote).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from taccl_py.errors import ArgumentError
from taccl_py.simulate.protocol import LL, LL128, SIMPLE

__all__ = [
    "NCCL_STEPS",
    "MSCCL_CHUNKSTEPS",
    "MSCCL_SLICE_BYTES",
    "MSCCL_SEND_SLOTS",
    "ExecutionModel",
    "WHOLE_CHUNKS",
    "MSCCL_LOOP",
    "MSCCL_PIPELINED",
    "MSCCL_NETWORK_PIPELINED",
    "DEFAULT_MODEL",
    "EXECUTION_MODELS",
    "execution_model",
    "slice_sizes",
]

NCCL_STEPS = 8  # slots of a connection's FIFO
MSCCL_CHUNKSTEPS = NCCL_STEPS // 2  # FIFO steps one Simple slice spans
_SIMPLE_STEP_BYTES = (1 << 22) // NCCL_STEPS
_LL_STEP_DATA_BYTES = 8 * 512 * NCCL_STEPS * 16 // NCCL_STEPS // 2  # 16-byte lines, half of them data
_LL128_STEP_DATA_BYTES = 120 * 640 * NCCL_STEPS * 8 // NCCL_STEPS * 15 // 16  # 15 data words a 16-word line
#: Bytes of one chunk the MSCCL kernel moves per pass of the program, by protocol.
MSCCL_SLICE_BYTES: Mapping[str, int] = MappingProxyType(
    {SIMPLE: _SIMPLE_STEP_BYTES * MSCCL_CHUNKSTEPS, LL: _LL_STEP_DATA_BYTES, LL128: _LL128_STEP_DATA_BYTES}
)
#: Slices a connection holds in flight with Simple (its FIFO steps over a slice's steps).
MSCCL_SEND_SLOTS = NCCL_STEPS // MSCCL_CHUNKSTEPS


@dataclass(frozen=True)
class ExecutionModel:
    """How a runtime runs a program: ``slices`` (protocol, bytes) pairs (None: whole chunks) and ``send_slots``.

    ``send_slots`` None serializes a threadblock's sends (the next step waits for the bytes to
    arrive); an integer k pipelines them, with up to k sends per connection ahead of the receiver.
    ``between_machines_only``: only sends from one machine to another are pipelined; sends inside
    a machine stay serialized. The fields are plain tuples so that a model pickles into
    synthesis worker processes.
    """

    name: str
    slices: tuple[tuple[str, int], ...] | None
    send_slots: int | None
    description: str
    between_machines_only: bool = False

    def slice_bytes(self, protocol: str) -> int | None:
        """Return the bytes of a chunk one pass moves under ``protocol`` (None: whole chunks)."""
        if self.slices is None:
            return None
        for name, size in self.slices:
            if name == protocol:
                return size
        raise ArgumentError(None, "protocol", f"protocol {protocol!r}", ", ".join(name for name, _ in self.slices))

    @property
    def pipelined(self) -> bool:
        """Return True when every connection's consecutive sends overlap their α."""
        return self.send_slots is not None and not self.between_machines_only

    @property
    def pipelined_between_machines(self) -> bool:
        """Return True when consecutive sends from one machine to another overlap their α."""
        return self.send_slots is not None

    def pipelines(self, between_machines: bool) -> bool:
        """Return True when sends over a route between machines (``between_machines``) or inside one are pipelined."""
        return self.pipelined_between_machines if between_machines else self.pipelined


#: Whole chunks, serialized sends: our own executor (and the model of older BENCHMARKS sections).
WHOLE_CHUNKS = ExecutionModel("chunks", None, None, "whole chunks, serialized sends (taccl_py's executor)")
#: MSCCL's kernel loop over slices, every send serialized (the default until 2026-11-30, and the
#: model of BENCHMARKS sections that name ``msccl``).
MSCCL_LOOP = ExecutionModel("msccl", tuple(MSCCL_SLICE_BYTES.items()), None, "MSCCL's slices, serialized sends")
#: MSCCL's slices with sends pipelined through the connection's slots (NCCL's proxy).
MSCCL_PIPELINED = ExecutionModel(
    "pipelined", tuple(MSCCL_SLICE_BYTES.items()), MSCCL_SEND_SLOTS, "MSCCL's slices, sends pipelined through 2 slots"
)
#: MSCCL's slices as its Simple sends run (module docstring): serialized inside a machine,
#: pipelined through 2 slots between machines.
MSCCL_NETWORK_PIPELINED = ExecutionModel(
    "msccl-net",
    tuple(MSCCL_SLICE_BYTES.items()),
    MSCCL_SEND_SLOTS,
    "MSCCL's slices, sends serialized inside a machine and pipelined through 2 slots between machines",
    between_machines_only=True,
)
#: What synthesis, ``simulate``, band choice and the export's leave-to-NCCL assume unless told:
#: MSCCL's sends as its source runs them. On one machine it times every schedule as ``msccl`` does.
DEFAULT_MODEL = MSCCL_NETWORK_PIPELINED
EXECUTION_MODELS: Mapping[str, ExecutionModel] = MappingProxyType(
    {model.name: model for model in (WHOLE_CHUNKS, MSCCL_LOOP, MSCCL_PIPELINED, MSCCL_NETWORK_PIPELINED)}
)


def execution_model(name: str | ExecutionModel) -> ExecutionModel:
    """Return the model called ``name`` (a key of ``EXECUTION_MODELS``); a model passes through."""
    if isinstance(name, ExecutionModel):
        return name
    try:
        return EXECUTION_MODELS[name]
    except KeyError:
        raise ArgumentError(None, "model", f"unknown execution model {name!r}", ", ".join(EXECUTION_MODELS)) from None


def slice_sizes(chunk_bytes: float, model: ExecutionModel, protocol: str) -> tuple[float, ...]:
    """Return the bytes of one chunk each pass of the program moves (one pass of ``chunk_bytes`` when whole).

    >>> slice_sizes(5 * 2**20, MSCCL_LOOP, SIMPLE)
    (2097152, 2097152, 1048576)
    """
    step = model.slice_bytes(protocol)
    if step is None or chunk_bytes <= 0:
        return (chunk_bytes,)
    passes = max(1, math.ceil(chunk_bytes / step))
    return (step,) * (passes - 1) + (chunk_bytes - step * (passes - 1),)
