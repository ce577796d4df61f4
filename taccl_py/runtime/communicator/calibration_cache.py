"""The automatic calibration: measured on a collective's first call, cached per group key in the user's cache folder.

A Communicator built without ``calibration=`` times its library's algorithm against the group's
own collective the first time each collective is called, at the default calibration sizes that
fall in one of the library's algorithm bands (see :func:`lazy_sizes`), and from then on runs the
group's own collective wherever that measured faster (see :mod:`taccl_py.runtime.communicator.calibration`).
The result is cached in one file per :class:`~taccl_py.runtime.communicator.calibration.CalibrationKey` (world
size, transport, device, library fingerprint and the ranks' hosts) in :func:`cache_dir`; a file
holds the collectives measured so far, and the next collective's points are added to it. Rank 0
alone reads and writes the cache and hands what it read to the other ranks, so a file on one host
cannot split the ranks' choices.

TACCL_CALIBRATION=off (or 0, false, no) turns the automatic calibration off for Communicators
that are not given ``calibration=``, e.g. in CI jobs; every rank must see the same value.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator.calibration import (
    DEFAULT_CALIBRATION_SIZES,
    DEFAULT_MARGIN,
    Calibration,
    CalibrationKey,
    CalibrationPoint,
    read_calibration,
    write_calibration,
)
from taccl_py.runtime.communicator.selection import AlgorithmChoices, Candidate

__all__ = [
    "CACHE_DIR_ENV",
    "CALIBRATION_ENV",
    "LAZY_CALIBRATION_ITERS",
    "LAZY_CALIBRATION_SIZES",
    "LAZY_CALIBRATION_WARMUP",
    "LazyCalibration",
    "automatic_calibration_on",
    "cache_dir",
    "cache_path",
    "lazy_sizes",
    "read_cached",
    "write_cached",
]

logger = logging.getLogger(__name__)

#: Turns the automatic calibration off when "off", "0", "false" or "no" (any case).
CALIBRATION_ENV = "TACCL_CALIBRATION"
#: The cache folder; unset: $XDG_CACHE_HOME/taccl_py, else ~/.cache/taccl_py (XDG base directories).
CACHE_DIR_ENV = "TACCL_CACHE_DIR"
#: Sizes (bytes) the automatic calibration may measure; those outside every algorithm band are skipped.
LAZY_CALIBRATION_SIZES = DEFAULT_CALIBRATION_SIZES
#: Timed pairs per size: the median of 5 rides out two descheduled calls, and the margin
#: (DEFAULT_MARGIN) absorbs the rest; 9, as ``calibrate`` uses, would make every first call ~2x longer.
LAZY_CALIBRATION_ITERS = 5
#: Untimed pairs per size first: the first call of ours compiles its executor.
LAZY_CALIBRATION_WARMUP = 1

_OFF = frozenset({"off", "0", "false", "no"})
_ON = frozenset({"", "on", "1", "true", "yes"})


class LazyCalibration:
    """What the automatic calibration of one Communicator knows: the collectives settled and their points.

    ``calibration`` holds the points of every settled collective (None before the first);
    ``hosts`` the ranks' hostnames and ``members`` their global ranks ("" for the whole job),
    gathered once (None before).
    """

    __slots__ = ("settled", "calibration", "hosts", "members")

    def __init__(self) -> None:
        self.settled: set[Collective] = set()
        self.calibration: Calibration | None = None
        self.hosts: str | None = None
        self.members: str | None = None

    def add(self, key: CalibrationKey, collective: Collective, points: Sequence[CalibrationPoint]) -> Calibration:
        """Add ``collective``'s points (replacing any it had) and return the calibration so far."""
        kept = () if self.calibration is None else self.calibration.points
        merged = tuple(p for p in kept if p.collective != collective.value) + tuple(points)
        self.calibration = Calibration(key, "float32", LAZY_CALIBRATION_ITERS, merged, margin=DEFAULT_MARGIN)
        return self.calibration


