"""What a library build is made of: its instances (machine × nodes × collective), options and results.

An instance's files are named as ``algorithms/`` holds them: ``<machine>/n<nodes>/<collective>.library.json``
with one ``<collective>-<band>.json.xz`` per band. Everything an instance records in its files (the
provenance's command and source commit included) comes from the instance and the options alone, never
from the engine that ran it or the clock, so every engine writes the same bytes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import taccl_py
from taccl_py.errors import ArgumentError
from taccl_py.ir.collectives import Collective
from taccl_py.topology import builtin_topology_names
from taccl_py.topology.builtins import builtin_topology_name
from taccl_py.topology.compose import checked_node_count
from taccl_py.units import parse_sizes

__all__ = [
    "DEFAULT_SIZES",
    "INSTANCE_TIMEOUT_S",
    "BuildOptions",
    "Instance",
    "InstanceResult",
    "instance_command",
    "instance_timeout_s",
    "timed_out_error",
    "list_instances",
    "source_commit",
]

#: The sizes a shipped library is built over (nccl-tests spelling, ``taccl_py.units.parse_sizes``).
DEFAULT_SIZES = "1KB-1GB"
#: Wall-clock cap per instance (s), twice the synthesizer's own safety cap at 64+ GPUs (30 min).
INSTANCE_TIMEOUT_S = 3600.0
# The source tree a git checkout of taccl_py has above the package; an installed wheel has none.
_SOURCE_TREE = Path(taccl_py.__file__).resolve().parents[1]


@dataclass(frozen=True, order=True)
class Instance:
    """One library to build: a built-in ``machine`` at ``nodes`` machines, for ``collective``."""

    machine: str
    nodes: int
    collective: str

    @property
    def label(self) -> str:
        """Return the instance as progress lines name it: ``ndv2 n2 allreduce``."""
        return f"{self.machine} n{self.nodes} {self.collective}"

    @property
    def library_file(self) -> str:
        """Return the library's path relative to the output folder: ``ndv2/n2/allreduce.library.json``."""
        return f"{self.machine}/n{self.nodes}/{self.collective}.library.json"


@dataclass(frozen=True)
class BuildOptions:
    """How every instance of a build is synthesized; all of it but ``jobs`` is recorded in the files.

    ``sizes``: the sizes to choose bands over (``"1KB-1GB"``); ``time_limit_s``: the wall-clock safety
    cap of a synthesis (s; None: by GPU count); ``jobs``: worker processes for one instance's candidates
    (same result); ``designs_only``: no routing MILPs (``taccl_py.synth.designs_only``);
    ``source_commit``: the commit recorded in the provenance, found once by the caller (``source_commit()``).
    """

    sizes: str = DEFAULT_SIZES
    time_limit_s: float | None = None
    jobs: int = 1
    designs_only: bool = False
    source_commit: str | None = None

    def __post_init__(self) -> None:
        parse_sizes(self.sizes)  # a bad size fails here, before any instance starts
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ArgumentError(None, "jobs", f"{self.jobs!r} jobs", "a positive number of worker processes")


@dataclass(frozen=True)
class InstanceResult:
    """One instance built: ``files`` maps each path relative to the output folder to its bytes.

    ``metrics`` holds the figures of the run (``wall_s``, ``peak_tree_MB`` and the other peaks in MB,
    the chosen algorithm per band and per size); they are reported, never written into the library.
    """

    instance: Instance
    files: Mapping[str, bytes]
    metrics: dict[str, Any] = field(compare=False)


def instance_timeout_s(options: BuildOptions) -> float:
    """Return an instance's cap on either engine (s): the larger of ``INSTANCE_TIMEOUT_S`` and twice ``time_limit_s``.

    The synthesis stops itself at its time limit and then still verifies and writes; an instance
    stopped before it could do that would be retried from the start and lose the whole run.
    """
    return max(INSTANCE_TIMEOUT_S, 2 * (options.time_limit_s or 0.0))


def timed_out_error(timeout_s: float) -> str:
    """Return the error line either engine reports for an instance it stopped at its cap (``timeout_s``, s)."""
    return f"timed out after {timeout_s:g} s"


def _names(values: Sequence[str], field_name: str) -> tuple[str, ...]:
    names = tuple(value.strip() for value in values if value.strip())
    if not names:
        raise ArgumentError(None, field_name, "no name given", "one or more names separated by commas")
    return names


def list_instances(topologies: Sequence[str], nodes: Sequence[int], collectives: Sequence[str]) -> tuple[Instance, ...]:
    """Return every machine × node count × collective, machines named as built-in (``NDv4``: ``dgx-a100``).

    Raises
    ------
    ArgumentError
        Naming ``topologies``, ``nodes`` or ``collectives`` when one names no built-in machine, is not a
        machine count or names no collective, or when a list is empty.

    Examples
    --------
    >>> [instance.label for instance in list_instances(["NDv4"], [1, 2], ["allgather"])]
    ['dgx-a100 n1 allgather', 'dgx-a100 n2 allgather']
    """
    machines = []
    for name in _names(topologies, "topologies"):
        machine = builtin_topology_name(name)
        if machine is None:
            expected = "built-in machines: " + ", ".join(builtin_topology_names())
            raise ArgumentError(None, "topologies", f"unknown machine {name!r}", expected)
        machines.append(machine)
    counts = [checked_node_count(count) for count in nodes]
    if not counts:
        raise ArgumentError(None, "nodes", "no machine count given", "counts separated by commas, e.g. 1,2")
    known = tuple(collective.value for collective in Collective)
    chosen = _names(collectives, "collectives")
    for name in chosen:
        if name not in known:
            raise ArgumentError(None, "collectives", f"unknown collective {name!r}", ", ".join(known))
    found = [Instance(m, n, c) for m in dict.fromkeys(machines) for n in dict.fromkeys(counts) for c in chosen]
    return tuple(dict.fromkeys(found))


def instance_command(instance: Instance, options: BuildOptions) -> str:
    """Return the command recorded in an instance's provenance: the one that rebuilds just it.

    The same for every engine and worker count, so a library's bytes do not depend on how it was run.
    """
    command = (
        f"python scripts/build_algorithms.py --topologies {instance.machine} --nodes {instance.nodes} "
        f"--collectives {instance.collective} --sizes {options.sizes}"
    )
    command += f" --time-limit {options.time_limit_s:g}" if options.time_limit_s is not None else ""
    return command + (" --designs-only" if options.designs_only else "")


def source_commit() -> str | None:
    """Return the commit of taccl_py's git checkout, ``-dirty`` when its source has changes; None without one.

    Libraries under ``algorithms/`` are a build's outputs, not a change to its source, so they do not count.
    """
    if not (_SOURCE_TREE / ".git").exists():  # an installed package: no commit to record
        return None
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_SOURCE_TREE, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)algorithms"],
            cwd=_SOURCE_TREE,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty.strip() else "")
