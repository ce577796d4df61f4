"""The ``taccl`` torch.distributed backend: collectives by taccl_py algorithms, the rest by gloo/NCCL.

After :func:`register_backend`, ``dist.init_process_group("taccl")`` (and ``new_group`` under it)
makes a :class:`TacclProcessGroup`. It routes ``all_reduce``, ``all_gather`` /
``all_gather_single``, ``reduce_scatter`` / ``reduce_scatter_single`` and ``all_to_all`` /
``all_to_all_single`` (called without split sizes) through a :class:`~taccl_py.runtime.communicator.Communicator`
whenever a library serving the group's members holds an algorithm for the call's collective and size, and hands
every other call (broadcast, barrier, send/recv, all_to_all_single with split sizes (logged
once), the reductions the Communicator lacks, calls with no fitting algorithm) to an
inner gloo backend (CPU tensors) or NCCL backend (CUDA tensors). DDP and FSDP2 use it unchanged::

    from taccl_py.runtime.backend import register_backend
    register_backend(library="ndv2")
    dist.init_process_group("taccl")

Subgroups: torch hands the creator each group's global ranks, and a ``new_group(ranks)`` group
runs, per collective, the libraries made for exactly those ranks (``taccl synthesize --parallel``
writes one folder per placement class; ``register_backend(library=FOLDER)`` reads them all), else
those made for a group placed alike on the same machines, else group-less libraries only where the
group is the job's first n ranks (see :mod:`taccl_py.runtime.communicator.group_match`); rank 0 of
each group logs which. ``new_group`` returns the :class:`TacclProcessGroup` itself (torch keeps a
backend that is a ProcessGroup as the group), so a script counts its calls with ``group.routed`` and
``group.delegated`` and reads ``group.library_matches``; ``group._get_backend(device)`` is the inner
gloo/NCCL backend. Each group calibrates its own Communicator.

Every collective entry point torch has is a Python method of the group, delegated ones included
(see :mod:`taccl_py.runtime.backend.collectives`): torch's C++ side of a Python process group runs
a method the subclass lacks with the GIL held, and gloo's worker thread frees finished work (and
the Python tensors it holds) under its queue lock, so an inherited method can deadlock the process
against gloo (seen with DTensor's ``full_tensor``). The inner backend's Python bindings release the GIL.

Threads and ordering: the group runs its calls in the order they were issued, routed and
delegated alike, as ProcessGroupNCCL does (see :mod:`taccl_py.runtime.backend.issue_order`). On a GPU a
routed collective is issued by the calling thread on the group's internal stream (one per device,
as ProcessGroupNCCL has), which first waits for the caller's current stream; its tensors are
marked used on that stream (``record_stream``), and its Work's ``wait`` makes the waiter's stream
wait, not the host, so compute issued after an async collective overlaps it. Delegated NCCL calls
are issued with the internal stream current, so they run after the routed calls issued before
them. On CPU a routed collective is queued on the group's worker thread, so DDP's bucket
all-reduces overlap backward, and delegated collectives queue behind it. A call made while
the thread captures a CUDA graph runs on the inner NCCL backend, whose calls can be captured. A
routed call's messages travel on a second backend of the same kind (its own store prefix and
connections), so they never pair up with the inner backend's collectives or with user
send/recv. ``barrier`` waits for the calls issued before it (NCCL's barrier on a group with
GPUs). As with gloo and NCCL, wait on a Work before touching its tensors. The group and its
executors never keep a caller's tensors alive once the caller dropped them.

Calibration: by default the first routed call of each collective times ours against the inner
backend's own on the live group, or reads that from the user's cache (see
:mod:`taccl_py.runtime.communicator.calibration_cache`); ``register_backend(calibration=False)`` turns that off.
``group.calibrate(path)`` (every rank, once the group exists) measures every routed collective on
request. Either way, a size where ours did not measure faster by the calibration's margin goes
straight to the inner backend (see :mod:`taccl_py.runtime.communicator.calibration`).

Cluster: given the live cluster (``register_backend(cluster=...)``, or TACCL_CLUSTER, TACCL_NIC_DOWN,
TACCL_NIC_SPEED, TACCL_SYSFS_ROOT and TACCL_NIC_PROBE in each process's environment; see
:mod:`taccl_py.runtime.communicator.live_cluster`), the group routes only through algorithms made for it; the
ranks exchange what sysfs shows of their NICs through the group's store while the group is made.
A subgroup resolves the cluster of the whole job, its members exchanging on its own store: a member
stands in for its node, and a node without members stays as declared. A collective whose libraries
were all made for other clusters runs on the inner backend, with one warning per collective.

This module registers the backend and makes its groups, reading the live cluster from the
environment at that moment; the group is :class:`~taccl_py.runtime.backend.group.TacclProcessGroup`.
"""