def automatic_calibration_on(environ: Mapping[str, str]) -> bool:
    """Return False when ``environ`` turns the automatic calibration off (TACCL_CALIBRATION), else True.

    >>> automatic_calibration_on({}), automatic_calibration_on({"TACCL_CALIBRATION": "OFF"})
    (True, False)
    """
    value = environ.get(CALIBRATION_ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value not in _ON:
        raise ArgumentError("environment", CALIBRATION_ENV, repr(environ[CALIBRATION_ENV]), "'on' or 'off'")
    return True


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Return the folder of cached calibrations: TACCL_CACHE_DIR, else $XDG_CACHE_HOME/taccl_py, else ~/.cache/taccl_py.

    >>> str(cache_dir({"TACCL_CACHE_DIR": "/tmp/c", "XDG_CACHE_HOME": "/x"})), str(cache_dir({"XDG_CACHE_HOME": "/x"}))
    ('/tmp/c', '/x/taccl_py')
    """
    if environ.get(CACHE_DIR_ENV):
        return Path(environ[CACHE_DIR_ENV])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "taccl_py"
    return Path.home() / ".cache" / "taccl_py"


def cache_path(key: CalibrationKey, folder: str | os.PathLike) -> Path:
    """Return the file in ``folder`` that caches calibrations of ``key``: readable fields, then a hash of all.

    >>> cache_path(CalibrationKey(4, "torch-gloo", "cpu", "0123", "a,a,b,b"), "/c").name[:34]
    'calibration-4ranks-torch-gloo-cpu-'
    """
    digest = hashlib.sha256(json.dumps(asdict(key), sort_keys=True).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{key.world_size}ranks-{key.transport}-{key.device}")
    return Path(folder) / f"calibration-{readable}-{digest}.json"


def read_cached(path: Path, key: CalibrationKey) -> Calibration | None:
    """Return the calibration cached in ``path`` when it is one of ``key``; None when missing, unreadable or another's.

    A cache file the user never named is not worth failing a collective for: a bad one is measured again.
    """
    if not path.exists():
        return None
    try:
        cached = read_calibration(path)
    except (ArgumentError, FormatError) as error:
        logger.info("ignoring the cached calibration %s: %s", path, error)
        return None
    return cached if cached.key == key else None


def write_cached(path: Path, calibration: Calibration, collective: Collective) -> None:
    """Write ``collective``'s points of ``calibration`` into ``path``, keeping the other collectives cached there.

    A cache that cannot be written (read-only home, full disk) costs a measurement next time, not the call.
    """
    points = tuple(p for p in calibration.points if p.collective == collective.value)
    cached = read_cached(path, calibration.key)
    if cached is not None:
        points = tuple(p for p in cached.points if p.collective != collective.value) + points
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_calibration(Calibration(calibration.key, "float32", calibration.iters, points), path)
    except (OSError, ArgumentError) as error:
        logger.warning("could not cache the calibration in %s: %s", path, error)


def lazy_sizes(choices: AlgorithmChoices, collective: Collective, sizes: Sequence[int]) -> tuple[int, ...]:
    """Return the sizes (bytes) to calibrate ``collective`` at: those of ``sizes`` that an algorithm runs.

    A band of ``choices`` that runs an algorithm at none of them adds one
    size inside it (its geometric middle, else an end), so no algorithm runs unmeasured.
    """
    chosen = {size for size in sizes if _runs(choices, collective, size) is not None}
    covered = {id(_runs(choices, collective, size)) for size in chosen}
    for candidate in choices.candidates:
        if candidate.collective is not collective or candidate.algorithm is None or id(candidate) in covered:
            continue
        low = max(1, candidate.min_bytes)
        inside = (low,) if candidate.max_bytes is None else (math.isqrt(low * candidate.max_bytes), low)
        size = next((s for s in inside if _runs(choices, collective, s) is candidate), None)
        if size is not None:
            chosen.add(size)
            covered.add(id(candidate))
    return tuple(sorted(chosen))


def _runs(choices: AlgorithmChoices, collective: Collective, size_bytes: int) -> Candidate | None:
    """Return the band that runs an algorithm for ``collective`` at ``size_bytes`` (None: none does)."""
    candidate = choices.select(collective, size_bytes)
    return candidate if candidate is not None and candidate.algorithm is not None else None
