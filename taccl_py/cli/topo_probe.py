"""``taccl topo probe`` and ``taccl topo export-nccl`` (being written)."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(topo_subparsers: argparse._SubParsersAction) -> None:
    """Add ``probe`` and ``export-nccl`` to the ``taccl topo`` group."""