from __future__ import annotations

import datetime
import os
from functools import partial
from typing import Any

import torch.distributed as dist

from taccl_py.runtime.backend.group import BACKEND_NAME, TacclProcessGroup
from taccl_py.runtime.communicator.live_cluster import declared_from_env, sysfs_root_from_env

__all__ = ["BACKEND_NAME", "TacclProcessGroup", "register_backend"]

_DEVICES = ["cpu", "cuda"]


def _create_group(settings: dict[str, Any], backend_opts: Any, pg_options: Any = None) -> TacclProcessGroup:
    """Return the group torch's extended backend API asks for (``pg_options``: unused, taccl has none).

    ``backend_opts`` is torch's ``_DistributedBackendOptions``: store, group_rank, group_size, timeout,
    group_id and global_ranks_in_group (empty for the default group).
    """
    options = dict(settings)
    if options["cluster"] is None:  # read in the rank's own process, at group creation
        options["cluster"] = declared_from_env(os.environ)
        if options["sysfs_root"] == "/":
            options["sysfs_root"] = sysfs_root_from_env(os.environ)
    members = list(backend_opts.global_ranks_in_group) or None
    timeout: datetime.timedelta = backend_opts.timeout
    return TacclProcessGroup(
        backend_opts.store, backend_opts.group_rank, backend_opts.group_size, timeout, global_ranks=members, **options
    )


def register_backend(
    library: Any = None,
    *,
    topology: str | None = None,
    nodes: int | None = None,
    cluster: Any = None,
    nic_down: Any = (),
    nic_speed: Any = (),
    sysfs_root: str | os.PathLike | None = "/",
    calibration: bool = True,
) -> None:
    """Register the ``taccl`` backend with torch.distributed, running algorithms from ``library``.

    Call it in every process before ``init_process_group("taccl")``; calling it again replaces the
    settings for groups created afterwards.

    Parameters
    ----------
    library : optional
        Algorithms, as for :class:`Communicator`: a built-in topology name, a ``*.library.json``,
        an algorithm file, an Algorithm, a folder of libraries or of folders of them (``taccl
        synthesize --parallel``), or a sequence of these. Each group takes those that serve its
        members (see the module notes). None (and no ``topology``) runs every collective on the
        inner gloo/NCCL backend.
    topology : str, optional
        A built-in topology whose shipped algorithms come after ``library``'s.
    nodes : int, optional
        The node count for a topology name.
    cluster, nic_down, nic_speed, sysfs_root : optional
        The live cluster, as for :class:`Communicator`; ``cluster`` None takes TACCL_CLUSTER (and
        TACCL_NIC_DOWN, TACCL_NIC_SPEED, TACCL_SYSFS_ROOT, TACCL_NIC_PROBE) from each process's
        environment when the group is made, and without it checks no cluster.
    calibration : bool
        True (default): the group's first routed call of each collective times ours against the
        inner backend's own, or reads that from the user's cache, as a Communicator does by
        default; sizes where the inner backend's measured faster then go to it. False: never
        (``group.calibrate(path)`` still measures on request).

    Raises
    ------
    ArgumentError
        (From ``init_process_group``.) ``library`` names nothing readable, or the cluster is malformed.

    Examples
    --------
    >>> register_backend()
    >>> "taccl" in dist.Backend.backend_list
    True
    """
    settings = {
        "library": library,
        "topology": topology,
        "nodes": nodes,
        "cluster": cluster,
        "nic_down": nic_down,
        "nic_speed": nic_speed,
        "sysfs_root": sysfs_root,
        "calibration": calibration,
    }
    creator = partial(_create_group, settings)
    # torch keeps one creator per name: registering again replaces it for groups made afterwards.
    # The extended API hands the creator each group's global ranks (distributed_c10d.py
    # _new_process_group_helper), which the group's library match needs.
    dist.Backend.register_backend(BACKEND_NAME, creator, extended_api=True, devices=list(_DEVICES))
