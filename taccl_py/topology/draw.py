"""Draw a topology to PNG or SVG with matplotlib (imported only when drawing)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from taccl_py._io import write_bytes_atomic
from taccl_py.errors import ArgumentError
from taccl_py.topology.model import Link, Topology, Vertex, VertexKind

__all__ = ["draw_topology", "layout_topology"]

# Marker, face colour and size (points²) of each vertex kind.
_VERTEX_STYLE: Mapping[VertexKind, tuple[str, str, float]] = MappingProxyType(
    {
        VertexKind.GPU: ("s", "#4caf50", 420.0),
        VertexKind.NIC: ("^", "#ff9800", 260.0),
        VertexKind.NVSWITCH: ("h", "#7e57c2", 520.0),
        VertexKind.PCIE_SWITCH: ("D", "#90a4ae", 160.0),
        VertexKind.NET_SWITCH: ("8", "#e53935", 620.0),
        VertexKind.CPU: ("o", "#8d6e63", 300.0),
    }
)
# Colour of each link kind.
_LINK_COLOUR = MappingProxyType(
    {
        "nvlink": "#2e7d32",
        "nvswitch": "#5e35b1",
        "pcie": "#78909c",
        "host": "#6d4c41",
        "ib": "#e65100",
        "ethernet": "#c62828",
        "xgmi": "#00838f",
    }
)
_MIN_WIDTH_PT = 0.6
_MAX_WIDTH_PT = 4.5
_ROW_GAP = 1.0  # vertical distance between rows of a node, in layout units
_SPACING = 1.0  # horizontal distance between GPUs, in layout units
_FORMATS = (".png", ".svg")


def _rows(topology: Topology, node: int) -> list[list[Vertex]]:
    """Return the rows of one machine, top to bottom: NVSwitches, GPUs, then the PCIe tree by depth."""
    members = [v for v in topology.vertices if v.node == node and v.kind is not VertexKind.NET_SWITCH]
    gpus = [v for v in members if v.kind is VertexKind.GPU]
    # Two GPU rows when GPUs link to each other directly (a mesh reads better folded) or are many.
    meshed = any(
        topology.vertex(link.dst).kind is VertexKind.GPU for link in topology.links if link.src == gpus[0].name
    )
    half = math.ceil(len(gpus) / 2) if len(gpus) > 8 or (meshed and len(gpus) > 4) else len(gpus)
    rows = [[v for v in members if v.kind is VertexKind.NVSWITCH], gpus[:half], gpus[half:]]
    depth = _depths(
        topology,
        {v.name for v in gpus},
        {v.name for v in members if v.kind not in (VertexKind.GPU, VertexKind.NVSWITCH)},
    )
    levels = sorted(set(depth.values()))
    for level in levels:
        rows.append([v for v in members if depth.get(v.name) == level and v.kind is VertexKind.NIC])
        rows.append(
            [v for v in members if depth.get(v.name) == level and v.kind not in (VertexKind.NIC, VertexKind.CPU)]
        )
    rows.append([v for v in members if v.kind is VertexKind.CPU])
    placed = {v.name for row in rows for v in row}
    rows.append([v for v in members if v.name not in placed])
    return [row for row in rows if row]


def _depths(topology: Topology, start: set[str], allowed: set[str]) -> dict[str, int]:
    """Return each allowed vertex's hop count from the GPUs (breadth first over links)."""
    depth: dict[str, int] = {}
    frontier = sorted(start)
    level = 0
    while frontier:
        level += 1
        following = []
        for name in frontier:
            for neighbour in topology.graph.successors(name):
                if neighbour in allowed and neighbour not in depth:
                    depth[neighbour] = level
                    following.append(neighbour)
        frontier = following
    return depth


def layout_topology(topology: Topology) -> dict[str, tuple[float, float]]:
    """Return an (x, y) position for every vertex: machines side by side, the network switch below.

    Inside a machine: NVSwitches on top, GPUs in one or two rows, then the PCIe tree by its
    depth from the GPUs (NICs on their own row), CPUs at the bottom. A vertex below the GPUs
    sits under the mean position of the vertices it links to above it.
    """
    positions: dict[str, tuple[float, float]] = {}
    left = 0.0
    for node in range(topology.nodes):
        rows = _rows(topology, node)
        width = max(len(row) for row in rows[:3]) * _SPACING
        mine: dict[str, tuple[float, float]] = {}
        for depth, row in enumerate(rows):
            xs = _row_xs(topology, row, mine, 0.0, width)
            mine.update((v.name, (x, -depth * _ROW_GAP)) for v, x in zip(row, xs))
        _nudge_off_lines(topology, mine)
        shift = left - min(x for x, _ in mine.values())
        positions.update((name, (x + shift, y)) for name, (x, y) in mine.items())
        left = max(x for x, _ in positions.values()) + 2.0 * _SPACING
    bottom = min(y for _, y in positions.values())
    right = max(x for x, _ in positions.values())
    for vertex in topology.vertices:
        if vertex.kind is VertexKind.NET_SWITCH:
            positions[vertex.name] = (right / 2, bottom - 1.5 * _ROW_GAP)
    return positions


