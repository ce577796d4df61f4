"""Which algorithm a Communicator runs: collect candidates from a library spec, pick by size.

A spec is an Algorithm, an AlgorithmLibrary, a path (a ``*.library.json`` from ``taccl synthesize
--sizes``, one algorithm ``.json``/``.xml``, or a folder of libraries or of folders of them, as
``--parallel`` writes), the name of a built-in topology (its shipped libraries), a Candidate
already collected, or a sequence of these. Pure Python: no torch here.

Every candidate knows the cluster it was made for (``MadeFor``): a library's ``cluster`` record, or
else the built-in topology and node count it names; an algorithm's ``cluster_fingerprint``
metadata, or else nothing. ``match_cluster`` keeps the candidates made for the live cluster.

A band whose algorithm has switch steps (``mrs``, ``ms``: NVLink SHARP multimem) runs no
point-to-point transport of ours (``compile_rank_plan`` refuses it): ``collect_algorithms`` makes
it a "native" band, logged once, so the group's own collective runs those sizes (NCCL's runs NVLS
on such a machine) and no call errors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taccl_py.errors import ArgumentError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import (
    NATIVE_ALGORITHM,
    AlgorithmLibrary,
    ClusterRecord,
    GroupRecord,
    builtin_cluster_fingerprint,
    read_library,
    shipped_library_paths,
    shipped_node_counts,
)

__all__ = [
    "CLUSTER_METADATA_KEY",
    "AlgorithmChoices",
    "Candidate",
    "MadeFor",
    "collect_algorithms",
    "collective_size_bytes",
    "gather_candidates",
    "library_specs",
    "match_cluster",
]

#: The algorithm metadata key that names the fingerprint of the cluster an algorithm file was made for.
CLUSTER_METADATA_KEY = "cluster_fingerprint"

_SOURCE = "Communicator"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MadeFor:
    """The cluster a candidate was made for: its record, or a built-in topology and node count, or nothing known."""

    record: ClusterRecord | None = None
    topology: str | None = None
    nodes: int | None = None

    def fingerprint(self) -> str | None:
        """Return the cluster fingerprint (None: not known, so no live cluster matches it)."""
        if self.record is not None:
            return self.record.fingerprint
        if self.topology is None or self.nodes is None:
            return None
        return builtin_cluster_fingerprint(self.topology, self.nodes)

    def describe(self) -> str:
        """Return what it was made for, in words: ``ndv2 n2 (fingerprint F)``."""
        where = f"{self.topology} n{self.nodes}" if self.topology is not None else "an algorithm"
        return f"{where} (fingerprint {self.fingerprint() or 'unknown'})"


@dataclass(frozen=True)
class Candidate:
    """What runs ``collective`` on ``num_ranks`` ranks for ``min_bytes`` <= size < ``max_bytes`` (None: unbounded).

    ``algorithm`` None is a library's "native" band: the backend's own collective runs there.
    ``group``: the process groups its library was made for (None: all of its ranks).
    """

    algorithm: Algorithm | None
    min_bytes: int
    max_bytes: int | None
    origin: str
    collective: Collective
    num_ranks: int
    made_for: MadeFor = MadeFor()
    group: GroupRecord | None = None

    @classmethod
    def of(cls, algorithm: Algorithm, origin: str) -> Candidate:
        """Return the candidate of one algorithm over the size range it was saved with."""
        fingerprint = algorithm.meta(CLUSTER_METADATA_KEY)
        made_for = MadeFor(ClusterRecord(fingerprint, ())) if fingerprint else MadeFor()
        return cls(
            algorithm,
            algorithm.min_bytes,
            algorithm.max_bytes,
            origin,
            algorithm.collective,
            algorithm.num_ranks,
            made_for,
        )

    @property
    def name(self) -> str:
        """Return the algorithm's name, or ``"native"``."""
        return NATIVE_ALGORITHM if self.algorithm is None else self.algorithm.name

    def covers(self, size_bytes: int) -> bool:
        """Return True when ``size_bytes`` falls in the band."""
        return self.min_bytes <= size_bytes and (self.max_bytes is None or size_bytes < self.max_bytes)


