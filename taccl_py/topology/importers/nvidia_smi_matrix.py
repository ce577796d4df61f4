"""Read the connection matrix ``nvidia-smi topo -m`` prints, checking every cell.

One reader serves both the nvidia-smi importer (``parse_nvidia_smi_topo``, which builds a
``Topology`` from the matrix) and the live probe (``taccl_py.topology.probe``, which takes the
NVLink counts, NUMA nodes and GPU-NIC affinity from it).

The cells say how traffic between two devices travels: ``NV#`` over # bonded NVLinks, ``PIX``
through at most one PCIe switch, ``PXB`` through several, ``PHB`` through a CPU's PCIe host
bridge, ``NODE`` between host bridges of one NUMA node, ``SYS`` across the SMP interconnect
between NUMA nodes, ``X`` the device itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from taccl_py.errors import FormatError, TopologyError

__all__ = [
    "PIX_TOKENS",
    "PXB_TOKENS",
    "SAME_NUMA_TOKENS",
    "SYS_TOKENS",
    "TopoMatrix",
    "is_gpu_label",
    "parse_topo_matrix",
]

logger = logging.getLogger(__name__)

PIX_TOKENS = frozenset({"PIX", "PSB"})  # PSB: older drivers' "single PCIe switch"
PXB_TOKENS = frozenset({"PXB"})
SAME_NUMA_TOKENS = frozenset({"PHB", "NODE"})
SYS_TOKENS = frozenset({"SYS", "SOC"})  # SOC: older drivers' name for SYS
_NV_RE = re.compile(r"^NV(\d+)$")
_GPU_RE = re.compile(r"^GPU\d+$")
_DEVICE_ROW_RE = re.compile(r"^(GPU|NIC)\d+$")
_EXTRA_COLUMN_RE = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID")
_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_NOT_AVAILABLE = frozenset({"N/A", "NA", "-"})


def is_gpu_label(label: str) -> bool:
    """Return whether a matrix label names a GPU (``GPU0``, ``GPU12``) rather than a NIC.

    >>> is_gpu_label("GPU3"), is_gpu_label("NIC0"), is_gpu_label("mlx5_0")
    (True, False, False)
    """
    return _GPU_RE.match(label) is not None


@dataclass(frozen=True)
class TopoMatrix:
    """``nvidia-smi topo -m``: device labels, the cell of each pair, NUMA, CPU affinity, NIC names."""

    devices: tuple[str, ...]  # device columns in header order
    cells: Mapping[tuple[str, str], str]
    numa: Mapping[str, int | None]
    cpu_affinity: Mapping[str, str | None]
    nic_names: Mapping[str, str]

    @property
    def gpus(self) -> tuple[str, ...]:
        """Return the GPU labels (``GPU0`` ...) in header order."""
        return tuple(label for label in self.devices if is_gpu_label(label))

    @property
    def nics(self) -> tuple[str, ...]:
        """Return the NIC labels (``NIC0`` or, in older outputs, ``mlx5_0``) in header order."""
        return tuple(label for label in self.devices if not is_gpu_label(label))

    def nvlinks(self, a: str, b: str) -> int:
        """Return the NVLink count between ``a`` and ``b`` (``NV12`` -> 12; 0 if none)."""
        nv = _NV_RE.match(self.cells.get((a, b), ""))
        return int(nv.group(1)) if nv else 0


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Return the connection matrix of ``nvidia-smi topo -m`` output (tabs or spaces).

    Parameters
    ----------
    text : str
        The output, columns separated by tabs or runs of spaces, legend text after it allowed.
    source : str
        Where the text came from, named in errors.

    Returns
    -------
    TopoMatrix
        The device columns, every cell, and per row the NUMA node (None when not one node),
        the CPU affinity (None when absent) and the NIC names of the "NIC Legend".

    Raises
    ------
    FormatError
        No header row starting with GPU0, an unknown header column, a row of the wrong length,
        a cell token that is not X, NV#, PIX, PXB, PHB, NODE, SYS (or the older PSB, SOC).
    TopologyError
        No GPU rows, a device listed twice, a row missing, an asymmetric matrix, NVLink to a NIC.

    Examples
    --------
    >>> m = parse_topo_matrix("\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV2\\t0-7\\nGPU1\\tNV2\\t X \\t0-7\\n")
    >>> m.gpus, m.nvlinks("GPU0", "GPU1")
    (('GPU0', 'GPU1'), 2)
    """
    lines = text.splitlines()
    # The header is the first line starting with GPU0 that has no "X" (every matrix row has one).
    header_index = next(
        (i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"] and "X" not in line.split()), None
    )
    if header_index is None:
        raise FormatError(source, None, "no header row starting with GPU0", "the output of 'nvidia-smi topo -m'")
    labels, extras = _parse_header(lines[header_index], header_index + 1, source)
    rows, end = _parse_rows(lines, header_index + 1, labels, extras, source)
    if not any(is_gpu_label(label) for label in rows):
        raise TopologyError(
            source, f"line {header_index + 2}", "no GPU rows below the header", "one row per GPU column"
        )
    for label in labels:
        if label not in rows:
            raise TopologyError(source, f"line {header_index + 1}", f"column {label} has no row", "one row per column")
    cells: dict[tuple[str, str], str] = {}
    numa: dict[str, int | None] = {}
    affinity: dict[str, str | None] = {}
    for label, (lineno, values, extra_values) in rows.items():
        for column, cell in zip(labels, values):
            _check_cell(label, column, cell, cells, lineno, source)
            cells[(label, column)] = cell
        numa[label] = _numa_value(extra_values.get("NUMA Affinity"), lineno, source)
        cpus = extra_values.get("CPU Affinity")
        affinity[label] = None if cpus is None or cpus in _NOT_AVAILABLE else cpus
    return TopoMatrix(labels, cells, numa, affinity, _parse_nic_legend(lines[end:]))


def _parse_header(line: str, lineno: int, source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    first_extra = _EXTRA_COLUMN_RE.search(line)
    device_part = line[: first_extra.start()] if first_extra else line
    extras = tuple(match.group(0) for match in _EXTRA_COLUMN_RE.finditer(line))
    leftover = _EXTRA_COLUMN_RE.sub("", line[len(device_part) :]).split()
    if leftover:
        raise FormatError(
            source,
            f"line {lineno}",
            f"unknown header column {leftover[0]!r}",
            "device columns then CPU Affinity, NUMA Affinity, GPU NUMA ID",
        )
    labels = tuple(device_part.split())
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            raise TopologyError(source, f"line {lineno}", f"{label} listed twice in the header", "each device once")
        seen.add(label)
    return labels, extras


def _parse_rows(
    lines: Sequence[str], start: int, labels: tuple[str, ...], extras: tuple[str, ...], source: str
) -> tuple[dict[str, tuple[int, list[str], dict[str, str]]], int]:
    known = set(labels)
    rows: dict[str, tuple[int, list[str], dict[str, str]]] = {}
    for index in range(start, len(lines)):
        tokens = lines[index].split()
        lineno = index + 1
        if not tokens or (tokens[0] not in known and not _DEVICE_ROW_RE.match(tokens[0])):
            return rows, index
        label = tokens[0]
        if label not in known:
            raise TopologyError(
                source, f"line {lineno}", f"row {label} is not a column of the header", "a header column"
            )
        if label in rows:
            raise TopologyError(
                source, f"line {lineno}", f"{label} listed twice (first on line {rows[label][0]})", "one row per device"
            )
        values = tokens[1:]
        lengths = {len(labels) + len(extras)} if is_gpu_label(label) else {len(labels), len(labels) + len(extras)}
        if len(values) not in lengths:
            raise FormatError(
                source,
                f"line {lineno}",
                f"row {label} has {len(values)} cells",
                f"{' or '.join(map(str, sorted(lengths)))} cells, one per header column",
            )
        rows[label] = (lineno, values[: len(labels)], dict(zip(extras, values[len(labels) :])))
    return rows, len(lines)


def _check_cell(
    row: str, column: str, cell: str, cells: Mapping[tuple[str, str], str], lineno: int, source: str
) -> None:
    where = f"line {lineno}"
    nv = _NV_RE.match(cell)
    known = PIX_TOKENS | PXB_TOKENS | SAME_NUMA_TOKENS | SYS_TOKENS
    if not (cell == "X" or cell in known or (nv and int(nv.group(1)) > 0)):
        raise FormatError(
            source,
            where,
            f"unknown cell token {cell!r} in row {row}, column {column}",
            "X, NV#, PIX, PXB, PHB, NODE or SYS",
        )
    if (cell == "X") != (row == column):
        raise TopologyError(source, where, f"row {row}, column {column} is {cell!r}", "X on the diagonal only")
    if nv and not (is_gpu_label(row) and is_gpu_label(column)):
        raise TopologyError(source, where, f"NVLink between {row} and {column}", "NV# only between two GPUs")
    mirror = cells.get((column, row))
    if mirror is not None and mirror != cell:
        raise TopologyError(
            source, where, f"{row}-{column} is {cell} but {column}-{row} is {mirror}", "a symmetric matrix"
        )


def _numa_value(cell: str | None, lineno: int, source: str) -> int | None:
    if cell is None or not cell.isdigit():  # N/A, or a range on hosts that do not bind the GPU
        if cell not in (None, *_NOT_AVAILABLE):
            logger.debug(
                "%s: line %d: NUMA Affinity %r is not one node; using the PCIe relations", source, lineno, cell
            )
        return None
    return int(cell)


def _parse_nic_legend(lines: Iterable[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for line in lines:
        match = _LEGEND_RE.match(line)
        if match:
            names[match.group(1)] = match.group(2)
    return names
