"""Draw a simulated run as a timeline: one row per busy link, one bar per transfer on it.

matplotlib is imported inside ``plot_timeline`` (an optional dependency: ``pip install
taccl-py[plot]``); the figure is drawn without pyplot, so no global figure state is touched.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from types import MappingProxyType

from taccl_py._io import write_bytes_atomic
from taccl_py.errors import ArgumentError
from taccl_py.simulate.result import SimulationResult, TimelineRecord, resource_label
from taccl_py.units import format_size

__all__ = ["plot_timeline", "plot_format", "require_matplotlib", "MAX_ROWS", "MAX_LANES"]

MAX_ROWS = 64  # links drawn at most (the busiest); more rows become unreadable
MAX_LANES = 4  # concurrent transfers on one link drawn side by side, at most this many lanes
_FORMATS = MappingProxyType({".png": "png", ".svg": "svg"})
_ROW_HEIGHT_IN = 0.28
_WIDTH_IN = 13.0
_DPI = 120


def _rows(result: SimulationResult) -> tuple[list[tuple[str, str]], dict[tuple[str, str], list[TimelineRecord]]]:
    """Return the links to draw (busiest first, at most ``MAX_ROWS``, then by name) and their records."""
    by_link: dict[tuple[str, str], list[TimelineRecord]] = defaultdict(list)
    for record in result.timeline or ():
        by_link[record.resource].append(record)
    busy = {usage.resource: usage.busy_us for usage in result.link_usage}
    chosen = sorted(by_link, key=lambda key: -busy.get(key, 0.0))[:MAX_ROWS]
    return sorted(chosen, key=resource_label), by_link


def _lanes(records: list[TimelineRecord]) -> list[int]:
    """Return a lane per record so that records sharing a link at once sit side by side.

    Greedy interval colouring by start time, wrapped at ``MAX_LANES`` lanes.
    """
    lanes = [0] * len(records)
    lane_end: list[float] = []
    for index in sorted(range(len(records)), key=lambda i: (records[i].start_us, records[i].end_us)):
        record = records[index]
        free = next((lane for lane, end in enumerate(lane_end) if end <= record.start_us), None)
        if free is None:
            free = len(lane_end)
            lane_end.append(record.end_us)
        lane_end[free] = record.end_us
        lanes[index] = free % MAX_LANES
    return lanes


def _draw(result: SimulationResult, rows: list[tuple[str, str]], by_link: dict, total_links: int):
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    height = max(2.5, 1.4 + _ROW_HEIGHT_IN * len(rows))
    figure = Figure(figsize=(_WIDTH_IN, height), dpi=_DPI, layout="constrained")
    axes = figure.add_subplot()
    colours = colormaps["tab20"]
    for y, key in enumerate(rows):
        records = by_link[key]
        lanes = _lanes(records)
        count = max(lanes) + 1
        for lane in range(count):
            chosen = [r for r, l in zip(records, lanes) if l == lane]
            bars = [(r.start_us, max(r.end_us - r.start_us, 0.0)) for r in chosen]
            top = y - 0.38 + 0.76 * lane / count
            axes.broken_barh(
                bars,
                (top, 0.76 / count),
                facecolors=[colours(r.src_rank % 20) for r in chosen],
                edgecolor="black",
                linewidth=0.3,
            )
        waits = [(r.ready_us, r.start_us - r.ready_us) for r in records if r.start_us > r.ready_us]
        if waits:
            axes.broken_barh(waits, (y - 0.06, 0.12), facecolors="0.6")
    axes.set_yticks(range(len(rows)), [resource_label(key) for key in rows], fontsize=7)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, result.time_us * 1.01 if result.time_us > 0 else 1.0)
    axes.set_xlabel("time (µs)")
    axes.grid(axis="x", linewidth=0.4, alpha=0.5)
    shown = "" if len(rows) == total_links else f", busiest {len(rows)} of {total_links} links"
    axes.set_title(
        f"{result.algorithm} ({result.collective.value}, {result.num_ranks} ranks) on {result.topology} at "
        f"{format_size(result.size_bytes)}: {result.time_us:.1f} µs, {result.fraction_of_bound:.2f} of bound{shown}",
        fontsize=9,
    )
    ranks = sorted({r.src_rank for key in rows for r in by_link[key]})
    handles = [
        Patch(facecolor=colours(rank % 20), edgecolor="black", linewidth=0.3, label=f"from rank {rank}")
        for rank in ranks[:20]
    ]
    handles.append(Line2D([], [], color="0.6", linewidth=4, label="latency α (no bandwidth)"))
    axes.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    return figure


def plot_format(path: str | Path) -> str:
    """Return ``"png"`` or ``"svg"`` for an image ``path``; raise ``ArgumentError`` otherwise.

    >>> plot_format("run.PNG")
    'png'
    """
    fmt = _FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ArgumentError(str(path), "extension", f"{Path(path).suffix or 'no extension'!r}", "'.png' or '.svg'")
    return fmt


def require_matplotlib() -> None:
    """Import matplotlib now; raise ``ModuleNotFoundError`` if the plot extra is missing.

    A caller that plots after seconds of simulation calls this first, so a missing extra fails
    before any work (the CLI turns the error into one line naming the extra).
    """
    import matplotlib  # noqa: F401  (imported for its ModuleNotFoundError only)


def plot_timeline(result: SimulationResult, path: str | Path) -> None:
    """Write a timeline of ``result`` to ``path`` (.png or .svg): links as rows, transfers as bars.

    Bars span the time a transfer's bytes occupy the link (coloured by sending rank);
    transfers sharing a link at once are drawn in thinner lanes side by side; the grey line
    before a bar is its latency α. At most ``MAX_ROWS`` links are drawn (the busiest).

    Raises
    ------
    ArgumentError
        When ``result`` has no timeline (simulate with ``record_timeline=True``) or the
        extension is neither .png nor .svg.
    """
    path = Path(path)
    fmt = plot_format(path)
    if result.timeline is None:
        raise ArgumentError(
            result.algorithm, "timeline", "the result has no timeline", "a result simulated with record_timeline=True"
        )
    rows, by_link = _rows(result)
    figure = _draw(result, rows, by_link, len(by_link))
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt)
    write_bytes_atomic(path, buffer.getvalue())