@dataclass(frozen=True)
class AlgorithmChoices:
    """The candidates for one world size, in priority order; ``rejected``: those made for another cluster."""

    world_size: int
    candidates: tuple[Candidate, ...]
    rejected: tuple[Candidate, ...] = ()

    @property
    def collectives(self) -> frozenset[Collective]:
        """Return the collectives some candidate implements."""
        return frozenset(candidate.collective for candidate in self.candidates)

    def select(self, collective: Collective, size_bytes: int) -> Candidate | None:
        """Return the first candidate for ``collective`` whose band covers ``size_bytes``, or None."""
        for candidate in self.candidates:
            if candidate.collective is collective and candidate.covers(size_bytes):
                return candidate
        return None

    def rejected_for(self, collective: Collective, size_bytes: int) -> tuple[Candidate, ...]:
        """Return the rejected candidates that would have covered ``size_bytes`` of ``collective``."""
        return tuple(c for c in self.rejected if c.collective is collective and c.covers(size_bytes))


def match_cluster(choices: AlgorithmChoices, fingerprint: str | None) -> AlgorithmChoices:
    """Return ``choices`` keeping the candidates made for the cluster ``fingerprint``; the others go to ``rejected``.

    A ``fingerprint`` of None (no usable live cluster) rejects every candidate.
    """
    known: dict[MadeFor, str | None] = {}  # one built-in topology load per library kind, not per band
    kept, rejected = [], list(choices.rejected)
    for candidate in choices.candidates:
        if candidate.made_for not in known:
            known[candidate.made_for] = candidate.made_for.fingerprint()
        made = known[candidate.made_for]
        (kept if fingerprint is not None and made == fingerprint else rejected).append(candidate)
    return AlgorithmChoices(choices.world_size, tuple(kept), tuple(rejected))


def collective_size_bytes(collective: Collective, input_bytes: int, output_bytes: int) -> int:
    """Return the nccl-tests size of a call: allgather output, reducescatter input, allreduce buffer, alltoall input.

    >>> collective_size_bytes(Collective.ALLGATHER, 100, 400)
    400
    """
    if collective is Collective.ALLGATHER:
        return output_bytes
    return input_bytes


def _from_library(library: AlgorithmLibrary, origin: str) -> list[Candidate]:
    made_for = MadeFor(library.cluster, library.topology, library.nodes)
    return [
        Candidate(
            band.algorithm,
            band.min_bytes,
            band.max_bytes,
            f"{origin} ({band.algorithm_file})",
            library.collective,
            library.num_ranks if band.algorithm is None else band.algorithm.num_ranks,
            made_for,
            library.group,
        )
        for band in library.bands
    ]


def _read_path(path: Path) -> list[Candidate]:
    if path.is_dir():
        # one level down too: ``--parallel`` writes one folder per placement class (tp-0/, dp-0/, ...)
        found = sorted(path.glob("*.library.json")) + sorted(path.glob("*/*.library.json"))
        if not found:
            raise ArgumentError(
                str(path),
                "library",
                "folder holds no *.library.json",
                "a library file, an algorithm file or a topology name",
            )
        return [c for item in found for c in _read_path(item)]
    if path.name.endswith(".library.json"):
        return _from_library(read_library(path), str(path))
    from taccl_py.files import read_any_algorithm  # imports the verifier; only when a file is given

    algorithm = read_any_algorithm(path)
    return [Candidate.of(algorithm, str(path))]


def _topology_candidates(name: str, nodes: int | None, world_size: int) -> list[Candidate]:
    """Return the shipped libraries of topology ``name`` that run on ``world_size`` ranks."""
    node_counts = [nodes] if nodes is not None else shipped_node_counts(name)
    libraries = [read_library(path) for count in node_counts for path in shipped_library_paths(name, count)]
    fitting = [lib for lib in libraries if lib.num_ranks == world_size]
    if libraries and not fitting:
        counts = sorted({lib.num_ranks for lib in libraries})
        where = f"{name} at {nodes} nodes" if nodes is not None else name
        raise ArgumentError(
            _SOURCE,
            "world_size",
            f"{world_size} ranks, but the shipped algorithms of {where} run on {counts} ranks",
            "a world size of the topology",
        )
    return [c for lib in fitting for c in _from_library(lib, f"{name} n{lib.nodes}")]