def _row_xs(
    topology: Topology, row: list[Vertex], placed: Mapping[str, tuple[float, float]], left: float, width: float
) -> list[float]:
    """Return x positions: GPUs and NVSwitches evenly, others under their placed neighbours."""
    if row[0].kind in (VertexKind.GPU, VertexKind.NVSWITCH) or not placed:
        step = width / len(row)
        return [left + step * (i + 0.5) for i in range(len(row))]
    wanted = []
    for index, vertex in enumerate(row):
        neighbours = [placed[n][0] for n in topology.graph.predecessors(vertex.name) if n in placed]
        wanted.append(sum(neighbours) / len(neighbours) if neighbours else left + width * (index + 0.5) / len(row))
    order = sorted(range(len(row)), key=lambda i: (wanted[i], i))
    xs = [0.0] * len(row)
    previous = -math.inf
    for i in order:
        xs[i] = max(wanted[i], previous + 0.8 * _SPACING)
        previous = xs[i]
    shift = (sum(xs) - sum(wanted)) / len(xs)  # re-centre what the spreading pushed right
    return [x - shift for x in xs]


def _nudge_off_lines(topology: Topology, positions: dict[str, tuple[float, float]]) -> None:
    """Move a vertex below the GPUs sideways when a link it is not on passes through it."""
    segments = [(link.src, link.dst) for link in topology.links if link.src in positions and link.dst in positions]
    for vertex in topology.vertices:
        if vertex.name not in positions or vertex.kind in (VertexKind.GPU, VertexKind.NVSWITCH):
            continue
        x, y = positions[vertex.name]
        for offset in (0.0, 0.4, -0.4, 0.7, -0.7):
            point = (x + offset * _SPACING, y)
            if not any(_near(point, positions[a], positions[b]) for a, b in segments if vertex.name not in (a, b)):
                positions[vertex.name] = point
                break


def _near(point: tuple[float, float], start: tuple[float, float], end: tuple[float, float]) -> bool:
    """Return True when the segment start-end passes within a marker's radius of ``point``."""
    (px, py), (ax, ay), (bx, by) = point, start, end
    dx, dy = bx - ax, by - ay
    length = dx * dx + dy * dy
    t = 0.0 if length == 0 else max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / length))
    return math.hypot(ax + t * dx - px, ay + t * dy - py) < 0.18 * _SPACING


def _link_pairs(topology: Topology) -> list[tuple[Link, bool]]:
    """Return each link once, with True when the reverse link exists (drawn as one line)."""
    drawn: set[tuple[str, str]] = set()
    pairs = []
    for link in topology.links:
        if (link.dst, link.src) in drawn:
            continue
        drawn.add(link.key)
        pairs.append((link, topology.link(link.dst, link.src) is not None))
    return pairs


def draw_topology(topology: Topology, path: str | Path, title: str | None = None) -> None:
    """Write a drawing of ``topology`` to ``path`` (``.png`` or ``.svg``), atomically.

    GPUs, NICs, switches and CPUs get distinct shapes and colours and are grouped by machine;
    each link class gets a colour, its line width grows with its bandwidth, and a legend
    names both.

    Parameters
    ----------
    topology : Topology
        What to draw.
    path : str or Path
        The output file; its suffix picks the format.
    title : str, optional
        Defaults to the topology's name and size.

    Raises
    ------
    ArgumentError
        If the suffix is neither ``.png`` nor ``.svg``.
    """
    path = Path(path)
    if path.suffix.lower() not in _FORMATS:
        raise ArgumentError(str(path), None, f"unknown image format {path.suffix!r}", "a .png or .svg file name")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    positions = layout_topology(topology)
    xs = [x for x, _ in positions.values()]
    ys = [y for _, y in positions.values()]
    figure, axes = pyplot.subplots(
        figsize=(max(8.0, 0.9 * (max(xs) - min(xs)) + 4.5), max(5.0, 0.9 * (max(ys) - min(ys)) + 2.0))
    )
    try:
        _draw_nodes_boxes(axes, topology, positions)
        link_handles = _draw_links(axes, topology, positions)
        vertex_handles = _draw_vertices(axes, topology, positions)
        axes.set_title(title or f"{topology.name}: {topology.nodes} node(s), {topology.num_ranks} GPUs")
        axes.legend(
            handles=vertex_handles + link_handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            frameon=False,
        )
        axes.set_aspect("equal")
        axes.axis("off")
        axes.margins(0.06)
        figure.tight_layout()
        _save_atomic(figure, path)
    finally:
        pyplot.close(figure)


def _save_atomic(figure: object, path: Path) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=110, format=path.suffix.lower()[1:], bbox_inches="tight")
    write_bytes_atomic(path, buffer.getvalue())


