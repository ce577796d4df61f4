"""Write a built instance's files under the output folder, each through a temporary name and a rename.

Only the driver writes, and only a whole result: the band files first, the library that names them
last, then the band files of an earlier build that the new library no longer names are removed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from taccl_py._io import write_bytes_atomic
from taccl_py.build.instance import Instance, InstanceResult

__all__ = ["library_path", "write_instance"]

logger = logging.getLogger(__name__)


def library_path(output_dir: str | Path, instance: Instance) -> Path:
    """Return where ``instance``'s library lives under ``output_dir``."""
    return Path(output_dir) / instance.library_file


def write_instance(result: InstanceResult, output_dir: str | Path) -> tuple[Path, ...]:
    """Write every file of ``result`` under ``output_dir`` (folders made as needed); return their paths.

    Raises ArgumentError (``taccl_py._io.write_bytes_atomic``) when a file cannot be written.
    """
    library = library_path(output_dir, result.instance)
    library.parent.mkdir(parents=True, exist_ok=True)  # a machine or node count built for the first time
    names = sorted(result.files, key=lambda name: name == result.instance.library_file)  # the library last
    written = []
    for name in names:
        path = Path(output_dir) / name
        write_bytes_atomic(path, result.files[name])
        written.append(path)
    for stale in sorted(set(library.parent.glob(f"{result.instance.collective}-*")) - set(written)):
        logger.info("removing %s: the new library has no such band", stale)
        stale.unlink()
    return tuple(written)
