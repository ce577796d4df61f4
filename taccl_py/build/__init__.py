"""Library builds: synthesize many instances (machine × nodes × collective) on an engine, write their files.

``build_libraries`` runs the instances ``list_instances`` names on the local engine (a worker process
per instance) or on Ray (a task per instance, on a local Ray or a cluster), retries failed or lost
ones, and writes each built library as ``algorithms/`` holds them:
``<machine>/n<nodes>/<collective>.library.json`` with one ``.json.xz`` per band. A task returns its
files' bytes; only the driver writes, and only a task that succeeded, so no library is half written.
The bytes depend on the instance and the options alone, so every engine writes the same files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from taccl_py.build.driver import DEFAULT_RETRIES, BuildReport, Engine, InstanceOutcome, check_retries, run_instances
from taccl_py.build.instance import (
    DEFAULT_SIZES,
    BuildOptions,
    Instance,
    InstanceResult,
    instance_command,
    list_instances,
    source_commit,
)
from taccl_py.build.output import library_path, write_instance
from taccl_py.build.run import FAULTS_ENV, build_instance
from taccl_py.errors import ArgumentError

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_SIZES",
    "ENGINES",
    "FAULTS_ENV",
    "BuildOptions",
    "BuildReport",
    "Instance",
    "InstanceOutcome",
    "InstanceResult",
    "build_instance",
    "build_libraries",
    "instance_command",
    "library_path",
    "list_instances",
    "make_engine",
    "source_commit",
    "write_instance",
]

#: The engines ``build_libraries`` runs instances on.
ENGINES = ("local", "ray")


def make_engine(engine: str, options: BuildOptions, *, address: str | None = None, jobs: int | None = None) -> Engine:
    """Return the engine named ``engine`` running ``jobs`` instances at once (None: local 1, Ray its CPUs).

    Raises
    ------
    ArgumentError
        For an unknown engine, an ``address`` for the local engine, ``jobs`` under 1, or ``ray`` without Ray.
    """
    if engine not in ENGINES:
        raise ArgumentError(None, "engine", f"unknown engine {engine!r}", " or ".join(ENGINES))
    if engine == "local":
        if address is not None:
            raise ArgumentError(None, "address", "only Ray joins a cluster", "--engine ray, or no address")
        from taccl_py.build.local import LocalEngine

        return LocalEngine(options, 1 if jobs is None else jobs)
    from taccl_py.build.ray_engine import RayEngine

    return RayEngine(options, address=address, slots=jobs)


def build_libraries(
    instances: Sequence[Instance],
    options: BuildOptions,
    output_dir: str | Path | None,
    *,
    engine: str = "local",
    address: str | None = None,
    jobs: int | None = None,
    retries: int = DEFAULT_RETRIES,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[InstanceResult], None] | None = None,
) -> BuildReport:
    """Build ``instances`` on ``engine`` and write each library under ``output_dir`` (None: nowhere); return the report.

    Parameters
    ----------
    instances : sequence of Instance
        What to build (``list_instances``).
    options : BuildOptions
        Sizes, time cap, workers per instance; recorded in every library.
    output_dir : str, Path or None
        The folder the libraries go under, made if missing (its parent must exist); a library
        built before in it is replaced, band files it no longer names removed.
    engine, address, jobs : str, str or None, int or None
        ``make_engine``'s: where the instances run and how many at once.
    retries : int
        Attempts after the first for a failed or lost instance.
    progress : callable or None
        Takes a line at each change of state: started, built, failed.
    on_result : callable or None
        Takes each result once its files are written.

    Returns
    -------
    BuildReport
        Every instance's outcome: its result and metrics, or the errors of its attempts.

    Raises
    ------
    ArgumentError
        From ``make_engine``, for negative ``retries``, or when a file cannot be written.
    """
    check_retries(retries)
    if output_dir is not None:
        folder = Path(output_dir)
        if not folder.parent.is_dir():
            raise ArgumentError(
                str(folder), None, f"its folder {folder.parent} does not exist", "a path in an existing folder"
            )
    built = make_engine(engine, options, address=address, jobs=jobs)
    return run_instances(built, instances, output_dir, retries=retries, progress=progress, on_result=on_result)
