"""Shared pieces of the DDP-hook and ``taccl`` backend tests (import, never copy).

A small MLP with odd layer widths (so DDP's buckets have uneven lengths, most not divisible by
the world size), an optional unused branch, its SGD training loop with per-rank seeded data, and
the ring algorithms for 4 ranks that make the Communicator run taccl_py schedules instead of
falling back to torch.
"""

from __future__ import annotations

from typing import Any

from taccl_py.ir.collectives import Collective

from helpers import ring_algorithm

__all__ = [
    "WORLD_SIZE",
    "STEPS",
    "BUCKET_CAP_MB",
    "ring_library",
    "init_taccl_group",
    "make_mlp",
    "train",
    "flat_parameters",
    "max_difference",
]

#: Ranks of every multi-process DDP test.
WORLD_SIZE = 4
#: Training steps compared between taccl_py and default DDP.
STEPS = 10
#: DDP bucket cap: about 1 kB, so the ~5 kB of gradients fill several uneven buckets.
BUCKET_CAP_MB = 0.001


def ring_library(world_size: int = WORLD_SIZE) -> list[Any]:
    """Return ring all-reduce, all-gather and reduce-scatter algorithms for ``world_size`` ranks."""
    return [
        ring_algorithm(c, world_size) for c in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER)
    ]


def run_on_shared_store(fn: Any, world_size: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, port, *args)`` on ``world_size`` ranks sharing a store at ``port``; return the values.

    The ranks' :func:`init_taccl_group` makes its group on that store.
    """
    import torch.distributed as dist

    from mp_utils import run_ranks

    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, True, wait_for_workers=False)
    try:
        return run_ranks(fn, world_size, store.port, *args)
    finally:
        del store


def init_taccl_group(rank: int, world_size: int, port: int, library: Any) -> Any:
    """Replace the launcher's gloo group by a ``taccl`` one on ``library``, on the parent's store; return it.

    The group keeps to the CPU, as on a machine without GPUs: these tests' ranks would all sit on
    GPU 0 of a machine with GPUs, where NCCL refuses to make the group's GPU side (its barrier runs there).
    """
    import datetime
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything in this rank starts CUDA

    import torch.distributed as dist

    from taccl_py.runtime.backend import register_backend

    dist.destroy_process_group()
    register_backend(library)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout)
    dist.init_process_group("taccl", store=store, rank=rank, world_size=world_size, timeout=timeout)
    return dist.group.WORLD


def make_mlp(seed: int = 0, *, unused: bool = False, dtype: Any = None) -> Any:
    """Return a 13-37-19-5 tanh MLP seeded by ``seed``; ``unused`` adds a branch forward never uses."""
    import torch

    class _MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(13, 37),
                torch.nn.Tanh(),
                torch.nn.Linear(37, 19),
                torch.nn.Tanh(),
                torch.nn.Linear(19, 5),
            )
            self.spare = torch.nn.Linear(37, 5) if unused else None

        def forward(self, x: Any) -> Any:
            return self.layers(x)

    torch.manual_seed(seed)
    model = _MLP()
    return model if dtype is None else model.to(dtype)


def train(model: Any, rank: int, *, steps: int = STEPS, lr: float = 0.05, dtype: Any = None) -> Any:
    """Train ``model`` with SGD on rank-seeded random batches; return its parameters, flat, in float64."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.randn(8, 13, generator=generator)
        y = torch.randn(8, 5, generator=generator)
        if dtype is not None:
            x, y = x.to(dtype), y.to(dtype)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return flat_parameters(model)


def flat_parameters(model: Any) -> Any:
    """Return all parameters of ``model`` concatenated, in float64 (DTensors gathered first)."""
    import torch

    parts = []
    for p in model.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        parts.append(p.detach().reshape(-1).double())
    return torch.cat(parts)


def max_difference(a: Any, b: Any) -> float:
    """Return the largest absolute elementwise difference of two flat tensors."""
    return float((a - b).abs().max())
