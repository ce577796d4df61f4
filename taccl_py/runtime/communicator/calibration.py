"""Calibration: which sizes run faster with the backend's own collective ("native") on a live group.

A :class:`Calibration` holds, per collective and size, the slowest rank's median time of the
algorithm the library picks there and of the backend's own collective, measured alternately on
the same group (``taccl_py.runtime.communicator.timing.bench_sizes``). A Communicator given one runs the native
collective unless the algorithm measured faster by more than the calibration's ``margin``: two
medians of a handful of calls differ by a few percent on a busy machine even when both sides run
the same code, and a user who plugs taccl_py in should never pay for that noise.

The file form (``read_calibration``/``write_calibration``) caches it; it is keyed by what the times
depend on (world size, transport, device, the library's bands and, for the automatic calibration's
cache, the ranks' hosts), and a key that does not match the live group means "measure again". The
automatic calibration a Communicator runs by default, and its cache folder, are in
:mod:`taccl_py.runtime.communicator.calibration_cache`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from taccl_py import __version__
from taccl_py._io import decode_json, read_text, write_text_atomic
from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import NATIVE_ALGORITHM, AlgorithmLibrary, SizeBand

__all__ = [
    "CALIBRATION_FORMAT",
    "DEFAULT_CALIBRATION_ITERS",
    "DEFAULT_CALIBRATION_SIZES",
    "DEFAULT_MARGIN",
    "NATIVE",
    "Calibration",
    "calibrated_library",
    "CalibrationKey",
    "CalibrationPoint",
    "library_fingerprint",
    "measure_points",
    "read_calibration",
    "write_calibration",
]

CALIBRATION_FORMAT = "taccl-calibration/1"
#: The name a calibration gives the backend's own collective (also where the library had no algorithm).
NATIVE = NATIVE_ALGORITHM
#: Sizes (bytes, nccl-tests convention) a calibration measures unless told otherwise: 64 KB to 64 MB
#: in steps of 4x, where DDP buckets and FSDP shards fall.
DEFAULT_CALIBRATION_SIZES = tuple(65536 * 4**i for i in range(6))
#: Calls timed per side and size; the median of 9 alternating pairs rides out one descheduled call.
DEFAULT_CALIBRATION_ITERS = 9
#: How much faster (fraction of the native time) an algorithm must measure to keep its size.
DEFAULT_MARGIN = 0.05


@dataclass(frozen=True)
class CalibrationKey:
    """What measured times depend on; a calibration applies only to a group with the same key.

    ``library`` is :func:`library_fingerprint` of the Communicator's algorithm choices; ``hosts``
    the ranks' hostnames in rank order, comma-separated ("": not recorded, as in a calibration
    given by path or measured by ``Communicator.calibrate``); ``members`` a process group's global
    ranks in rank order, comma-separated ("": the whole job, or not recorded), so two groups of
    one library on the same hosts (two tensor-parallel groups) keep their own times.
    """

    world_size: int
    transport: str
    device: str
    library: str
    hosts: str = ""
    members: str = ""


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured size: the library's algorithm there (``NATIVE``: none) and both median times (µs)."""

    collective: str
    size_bytes: int
    algorithm: str
    ours_us: float
    native_us: float

    def prefers_native(self, margin: float = DEFAULT_MARGIN) -> bool:
        """Return True unless the algorithm beat the native collective here by more than ``margin`` (a fraction)."""
        return self.algorithm == NATIVE or self.ours_us * (1.0 + margin) >= self.native_us


@dataclass(frozen=True)
class Calibration:
    """Measured times of one group, and the choice they imply per (collective, size).

    ``margin`` (a fraction) is how much faster than native an algorithm must have measured to run.
    """

    key: CalibrationKey
    dtype: str
    iters: int
    points: tuple[CalibrationPoint, ...]
    taccl_py: str = __version__
    margin: float = DEFAULT_MARGIN

    def native_faster(self, collective: Collective, size_bytes: int, algorithm: str) -> bool:
        """Return True when ``collective`` of ``size_bytes`` should run natively instead of ``algorithm``.

        The verdict is that of the nearest measured size (in ratio; ties to the smaller), or of the
        other neighbour when only that one measured ``algorithm``; with no measurement of
        ``algorithm`` beside the size, the algorithm keeps it.
        """
        points = self._by_collective.get(collective.value, ())
        if not points:
            return False
        above = next((i for i, p in enumerate(points) if p.size_bytes >= size_bytes), len(points))
        neighbours = [points[i] for i in (above - 1, above) if 0 <= i < len(points)]
        neighbours.sort(key=lambda p: (abs(math.log(p.size_bytes / max(1, size_bytes))), p.size_bytes))
        for point in neighbours:
            if point.algorithm == algorithm:
                return point.prefers_native(self.margin)
        return False

    @functools.cached_property
    def _by_collective(self) -> dict[str, tuple[CalibrationPoint, ...]]:
        """Return the points per collective, by size: every call of a calibrated Communicator looks here."""
        found: dict[str, list[CalibrationPoint]] = {}
        for point in sorted(self.points, key=lambda p: p.size_bytes):
            found.setdefault(point.collective, []).append(point)
        return {collective: tuple(points) for collective, points in found.items()}

    def summary(self) -> str:
        """Return one line: how many measured sizes each side won."""
        native = sum(p.prefers_native(self.margin) for p in self.points)
        return f"native runs at {native} of {len(self.points)} measured sizes (margin {self.margin:.0%})"


