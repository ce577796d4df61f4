"""Measure α and bandwidth between ranks with point-to-point transfers: ``taccl profile``.

Every rank calls :func:`run_profile`. Each size is timed ``repeats`` times after ``warmup``
untimed samples. A sample is ``rounds`` consecutive rounds of the pattern with no barrier between
them (a round: post every send and receive, wait for the receives; the sends are waited at the
end), as a collective's steps follow each other; it counts the slowest rank's time from a barrier
to the end of its last round (on a GPU, of the device work), divided by ``rounds``. The medians are fitted by
:func:`~taccl_py.topology.measured.fit_samples`.

Without a topology the group is taken as one host (gloo over loopback, or one GPU box): a lone
pair 0 → 1 gives each rank's own bandwidth and a ring shift (every rank sends to the next at
once) the capacity the ranks share; :func:`measured_topology` builds the star model of
:func:`~taccl_py.topology.measured.host_topology`. With a topology (probed or built-in) one
representative pair per link class (NVLink, PCIe, NIC ...) is timed alone, as TACCL's profiler
does, and merged into it.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from taccl_py import __version__
from taccl_py.errors import ArgumentError
from taccl_py.runtime.communicator import Communicator
from taccl_py.topology.builtins import load_topology
from taccl_py.topology.measured import (
    DEFAULT_PROFILE_REPEATS,
    ClassFit,
    HostProfile,
    ProfileProvenance,
    fit_samples,
    host_topology,
    merge_measured,
    pairs_by_class,
)
from taccl_py.topology.model import LinkKind, Topology
from taccl_py.units import format_size

__all__ = [
    "PatternSamples",
    "ProfileOutcome",
    "ProfileSamples",
    "ProfileSpec",
    "check_topology_ranks",
    "fit_profile",
    "measured_topology",
    "profile_worker",
    "run_profile",
]

logger = logging.getLogger(__name__)


_Transfers = tuple[tuple[int, int], ...]  # (src, dst) rank pairs moving at once


@dataclass(frozen=True)
class ProfileSpec:
    """What ``taccl profile`` measures: sizes (bytes), repeats, and the topology whose classes to time (None: host)."""

    sizes: tuple[int, ...]
    repeats: int = DEFAULT_PROFILE_REPEATS
    warmup: int = 1
    topology: str | None = None  # a built-in name or file: one pair per link class, merged into it
    timeout_s: float = 60.0
    date: str = ""  # recorded in the provenance; "" means today (UTC)
    rounds: int | None = None  # rounds per timed sample; None: world size - 1 (a ring's steps), 1 with a topology

    def __post_init__(self) -> None:
        if len(set(self.sizes)) < 2:
            raise ArgumentError(None, "sizes", f"{len(set(self.sizes))} distinct size(s)", "at least two sizes to fit")
        if self.repeats < 1 or self.warmup < 0:
            raise ArgumentError(
                None,
                "repeats",
                f"{self.repeats} repeats, {self.warmup} warm-up",
                "1 or more repeats, 0 or more warm-up",
            )
        if self.rounds is not None and self.rounds < 1:
            raise ArgumentError(None, "rounds", f"{self.rounds} rounds", "1 or more rounds per sample")


@dataclass(frozen=True)
class PatternSamples:
    """One timed pattern: transfers at once (src, dst), and the slowest rank's µs per round, per repeat, per size."""

    name: str
    transfers: _Transfers
    samples_us: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class ProfileSamples:
    """What every rank measured: the host's pair and ring shift, or one pair per link class of ``topology``."""

    provenance: ProfileProvenance
    topology: str | None
    patterns: tuple[PatternSamples, ...]


@dataclass(frozen=True)
class ProfileOutcome:
    """The fits of a profile: the host model's, or one per link class of the profiled topology."""

    provenance: ProfileProvenance
    host: HostProfile | None
    classes: tuple[ClassFit, ...]


def check_topology_ranks(topology: Topology, world_size: int, option: str = "--topology") -> None:
    """Raise ``ArgumentError`` unless ``topology`` has one GPU per rank of a ``world_size`` group."""
    if topology.num_ranks != world_size:
        raise ArgumentError(
            topology.name,
            option,
            f"{topology.num_ranks} GPUs for {world_size} ranks",
            f"one GPU per rank ({world_size})",
        )


def run_profile(spec: ProfileSpec) -> ProfileSamples:
    """Time ``spec`` on this rank of the group torchrun's environment describes; every rank must call it.

    Initialises torch.distributed from the environment when needed (``Communicator.from_env``).
    Every rank returns the same samples. Raises ``ArgumentError`` for fewer than 2 ranks or a
    topology of another rank count.
    """
    comm = Communicator.from_env(None, timeout_s=spec.timeout_s)
    group, device, world_size = comm.group, comm.transport.device, comm.world_size
    if world_size < 2:
        raise ArgumentError(None, "world size", f"{world_size} rank", "2 or more ranks to time transfers between")
    if spec.topology is None:
        patterns = {"lone pair": ((0, 1),), "ring shift": tuple((r, (r + 1) % world_size) for r in range(world_size))}
    else:
        topology = load_topology(spec.topology)
        check_topology_ranks(topology, world_size)
        patterns = {kind.value: (pairs[0],) for kind, pairs in pairs_by_class(topology).items()}
    # A host's pair and ring shift run as a ring's steps follow each other; a class's lone pair, as
    # TACCL's profiler times it, one transfer at a time.
    rounds = spec.rounds if spec.rounds is not None else (max(1, world_size - 1) if spec.topology is None else 1)
    date = spec.date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    provenance = ProfileProvenance(
        __version__,
        str(dist.get_backend(group)),
        world_size,
        str(device),
        spec.sizes,
        spec.repeats,
        spec.warmup,
        rounds,
        date,
    )
    samples = _Timer(comm.rank, group, device, spec, rounds).sizes_samples(patterns)
    timed = tuple(PatternSamples(name, patterns[name], samples[name]) for name in patterns)
    return ProfileSamples(provenance, spec.topology, timed)


