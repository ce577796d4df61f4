"""The ``taccl`` command line: a thin layer that parses, calls the library, and formats.

Every ``TacclError`` becomes one ``error: ...`` line on stderr and exit status 2, here and
nowhere else; other exceptions keep their traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from taccl_py.cli import algo, bench, place, sim, synth, topo
from taccl_py.errors import TacclError

__all__ = ["main", "build_parser"]

_SUBCOMMAND_MODULES = (topo, algo, sim, synth, bench, place)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="taccl", description="Synthesize, verify, simulate and run collective algorithms."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _SUBCOMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taccl`` command line with ``argv``; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the provenance of what is written
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except TacclError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
