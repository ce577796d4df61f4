"""Libraries of algorithms by size band: what ``taccl synthesize --sizes`` writes and the runtime reads.

A library file (``*.library.json``) names, for one topology, node count and collective, the
algorithm to use for each size band, and how the library was made; the algorithms sit beside it
as taccl JSON files (plain, or compressed as ``.json.xz`` or ``.json.gz``)::

    {"schema": "taccl-library/1", "topology": "ndv2", "nodes": 2, "collective": "allgather",
     "num_ranks": 16,
     "cluster": {"fingerprint": "3f0c...", "nodes": ["a1b2...", "a1b2..."], "description": "..."},
     "provenance": {"taccl_py": "0.1.0", "solver": "highs", "solver_options": {...}, ...},
     "bands": [{"min_bytes": 0, "max_bytes": 1048576, "algorithm": "allgather-0.json.xz",
                "simulated_time_us": 41.2}, ...]}

``max_bytes`` null means unbounded. A band whose algorithm is ``"native"`` names no file: there the
runtime runs its backend's own collective (gloo's, NCCL's), as one calibrated on the live group
chooses where that is faster; MSCCL export writes no XML for it, so MSCCL falls back to NCCL there
too. MSCCL XML is not stored: ``taccl export-msccl`` derives it.
The optional ``cluster`` object names the cluster the library was made for: its fingerprint
(``taccl_py.topology.fingerprint.cluster_fingerprint``), every node's signature in rank order and
its description. A library without one (every shipped library) was made for the built-in topology
it names, at its node count; ``library_cluster_fingerprint`` works that out when asked.
The optional ``group`` object says the library runs on a process group of that machine set, not
on all of it: ``{"kind": "dp", "world_size": 32, "members": [0, 8, 16, 24], "groups": [[0, 8, 16,
24], [1, 9, 17, 25], ...], "concurrent": [...]}``. ``members`` are the global ranks (torchrun's,
node-major) of the group it was synthesized for, in group-rank order; ``groups`` every group of
its kind it serves (same placement class); ``concurrent`` every group of its kind, all modelled as
running at once (default ``groups``); ``num_ranks`` is then the group's size.
Shipped libraries live in ``algorithms/<topology>/n<nodes>/<collective>.library.json`` of the
source tree and inside the wheel as package data (``shipped_library_dir``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PureWindowsPath
from typing import Any

from taccl_py._io import decode_json, read_text, write_text_atomic
from taccl_py.errors import FormatError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.algorithm_json import is_topology_document, read_algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.provenance import Provenance, provenance_from_json, provenance_to_json
from taccl_py.ir.provenance import typed_field as _typed

__all__ = [
    "ClusterRecord",
    "GroupRecord",
    "LIBRARY_SCHEMA",
    "NATIVE_ALGORITHM",
    "SHIPPED_PACKAGE",
    "AlgorithmLibrary",
    "Provenance",
    "builtin_cluster_fingerprint",
    "SizeBand",
    "cluster_record",
    "band_part_name",
    "earlier_band_files",
    "export_stem",
    "write_band_files",
    "generate_library",
    "library_cluster_fingerprint",
    "parse_library",
    "read_library",
    "shipped_library_dir",
    "shipped_library_paths",
    "shipped_node_counts",
]

LIBRARY_SCHEMA = "taccl-library/1"
#: The algorithm name of a band that runs the backend's own collective.
NATIVE_ALGORITHM = "native"
# The package that carries algorithms/ as data (pyproject.toml maps the folder onto it).
SHIPPED_PACKAGE = "taccl_py.data.algorithms"


@dataclass(frozen=True)
class SizeBand:
    """The algorithm for sizes ``min_bytes`` <= size < ``max_bytes`` (None: no upper end).

    ``algorithm`` None (``algorithm_file`` ``"native"``): the backend's own collective runs here.
    """

    min_bytes: int
    max_bytes: int | None
    algorithm: Algorithm | None
    algorithm_file: str
    simulated_time_us: float | None = None

    @property
    def native(self) -> bool:
        """Return True when the backend's own collective runs in this band."""
        return self.algorithm is None

    def covers(self, size_bytes: int) -> bool:
        """Return True when ``size_bytes`` falls in this band."""
        return self.min_bytes <= size_bytes and (self.max_bytes is None or size_bytes < self.max_bytes)


