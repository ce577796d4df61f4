"""Register a folder of exported MSCCL++ plans with MSCCL++'s NCCL shim, so that only calls they run right reach them.

What this module relies on, as microsoft/mscclpp @1f5f065d has it:

* Selection. ``AlgorithmCollection::selectAlgorithm`` (src/core/algorithm.cc:98-110) asks the
  user's selector first, then the shim's (``algoSelector``, src/ext/nccl/nccl.cc:222-279): the first
  DSL algorithm for which ``matchExecutionPlan`` holds (src/ext/nccl/algorithm_selector.cc:38-50),
  else MSCCL++'s own kernels (one machine: AllGather and AllReduce), else NCCL through
  ``MSCCLPP_NCCL_LIB_PATH`` (nccl.cc:646-658).
* Placement. ``DslAlgorithm::bufferMode()`` is a function-local static (algorithm.cc:165-170,
  "TODO: need to fix"): every DSL algorithm reports the placement of the first one asked, so the
  shim's rule can run an in-place plan for an out-of-place call. Our plans are registered with
  ``Algorithm.Constraint()`` (world size 0), which ``matchExecutionPlan`` never matches
  (algorithm_selector.cc:39), so only our selector runs them, and it reads the placement from the
  call's pointers as MSCCL does (``call_placement``).
* Reduction ops. No op reaches a plan: ``DslAlgorithm::execute`` drops its ``ReduceOp``
  (algorithm.cc:174-176), the executor never reads ``reduce_op`` (execution_plan.cc:478-599) and
  the request a selector sees carries none (python/csrc/algorithm.cpp:111-124). Every AllReduce and
  ReduceScatter plan therefore sums, and ``register_plans`` refuses them for a job that reduces
  otherwise.
* Sizes. The executor throws for a size its chunk counts do not divide (``checkMessageSize``,
  execution_plan.cc:299-311) and wraps offsets past 2^32 bytes; the selector never picks a plan at
  such a size (``taccl_py.mscclpp.sizes``), so those calls go to the shim's own choice.
* Element types. ``DslAlgorithm::execute`` refuses uint8 and, per platform, some fp8 types
  (algorithm.cc:182-241): the selector serves int32, uint32, float16, float32 and bfloat16 only.
* AlltoAll. The shim's ``ncclAllToAll`` is unavailable (nccl.cc:794-805): AlltoAll plans are not
  registered.

Sizes are bytes in nccl-tests' convention (AllGather: the whole output; ReduceScatter: the whole
input), as the plans' ``min_message_size``/``max_message_size`` are.
"""

from __future__ import annotations

import importlib
import logging
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from taccl_py.deploy.mscclpp_plans import (
    FORCE_NCCL_ENV,
    REDUCE_OPS,
    SHIM_COLLECTIVES,
    SUM_ONLY_COLLECTIVES,
    DeployPlan,
    check_job,
    check_reduce_ops,
    read_plan_folder,
)
from taccl_py.errors import ArgumentError
from taccl_py.mscclpp.sizes import buffer_bytes, executor_accepts

__all__ = [
    "FORCE_NCCL_ENV",
    "PLAN_DTYPES",
    "REDUCE_OPS",
    "SHIM_COLLECTIVES",
    "SUM_ONLY_COLLECTIVES",
    "DeployPlan",
    "MscclppSelector",
    "PlanSelector",
    "Registration",
    "call_placement",
    "check_reduce_ops",
    "read_plan_folder",
    "register_plans",
    "registered_plans",
    "shim_message_size",
]

logger = logging.getLogger(__name__)

#: The element types ``DslAlgorithm::execute`` runs on every platform (algorithm.cc:182-241); uint8 is refused
#: there, and each fp8 type throws on the platforms that lack it, so calls of those types never reach a plan.
PLAN_DTYPES = frozenset({"int32", "uint32", "float16", "float32", "bfloat16"})


def shim_message_size(collective: str, request_size: int, world_size: int) -> int:
    """Return the nccl-tests size (bytes) of a shim request's ``message_size``: AllGather's is one rank's input.

    ncclAllGather passes its send bytes (nccl.cc:752); ncclReduceScatter its receive bytes times the
    ranks (:697); ncclAllReduce its bytes (:640).

    >>> shim_message_size("allgather", 1024, 8), shim_message_size("reducescatter", 8192, 8)
    (8192, 8192)
    """
    return request_size * world_size if collective == "allgather" else request_size


