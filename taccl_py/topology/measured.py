"""Measured α-β figures: the least-squares fit, the host model of one machine, and merging into a topology.

``taccl profile`` (:mod:`taccl_py.runtime.measure.profile`) times point-to-point transfers at several
sizes; this module turns those times into topologies the simulator reads, without torch:

* :func:`fit_alpha_beta` fits ``time = α + bytes / bandwidth`` by least squares on relative
  residuals (a 4 KB time counts as much as a 32 MB one), reporting the worst residual and how
  far the repeats of one size spread.
* :func:`host_topology` models N ranks of one host (gloo over loopback) as a star: every rank
  sends into ``host_tx``, which feeds ``host_rx`` over one shared link, which feeds every rank.
  Each rank's own links run at the lone pair's bandwidth, the shared link at what N concurrent
  transfers reached together: on a CPU the copies of every transfer compete for the same cores
  and memory, so N transfers at once do not each get the lone rate.
* :func:`merge_measured` writes per-class figures (NVLink, PCIe, NIC ...) into a probed or
  built-in topology, as TACCL's profiler measures one pair per link class.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from taccl_py.errors import ArgumentError
from taccl_py.topology.model import Link, LinkKind, Topology, Vertex, VertexKind, make_topology, route
from taccl_py.units import BYTES_PER_US_PER_GBPS, format_size

__all__ = [
    "DEFAULT_PROFILE_REPEATS",
    "HOST_RX",
    "HOST_TX",
    "MAX_TRUSTED_RESIDUAL",
    "MAX_TRUSTED_SPREAD",
    "AlphaBetaFit",
    "ClassFit",
    "HostProfile",
    "ProfileProvenance",
    "fit_alpha_beta",
    "fit_samples",
    "host_topology",
    "link_class",
    "merge_measured",
    "pairs_by_class",
]

#: Vertex names of the host model: every transfer enters ``HOST_TX`` and leaves ``HOST_RX``.
HOST_TX, HOST_RX = "host_tx", "host_rx"
#: Timed repeats per size and pattern by default: the median is fitted, the spread reported (7: a
#: median that one or two descheduled samples on a loaded 2-core machine do not move).
DEFAULT_PROFILE_REPEATS = 7
#: A fit whose line misses some size's median by more than half (50%) does not describe that
#: size: its α or bandwidth may be off as much (gloo on a loaded 2-core host, BENCHMARKS.md:
#: 26-71%, spreads 46-340%).
MAX_TRUSTED_RESIDUAL = 0.5
#: Repeats of one size whose interquartile range passes their median (100%): the machine's load,
#: not the link, set those times (a descheduled rank costs milliseconds).
MAX_TRUSTED_SPREAD = 1.0


@dataclass(frozen=True)
class AlphaBetaFit:
    """``time = alpha_us + bytes / bandwidth_GBps`` fitted to ``median_us`` per size, with its spread.

    ``max_residual``: the worst |fit − median| / median over the sizes. ``repeat_spread``: the
    worst, over the sizes, of the repeats' interquartile range over their median (0 with one repeat).
    """

    alpha_us: float
    bandwidth_GBps: float
    sizes_bytes: tuple[int, ...]
    median_us: tuple[float, ...]
    max_residual: float
    repeat_spread: float = 0.0

    def time_us(self, size_bytes: float) -> float:
        """Return the fitted time (µs) of one transfer of ``size_bytes``."""
        return self.alpha_us + size_bytes / (self.bandwidth_GBps * BYTES_PER_US_PER_GBPS)

    def describe(self) -> str:
        """Return the fit in words: α, bandwidth, residual and repeat spread."""
        return (
            f"alpha {self.alpha_us:.1f} us, {self.bandwidth_GBps:.4g} GB/s; fit max residual "
            f"{self.max_residual:.0%}, repeat spread (IQR/median, worst size) {self.repeat_spread:.0%}"
        )

    def doubts(self) -> str | None:
        """Return the residual and spread past their trusted limits (``MAX_TRUSTED_*``) in words; None if neither."""
        parts = []
        if self.max_residual > MAX_TRUSTED_RESIDUAL:
            parts.append(f"fit max residual {self.max_residual:.0%} (over {MAX_TRUSTED_RESIDUAL:.0%})")
        if self.repeat_spread > MAX_TRUSTED_SPREAD:
            parts.append(f"repeat spread {self.repeat_spread:.0%} (over {MAX_TRUSTED_SPREAD:.0%})")
        return ", ".join(parts) or None

    def describe_medians(self) -> str:
        """Return the fitted medians per size in words (µs), so a file shows where the fit strays."""
        return "medians " + ", ".join(f"{format_size(b)} {t:.0f} us" for b, t in zip(self.sizes_bytes, self.median_us))


def fit_alpha_beta(
    sizes_bytes: Sequence[int], times_us: Sequence[float], *, repeat_spread: float = 0.0, source: str | None = None
) -> AlphaBetaFit:
    """Return the α (µs) and bandwidth (GB/s) that fit ``times_us`` at ``sizes_bytes`` best.

    Parameters
    ----------
    sizes_bytes : sequence of int
        Message sizes, at least two different ones.
    times_us : sequence of float
        One positive time (µs) per size, e.g. the median of repeats.
    repeat_spread : float
        Recorded as is in the result (see ``fit_samples``).
    source : str, optional
        What was measured (e.g. ``"ring shift"``); error messages start with it.

    Returns
    -------
    AlphaBetaFit
        The fit and its worst relative residual.

    Raises
    ------
    ArgumentError
        Fewer than two distinct sizes, lengths differ, a time is not positive, or the times do
        not grow with the size (no positive bandwidth fits).

    Notes
    -----
    Weighted least squares on relative residuals ``(α + s·b − t) / t`` (weights 1/t²), solved
    in closed form; α is clamped at 0 (then only the slope s = 1/bandwidth is fitted). Times
    that follow the model exactly are recovered exactly.

    Examples
    --------
    >>> fit = fit_alpha_beta([1000, 1_000_000], [11.0, 1010.0])  # 10 µs + 1 GB/s
    >>> round(fit.alpha_us, 6), round(fit.bandwidth_GBps, 6), fit.max_residual < 1e-9
    (10.0, 1.0, True)
    """
    if len(sizes_bytes) != len(times_us):
        raise ArgumentError(source, "times_us", f"{len(times_us)} times for {len(sizes_bytes)} sizes", "one per size")
    if len(set(sizes_bytes)) < 2:
        raise ArgumentError(source, "sizes", f"{len(set(sizes_bytes))} distinct size(s)", "at least two sizes to fit")
    if not all(t > 0 and math.isfinite(t) for t in times_us):
        raise ArgumentError(source, "times_us", "a time is not positive", "positive finite times")
    alpha_us, slope = _weighted_fit([float(b) for b in sizes_bytes], [float(t) for t in times_us])
    if not slope > 0:
        raise ArgumentError(
            source,
            "sizes",
            f"times do not grow with size between {format_size(min(sizes_bytes))} and {format_size(max(sizes_bytes))}",
            "sizes reaching where bandwidth shows (1 MB or more)",
        )
    fit = AlphaBetaFit(alpha_us, 1.0 / slope / BYTES_PER_US_PER_GBPS, tuple(sizes_bytes), tuple(times_us), 0.0)
    worst = max(abs(fit.time_us(b) - t) / t for b, t in zip(sizes_bytes, times_us))
    return replace(fit, max_residual=float(worst), repeat_spread=float(repeat_spread))


def _weighted_fit(x: list[float], t: list[float]) -> tuple[float, float]:
    """Return (α, slope) minimising Σ((α + slope·x − t)/t)², with α >= 0."""
    w = [1.0 / (ti * ti) for ti in t]
    sw, swx, swxx = sum(w), sum(wi * xi for wi, xi in zip(w, x)), sum(wi * xi * xi for wi, xi in zip(w, x))
    swt, swxt = sum(wi * ti for wi, ti in zip(w, t)), sum(wi * xi * ti for wi, xi, ti in zip(w, x, t))
    determinant = sw * swxx - swx * swx
    alpha = (swt * swxx - swx * swxt) / determinant
    slope = (sw * swxt - swx * swt) / determinant
    if alpha < 0:  # a negative latency is noise at the small sizes: fit the slope through the origin
        alpha, slope = 0.0, swxt / swxx
    return alpha, slope


def fit_samples(
    sizes_bytes: Sequence[int], samples_us: Sequence[Sequence[float]], source: str | None = None
) -> AlphaBetaFit:
    """Return the fit of the median of each size's repeated times (µs), with their spread recorded.

    >>> fit = fit_samples([1000, 1_000_000], [[11.0, 12.0, 10.0], [1010.0, 1010.0, 1010.0]])
    >>> round(fit.alpha_us, 3), round(fit.repeat_spread, 3)
    (10.0, 0.091)
    """
    medians = [statistics.median(s) for s in samples_us]
    spread = max(_relative_iqr(s) for s in samples_us)
    return fit_alpha_beta(sizes_bytes, medians, repeat_spread=spread, source=source)


def _relative_iqr(samples: Sequence[float]) -> float:
    if len(samples) < 2:
        return 0.0
    low, _, high = statistics.quantiles(samples, n=4, method="inclusive")
    return (high - low) / statistics.median(samples)


@dataclass(frozen=True)
class ProfileProvenance:
    """Where measured figures come from: version, backend, ranks, device, sizes (bytes), repeats, date.

    ``rounds``: consecutive rounds of transfers in one timed sample, whose time is divided by it.
    """

    taccl_version: str
    backend: str
    world_size: int
    device: str
    sizes_bytes: tuple[int, ...]
    repeats: int
    warmup: int
    rounds: int
    date: str

    def describe(self) -> str:
        """Return one line for a topology's ``sources``."""
        sizes = ",".join(format_size(s) for s in self.sizes_bytes)
        return (
            f"measured by taccl profile (taccl_py {self.taccl_version}) on {self.date}: backend {self.backend}, "
            f"{self.world_size} ranks, device {self.device}, sizes {sizes}, {self.repeats} repeats after "
            f"{self.warmup} warm-up, each {self.rounds} rounds back to back; time per size = median over repeats "
            "of the slowest rank's time per round"
        )