def profile_worker(rank: int, world_size: int, spec: ProfileSpec) -> ProfileSamples:
    """Entry point of one local rank started by :func:`taccl_py.runtime.launch.launch_local`."""
    return run_profile(spec)


def fit_profile(samples: ProfileSamples, *, warn: Callable[[str], None] | None = None) -> ProfileOutcome:
    """Return the α-β fit of every pattern ``samples`` timed (``fit_samples``: medians, least squares).

    Fits whose residual or repeat spread pass ``MAX_TRUSTED_RESIDUAL``/``MAX_TRUSTED_SPREAD``
    are named in one message given to ``warn`` (default: logged as a warning). Raises
    ``ArgumentError`` naming the pattern whose times no α-β line fits (sizes too small).
    """
    sizes = samples.provenance.sizes_bytes
    fits = {p.name: fit_samples(sizes, p.samples_us, source=p.name) for p in samples.patterns}
    doubts = [f"{name}: {fit.doubts()}" for name, fit in fits.items() if fit.doubts()]
    if doubts:
        message = (
            f"profile: {'; '.join(doubts)}; the fitted alpha and bandwidth may be off as much: "
            "profile an idle machine or time more repeats"
        )
        if warn is None:
            logger.warning("%s", message)
        else:
            warn(message)
    if samples.topology is None:
        host = HostProfile(samples.provenance, fits["lone pair"], fits["ring shift"], samples.provenance.world_size)
        return ProfileOutcome(samples.provenance, host, ())
    classes = tuple(
        ClassFit(LinkKind(p.name), p.transfers[0][0], p.transfers[0][1], fits[p.name]) for p in samples.patterns
    )
    return ProfileOutcome(samples.provenance, None, classes)


def measured_topology(outcome: ProfileOutcome, topology: str | None = None, name: str | None = None) -> Topology:
    """Return the topology ``outcome`` measured: the host model, or ``topology`` with its classes merged in.

    ``name`` names it (default: ``measured``, or the merged topology's own name).
    """
    if outcome.host is not None:
        return host_topology(outcome.host, name or "measured")
    if topology is None:
        raise ArgumentError(None, "topology", "per-class figures without their topology", "the profiled topology")
    merged = merge_measured(load_topology(topology), outcome.classes, outcome.provenance)
    return merged if name is None else replace(merged, name=name)


class _Timer:
    """Times sets of concurrent transfers on one rank; buffers of the largest size are allocated once."""

    __slots__ = ("rank", "group", "device", "spec", "rounds", "send", "recv", "finish")

    def __init__(self, rank: int, group: Any, device: torch.device, spec: ProfileSpec, rounds: int) -> None:
        self.rank, self.group, self.device, self.spec, self.rounds = rank, group, device, spec, rounds
        largest = max(spec.sizes)
        self.send = torch.ones(largest, dtype=torch.uint8, device=device)
        self.recv = torch.empty(largest, dtype=torch.uint8, device=device)
        self.finish: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else _nothing

    def sizes_samples(self, patterns: dict[str, _Transfers]) -> dict[str, tuple[tuple[float, ...], ...]]:
        """Return, per pattern, the slowest rank's times (µs per round) of every repeat at every size."""
        samples: dict[str, list[tuple[float, ...]]] = {name: [] for name in patterns}
        for size in self.spec.sizes:
            for transfers in patterns.values():
                for _ in range(self.spec.warmup):
                    self._rounds(transfers, size)
            times: dict[str, list[float]] = {name: [] for name in patterns}
            for _ in range(self.spec.repeats):  # patterns alternate, so both see the same machine noise
                for name, transfers in patterns.items():
                    times[name].append(self._timed(transfers, size))
            for name in patterns:
                samples[name].append(tuple(times[name]))
            if self.rank == 0:
                medians = ", ".join(f"{name} {statistics.median(times[name]):.0f} us" for name in patterns)
                logger.info("profile %s: %s", format_size(size), medians)
        return {name: tuple(values) for name, values in samples.items()}

    def _timed(self, transfers: _Transfers, size: int) -> float:
        self.finish()
        dist.barrier(self.group)
        self.finish()
        start = time.perf_counter()
        self._rounds(transfers, size)
        self.finish()
        elapsed_us = (time.perf_counter() - start) * 1e6 / self.rounds
        slowest = torch.tensor([elapsed_us], dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.group)
        return float(slowest[0])

    def _rounds(self, transfers: _Transfers, size: int) -> None:
        """Run ``rounds`` rounds: each posts its sends and receives and waits for the receives.

        Sends are waited after the last round, as the executor places its send waits lazily: a
        rank forwards as soon as its data is in, not when its previous send has drained.
        """
        sends = [
            dist.P2POp(dist.isend, self.send[:size], dst, self.group) for src, dst in transfers if src == self.rank
        ]
        recvs = [
            dist.P2POp(dist.irecv, self.recv[:size], src, self.group) for src, dst in transfers if dst == self.rank
        ]
        pending = []
        for _ in range(self.rounds):
            if self.device.type == "cuda":  # NCCL matches p2p calls in posting order inside one group call
                works = dist.batch_isend_irecv(sends + recvs) if sends or recvs else []
            else:
                works = [op.op(op.tensor, op.peer, op.group) for op in sends + recvs]
            for work in works[len(sends) :]:
                work.wait()
            pending += works[: len(sends)]
        for work in pending:
            work.wait()


def _nothing() -> None:
    return None
