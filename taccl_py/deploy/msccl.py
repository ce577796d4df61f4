"""The environment under which msccl-executor-nccl or RCCL loads a folder of MSCCL XML files we exported.

Both runtimes read the folder named by ``MSCCL_ALGO_DIR`` once per process, parse every regular
file and link in it, and pick per call the first file whose collective, rank count, size range,
chunk divisibility and placement fit (``taccl_py.msccl.selection`` holds that rule); every other
call runs the library's own algorithm. Facts from Azure/msccl-executor-nccl @c6f6b36d
(``src/misc/msccl/msccl_lifecycle.cc``) and ROCm/rccl @0cbce2a7 (the same file, and
``src/init.cc``); each variable's docstring line below cites where it is read. Neither reads
``MSCCL_XML_FILES`` (microsoft/msccl's older runtime); RCCL declares ``MSCCL_ALGO_FILE_PATH``
(msccl_lifecycle.cc:32) and never reads it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from taccl_py.errors import ArgumentError, FormatError
from taccl_py.msccl.library import folder_selection_keys

__all__ = ["MscclRuntime", "MscclEnvironment", "format_environment", "msccl_environment"]


class MscclRuntime(str, Enum):
    """The MSCCL runtimes that load a folder; values are the names ``taccl deploy msccl --runtime`` takes."""

    EXECUTOR = "msccl-executor-nccl"
    RCCL = "rccl"


# How each runtime is built or found, and how a job picks it up (comment lines of the printed block).
_SETUP = {
    MscclRuntime.EXECUTOR: (
        "build: git clone https://github.com/Azure/msccl-executor-nccl && cd msccl-executor-nccl && make -j src.build",
        "run every rank with LD_PRELOAD=<msccl-executor-nccl>/build/lib/libnccl.so.2 (in place of the NCCL torch "
        "loads)",
        "one GPU per process: MSCCL turns itself off otherwise (msccl_lifecycle.cc:219-222)",
        "no libmsccl-scheduler.so on the library path (or MSCCL_SCHEDULER): an external scheduler replaces the "
        "rule below (msccl_lifecycle.cc:191-213)",
    ),
    MscclRuntime.RCCL: (
        "RCCL is built with MSCCL by default (CMakeLists.txt:28, ENABLE_MSCCL_KERNEL ON); a job uses the librccl "
        "its PyTorch loads, or one named by LD_PRELOAD",
        "NCCL_MAX_NCHANNELS below a file's channel count drops that file (msccl_lifecycle.cc:186-194)",
    ),
}
_SELECTION = (
    "a call runs the first file whose collective, rank count, minBytes..maxBytes (count x type size x "
    "ranks for AllGather, ReduceScatter, AlltoAll), chunk divisibility and placement fit "
    "(msccl_lifecycle.cc:329-345)",
    "every other call, and ops avg and after (:309), runs NCCL's (RCCL's) own algorithm; "
    "check which with taccl export-msccl --check-selection",
)


@dataclass(frozen=True)
class MscclEnvironment:
    """The variables (name, value) a job sets for ``runtime`` to load ``folder``, and notes on using it."""

    runtime: MscclRuntime
    folder: Path
    variables: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    files: int
    rank_counts: tuple[int, ...]

    @property
    def mapping(self) -> Mapping[str, str]:
        """Return the variables as a dict, e.g. to update ``os.environ`` or a launcher's env."""
        return dict(self.variables)


def msccl_environment(
    folder: str | Path, runtime: str | MscclRuntime = MscclRuntime.EXECUTOR, *, keep_rccl_mscclpp: bool = False
) -> MscclEnvironment:
    """Return the environment under which ``runtime`` loads the MSCCL XML files of ``folder``.

    msccl-executor-nccl:

    * ``MSCCL_ALGO_DIR``: the folder, read with getenv (msccl_lifecycle.cc:79, 103); unset, the
      runtime looks beside libnccl.so and under share/nccl and /usr/share/nccl (:110-151).
    * ``NCCL_MSCCL_ENABLE=1``: MSCCL on (``NCCL_PARAM(MscclEnabled, "MSCCL_ENABLE", 1)``,
      :27; the prefix is param.h:25's); 1 is the default, set against a 0 inherited.

    RCCL (MI300X):

    * ``MSCCL_ALGO_DIR``: the folder (rccl msccl_lifecycle.cc:112, 140).
    * ``RCCL_MSCCL_ENABLE=1`` (:29; ``RCCL_PARAM`` prefixes ``RCCL_``, src/include/param.h:41).
    * ``RCCL_MSCCL_FORCE_ENABLE=1`` (:30): without it RCCL's scheduler selects nothing unless the
      topology model it matched sets ``mscclEnabled`` (:353-358; src/graph/rome_models.cc options).
    * ``RCCL_MSCCLPP_ENABLE=0`` unless ``keep_rccl_mscclpp`` (src/init.cc:105-111): under graph
      capture, AllReduce and AllGather up to ``RCCL_MSCCLPP_THRESHOLD`` (1 MiB) run MSCCL++ before any
      file is consulted (msccl_lifecycle.cc:516-545).

    Raises
    ------
    ArgumentError
        ``folder`` is no folder or holds no file; ``runtime`` is unknown.
    FormatError
        A file of the folder is no MSCCL-IR XML: the runtime parses every file and stops on it.
    """
    kind = _runtime(runtime)
    root = Path(folder)
    if not root.is_dir():
        raise ArgumentError(str(folder), None, "no such folder", "a folder written by taccl export-msccl")
    keys, unreadable = folder_selection_keys(root)
    if unreadable:
        name, why = unreadable[0]
        raise FormatError(
            str(root / name),
            None,
            f"not MSCCL-IR XML ({why}); the runtime parses every file of its folder",
            "only files written by taccl export-msccl in the folder",
        )
    if not keys:
        raise ArgumentError(str(folder), None, "holds no file", "a folder written by taccl export-msccl")
    absolute = str(root.resolve())
    if kind is MscclRuntime.EXECUTOR:
        variables = (("MSCCL_ALGO_DIR", absolute), ("NCCL_MSCCL_ENABLE", "1"))
    else:
        variables = (("MSCCL_ALGO_DIR", absolute), ("RCCL_MSCCL_ENABLE", "1"), ("RCCL_MSCCL_FORCE_ENABLE", "1"))
        if not keep_rccl_mscclpp:
            variables += (("RCCL_MSCCLPP_ENABLE", "0"),)
    ranks = tuple(sorted({key.num_ranks for key in keys}))
    return MscclEnvironment(kind, root, variables, _SETUP[kind] + _SELECTION, len(keys), ranks)


def _runtime(runtime: str | MscclRuntime) -> MscclRuntime:
    try:
        return MscclRuntime(runtime)
    except ValueError:
        expected = " or ".join(member.value for member in MscclRuntime)
        raise ArgumentError(None, "runtime", f"unknown runtime {runtime!r}", expected) from None


def format_environment(environment: MscclEnvironment) -> str:
    """Return the environment as shell lines: a comment header, the notes, then one ``export`` per variable."""
    ranks = ", ".join(str(count) for count in environment.rank_counts)
    lines = [
        f"# {environment.runtime.value}: load the {environment.files} MSCCL XML files of "
        f"{environment.folder.resolve()} (for {ranks} ranks)"
    ]
    lines.extend(f"# {note}" for note in environment.notes)
    lines.extend(f"export {name}={shlex.quote(value)}" for name, value in environment.variables)
    return "\n".join(lines)