@dataclass(frozen=True)
class ClusterRecord:
    """The cluster a library was made for: its fingerprint, its nodes' signatures (rank order), its description."""

    fingerprint: str
    nodes: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class GroupRecord:
    """The process groups a library serves: their kind, the job's rank count and each group's global ranks.

    ``members`` is the group it was synthesized for; ``groups`` holds it and the other groups of
    ``kind`` with the same placement; ``concurrent`` every group of ``kind`` (default ``groups``),
    modelled as running at once and sharing links.
    """

    kind: str
    world_size: int
    members: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    concurrent: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.concurrent:
            object.__setattr__(self, "concurrent", self.groups)

    def serves(self, ranks: Sequence[int]) -> bool:
        """Return True when ``ranks`` (global, in group-rank order) are one of the groups this library serves."""
        return tuple(ranks) in self.groups


@dataclass(frozen=True)
class AlgorithmLibrary:
    """Algorithms for one topology, node count and collective, by size band.

    ``cluster`` None: made for the built-in topology ``topology`` at ``nodes`` nodes (as far as known).
    ``group`` None: runs on all of its ranks; else on the process groups it names.
    """

    topology: str
    nodes: int
    collective: Collective
    num_ranks: int
    bands: tuple[SizeBand, ...]
    provenance: Provenance | None = None
    cluster: ClusterRecord | None = None
    group: GroupRecord | None = None

    def select(self, size_bytes: int) -> Algorithm | None:
        """Return the algorithm of the band covering ``size_bytes``; None: no band, or a native one."""
        for band in self.bands:
            if band.covers(size_bytes):
                return band.algorithm
        return None


def _count(obj: dict[str, Any], key: str, source: str, where: str, low: int = 0) -> int:
    """Return the integer ``obj[key]`` (>= ``low``)."""
    value = _typed(obj, key, (int,), source, where, f"an integer >= {low}")
    if value < low:
        raise FormatError(source, f"{where}.{key}" if where else key, f"{value} out of range", f"an integer >= {low}")
    return value


def _cluster_from_json(obj: Any, source: str) -> ClusterRecord | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise FormatError(source, "cluster", f"{obj!r}", "an object with fingerprint, nodes and description")
    nodes = _typed(obj, "nodes", (list,), source, "cluster", "a list of node signatures")
    if not nodes or not all(isinstance(node, str) and node for node in nodes):
        raise FormatError(source, "cluster.nodes", f"{nodes!r}", "a non-empty list of node signatures")
    fingerprint = _typed(obj, "fingerprint", (str,), source, "cluster", "a cluster fingerprint")
    if not fingerprint:
        raise FormatError(source, "cluster.fingerprint", "empty", "a cluster fingerprint")
    description = obj.get("description", "")
    if not isinstance(description, str):
        raise FormatError(source, "cluster.description", f"{description!r}", "a string")
    return ClusterRecord(fingerprint, tuple(nodes), description)


def _rank_list(obj: Any, source: str, where: str, world_size: int) -> tuple[int, ...]:
    if not isinstance(obj, list) or not obj or not all(isinstance(r, int) and 0 <= r < world_size for r in obj):
        raise FormatError(source, where, f"{obj!r}", f"a non-empty list of global ranks in 0..{world_size - 1}")
    if len(set(obj)) != len(obj):
        raise FormatError(source, where, f"{obj!r} repeats a rank", "each rank once")
    return tuple(obj)


