"""The ``taccl`` command line: a thin layer that parses, calls the library, and formats.

The one error path of the CLI is here: every ``TacclError`` becomes one ``error: ...`` line on
stderr and exit status 2, and so does a missing optional package (naming the extra that provides
it); Ctrl-C exits with 130 and a closed output pipe with 141 (128 + the signal, as a shell
reports them), without a traceback. Other exceptions are bugs and keep theirs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from taccl_py import __version__
from taccl_py.cli import algo, bench, place, sim, synth, topo
from taccl_py.errors import ArgumentError, TacclError

__all__ = ["EXIT_CLOSED_PIPE", "EXIT_INPUT", "EXIT_INTERRUPTED", "OPTIONAL_PACKAGES", "build_parser", "main"]

_SUBCOMMAND_MODULES = (topo, algo, sim, synth, bench, place)
#: Exit status for a fault of the input, an argument or the environment.
EXIT_INPUT = 2
#: Exit status after Ctrl-C (128 + SIGINT) and after the reader of stdout went away (128 + SIGPIPE).
EXIT_INTERRUPTED, EXIT_CLOSED_PIPE = 130, 141
#: Options naming a file (or a folder) a command writes, by their argparse attribute.
OUTPUT_OPTIONS = MappingProxyType(
    {"output": "-o", "xml": "--xml", "plot": "--plot", "write_library": "--write-library"}
)
#: The optional extra (``pip install 'taccl-py[extra]'``) that provides each package imported on demand.
OPTIONAL_PACKAGES = MappingProxyType(
    {"matplotlib": "plot", "torch": "runtime", "cupy": "cuda", "pynvml": "cuda", "ortools": "cpsat"}
)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="taccl", description="Synthesize, verify, simulate and run collective algorithms."
    )
    parser.add_argument("--version", action="version", version=f"taccl {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _SUBCOMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taccl`` command line with ``argv``; return the exit status."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Whatever is still buffered for stdout would raise again at exit: send it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the provenance of what is written
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        _check_output_folders(args)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, inside the error path, not at exit
        return status
    except TacclError as error:
        return _error_line(str(error))
    except ModuleNotFoundError as error:
        package = (error.name or "").partition(".")[0]
        if package not in OPTIONAL_PACKAGES:
            raise
        extra = OPTIONAL_PACKAGES[package]
        return _error_line(
            f"taccl {args.command}: {package} is not installed; expected pip install 'taccl-py[{extra}]'"
        )


def _check_output_folders(args: argparse.Namespace) -> None:
    """Raise ArgumentError, before any work, for an output whose folder does not exist (we create none)."""
    for attribute, option in OUTPUT_OPTIONS.items():
        value = getattr(args, attribute, None)
        if isinstance(value, str) and value != "-" and not Path(value).parent.is_dir():
            folder = Path(value).parent
            raise ArgumentError(value, option, f"its folder {folder} does not exist", "a path in an existing folder")


def _error_line(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_INPUT
