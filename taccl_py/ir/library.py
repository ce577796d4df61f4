"""Libraries of algorithms by size band: what ``taccl synthesize --sizes`` writes and the runtime reads.

A library file (``*.library.json``) names, for one topology, node count and collective, the
algorithm to use for each size band; the algorithms sit beside it as JSON files::

    {"schema": "taccl-library/1", "topology": "ndv2", "nodes": 2, "collective": "allgather",
     "num_ranks": 16,
     "bands": [{"min_bytes": 0, "max_bytes": 1048576, "algorithm": "allgather-0.json",
                "xml": "allgather-0.xml", "simulated_time_us": 41.2}, ...]}

``max_bytes`` null means unbounded. Shipped libraries live in
``algorithms/<topology>/n<nodes>/<collective>.library.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from taccl_py._io import read_text
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.algorithm_json import read_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.errors import FormatError

__all__ = [
    "LIBRARY_SCHEMA",
    "SizeBand",
    "AlgorithmLibrary",
    "parse_library",
    "read_library",
    "generate_library",
    "shipped_library_dir",
    "shipped_library_paths",
]

LIBRARY_SCHEMA = "taccl-library/1"


@dataclass(frozen=True)
class SizeBand:
    """The algorithm for sizes ``min_bytes`` <= size < ``max_bytes`` (None: no upper end)."""

    min_bytes: int
    max_bytes: int | None
    algorithm: Algorithm
    algorithm_file: str
    xml_file: str | None = None
    simulated_time_us: float | None = None

    def covers(self, size_bytes: int) -> bool:
        """Return True when ``size_bytes`` falls in this band."""
        return self.min_bytes <= size_bytes and (self.max_bytes is None or size_bytes < self.max_bytes)


@dataclass(frozen=True)
class AlgorithmLibrary:
    """Algorithms for one topology, node count and collective, by size band."""

    topology: str
    nodes: int
    collective: Collective
    num_ranks: int
    bands: tuple[SizeBand, ...]

    def select(self, size_bytes: int) -> Algorithm | None:
        """Return the algorithm of the band covering ``size_bytes``, or None."""
        for band in self.bands:
            if band.covers(size_bytes):
                return band.algorithm
        return None


def parse_library(text: str, source: str, base_dir: Path) -> AlgorithmLibrary:
    """Return the library a JSON text describes, reading its algorithms relative to ``base_dir``."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise FormatError(source, f"line {error.lineno}", f"invalid JSON: {error.msg}", "a library file") from None
    if not isinstance(obj, dict) or obj.get("schema") != LIBRARY_SCHEMA:
        raise FormatError(source, "schema", "not a taccl library file", repr(LIBRARY_SCHEMA))
    try:
        collective = Collective(obj["collective"])
        bands = []
        for index, band in enumerate(obj["bands"]):
            algorithm = read_algorithm(str(base_dir / band["algorithm"]))
            bands.append(SizeBand(int(band["min_bytes"]), band["max_bytes"], algorithm, band["algorithm"], band.get("xml"), band.get("simulated_time_us")))
        return AlgorithmLibrary(str(obj["topology"]), int(obj["nodes"]), collective, int(obj["num_ranks"]), tuple(bands))
    except (KeyError, TypeError, ValueError) as error:
        raise FormatError(source, "bands", f"malformed entry ({error})", "topology, nodes, collective, num_ranks and bands") from None


def read_library(path: str | Path) -> AlgorithmLibrary:
    """Return the library in the file at ``path``."""
    path = Path(path)
    return parse_library(read_text(path), str(path), path.parent)


def generate_library(library: AlgorithmLibrary) -> str:
    """Return the JSON text of ``library`` (the algorithm files are written separately)."""
    obj = {
        "schema": LIBRARY_SCHEMA,
        "topology": library.topology,
        "nodes": library.nodes,
        "collective": library.collective.value,
        "num_ranks": library.num_ranks,
        "bands": [
            {
                "min_bytes": band.min_bytes,
                "max_bytes": band.max_bytes,
                "algorithm": band.algorithm_file,
                "xml": band.xml_file,
                "simulated_time_us": band.simulated_time_us,
            }
            for band in library.bands
        ],
    }
    return json.dumps(obj, indent=2) + "\n"


def shipped_library_dir() -> Path:
    """Return the ``algorithms/`` directory of the source tree."""
    return Path(__file__).resolve().parents[2] / "algorithms"


def shipped_library_paths(topology: str, nodes: int) -> tuple[Path, ...]:
    """Return the shipped library files for ``topology`` at ``nodes`` nodes (possibly none)."""
    folder = shipped_library_dir() / topology / f"n{nodes}"
    return tuple(sorted(folder.glob("*.library.json")))