@dataclass(frozen=True)
class HostProfile:
    """One host's measurement: a lone pair 0→1 and ``concurrent`` transfers at once (a ring shift)."""

    provenance: ProfileProvenance
    pair: AlphaBetaFit
    ring: AlphaBetaFit
    concurrent: int

    @property
    def shared_bandwidth_GBps(self) -> float:
        """Return what the ``concurrent`` transfers moved together (GB/s): the host's shared capacity."""
        return self.ring.bandwidth_GBps * self.concurrent


def host_topology(profile: HostProfile, name: str = "measured") -> Topology:
    """Return the star model of ``profile``'s host: rank → ``host_tx`` → ``host_rx`` → rank.

    Every rank's links run at the lone pair's bandwidth; ``host_tx`` → ``host_rx`` at the shared
    capacity (ring bandwidth × concurrent transfers), so the simulator's fair sharing of it
    reproduces the ring shift, and a lone transfer runs at the slower of the two. The route's α is the ring shift's,
    on each rank's link into ``host_tx``: collectives move data in such concurrent steps.

    >>> fit = AlphaBetaFit(100.0, 2.0, (1, 2), (1.0, 2.0), 0.0)
    >>> prov = ProfileProvenance("0", "gloo", 2, "cpu", (1, 2), 1, 0, 1, "2026-11-26")
    >>> topo = host_topology(HostProfile(prov, fit, replace(fit, bandwidth_GBps=0.5), 2))
    >>> [(link.src, link.dst, link.bandwidth_GBps) for link in route(topo, 0, 1).links]
    [('gpu0', 'host_tx', 2.0), ('host_tx', 'host_rx', 1.0), ('host_rx', 'gpu1', 2.0)]
    """
    n = profile.provenance.world_size
    shared = profile.shared_bandwidth_GBps
    alpha = profile.ring.alpha_us
    ranks = [Vertex(f"gpu{r}", VertexKind.GPU, local_index=r, rank=r) for r in range(n)]
    hubs = [Vertex(HOST_TX, VertexKind.CPU), Vertex(HOST_RX, VertexKind.CPU)]
    links = [Link(f"gpu{r}", HOST_TX, LinkKind.HOST, alpha, profile.pair.bandwidth_GBps) for r in range(n)]
    links.append(Link(HOST_TX, HOST_RX, LinkKind.HOST, 0.0, shared))
    links += [Link(HOST_RX, f"gpu{r}", LinkKind.HOST, 0.0, profile.pair.bandwidth_GBps) for r in range(n)]
    sources = (
        profile.provenance.describe(),
        f"lone pair 0->1: {profile.pair.describe()}; {profile.pair.describe_medians()}",
        f"ring shift, {profile.concurrent} transfers at once (r -> r+1): {profile.ring.describe()}; "
        f"together {profile.shared_bandwidth_GBps:.4g} GB/s; {profile.ring.describe_medians()}",
        "model: rank -> host_tx -> host_rx -> rank; alpha of the ring shift on the first hop, each rank's links "
        f"at the lone pair's bandwidth, host_tx -> host_rx shared at {shared:.4g} GB/s",
    )
    description = (
        f"{n} ranks of one host ({profile.provenance.backend}, {profile.provenance.device}), measured "
        f"{profile.provenance.date}: ranks stand in for GPUs, transfers share one host link"
    )
    return make_topology(name, ranks + hubs, links, description=description, sources=sources)