def calibrated_library(library: AlgorithmLibrary, calibration: Calibration) -> AlgorithmLibrary:
    """Return ``library`` with a "native" band wherever ``calibration`` runs the backend's own collective.

    Bands are cut where the calibration's verdict can change (at a measured size, and between two
    at their geometric mean, where the nearer one changes); native pieces that touch merge.
    """
    sizes = sorted({p.size_bytes for p in calibration.points if p.collective == library.collective.value})
    cuts = {edge for size in sizes for edge in (size, size + 1)}
    for low, high in zip(sizes, sizes[1:]):
        middle = math.isqrt(low * high)  # the verdict flips just above the geometric mean; floats may blur it by one
        cuts.update((middle, middle + 1, middle + 2))
    pieces: list[SizeBand] = []
    for band in library.bands:
        edges = [band.min_bytes, *sorted(c for c in cuts if c > band.min_bytes and band.covers(c))]
        for low, high in zip(edges, [*edges[1:], band.max_bytes]):
            runs_natively = band.algorithm is None or calibration.native_faster(
                library.collective, low, band.algorithm.name
            )
            piece = (
                SizeBand(low, high, None, NATIVE_ALGORITHM)
                if runs_natively
                else replace(band, min_bytes=low, max_bytes=high)
            )
            if pieces and pieces[-1].algorithm_file == piece.algorithm_file and pieces[-1].max_bytes == low:
                piece = replace(pieces.pop(), max_bytes=high)
            pieces.append(piece)
    return replace(library, bands=tuple(pieces))


def library_fingerprint(bands: Sequence[tuple[str, int, int | None, str]]) -> str:
    """Return a short hash of (collective, min_bytes, max_bytes, algorithm name) bands, order kept.

    >>> library_fingerprint([]) == library_fingerprint(())
    True
    """
    text = json.dumps([list(band) for band in bands])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measure_points(
    communicator: Any, collectives: Sequence[Collective], sizes: Sequence[int], iters: int, warmup: int
) -> tuple[CalibrationPoint, ...]:
    """Return, per collective and size, ``communicator``'s library algorithm timed against the native collective.

    Every rank must call this alike; the times are the slowest rank's medians over ``iters``
    float32 calls (``taccl_py.runtime.communicator.timing.bench_sizes``), so every rank gets the same points.
    """
    from taccl_py.runtime.communicator.timing import bench_sizes  # needs torch

    rows = [
        row
        for collective in collectives
        for row in bench_sizes(communicator, collective, sizes, iters=iters, warmup=warmup)
    ]
    return tuple(
        CalibrationPoint(
            row.collective,
            row.size_bytes,
            NATIVE if row.algorithm == "torch" else row.algorithm,
            row.ours_time_us,
            row.torch_time_us,
        )
        for row in rows
    )


def write_calibration(calibration: Calibration, path: str | Path) -> None:
    """Write ``calibration`` as JSON to ``path`` (whole or not at all)."""
    body = {"format": CALIBRATION_FORMAT, **asdict(calibration)}
    for optional in ("hosts", "members"):  # a key without them reads in taccl_py versions from before them
        if not getattr(calibration.key, optional):
            del body["key"][optional]
    write_text_atomic(path, json.dumps(body, indent=1) + "\n")


def read_calibration(path: str | Path) -> Calibration:
    """Return the calibration in ``path``; raise FormatError naming the file and the fault.

    An unreadable file, or one past the input limit (``taccl_py._io.read_text``), is an ArgumentError.
    """
    source = str(path)
    body = decode_json(read_text(path, ArgumentError), source, FormatError, "a calibration written by taccl_py")
    if not isinstance(body, dict) or body.get("format") != CALIBRATION_FORMAT:
        got = body.get("format") if isinstance(body, dict) else type(body).__name__
        raise FormatError(source, "format", f"{got!r}", CALIBRATION_FORMAT)
    try:
        key = CalibrationKey(**_fields(body["key"], CalibrationKey, source))
        points = tuple(CalibrationPoint(**_fields(p, CalibrationPoint, source)) for p in body["points"])
        margin = float(body.get("margin", DEFAULT_MARGIN))  # written before margins existed: the default
        calibration = Calibration(key, str(body["dtype"]), int(body["iters"]), points, str(body["taccl_py"]), margin)
    except KeyError as error:
        raise FormatError(source, str(error.args[0]), "missing", "every field of a calibration") from error
    except (TypeError, ValueError) as error:
        raise FormatError(source, None, str(error), "a calibration written by taccl_py") from error
    if not 0.0 <= calibration.margin < 1.0:
        raise FormatError(source, "margin", f"{calibration.margin!r}", "a fraction in [0, 1)")
    for point in points:
        if point.collective not in {c.value for c in Collective}:
            raise FormatError(source, "points.collective", f"{point.collective!r}", "a collective name")
    return calibration


_TYPES = {"int": int, "float": float, "str": str}


def _fields(obj: Any, cls: type, source: str) -> dict[str, Any]:
    """Return ``obj``'s values for ``cls``'s fields, each checked against its type (those with defaults optional)."""
    if not isinstance(obj, dict):
        raise FormatError(source, cls.__name__, type(obj).__name__, "an object")
    out = {}
    optional = {field.name for field in fields(cls) if field.default is not MISSING}
    for name, kind in cls.__annotations__.items():
        if name not in obj and name in optional:
            continue
        if name not in obj:
            raise FormatError(source, f"{cls.__name__}.{name}", "missing", "every field of a calibration")
        value, want = obj[name], _TYPES[kind]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if want is float else type(value) is want
        if not ok:
            raise FormatError(source, f"{cls.__name__}.{name}", f"{value!r}", kind)
        out[name] = want(value)
    unknown = set(obj) - set(cls.__annotations__)
    if unknown:
        raise FormatError(source, cls.__name__, f"unknown field {sorted(unknown)[0]!r}", "no other fields")
    return out