def call_placement(
    collective: str, input_address: int, output_address: int, rank: int, message_size: int, world_size: int
) -> bool | None:
    """Return True for a call in place as MSCCL defines it, False for disjoint buffers, None for any other overlap.

    In place: AllReduce ``output == input``; AllGather ``input == output + rank·input_bytes``;
    ReduceScatter ``output == input + rank·output_bytes`` (msccl-executor-nccl
    msccl_lifecycle.cc:315-327). MSCCL++'s own ``bufferMode`` (algorithm.cc:13-24) never calls a
    ReduceScatter in place, so a plan chosen by it could run on aliased buffers it was not verified for.

    >>> call_placement("reducescatter", 0, 3 * 128, 3, 1024, 8), call_placement("allreduce", 0, 512, 0, 1024, 8)
    (True, None)
    """
    input_bytes, output_bytes = buffer_bytes(collective, world_size, message_size)
    if collective == "allgather":
        inplace = input_address == output_address + rank * input_bytes
    elif collective == "reducescatter":
        inplace = output_address == input_address + rank * output_bytes
    else:
        inplace = input_address == output_address
    if inplace:
        return True
    disjoint = input_address + input_bytes <= output_address or output_address + output_bytes <= input_address
    return False if disjoint else None


class PlanSelector:
    """Pick the plan for a call exactly: same collective, placement and job shape, and a size the plan runs at."""

    __slots__ = ("world_size", "ranks_per_node", "_plans", "_starts")

    def __init__(self, plans: Iterable[DeployPlan], world_size: int, ranks_per_node: int) -> None:
        check_job(world_size, ranks_per_node)
        self.world_size = world_size
        self.ranks_per_node = ranks_per_node
        groups: dict[tuple[str, bool], list[DeployPlan]] = {}
        for entry in plans:
            groups.setdefault((entry.collective, entry.inplace), []).append(entry)
        self._plans = {key: sorted(group, key=lambda e: e.plan.min_message_size) for key, group in groups.items()}
        self._starts = {key: [e.plan.min_message_size for e in group] for key, group in self._plans.items()}

    @property
    def plans(self) -> tuple[DeployPlan, ...]:
        return tuple(entry for group in self._plans.values() for entry in group)

    def select(
        self,
        collective: str,
        message_size: int,
        inplace: bool | None,
        world_size: int | None = None,
        ranks_per_node: int | None = None,
    ) -> DeployPlan | None:
        """Return the plan that serves the call, or None (the call goes to the shim's own choice).

        ``message_size`` in bytes, nccl-tests' convention; ``inplace`` None: buffers that overlap
        otherwise than in place, which no plan serves. ``world_size``/``ranks_per_node`` default to the job's.
        """
        return self.decide(collective, message_size, inplace, world_size, ranks_per_node)[0]

    def decide(
        self,
        collective: str,
        message_size: int,
        inplace: bool | None,
        world_size: int | None = None,
        ranks_per_node: int | None = None,
    ) -> tuple[DeployPlan | None, str]:
        """Return the plan that serves the call (or None) and why, in words."""
        if world_size is not None and world_size != self.world_size:
            return None, f"a communicator of {world_size} ranks"
        if ranks_per_node is not None and ranks_per_node != self.ranks_per_node:
            return None, f"{ranks_per_node} ranks per machine"
        if inplace is None:
            return None, "buffers overlap, not in place"
        key = (collective, inplace)
        if key not in self._plans:
            return None, "no plan for this collective and placement"
        index = bisect_right(self._starts[key], message_size) - 1
        if index < 0 or message_size > self._plans[key][index].plan.max_message_size:
            return None, "no plan's range holds the size"
        entry = self._plans[key][index]
        if message_size > entry.largest_bytes:
            return None, f"{entry.name} would pass 32-bit offsets"
        if not executor_accepts(entry.plan, message_size):
            return None, f"{entry.name}'s chunks do not divide the size"
        return entry, entry.name

    def select_request(self, request: Any) -> DeployPlan | None:
        """Return the plan for an MSCCL++ ``CollectiveRequest`` (python/csrc/algorithm.cpp:111-124), or None."""
        collective = request.collective
        if collective not in SHIM_COLLECTIVES or _dtype_name(request.dtype) not in PLAN_DTYPES:
            return None
        world_size = request.world_size
        size = shim_message_size(collective, request.message_size, world_size)
        inplace = call_placement(
            collective, request.input_buffer, request.output_buffer, request.rank, size, world_size
        )
        return self.select(collective, size, inplace, world_size, request.n_ranks_per_node)


def _dtype_name(dtype: Any) -> str:
    """Return a ``CppDataType``'s name (python/csrc/core_py.cpp:42-53 spells them ``float16``, ``bfloat16``, ...)."""
    return str(getattr(dtype, "name", dtype)).rpartition(".")[2].lower()


