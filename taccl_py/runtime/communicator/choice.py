"""What a Communicator runs for each call: its library's band, the live cluster's check, the calibration's verdict.

:class:`AlgorithmChoice` is the part of :class:`~taccl_py.runtime.communicator.Communicator` that
decides, per call, between a library algorithm and torch.distributed's own collective ("native"):
the library's size band for the collective (see :mod:`taccl_py.runtime.communicator.selection`), with the bands
made for another cluster than the live one set aside and warned about once per collective (see
:mod:`taccl_py.runtime.communicator.live_cluster`), then the calibration's verdict where one was measured or
read (see :mod:`taccl_py.runtime.communicator.calibration`), or measured on the collective's first call by
default (see :mod:`taccl_py.runtime.communicator.calibration_cache`); a call whose tensors alias runs the algorithm's
in-place form (see :mod:`taccl_py.runtime.executor.inplace_calls`). The Communicator's construction,
executors and collective methods are in :mod:`taccl_py.runtime.communicator`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from taccl_py.errors import ArgumentError, FormatError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.collectives import Collective
from taccl_py.runtime.communicator import calibration_cache
from taccl_py.runtime.communicator.calibration import (
    DEFAULT_CALIBRATION_ITERS,
    DEFAULT_CALIBRATION_SIZES,
    DEFAULT_MARGIN,
    Calibration,
    CalibrationKey,
    library_fingerprint,
    measure_points,
    read_calibration,
    write_calibration,
)
from taccl_py.runtime.communicator.calibration_cache import (
    LazyCalibration,
    automatic_calibration_on,
    cache_dir,
    cache_path,
    lazy_sizes,
    read_cached,
    write_cached,
)
from taccl_py.runtime.communicator.group_log import group_warning_level
from taccl_py.runtime.communicator.live_cluster import LiveCluster, resolve_live_cluster, warn_other_cluster
from taccl_py.runtime.communicator.selection import AlgorithmChoices, Candidate, collect_algorithms, match_cluster
from taccl_py.runtime.executor.inplace_calls import INPLACE_COLLECTIVES, InplaceForms

__all__ = ["AlgorithmChoice"]

# The Communicator's log lines keep its module's logger name, the one users and tests listen to.
logger = logging.getLogger("taccl_py.runtime.communicator")
_SOURCE = "Communicator"


class AlgorithmChoice:
    """The Communicator's choice per call: a library algorithm, or torch.distributed's own collective.

    A base of :class:`~taccl_py.runtime.communicator.Communicator`, which sets ``group``, ``rank``,
    ``world_size`` and ``transport``; it calls :meth:`_collect_choices` before making its
    transport and :meth:`_use_calibration` after.
    """

    __slots__ = ("choices", "calibration", "cluster", "_logged", "_inplace_forms", "_lazy")

    group: Any
    rank: int
    world_size: int
    transport: Any

    def _collect_choices(
        self,
        library: Any,
        topology: str | None,
        nodes: int | None,
        cluster: Any,
        nic_down: Any,
        nic_speed: Any,
        sysfs_root: str | os.PathLike | None,
    ) -> None:
        """Take the library's algorithms for this world size; with ``cluster``, only those made for it."""
        self.choices: AlgorithmChoices = collect_algorithms(library, self.world_size, topology=topology, nodes=nodes)
        self.cluster: LiveCluster | None = None
        if cluster is not None:
            self.cluster = resolve_live_cluster(
                cluster, nic_down, nic_speed, sysfs_root, self.world_size, self._exchange_texts
            )
            self.choices = match_cluster(self.choices, self.cluster.fingerprint)
            if self.choices.rejected:
                logger.info(
                    "%d of %d algorithm bands were made for another cluster than %s; they will not run",
                    len(self.choices.rejected),
                    len(self.choices.rejected) + len(self.choices.candidates),
                    self.cluster.describe(),
                )
        self._logged: set[tuple] = set()
        self._inplace_forms = InplaceForms()

    def _exchange_texts(self, text: str) -> list[str]:
        """Return every rank's ``text``, in rank order (all ranks call it alike)."""
        if self.world_size == 1:
            return [text]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, text, group=self.group)
        return [str(item) for item in gathered]

    def _use_calibration(self, calibration: Any) -> None:
        """Take ``calibration`` (see the Communicator's parameter): True or None, False, a Calibration or a path."""
        self.calibration: Calibration | None = None
        self._lazy: LazyCalibration | None = None
        if calibration is True or calibration is None:
            if automatic_calibration_on(os.environ):
                self._lazy = LazyCalibration()
        elif isinstance(calibration, Calibration):
            if calibration.key != self.calibration_key():
                raise ArgumentError(
                    _SOURCE, "calibration", f"measured on {calibration.key}", f"one of {self.calibration_key()}"
                )
            self.calibration = calibration
        elif isinstance(calibration, (str, os.PathLike)):
            self.load_or_calibrate(calibration)
        elif calibration is not False:
            raise ArgumentError(
                _SOURCE, "calibration", repr(calibration), "True, None or False, a file path, or a Calibration"
            )

    @property
    def automatic_calibration(self) -> Calibration | None:
        """Return what the automatic calibration measured or read so far (None: nothing yet, or it is off)."""
        return None if self._lazy is None else self._lazy.calibration

    # -- selection --------------------------------------------------------------------------------

    def algorithm_for(
        self, collective: Collective | str, size_bytes: int, *, inplace: bool = False
    ) -> Algorithm | None:
        """Return the algorithm a call of ``collective`` with nccl-tests size ``size_bytes`` runs (None: torch's).

        None where no band covers the size, where the band is a library's "native" one, and where
        the calibration given or made by :meth:`calibrate` measured torch's collective faster (not
        the automatic one: it is measured inside a call, perhaps on another thread, so a caller
        that routes by this answer gets the same one on every rank). With ``inplace``, the schedule an
        in-place call runs (see :func:`~taccl_py.runtime.executor.inplace_calls.is_inplace_call`): the
        algorithm when it is in place, its verified in-place variant (``inplace`` True, metadata
        ``inplace_of``), or the out-of-place algorithm where no variant verifies (run on a copy).
        """
        collective = Collective(collective)
        return self._form_for_call(collective, self._choose(collective, int(size_bytes))[1], inplace)

    def _form_for_call(
        self, collective: Collective, algorithm: Algorithm | None, inplace_call: bool
    ) -> Algorithm | None:
        """Return the schedule a call runs: ``algorithm``, or an in-place call's in-place form where one verifies."""
        if algorithm is None or not inplace_call or collective not in INPLACE_COLLECTIVES:
            return algorithm
        form = self._inplace_forms.form(algorithm)
        return algorithm if form is None else form

    def _choose_for_call(self, collective: Collective, size_bytes: int) -> tuple[Candidate | None, Algorithm | None]:
        """Return what a call runs, as :meth:`_choose`, then the automatic calibration's verdict (measured if due)."""
        lazy = self._lazy
        if lazy is None:
            return self._choose(collective, size_bytes)
        self._calibrate_lazily(collective)
        candidate, algorithm = self._choose(collective, size_bytes)
        if algorithm is None or lazy.calibration is None:
            return candidate, algorithm
        return candidate, None if lazy.calibration.native_faster(collective, size_bytes, algorithm.name) else algorithm

    def _choose(self, collective: Collective, size_bytes: int) -> tuple[Candidate | None, Algorithm | None]:
        """Return the band covering the size (None: none) and the algorithm to run (None: torch's)."""
        candidate = self.choices.select(collective, size_bytes)
        if candidate is None or candidate.algorithm is None:
            return candidate, None
        if self.calibration is not None and self.calibration.native_faster(
            collective, size_bytes, candidate.algorithm.name
        ):
            return candidate, None
        return candidate, candidate.algorithm

    # -- calibration ------------------------------------------------------------------------------

    def calibration_key(self) -> CalibrationKey:
        """Return what this Communicator's measured times depend on (see ``calibration``)."""
        bands = [(c.collective.value, c.min_bytes, c.max_bytes, c.name) for c in self.choices.candidates]
        device = torch.device(self.transport.device).type
        return CalibrationKey(self.world_size, self.transport.name, device, library_fingerprint(bands))

    def calibrate(
        self,
        sizes: Sequence[int] = DEFAULT_CALIBRATION_SIZES,
        *,
        collectives: Sequence[Collective | str] | None = None,
        iters: int = DEFAULT_CALIBRATION_ITERS,
        warmup: int = 1,
        margin: float = DEFAULT_MARGIN,
        path: str | os.PathLike | None = None,
    ) -> Calibration:
        """Time the library's algorithm against the group's own collective at ``sizes`` (bytes); use the result.

        Every rank must call this with the same arguments; all get the same calibration (times are
        the slowest rank's, medians over ``iters`` float32 calls each). ``collectives`` defaults to
        those the library has algorithms for. An algorithm keeps a size only where it measured
        faster than native by more than ``margin`` (a fraction). Rank 0 writes the result to
        ``path`` when given. The result replaces the automatic calibration, which stops.
        """
        if not 0.0 <= margin < 1.0:
            raise ArgumentError(_SOURCE, "margin", f"{margin!r}", "a fraction in [0, 1)")
        if collectives is None:
            collectives = [c for c in Collective if c in self.choices.collectives]
        self._lazy = None  # this calibration replaces the automatic one, which must not start inside it
        self.calibration = None  # time the library's algorithms, not an earlier calibration's choice
        points = measure_points(self, [Collective(c) for c in collectives], sizes, iters, warmup)
        self.calibration = Calibration(self.calibration_key(), "float32", iters, points, margin=margin)
        if path is not None and self.rank == 0:
            write_calibration(self.calibration, path)
        logger.info("calibrated %d ranks on %s: %s", self.world_size, self.transport.name, self.calibration.summary())
        return self.calibration

    def load_or_calibrate(
        self, path: str | os.PathLike, sizes: Sequence[int] = DEFAULT_CALIBRATION_SIZES, **options: Any
    ) -> Calibration:
        """Use the calibration cached in ``path`` when it fits this group, else :meth:`calibrate` and write it there.

        Every rank must call this alike. Rank 0 reads the file and hands it to every rank, so all
        ranks choose alike even without a shared file system. ``sizes`` and ``options`` go to
        :meth:`calibrate` when measuring; a ``margin`` among them also applies to a cached file.
        The result replaces the automatic calibration, which stops.
        """
        path = Path(path)
        self._lazy = None  # the file (or its measurement) replaces the automatic calibration
        found: Any = None
        if self.rank == 0 and path.exists():
            try:
                cached = read_calibration(path)
            except FormatError as error:  # every rank raises it, instead of waiting for rank 0
                found = error
            else:
                found = cached if cached.key == self.calibration_key() else None
                if found is None:
                    logger.info("%s was measured on another group or library (%s); measuring again", path, cached.key)
        found = self._from_rank0(found)
        if isinstance(found, FormatError):
            raise found
        if found is None:
            return self.calibrate(sizes, path=path, **options)
        self.calibration = found if "margin" not in options else replace(found, margin=options["margin"])
        logger.info("calibration from %s: %s", path, self.calibration.summary())
        return self.calibration

    def _from_rank0(self, value: Any) -> Any:
        """Return group rank 0's ``value`` on every rank (a broadcast on the group; all ranks call it alike)."""
        if self.world_size == 1:
            return value
        box = [value]
        source = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.broadcast_object_list(box, src=source, group=self.group)
        return box[0]

    def _calibrate_lazily(self, collective: Collective) -> None:
        """Settle ``collective`` for the automatic calibration on its first call: read rank 0's cache, or measure.

        Every rank reaches this at the same call (the first of ``collective``) and makes the same
        group calls: the hosts' exchange (once), rank 0's broadcast of what it read, and the
        measurement. The collective is settled first, so the measurement's own calls of it do
        not start another.
        """
        lazy = self._lazy
        if lazy is None or collective in lazy.settled:
            return
        lazy.settled.add(collective)
        sizes = lazy_sizes(self.choices, collective, calibration_cache.LAZY_CALIBRATION_SIZES)
        if not sizes:  # the library runs no algorithm for it: nothing to weigh
            return
        if lazy.hosts is None:
            # the job's ranks: a subgroup's own ranks would not tell two groups of one library apart
            job = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (self.rank, self.world_size)
            texts = self._exchange_texts(f"{socket.gethostname()} {job[0]}")
            hosts, ranks = zip(*(text.split(" ") for text in texts))
            whole_job = list(map(int, ranks)) == list(range(job[1]))
            lazy.hosts, lazy.members = ",".join(hosts), "" if whole_job else ",".join(ranks)
        key = replace(self.calibration_key(), hosts=lazy.hosts, members=lazy.members)
        path = cache_path(key, cache_dir(os.environ))
        cached = read_cached(path, key) if self.rank == 0 else None
        points = self._from_rank0(
            None if cached is None else tuple(p for p in cached.points if p.collective == collective.value) or None
        )
        measured = points is None
        start = time.perf_counter()
        if measured:
            iters, warmup = calibration_cache.LAZY_CALIBRATION_ITERS, calibration_cache.LAZY_CALIBRATION_WARMUP
            points = measure_points(self, [collective], sizes, iters, warmup)
        calibration = lazy.add(key, collective, points)
        if measured and self.rank == 0:
            write_cached(path, calibration, collective)
        logger.info(
            "%s on %d ranks (%s, %s): %s %s; %s",
            collective.value,
            self.world_size,
            self.transport.name,
            key.device,
            f"calibrated at {len(points)} sizes in {time.perf_counter() - start:.1f} s, cached in"
            if measured
            else "calibration read from",
            path if self.rank == 0 else f"rank 0's {path.name}",
            replace(calibration, points=tuple(points)).summary(),
        )

    def _log_fallback(self, collective: Collective, size_bytes: int) -> None:
        if self.cluster is not None:
            if warn_other_cluster(logger, self.choices, self.cluster, collective, size_bytes, self._logged, self.rank):
                return
        if collective not in self._logged:  # one line per collective, not one per call
            self._logged.add(collective)
            logger.log(  # a warning on rank 0: shown by default, as the README promises, once per job
                group_warning_level(self.rank),
                "no taccl algorithm for %s of %d bytes on %d ranks; using torch.distributed's own (logged once per "
                "collective)",
                collective.value,
                size_bytes,
                self.world_size,
            )

    def _log_split_sizes(self, output_splits: Sequence[int] | None, input_splits: Sequence[int] | None) -> None:
        key = (Collective.ALLTOALL, "split sizes")
        if key not in self._logged:  # one line, not one per call: MoE all-to-alls repeat every step
            self._logged.add(key)
            logger.log(
                group_warning_level(self.rank),
                "all_to_all with split sizes (input %s, output %s) on %d ranks: taccl algorithms move equal blocks "
                "that only a call without split sizes promises on every rank; using torch.distributed's own "
                "all_to_all_single (logged once)",
                "none" if not input_splits else list(input_splits),
                "none" if not output_splits else list(output_splits),
                self.world_size,
            )
