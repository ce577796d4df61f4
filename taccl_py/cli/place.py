"""``taccl`` subcommands of this group (being written)."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this group's subcommands to ``subparsers``."""