class MscclppSelector:
    """The callable MSCCL++ asks on every call: our plan's algorithm, else ``user_selector``'s answer, else None."""

    __slots__ = ("selector", "user_selector")

    def __init__(self, selector: PlanSelector, user_selector: Callable[[Mapping, Any], Any] | None = None) -> None:
        self.selector = selector
        self.user_selector = user_selector

    def __call__(self, algorithms: Mapping[str, Mapping[str, Any]], request: Any) -> Any:
        entry = self.selector.select_request(request)
        if entry is not None:
            # MSCCL++ registers a DSL algorithm under its plan's name (algorithm_collection_builder.cc:42-50)
            algorithm = algorithms.get(entry.collective, {}).get(entry.name)
            if algorithm is not None:
                return algorithm
            logger.warning("plan %s is not among MSCCL++'s algorithms; the call goes to its own choice", entry.name)
        return None if self.user_selector is None else self.user_selector(algorithms, request)


@dataclass(frozen=True)
class Registration:
    """What ``register_plans`` registered: the plans, and the selector installed with MSCCL++."""

    plans: tuple[DeployPlan, ...]
    selector: PlanSelector


def registered_plans(
    plans: Iterable[DeployPlan], reduce_ops: Iterable[str], collectives: Iterable[str] | None = None
) -> tuple[DeployPlan, ...]:
    """Return the plans to register: the shim's collectives (and ``collectives``, if given), sum-only checked."""
    wanted = set(SHIM_COLLECTIVES if collectives is None else collectives)
    unknown = sorted(wanted - set(SHIM_COLLECTIVES))
    if unknown:
        raise ArgumentError(
            None, "collectives", f"{', '.join(unknown)} cannot be registered", "any of " + ", ".join(SHIM_COLLECTIVES)
        )
    chosen = tuple(entry for entry in plans if entry.collective in wanted)
    check_reduce_ops(chosen, reduce_ops)
    return chosen


def register_plans(
    folder: str | Path,
    *,
    rank: int,
    world_size: int,
    ranks_per_node: int,
    reduce_ops: Iterable[str] = ("sum",),
    collectives: Iterable[str] | None = None,
    mscclpp_module: ModuleType | Any | None = None,
    user_selector: Callable[[Mapping, Any], Any] | None = None,
) -> Registration:
    """Register the plans of ``folder`` with MSCCL++'s NCCL shim for this ``rank``; return what was registered.

    Call it in every rank before ``torch.distributed.init_process_group(backend="nccl")``, in a
    process started with ``LD_PRELOAD=<mscclpp>/build/lib/libmscclpp_nccl.so`` (docs/deploy.md).

    Parameters
    ----------
    folder : str or Path
        A folder written by ``taccl export-mscclpp``.
    rank, world_size, ranks_per_node : int
        This process's rank, the job's ranks and ranks per machine (the plans cannot carry them).
    reduce_ops : iterable of str
        Every reduction op the job uses; anything but ``"sum"`` refuses AllReduce and ReduceScatter plans.
    collectives : iterable of str, optional
        Register only these collectives' plans (default: allgather, allreduce, reducescatter).
    mscclpp_module : module, optional
        The ``mscclpp`` package (default: imported here).
    user_selector : callable, optional
        Asked, as MSCCL++ asks a selector, for every call no plan serves.

    Returns
    -------
    Registration

    Raises
    ------
    FormatError
        A file of the folder is no MSCCL++ plan.
    ArgumentError
        The folder does not fit the job (``read_plan_folder``), an op is not a sum while a plan
        reduces, ``rank`` is out of range, or ``mscclpp`` cannot be imported.
    """
    if not 0 <= rank < world_size:
        raise ArgumentError(None, "rank", f"rank {rank}", f"a rank in 0..{world_size - 1}")
    plans = registered_plans(
        read_plan_folder(folder, world_size=world_size, ranks_per_node=ranks_per_node), reduce_ops, collectives
    )
    module = _import_mscclpp() if mscclpp_module is None else mscclpp_module
    builder = module.ext.AlgorithmCollectionBuilder()
    for entry in plans:
        execution_plan = module.ExecutionPlan(str(entry.path), rank)
        # Constraint() is world size 0: the shim's matchExecutionPlan never picks the plan (see the module docstring).
        algorithm = module.Algorithm(
            id=entry.name, execution_plan=execution_plan, tags=None, constraint=module.Algorithm.Constraint()
        )
        builder.add_algorithm_builder(algorithm)
    selector = PlanSelector(plans, world_size, ranks_per_node)
    builder.set_algorithm_selector(MscclppSelector(selector, user_selector))
    logger.info("registered %d MSCCL++ plans of %s for rank %d of %d", len(plans), folder, rank, world_size)
    return Registration(plans, selector)


def _import_mscclpp() -> ModuleType:
    try:
        module = importlib.import_module("mscclpp")
        importlib.import_module("mscclpp.ext")
    except ImportError as error:
        raise ArgumentError(
            None,
            "mscclpp",
            f"MSCCL++'s Python package cannot be imported ({error})",
            "MSCCL++ built with its Python bindings (pip install . in a clone of microsoft/mscclpp)",
        ) from None
    return module