@dataclass(frozen=True)
class ClassFit:
    """A link class measured on one representative rank pair (``src`` → ``dst``)."""

    kind: LinkKind
    src: int
    dst: int
    fit: AlphaBetaFit


def link_class(topology: Topology, src: int, dst: int) -> LinkKind:
    """Return the class of the rank pair: the kind of the slowest link of its route (first of equals)."""
    links = route(topology, src, dst).links
    return min(links, key=lambda link: link.bandwidth_GBps).kind


def pairs_by_class(topology: Topology) -> dict[LinkKind, tuple[tuple[int, int], ...]]:
    """Return every ordered rank pair grouped by :func:`link_class`, classes and pairs in rank order.

    >>> from taccl_py.topology import load_topology
    >>> sorted((kind.value, len(pairs)) for kind, pairs in pairs_by_class(load_topology("ndv2")).items())
    [('nvlink', 32), ('pcie', 24)]
    """
    groups: dict[LinkKind, list[tuple[int, int]]] = {}
    n = topology.num_ranks
    for src in range(n):
        for dst in range(n):
            if src != dst:
                groups.setdefault(link_class(topology, src, dst), []).append((src, dst))
    return {kind: tuple(pairs) for kind, pairs in groups.items()}


def merge_measured(
    topology: Topology, classes: Sequence[ClassFit], provenance: ProfileProvenance | None = None
) -> Topology:
    """Return ``topology`` with every link of each measured class rescaled to its measurement.

    For a class measured on pair (a, b), links of that kind have their bandwidth scaled by
    measured / route(a, b)'s bandwidth (so double NVLinks stay twice single ones) and their α
    shifted so that route(a, b)'s α becomes the measured one (never below 0). Other links keep
    their figures. The measured route then reads exactly as measured, unless another kind of
    link on it is slower than the measured bandwidth.

    Raises ``ArgumentError`` when a class is measured twice or its pair's class differs.
    """
    scale: dict[LinkKind, tuple[float, float]] = {}
    for item in classes:
        if item.kind in scale:
            raise ArgumentError(topology.name, "classes", f"class {item.kind.value} measured twice", "one per class")
        if link_class(topology, item.src, item.dst) is not item.kind:
            raise ArgumentError(
                topology.name, "classes", f"pair {item.src}->{item.dst} is not {item.kind.value}", "a pair of its class"
            )
        measured = route(topology, item.src, item.dst)
        hops = sum(1 for link in measured.links if link.kind is item.kind)
        scale[item.kind] = (
            item.fit.bandwidth_GBps / measured.bandwidth_GBps,
            (item.fit.alpha_us - measured.alpha_us) / hops,
        )
    links = tuple(_rescaled(link, scale) for link in topology.links)
    notes = tuple(
        f"{c.kind.value} links, measured on {c.src}->{c.dst}: {c.fit.describe()}; {c.fit.describe_medians()}"
        for c in classes
    )
    head = (provenance.describe(),) if provenance is not None else ()
    return make_topology(
        topology.name,
        topology.vertices,
        links,
        nodes=topology.nodes,
        description=topology.description,
        sources=topology.sources + head + notes,
    )


def _rescaled(link: Link, scale: Mapping[LinkKind, tuple[float, float]]) -> Link:
    if link.kind not in scale:
        return link
    bandwidth_factor, alpha_shift = scale[link.kind]
    return replace(
        link, bandwidth_GBps=link.bandwidth_GBps * bandwidth_factor, alpha_us=max(0.0, link.alpha_us + alpha_shift)
    )