def _group_from_json(obj: Any, source: str, num_ranks: int) -> GroupRecord | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise FormatError(source, "group", f"{obj!r}", "an object with kind, world_size, members and groups")
    kind = _typed(obj, "kind", (str,), source, "group", "a group kind such as 'tp' or 'dp'")
    world_size = _count(obj, "world_size", source, "group", num_ranks)
    members = _rank_list(obj.get("members"), source, "group.members", world_size)
    groups = _typed(obj, "groups", (list,), source, "group", "a list of rank lists")
    served = tuple(_rank_list(group, source, f"group.groups[{i}]", world_size) for i, group in enumerate(groups))
    for where, ranks in (("group.members", members), *((f"group.groups[{i}]", g) for i, g in enumerate(served))):
        if len(ranks) != num_ranks:
            raise FormatError(source, where, f"{len(ranks)} ranks", f"num_ranks ({num_ranks})")
    if members not in served:
        raise FormatError(source, "group.groups", f"does not hold members {list(members)}", "the members among them")
    running = _typed(obj, "concurrent", (list, type(None)), source, "group", "a list of rank lists") or []
    concurrent = tuple(
        _rank_list(group, source, f"group.concurrent[{i}]", world_size) for i, group in enumerate(running)
    )
    if concurrent and not set(served) <= set(concurrent):
        raise FormatError(source, "group.concurrent", "misses some of groups", "every served group among them")
    return GroupRecord(kind, world_size, members, served, concurrent)


def _band_from_json(obj: Any, source: str, where: str, base_dir: Path | Traversable) -> SizeBand:
    if not isinstance(obj, dict):
        raise FormatError(source, where, f"{obj!r}", "a band object with min_bytes, max_bytes and algorithm")
    min_bytes = _count(obj, "min_bytes", source, where)
    max_bytes = None if obj.get("max_bytes") is None else _count(obj, "max_bytes", source, where, min_bytes + 1)
    name = _typed(obj, "algorithm", (str,), source, where, f"a file name beside the library, or {NATIVE_ALGORITHM!r}")
    time_us = _typed(obj, "simulated_time_us", (int, float, type(None)), source, where, "a time in µs or null")
    algorithm = None if name == NATIVE_ALGORITHM else read_algorithm(_band_path(name, source, where, base_dir))
    return SizeBand(min_bytes, max_bytes, algorithm, name, time_us)


def _band_path(name: str, source: str, where: str, base_dir: Path | Traversable) -> Path | Traversable:
    """Return the file band ``name`` names inside ``base_dir``; refuse one outside it, or missing.

    A library is data a user may have downloaded: its band names must not read files elsewhere
    (``../../etc/passwd``, an absolute path, a symlink out of the folder).
    """
    field, expected = f"{where}.algorithm", "a file name inside the library's folder, or 'native'"
    # Windows rules read both separators and drive letters, so a name is judged the same on every system.
    lexical = PureWindowsPath(name)
    if lexical.drive or lexical.root or not lexical.parts or ".." in lexical.parts:
        raise FormatError(source, field, f"{name!r} leaves the library's folder", expected)
    path = base_dir / name
    if isinstance(base_dir, Path) and not path.resolve().is_relative_to(base_dir.resolve()):
        raise FormatError(source, field, f"{name!r} is a link out of the library's folder", expected)
    if not path.is_file():
        raise FormatError(source, field, f"{name!r}: no such file in {base_dir}", expected)
    return path