def _draw_nodes_boxes(axes: object, topology: Topology, positions: Mapping[str, tuple[float, float]]) -> None:
    from matplotlib.patches import FancyBboxPatch

    for node in range(topology.nodes):
        points = [
            positions[v.name] for v in topology.vertices if v.node == node and v.kind is not VertexKind.NET_SWITCH
        ]
        x0, x1 = min(p[0] for p in points) - 0.6, max(p[0] for p in points) + 0.6
        y0, y1 = min(p[1] for p in points) - 0.55, max(p[1] for p in points) + 0.7
        box = FancyBboxPatch(
            (x0, y0),
            x1 - x0,
            y1 - y0,
            boxstyle="round,pad=0.05,rounding_size=0.3",
            facecolor="#f5f5f5",
            edgecolor="#9e9e9e",
            zorder=0,
        )
        axes.add_patch(box)
        label = f"node {node}" if topology.nodes > 1 else topology.name
        axes.text(x0 + 0.15, y1 - 0.2, label, fontsize=9, color="#616161", va="top", zorder=1)


def _draw_links(axes: object, topology: Topology, positions: Mapping[str, tuple[float, float]]) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    pairs = _link_pairs(topology)
    ceiling: dict[int, float] = {}  # the y of each machine's top GPU row
    for vertex in topology.gpus:
        ceiling[vertex.node] = max(ceiling.get(vertex.node, -math.inf), positions[vertex.name][1])
    top = max(link.bandwidth_GBps for link, _ in pairs)
    classes: dict[tuple[str, float, int], float] = {}
    for link, both_ways in pairs:
        width = _MIN_WIDTH_PT + (_MAX_WIDTH_PT - _MIN_WIDTH_PT) * link.bandwidth_GBps / top
        (x0, y0), (x1, y1) = positions[link.src], positions[link.dst]
        bend = _bend(x0, y0, x1, y1, y0 >= ceiling.get(topology.vertex(link.src).node, math.inf))
        if not bend and any(
            _near(point, (x0, y0), (x1, y1)) for name, point in positions.items() if name not in link.key
        ):
            bend = 0.25  # a straight line would run through another vertex
        patch = FancyArrowPatch(
            (x0, y0),
            (x1, y1),
            arrowstyle="-" if both_ways else "-|>",
            mutation_scale=10,
            connectionstyle=f"arc3,rad={bend}",
            color=_LINK_COLOUR.get(link.kind.value, "black"),
            linewidth=width,
            alpha=0.75,
            zorder=2,
        )
        axes.add_patch(patch)
        classes[(link.kind.value, round(link.bandwidth_GBps, 2), link.count)] = width
    handles = []
    for (kind, bandwidth, count), width in sorted(classes.items(), key=lambda item: (item[0][0], -item[0][1])):
        lanes = f" x{count}" if count > 1 else ""
        handles.append(
            Line2D(
                [],
                [],
                color=_LINK_COLOUR.get(kind, "black"),
                linewidth=width,
                label=f"{kind}{lanes}: {bandwidth:g} GB/s",
            )
        )
    return handles


def _bend(x0: float, y0: float, x1: float, y1: float, upward: bool) -> float:
    """Return the arc3 curvature: 0 across rows; along a row, bulge away from the row's neighbours.

    matplotlib puts arc3's control point at the midpoint + rad * (dy, -dx), so for a
    left-to-right line a positive rad bends it down.
    """
    if abs(y0 - y1) > 1e-9 or abs(x0 - x1) <= 1.5 * _SPACING:
        return 0.0
    direction = 1.0 if x1 > x0 else -1.0
    return -0.3 * direction if upward else 0.3 * direction


def _draw_vertices(axes: object, topology: Topology, positions: Mapping[str, tuple[float, float]]) -> list:
    from matplotlib.lines import Line2D

    handles = []
    for kind, (marker, colour, size) in _VERTEX_STYLE.items():
        members = [v for v in topology.vertices if v.kind is kind]
        if not members:
            continue
        axes.scatter(
            [positions[v.name][0] for v in members],
            [positions[v.name][1] for v in members],
            s=size,
            marker=marker,
            c=colour,
            edgecolors="black",
            linewidths=0.6,
            zorder=3,
        )
        for vertex in members:
            x, y = positions[vertex.name]
            if kind is VertexKind.GPU:
                axes.text(
                    x,
                    y,
                    str(vertex.local_index),
                    fontsize=7,
                    ha="center",
                    va="center",
                    color="white",
                    fontweight="bold",
                    zorder=4,
                )
            else:
                short = vertex.name.split(".")[-1]
                above = kind is VertexKind.NVSWITCH  # its links fan out below it
                axes.text(
                    x,
                    y + 0.3 if above else y - 0.3,
                    short,
                    fontsize=6,
                    ha="center",
                    va="bottom" if above else "top",
                    color="#424242",
                    zorder=4,
                )
        handles.append(
            Line2D(
                [],
                [],
                marker=marker,
                linestyle="",
                markerfacecolor=colour,
                markeredgecolor="black",
                markersize=8,
                label=kind.value,
            )
        )
    return handles
