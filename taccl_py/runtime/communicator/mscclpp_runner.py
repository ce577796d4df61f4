"""The ``mscclpp`` transport: a whole call as one MSCCL++ executor kernel where a verified plan serves it.

``Communicator(transport="mscclpp")`` runs each call its library gives an algorithm through
MSCCL++'s Python bindings: the algorithm (the call's in-place form where it aliases) is exported
once as a verified plan (:func:`taccl_py.mscclpp.files.mscclpp_plan_text`, the band's size range),
written into a cache folder, loaded with ``mscclpp.ExecutionPlan(path, rank)`` and run with one
``Executor.execute`` on the current CUDA stream. A call no plan can serve runs as over the
``torch`` transport (one NCCL group per round), with one log line per collective and reason:

* ops other than sum and avg (MSCCL++'s parser never reads ``reduce_op`` and its kernels sum,
  microsoft/mscclpp @1f5f065d execution_kernel.hpp:753-764; avg here is the sum then a divide,
  as :func:`~taccl_py.runtime.executor.native.divide_for_avg` does for torch's own collectives);
* dtypes outside ``MSCCLPP_DATA_TYPES`` (float64, int64: no ``DataType`` for them, core_py.cpp:42-53);
* sizes the plan refuses (``taccl_py.mscclpp.sizes.executor_accepts``: chunks, 16 B alignment,
  range), where MSCCL++ would throw (execution_plan.cc:299-311);
* aliased tensors under an out-of-place plan, an algorithm without a plan within MSCCL++'s limits,
  and a group over several machines whose band names no topology to say which ranks share one.

MSCCL++'s communicator is bootstrapped from the torch group (rank 0's ``TcpBootstrap`` id is
broadcast on it, as ``mscclpp.CommGroup(torch_group=...)`` does, python/mscclpp/_core/comm.py,
but through ``broadcast_object_list`` so that an NCCL-only group works too).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from taccl_py._io import write_text_atomic
from taccl_py.errors import ArgumentError, TacclError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.mscclpp.files import mscclpp_plan_text
from taccl_py.mscclpp.parse import parse_mscclpp_plan
from taccl_py.mscclpp.plan import ExecutionPlan
from taccl_py.mscclpp.sizes import executor_accepts
from taccl_py.runtime.communicator.calibration_cache import cache_dir
from taccl_py.runtime.communicator.selection import Candidate, collective_size_bytes
from taccl_py.runtime.executor.inplace_calls import is_inplace_call
from taccl_py.runtime.executor.native import divide_for_avg
from taccl_py.runtime.transports.torch_dist import TorchDistTransport
from taccl_py.topology.builtins import load_topology
from taccl_py.topology.model import Topology

__all__ = [
    "MSCCLPP_DATA_TYPES",
    "PLAN_FOLDER",
    "SERVED_OPS",
    "LoadedPlan",
    "MscclppTransport",
    "PlanRunner",
    "call_refusal",
    "current_stream_handle",
    "require_mscclpp",
]

logger = logging.getLogger(__name__)

_SOURCE = "Communicator"
#: torch dtype -> the name of its ``mscclpp.DataType`` member (python/csrc/core_py.cpp:42-53);
#: the ones the Communicator takes and MSCCL++'s kernels reduce (src/core/algorithm.cc:182-241).
MSCCLPP_DATA_TYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
}
#: Ops a plan serves: MSCCL++ always sums; avg divides the sum afterwards.
SERVED_OPS = frozenset({"sum", "avg"})
#: Folder under the taccl cache (TACCL_CACHE_DIR, see calibration_cache.cache_dir) holding exported plans.
PLAN_FOLDER = "mscclpp-plans"


def require_mscclpp(cuda_available: bool | None = None) -> ModuleType:
    """Return the imported ``mscclpp`` module; raise ArgumentError naming what is missing (bindings or CUDA)."""
    try:
        import mscclpp
    except ImportError as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ArgumentError(
            _SOURCE,
            "transport",
            f"'mscclpp': MSCCL++'s Python bindings are not importable ({first_line})",
            "mscclpp installed",
        ) from None
    if not (torch.cuda.is_available() if cuda_available is None else cuda_available):
        raise ArgumentError(_SOURCE, "transport", "'mscclpp': CUDA is not available", "a CUDA device for every rank")
    return mscclpp


def current_stream_handle(device: Any) -> int:
    """Return the raw handle of the current CUDA stream on ``device`` (what ``Executor.execute`` takes)."""
    return int(torch.cuda.current_stream(device).cuda_stream)


def call_refusal(op: str, dtype: Any, aliased_out_of_place: bool) -> str | None:
    """Return why a plan cannot serve a call with ``op`` and ``dtype`` (None: it can, size aside).

    >>> call_refusal("max", torch.float32, False)
    "op 'max' (MSCCL++ plans only sum)"
    >>> call_refusal("sum", torch.int64, False)
    'dtype torch.int64 (MSCCL++ takes float32, float16, bfloat16, int32 here)'
    """
    if op not in SERVED_OPS:
        return f"op {op!r} (MSCCL++ plans only sum)"
    if dtype not in MSCCLPP_DATA_TYPES:
        return f"dtype {dtype} (MSCCL++ takes {', '.join(MSCCLPP_DATA_TYPES.values())} here)"
    if aliased_out_of_place:
        return "aliased tensors with no in-place plan"
    return None


@dataclass(frozen=True)
class LoadedPlan:
    """A verified plan of ``algorithm``: our parse (for the size rule), MSCCL++'s loaded plan and its file."""

    algorithm: Algorithm
    plan: ExecutionPlan
    handle: Any
    path: Path