def parse_library(text: str, source: str, base_dir: Path | Traversable) -> AlgorithmLibrary:
    """Return the library a JSON text describes, reading its algorithms relative to ``base_dir``.

    Raises ``FormatError`` naming the field for a value of the wrong type or out of range, naming
    the library and band for a band file that is missing or outside ``base_dir`` (an absolute
    path, ``..``, a symlink out), and naming the band's file for an algorithm that cannot be read.
    """
    obj = decode_json(text, source, FormatError, "a library file")
    if is_topology_document(obj):
        raise FormatError(source, None, "a topology file, not an algorithm library", repr(LIBRARY_SCHEMA))
    if not isinstance(obj, dict) or obj.get("schema") != LIBRARY_SCHEMA:
        raise FormatError(source, "schema", "not a taccl library file", repr(LIBRARY_SCHEMA))
    provenance = provenance_from_json(obj.get("provenance"), source)
    cluster = _cluster_from_json(obj.get("cluster"), source)
    name = _typed(obj, "collective", (str,), source, "", "a collective name")
    try:
        collective = Collective(name)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in Collective)
        raise FormatError(source, "collective", f"unknown value {name!r}", f"one of {allowed}") from None
    bands = _typed(obj, "bands", (list,), source, "", "a list of band objects")
    nodes = _count(obj, "nodes", source, "", 1)
    num_ranks = _count(obj, "num_ranks", source, "", 1)
    group = _group_from_json(obj.get("group"), source, num_ranks)
    if cluster is not None and len(cluster.nodes) != nodes:
        raise FormatError(source, "cluster.nodes", f"{len(cluster.nodes)} signatures", f"one per node ({nodes})")
    return AlgorithmLibrary(
        _typed(obj, "topology", (str,), source, "", "a topology name"),
        nodes,
        collective,
        num_ranks,
        tuple(_band_from_json(band, source, f"bands[{i}]", base_dir) for i, band in enumerate(bands)),
        provenance,
        cluster,
        group,
    )


def read_library(path: str | Path | Traversable) -> AlgorithmLibrary:
    """Return the library in the file at ``path`` (a path, or a shipped package resource)."""
    if isinstance(path, str):
        path = Path(path)
    # Package resources on disk are Paths, and inside a zip zipfile.Paths: both have ``parent``.
    return parse_library(read_text(path), str(path), path.parent)


def band_part_name(name: str, part: int) -> str:
    """Return the file name of run ``part`` (0: the first) of a band split where NCCL is faster.

    >>> band_part_name("ndv2-n1-allgather-2-inplace.xml", 1)
    'ndv2-n1-allgather-2-part2-inplace.xml'
    >>> band_part_name("ndv2-n1-allgather-2.json", 0)
    'ndv2-n1-allgather-2.json'
    """
    if part == 0:
        return name
    stem, dot, extension = name.rpartition(".")
    inplace = stem.endswith("-inplace")
    return f"{stem.removesuffix('-inplace')}-part{part + 1}{'-inplace' if inplace else ''}{dot}{extension}"


def export_stem(library: AlgorithmLibrary) -> str:
    """Return how an exported band file's name starts: ``<topology>-n<nodes>[-<kind>-<first>]-<collective>``.

    A process group's library adds its kind and first member (``ndv2-n1-dp-1-allreduce``), so the
    exports of a job's kinds of group share a folder without one replacing another's files.
    """
    group = "" if library.group is None else f"-{library.group.kind}-{library.group.members[0]}"
    return f"{library.topology}-n{library.nodes}{group}-{library.collective.value}"


def earlier_band_files(
    library: AlgorithmLibrary, folder: str | Path, extension: str, keep: Collection[str]
) -> tuple[Path, ...]:
    """Return the files of ``folder`` named as an export of ``library``'s bands that ``keep`` does not name, by name.

    The exporters name a band's file ``<export_stem>-<band>[-part<n>][-inplace]<extension>``
    (``taccl_py.msccl.library.library_xml_name``, ``taccl_py.mscclpp.files.library_plan_name``);
    only such names count, so a user's own files in the folder are never touched.
    """
    stem = re.escape(f"{export_stem(library)}-")
    pattern = re.compile(stem + r"[0-9]+(-part[0-9]+)?(-inplace)?" + re.escape(extension))
    folder = Path(folder)
    if not folder.is_dir():
        return ()
    return tuple(
        sorted(
            (
                path
                for path in folder.iterdir()
                if pattern.fullmatch(path.name) and path.name not in keep and not path.is_dir()
            ),
            key=lambda path: path.name,
        )
    )