def _topology_name(text: str) -> str | None:
    """Return the canonical built-in topology name ``text`` (any case, or an alias) names, or None."""
    if shipped_node_counts(text):
        return text
    try:
        from taccl_py.topology.builtins import builtin_topology_name
    except ImportError:  # the topology package is optional for the runtime
        return None
    name = builtin_topology_name(text)
    if name is not None:
        return name
    # A machine with shipped libraries but no built-in topology file: aliases name only built-ins.
    return text.lower() if shipped_node_counts(text.lower()) else None


def _collect_one(spec: Any, nodes: int | None, world_size: int) -> list[Candidate]:
    if isinstance(spec, Candidate):
        return [spec]
    if isinstance(spec, Algorithm):
        return [Candidate.of(spec, spec.name)]
    if isinstance(spec, AlgorithmLibrary):
        return _from_library(spec, f"library of {spec.topology}")
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if path.exists():
            return _read_path(path)
        name = _topology_name(spec) if isinstance(spec, str) and os.sep not in spec else None
        if name is not None:
            return _topology_candidates(name, nodes, world_size)
        raise ArgumentError(
            str(spec),
            "library",
            "neither a file nor a built-in topology",
            "a library or algorithm file, or a topology name",
        )
    raise ArgumentError(
        _SOURCE,
        "library",
        f"{type(spec).__name__} {spec!r}",
        "an Algorithm, an AlgorithmLibrary, a path or a topology name",
    )


def collect_algorithms(
    library: Any, world_size: int, *, topology: str | None = None, nodes: int | None = None
) -> AlgorithmChoices:
    """Return the algorithms a Communicator on ``world_size`` ranks may run, in priority order.

    Parameters
    ----------
    library : Algorithm, AlgorithmLibrary, str, PathLike, sequence of these, or None
        Where the algorithms come from (see the module notes).
    world_size : int
        The process group's size.
    topology : str, optional
        A built-in topology whose shipped libraries come after ``library``'s entries.
    nodes : int, optional
        The node count of ``topology`` (or of a topology name in ``library``); None tries all.

    Raises
    ------
    ArgumentError
        A given algorithm or library is for another world size, a path does not exist and is
        no topology name, or a topology's shipped algorithms are all for other world sizes.

    Examples
    --------
    >>> collect_algorithms(None, 4).candidates
    ()
    """
    candidates: list[Candidate] = []
    for spec in library_specs(library, topology):
        for candidate in gather_candidates(spec, world_size, nodes=nodes):
            if candidate.num_ranks != world_size:
                raise ArgumentError(
                    candidate.origin,
                    "num_ranks",
                    f"{candidate.name} runs on {candidate.num_ranks} ranks, the group has {world_size}",
                    "an algorithm for the group's world size",
                )
            candidates.append(_runnable(candidate))
    return AlgorithmChoices(world_size, tuple(candidates))


def library_specs(library: Any, topology: str | None = None) -> list[Any]:
    """Return the specs ``library`` (one or a sequence) and ``topology`` name, in priority order.

    >>> library_specs(["a.library.json", "b.json"], "ndv2")
    ['a.library.json', 'b.json', 'ndv2']
    """
    specs: list[Any] = []
    if library is not None:
        specs += list(library) if isinstance(library, Sequence) and not isinstance(library, str) else [library]
    if topology is not None:
        specs.append(topology)
    return specs


def gather_candidates(spec: Any, world_size: int, *, nodes: int | None = None) -> list[Candidate]:
    """Return the candidates of one spec, of any rank count; a topology name's shipped ones of ``world_size`` ranks.

    Raises ``ArgumentError`` (field ``world_size``) when a topology name ships none for ``world_size``
    ranks, and as :func:`collect_algorithms` for a spec that names nothing readable.
    """
    return _collect_one(spec, nodes, world_size)


def _runnable(candidate: Candidate) -> Candidate:
    """Return ``candidate``, or its native form where its algorithm has switch steps (see the module notes)."""
    algorithm = candidate.algorithm
    if algorithm is None or not algorithm.uses_switch:
        return candidate
    high = "up" if candidate.max_bytes is None else f"to {candidate.max_bytes} B"
    logger.info(
        "%s: %s %s uses switch steps (NVLink SHARP), which no point-to-point transport runs; "
        "sizes from %d B %s run the group's own collective (NCCL: NVLS)",
        candidate.origin,
        candidate.collective.value,
        algorithm.name,
        candidate.min_bytes,
        high,
    )
    return replace(candidate, algorithm=None)