class PlanRunner:
    """Run a Communicator's calls as MSCCL++ plans where they can be served; say once why not elsewhere.

    ``module``: the ``mscclpp`` module (or one with its call shapes); ``communicator``: its
    ``Communicator`` for this group; ``ranks_per_node``: the bootstrap's count (a group on one
    machine needs no topology); ``plan_dir``: where plans are written (a file per plan text);
    ``stream_handle``: device -> the raw stream to launch on.
    """

    __slots__ = (
        "module",
        "executor",
        "rank",
        "world_size",
        "ranks_per_node",
        "plan_dir",
        "stream_handle",
        "_plans",
        "_logged",
    )

    def __init__(
        self,
        module: Any,
        communicator: Any,
        rank: int,
        world_size: int,
        ranks_per_node: int,
        plan_dir: str | os.PathLike,
        stream_handle: Callable[[Any], int] = current_stream_handle,
    ) -> None:
        self.module = module
        self.executor = module.Executor(communicator)
        self.rank = rank
        self.world_size = world_size
        self.ranks_per_node = ranks_per_node
        self.plan_dir = Path(plan_dir)
        self.stream_handle = stream_handle
        self._plans: dict[tuple, tuple[Algorithm, LoadedPlan | str]] = {}
        self._logged: set[tuple] = set()

    def run(
        self,
        collective: Collective,
        output: Any,
        input: Any,
        op: str,
        algorithm: Algorithm,
        candidate: Candidate | None,
    ) -> bool:
        """Run the call as ``algorithm``'s plan and return True, or return False (logged once) where none serves it."""
        input_bytes, output_bytes = input.numel() * input.element_size(), output.numel() * output.element_size()
        size_bytes = collective_size_bytes(collective, input_bytes, output_bytes)
        aliased = output.untyped_storage().data_ptr() == input.untyped_storage().data_ptr()
        inplace = is_inplace_call(collective, output, input, self.rank)
        reason = call_refusal(op, input.dtype, aliased and not algorithm.inplace)
        if reason is None and algorithm.inplace and not inplace:
            reason = "an in-place plan for a call whose tensors do not alias"
        if reason is None:
            loaded = self._plan_for(algorithm, candidate)
            reason = loaded if isinstance(loaded, str) else None
            if reason is None and not executor_accepts(loaded.plan, size_bytes):
                reason = f"{size_bytes} bytes, a size the plan refuses (chunks at {loaded.plan.buffer_alignment} B)"
        if reason is not None:
            self._log_refusal(collective, algorithm, reason)
            return False
        self.executor.execute(
            rank=self.rank,
            send_buff=input.data_ptr(),
            recv_buff=output.data_ptr(),
            send_buff_size=input_bytes,
            recv_buff_size=output_bytes,
            data_type=getattr(self.module.DataType, MSCCLPP_DATA_TYPES[input.dtype]),
            plan=loaded.handle,
            stream=self.stream_handle(output.device),
            packet_type=self.module.PacketType.LL16,  # our LL plans carry LL16 packets (mscclpp.lower.packets)
        )
        if op == "avg":
            divide_for_avg(output, self.world_size)
        return True

    def _plan_for(self, algorithm: Algorithm, candidate: Candidate | None) -> LoadedPlan | str:
        """Return ``algorithm``'s loaded plan over the candidate's size range, or why it has none (cached)."""
        low, high = (
            (algorithm.min_bytes, algorithm.max_bytes)
            if candidate is None
            else (candidate.min_bytes, candidate.max_bytes)
        )
        key = (id(algorithm), low, high)
        cached = self._plans.get(key)
        if cached is not None:
            return cached[1]
        try:
            topology = self._topology(candidate)
            # MSCCL++ checks the size against the plan's range, so the plan takes the band's
            text = mscclpp_plan_text(replace(algorithm, min_bytes=low, max_bytes=high), topology)
            loaded: LoadedPlan | str = self._load(algorithm, text)
        except (TacclError, OSError) as error:  # deterministic on every rank: all fall back alike
            loaded = f"no MSCCL++ plan: {error}"
        self._plans[key] = (algorithm, loaded)  # holding the algorithm keeps its id from being reused
        return loaded

    def _topology(self, candidate: Candidate | None) -> Topology | None:
        """Return the machine layout the plan needs: the band's built-in topology, or None on one machine."""
        one_machine = self.ranks_per_node >= self.world_size
        made_for = None if candidate is None else candidate.made_for
        if made_for is not None and made_for.topology is not None and made_for.nodes is not None:
            try:
                topology = load_topology(made_for.topology, made_for.nodes)
            except TacclError:
                if not one_machine:
                    raise
            else:
                if topology.gpus_per_node != self.ranks_per_node:  # its channels would join the wrong ranks
                    raise ArgumentError(
                        _SOURCE,
                        "transport",
                        f"a band made for {made_for.describe()}, {topology.gpus_per_node} GPUs per machine",
                        f"{self.ranks_per_node} as this group has",
                    )
                return topology
        if one_machine:  # every rank shares one machine: memory channels throughout, as topology None exports
            return None
        raise ArgumentError(
            _SOURCE,
            "transport",
            f"the group spans machines ({self.ranks_per_node} ranks per node) and the band names no topology",
            "a library made for a built-in topology",
        )

    def _load(self, algorithm: Algorithm, text: str) -> LoadedPlan:
        """Write ``text`` into the plan folder (once per text) and load it for this rank."""
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", algorithm.name)[:64]
        path = self.plan_dir / f"{stem}-{digest}.json"
        if not path.is_file():  # ranks of one machine may race here: each writes the same bytes, renamed whole
            self.plan_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, text)
        plan = parse_mscclpp_plan(text, str(path))
        return LoadedPlan(algorithm, plan, self.module.ExecutionPlan(str(path), self.rank), path)

    def _log_refusal(self, collective: Collective, algorithm: Algorithm, reason: str) -> None:
        # one line per kind of reason, not per size: a refused size recurs with every bucket
        key = (collective, algorithm.name, "size" if "bytes" in reason else reason)
        if key in self._logged:
            return
        self._logged.add(key)
        logger.info(
            "%s with %s: %s; running it over torch rounds instead (logged once)",
            collective.value,
            algorithm.name,
            reason,
        )


