"""The ``taccl`` command line: a thin layer that parses, calls the library, and formats.

The one error path of the CLI is here: every ``TacclError`` becomes one ``error: ...`` line on
stderr and exit status 2, and so does a missing optional package (naming the extra that provides
it); Ctrl-C (SIGINT) exits with 130, SIGTERM with 143 and a closed output pipe with 141 (128 +
the signal, as a shell reports them), without a traceback and with every worker process ended.
Other exceptions are bugs and keep theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MappingProxyType

from taccl_py import __version__
from taccl_py.errors import CUDA_INSTALL_HINT, ArgumentError, TacclError, install_hint
from taccl_py.gc_tuning import collect_cycles_rarely

__all__ = [
    "COMMANDS",
    "EXIT_CLOSED_PIPE",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "OPTIONAL_PACKAGES",
    "OUTPUT_OPTIONS",
    "PARAMETER_OPTIONS",
    "build_parser",
    "main",
]

#: Every command: the module of ``taccl_py.cli`` that adds its options, and its line in ``taccl --help``.
#: Only the module of the command that runs is imported (its options' choices and defaults come from
#: the library), so ``taccl --help`` and ``--version`` import neither numpy, networkx nor a solver.
COMMANDS = MappingProxyType(
    {
        "topo": ("topo", "list, show, import and draw topologies"),
        "verify": (
            "algo",
            "check that an algorithm file (JSON, MSCCL XML or an MSCCL++ plan) implements its collective",
        ),
        "convert": (
            "algo",
            "translate an algorithm between taccl JSON and MSCCL-IR XML, or lift an MSCCL++ plan into either",
        ),
        "export-msccl": (
            "algo",
            "write every size band of a library as MSCCL-IR XML, for an MSCCL runtime's algorithm folder",
        ),
        "export-mscclpp": (
            "mscclpp",
            "write every size band of a library as MSCCL++ execution plans (JSON), in and out of place",
        ),
        "simulate": ("sim", "predict an algorithm's time on a topology, against the best baseline"),
        "baseline": (
            "baseline",
            "write an NCCL-like ring, double binary tree, hierarchical, packed-trees or direct algorithm; "
            "print NCCL's modelled NVLS or PAT times",
        ),
        "synthesize": ("synth", "synthesize a verified algorithm for a topology (TACCL-style MILP)"),
        "build": ("build", "synthesize libraries for machines x node counts x collectives (local processes or Ray)"),
        "bench": ("bench", "time an algorithm or library against torch.distributed's own collectives"),
        "profile": ("profile", "measure alpha and bandwidth between ranks; write a topology with the measured links"),
        "place": ("place", "place pipeline stages on GPUs (NVLink chains, NIC-near boundary GPUs)"),
        "deploy": ("deploy", "print how a job loads an exported folder: MSCCL++ registration dry run, MSCCL env"),
    }
)
#: Exit status for a fault of the input, an argument or the environment.
EXIT_INPUT = 2
#: Exit status after Ctrl-C (128 + SIGINT) and after the reader of stdout went away (128 + SIGPIPE).
EXIT_INTERRUPTED, EXIT_CLOSED_PIPE = 130, 141
#: Exit status after SIGTERM (128 + SIGTERM), what ``kill`` and batch schedulers send.
EXIT_TERMINATED = 143
#: Options naming a file (or a folder) a command writes, by their argparse attribute. A subcommand
#: whose option names a folder (created if missing) lists the attribute in its ``output_folders`` default.
OUTPUT_OPTIONS = MappingProxyType(
    {"output": "-o", "xml": "--xml", "plot": "--plot", "write_library": "--write-library"}
)
#: Library parameters whose faults the CLI reports under the option the user typed (by argparse attribute).
PARAMETER_OPTIONS = MappingProxyType(
    {
        "jobs": "--jobs",
        "node_limit": "--node-limit",
        "time_limit": "--time-limit",
        "size": "--size",
        "sizes": "--sizes",
        "nodes": "--nodes",
        "solver": "--solver",
        "topologies": "--topologies",
        "collectives": "--collectives",
        "engine": "--engine",
        "address": "--address",
        "retries": "--retries",
    }
)
#: How to install each package imported on demand: the extra(s) that provide it.
OPTIONAL_PACKAGES = MappingProxyType(
    {
        "matplotlib": install_hint("plot"),
        "torch": install_hint("runtime"),
        "cupy": CUDA_INSTALL_HINT,
        "pynvml": CUDA_INSTALL_HINT,
        "ortools": install_hint("cpsat"),
    }
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser: every command listed, the options of ``command``'s module added (None: none).

    A command listed without its module takes any arguments (``parse_known_args`` hands them back):
    a first pass finds the command and answers ``--help``, ``--version`` or a bad command before any
    command's module, and the library behind it, is imported.
    """
    parser = argparse.ArgumentParser(
        prog="taccl", description="Synthesize, verify, simulate and run collective algorithms."
    )
    parser.add_argument("--version", action="version", version=f"taccl {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = COMMANDS[command][0] if command in COMMANDS else None
    if chosen is not None:
        importlib.import_module(f"{__name__}.{chosen}").register(subparsers)
    for name, (module, line) in COMMANDS.items():
        if module != chosen:
            subparsers.add_parser(name, help=line, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``taccl`` command line with ``argv``; return the exit status."""
    try:
        with _signals_as_exceptions():
            return _run(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Terminated:
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except BrokenPipeError:
        # Whatever is still buffered for stdout would raise again at exit: send it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


class _Terminated(BaseException):
    """SIGTERM arrived: a BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it."""


@contextlib.contextmanager
def _signals_as_exceptions() -> Iterator[None]:
    """Turn SIGINT into KeyboardInterrupt and SIGTERM into ``_Terminated`` while the command runs.

    Raising, not dying, lets the code on the way out end the worker processes. SIGINT is caught even
    where it was ignored (a shell's ``&`` job): ``kill -INT`` to the run's process group ends it as
    Ctrl-C ends a foreground run. Only the first signal raises: a repeat does not cut the cleanup
    short. Outside the main thread, where Python takes no handler, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def _raise(signum: int, _frame: object) -> None:
        if seen:
            return
        seen.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated

    previous = {signum: signal.signal(signum, _raise) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _run(argv: Sequence[str] | None) -> int:
    collect_cycles_rarely()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = build_parser().parse_known_args(argv)[0].command
    args = build_parser(command).parse_args(argv)
    args.argv = argv  # recorded in the provenance of what is written
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        _check_arguments(args)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, inside the error path, not at exit
        return status
    except TacclError as error:
        return _error_line(str(_named_as_typed(error, args)))
    except ModuleNotFoundError as error:
        package = (error.name or "").partition(".")[0]
        if package not in OPTIONAL_PACKAGES:
            raise
        return _error_line(f"taccl {args.command}: {package} is not installed; expected {OPTIONAL_PACKAGES[package]}")


def _check_arguments(args: argparse.Namespace) -> None:
    """Raise ArgumentError, before any work, for a ``--nodes`` out of range or an output that cannot be written."""
    if getattr(args, "nodes", None) is not None:
        from taccl_py.topology.compose import checked_node_count

        checked_node_count(args.nodes, field="--nodes")
    folders = getattr(args, "output_folders", ())
    for attribute, option in OUTPUT_OPTIONS.items():
        value = getattr(args, attribute, None)
        if isinstance(value, str) and value != "-":
            _check_output(value, option, folder=attribute in folders)


def _check_output(value: str, option: str, *, folder: bool) -> None:
    """Raise ArgumentError when ``value`` cannot be written: a file (``folder``: a folder) is created nowhere.

    The folder it goes into must exist (we create none) and take a new file, which only trying
    tells for sure (root passes ``os.access`` where a virtual file system refuses every file).
    """
    path = Path(value)
    if folder and path.exists() and not path.is_dir():
        raise ArgumentError(value, option, "is a file", "a folder (created if missing)")
    if not folder and path.is_dir():
        raise ArgumentError(value, option, "is a directory", "a file path")
    parent = path if folder and path.is_dir() else path.parent
    if not parent.is_dir():
        raise ArgumentError(value, option, f"its folder {parent} does not exist", "a path in an existing folder")
    try:
        handle, probe = tempfile.mkstemp(dir=parent, prefix=".taccl-", suffix=".tmp")
    except OSError as error:
        reason = error.strerror or str(error)
        raise ArgumentError(
            value, option, f"cannot create a file in {parent}: {reason}", "a folder you can write to"
        ) from None
    os.close(handle)
    os.unlink(probe)


def _named_as_typed(error: TacclError, args: argparse.Namespace) -> TacclError:
    """Return ``error`` with the option the user typed in place of the library parameter it names.

    Only a fault of a value passed in (no source file) of a parameter this subcommand takes an
    option for is renamed: ``jobs: 0 jobs`` reads ``--jobs: 0 jobs``.
    """
    if type(error) is not ArgumentError or error.source is not None:
        return error
    if error.field not in PARAMETER_OPTIONS or not hasattr(args, error.field):
        return error
    return ArgumentError(None, PARAMETER_OPTIONS[error.field], error.fault, error.expected)


def _error_line(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_INPUT