def write_band_files(
    library: AlgorithmLibrary,
    folder: str | Path,
    files: Sequence[tuple[str, str]],
    extension: str,
    replace_earlier: bool,
) -> tuple[str, ...]:
    """Write ``files`` (name, text) into ``folder``; return the names of an earlier export's files removed.

    Each file goes through a temporary name; with ``replace_earlier`` the ``earlier_band_files`` not
    overwritten are removed, and only after every new file is written.
    """
    if files:
        Path(folder).mkdir(exist_ok=True)  # the folder is the output named; its parent must exist
    for name, text in files:
        write_text_atomic(Path(folder) / name, text)
    if not replace_earlier:
        return ()
    stale = earlier_band_files(library, folder, extension, {name for name, _text in files})
    for path in stale:
        path.unlink()
    return tuple(path.name for path in stale)


def generate_library(library: AlgorithmLibrary) -> str:
    """Return the JSON text of ``library`` (the algorithm files are written separately)."""
    obj: dict[str, Any] = {
        "schema": LIBRARY_SCHEMA,
        "topology": library.topology,
        "nodes": library.nodes,
        "collective": library.collective.value,
        "num_ranks": library.num_ranks,
    }
    if library.cluster is not None:
        obj["cluster"] = {
            "fingerprint": library.cluster.fingerprint,
            "nodes": list(library.cluster.nodes),
            "description": library.cluster.description,
        }
    if library.group is not None:
        obj["group"] = {
            "kind": library.group.kind,
            "world_size": library.group.world_size,
            "members": list(library.group.members),
            "groups": [list(group) for group in library.group.groups],
            "concurrent": [list(group) for group in library.group.concurrent],
        }
    if library.provenance is not None:
        obj["provenance"] = provenance_to_json(library.provenance)
    obj["bands"] = [
        {
            "min_bytes": band.min_bytes,
            "max_bytes": band.max_bytes,
            "algorithm": band.algorithm_file,
            "simulated_time_us": band.simulated_time_us,
        }
        for band in library.bands
    ]
    return json.dumps(obj, indent=2) + "\n"


def cluster_record(topology: Any) -> ClusterRecord:
    """Return the record of the cluster ``topology`` (a ``taccl_py.topology.model.Topology``) describes."""
    from taccl_py.topology.fingerprint import cluster_fingerprint, node_signatures

    return ClusterRecord(cluster_fingerprint(topology), node_signatures(topology), topology.description)


def library_cluster_fingerprint(library: AlgorithmLibrary) -> str | None:
    """Return the fingerprint of the cluster ``library`` was made for; None when that is not known.

    A library without a ``cluster`` record gets the fingerprint of the built-in topology it names
    at its node count (computed here, never written back); None where ``topology`` names no
    built-in machine.
    """
    if library.cluster is not None:
        return library.cluster.fingerprint
    return builtin_cluster_fingerprint(library.topology, library.nodes)


def builtin_cluster_fingerprint(topology: str, nodes: int) -> str | None:
    """Return the fingerprint of built-in ``topology`` at ``nodes`` nodes; None for a name that is no built-in."""
    from taccl_py.topology.builtins import builtin_topology_name, load_topology
    from taccl_py.topology.fingerprint import cluster_fingerprint

    if builtin_topology_name(topology) is None:
        return None
    return cluster_fingerprint(load_topology(topology, nodes))


def shipped_library_dir() -> Traversable:
    """Return the folder of shipped libraries (``algorithms/``), from the installed package's data."""
    return files(SHIPPED_PACKAGE)


def shipped_library_paths(topology: str, nodes: int) -> tuple[Traversable, ...]:
    """Return the shipped library files for ``topology`` at ``nodes`` nodes (possibly none), by name."""
    folder = shipped_library_dir() / topology / f"n{nodes}"
    if not folder.is_dir():
        return ()
    return tuple(
        sorted((item for item in folder.iterdir() if item.name.endswith(".library.json")), key=lambda item: item.name)
    )


def shipped_node_counts(topology: str) -> tuple[int, ...]:
    """Return the node counts that ``topology`` has shipped libraries for, ascending (possibly none)."""
    folder = shipped_library_dir() / topology
    if not folder.is_dir():
        return ()
    return tuple(
        sorted(int(item.name[1:]) for item in folder.iterdir() if item.name[:1] == "n" and item.name[1:].isdigit())
    )