class MscclppTransport(TorchDistTransport):
    """torch.distributed NCCL rounds for what no plan serves, and a :class:`PlanRunner` for the rest.

    ``module``: the ``mscclpp`` module (None: imported, with CUDA required; see :func:`require_mscclpp`);
    ``plan_dir``: where plans are written (None: ``PLAN_FOLDER`` in the taccl cache folder).

    Raises
    ------
    ArgumentError
        MSCCL++'s bindings or CUDA are missing, or the group's CUDA backend is not NCCL.
    """

    def __init__(
        self, group: Any = None, module: Any = None, plan_dir: str | os.PathLike | None = None, device: Any = None
    ) -> None:
        module = require_mscclpp() if module is None else module
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        super().__init__(group, device)
        if self.backend != "nccl" and torch.device(device).type == "cuda":
            raise ArgumentError(_SOURCE, "transport", f"'mscclpp' on a {self.backend} group", "an NCCL group")
        self.name = "mscclpp"
        bootstrap = module.TcpBootstrap.create(self.rank, self.world_size)
        unique_id = [module.TcpBootstrap.create_unique_id() if self.rank == 0 else None]
        if self.world_size > 1:
            dist.broadcast_object_list(unique_id, src=self._global[0], group=group)
        bootstrap.initialize(unique_id[0])
        folder = Path(plan_dir) if plan_dir is not None else cache_dir(os.environ) / PLAN_FOLDER
        self.plan_runner = PlanRunner(
            module,
            module.Communicator(bootstrap),
            self.rank,
            self.world_size,
            bootstrap.get_n_ranks_per_node(),
            folder,
        )
