"""The ``--runtime`` option of the commands that write MSCCL XML, and the dialect a runtime reads."""

from __future__ import annotations

import argparse

from taccl_py.errors import ArgumentError
from taccl_py.msccl.dialect import Dialect
from taccl_py.msccl.limits import DEFAULT_RUNTIME, Runtime, RuntimeLimits, parse_runtime, runtime_limits

__all__ = ["add_runtime_argument", "xml_dialect", "xml_target"]

_RUNTIME_HELP = (
    "MSCCL runtime the XML must load in, checked before the work where it can be: msccl-executor-nccl "
    "(64 steps per threadblock), msccl (microsoft/msccl, old dialect; 256), rccl (64 steps, 64 threadblocks); "
    f"default {DEFAULT_RUNTIME.value}, the strictest of them all"
)


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--runtime`` to ``parser`` (default None: portable)."""
    parser.add_argument("--runtime", choices=[r.value for r in Runtime], default=None, help=_RUNTIME_HELP)


def xml_target(runtime: str | None, dialect: str | None, *, xml: bool, path: str | None = None) -> RuntimeLimits:
    """Return the limits an output is written within; raise ``ArgumentError`` for a runtime it cannot use.

    A runtime is refused for a JSON output (``xml`` False) and with a ``dialect`` it does not read.
    """
    if runtime is None:
        return runtime_limits(DEFAULT_RUNTIME)
    limits = runtime_limits(parse_runtime(runtime))
    if not xml:
        raise ArgumentError(path, "--runtime", f"runtime {runtime} for a JSON output", "--runtime only with .xml")
    if dialect is not None and limits.runtime is not Runtime.PORTABLE and Dialect(dialect) is not limits.dialect:
        raise ArgumentError(
            path,
            "--dialect",
            f"dialect {dialect} for runtime {runtime}",
            f"--dialect {limits.dialect.value} (what {runtime} reads) or no --dialect",
        )
    return limits


def xml_dialect(limits: RuntimeLimits, dialect: str | None) -> Dialect:
    """Return the dialect to write: ``dialect`` when given, else the one ``limits``' runtime reads."""
    return limits.dialect if dialect is None else Dialect(dialect)
