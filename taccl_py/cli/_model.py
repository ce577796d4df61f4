"""The ``--model`` option: which execution model (``taccl_py.simulate.model``) times a schedule."""

from __future__ import annotations

import argparse

from taccl_py.simulate import EXECUTION_MODELS, MSCCL_LOOP

__all__ = ["add_model_option"]


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--model {chunks,msccl,pipelined}`` (default msccl) to ``parser``."""
    described = "; ".join(f"{name}: {model.description}" for name, model in EXECUTION_MODELS.items())
    parser.add_argument(
        "--model",
        choices=tuple(EXECUTION_MODELS),
        default=MSCCL_LOOP.name,
        help=f"how the runtime runs the program (default {MSCCL_LOOP.name}; {described})",
    )
