"""Live topology probe: discover this machine's GPUs, NVLinks, PCIe tree and NICs.

Sources, in order: NVML through nvidia-ml-py (``pynvml``) for GPUs (PCI bus id, model) and
NVLinks (state, version, remote PCI bus id); ``nvidia-smi --query-gpu``, ``nvidia-smi topo
-m`` and ``nvidia-smi nvlink -s`` when NVML is not usable; sysfs (read under ``root``) for
the PCIe path, NUMA node and link width of every GPU, and for the NICs
(``/sys/class/infiniband``: port rate and state; ``/sys/class/net``: speed and operstate).
Devices are matched by PCI bus id, never by index: NVML ignores ``CUDA_VISIBLE_DEVICES``,
so the probe always describes every GPU of the machine, ranked in PCI bus order.

``probe_machine`` collects the facts (``MachineProbe``); ``build_probed_topology`` turns
them into a one-machine ``Topology`` with α-β figures from the link kinds and rates found
(``taccl_py.topology.probe.build``); ``probe_topology`` does both.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from taccl_py.errors import FormatError, TopologyError
from taccl_py.topology.importers.nvidia_smi_matrix import parse_topo_matrix
from taccl_py.topology.model import LinkKind, Topology
from taccl_py.topology.probe.build import (
    MachineProbe,
    ProbedGpu,
    ProbedNic,
    ProbedNvlink,
    build_probed_topology,
    nvlink_version_of_rate,
)
from taccl_py.topology.probe.sources import (
    SysfsNic,
    normalize_pci_bus_id,
    parse_gpu_query_csv,
    parse_nvlink_status,
    read_pci_device,
    read_sysfs_nics,
)
from taccl_py.topology.rates import MAX_NVLINKS_PER_GPU

__all__ = [
    "MachineProbe",
    "ProbedGpu",
    "ProbedNic",
    "ProbedNvlink",
    "build_probed_topology",
    "collect_nvidia_smi",
    "collect_nvml",
    "probe_machine",
    "probe_topology",
]

_log = logging.getLogger(__name__)

# nvmlNvlinkVersion_t (NVML API reference, nvmlDeviceGetNvLinkVersion): enum value -> version.
_NVML_VERSION_CODES = MappingProxyType({1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"})
_NVML_LINK_SLOTS = 18  # NVML_NVLINK_MAX_LINKS of NVML 11/12; newer pynvml exports its own
_NVML_FEATURE_ENABLED = 1
_COMMAND_TIMEOUT_S = 60


def _no_gpu_error(notes: Sequence[str]) -> TopologyError:
    return TopologyError(
        "probe",
        "gpus",
        f"no NVIDIA GPU found ({'; '.join(notes)})",
        "a machine with an NVIDIA driver and at least one GPU",
    )


def collect_nvml(nvml: Any) -> tuple[tuple[ProbedGpu, ...], tuple[ProbedNvlink, ...]]:
    """Return the GPUs and NVLinks NVML reports, through the ``pynvml``-like module ``nvml``.

    Calls nvmlInit, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetPciInfo
    (``busId``), nvmlDeviceGetName, and per link slot nvmlDeviceGetNvLinkState,
    nvmlDeviceGetNvLinkRemotePciInfo (``busId``) and nvmlDeviceGetNvLinkVersion, then
    nvmlShutdown. A slot whose state query fails (``NVMLError``: not supported, invalid
    argument) has no link. NVML errors of the other calls propagate.
    """
    nvml.nvmlInit()
    try:
        handles, gpus = [], []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus_id = normalize_pci_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId, "nvml")
            name = nvml.nvmlDeviceGetName(handle)
            gpus.append(ProbedGpu(index, bus_id, name.decode() if isinstance(name, bytes) else str(name)))
            handles.append(handle)
        by_bus = {gpu.pci_bus_id: gpu.index for gpu in gpus}
        links = [link for gpu, handle in zip(gpus, handles) for link in _nvml_links(nvml, gpu.index, handle, by_bus)]
    finally:
        nvml.nvmlShutdown()
    return tuple(gpus), tuple(links)


def _nvml_links(nvml: Any, index: int, handle: Any, by_bus: dict[str, int]) -> list[ProbedNvlink]:
    found: dict[str, list] = {}
    slots = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _NVML_LINK_SLOTS))
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", _NVML_FEATURE_ENABLED)
    for slot in range(slots):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, slot) != enabled:
                continue
            remote = normalize_pci_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, slot).busId, "nvml")
        except nvml.NVMLError:
            continue
        try:
            version = _nvml_version(nvml, nvml.nvmlDeviceGetNvLinkVersion(handle, slot))
        except nvml.NVMLError:
            version = None
        entry = found.setdefault(remote, [0, version])
        entry[0] += 1
    links = []
    for remote, (count, version) in sorted(found.items()):
        peer = by_bus.get(remote)
        links.append(ProbedNvlink(index, peer, None if peer is not None else remote, count, version))
    return links


def _nvml_version(nvml: Any, code: int) -> str | None:
    names = dict(_NVML_VERSION_CODES)
    for attribute in dir(nvml):
        if attribute.startswith("NVML_NVLINK_VERSION_") and attribute[-3:-2].isdigit():
            names[getattr(nvml, attribute)] = attribute[-3:].replace("_", ".")
    return names.get(int(code))


def collect_nvidia_smi(
    run: Callable[[list[str]], str],
) -> tuple[tuple[ProbedGpu, ...], tuple[ProbedNvlink, ...], tuple[tuple[int, str], ...]]:
    """Return GPUs, NVLinks and GPU-NIC affinity from nvidia-smi run through ``run(argv) -> stdout``.

    Runs ``--query-gpu=index,pci.bus_id,name``, ``topo -m`` and ``nvlink -s`` (optional: its
    per-link rate tells the NVLink version; without it the version stays unknown). When a
    GPU's NV# counts add up to more links than it has, they go through NVSwitches.
    """
    fields = ("index", "pci.bus_id", "name")
    rows = parse_gpu_query_csv(run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader"]), fields)
    gpus = [
        ProbedGpu(int(r["index"]), normalize_pci_bus_id(r["pci.bus_id"], "nvidia-smi --query-gpu"), r["name"])
        for r in rows
    ]
    matrix = parse_topo_matrix(run(["nvidia-smi", "topo", "-m"]))
    labels = matrix.gpus
    if len(labels) != len(gpus):
        raise FormatError(
            "nvidia-smi topo -m",
            None,
            f"{len(labels)} GPU columns for {len(gpus)} GPUs",
            "one column per GPU of --query-gpu",
        )
    try:
        status = {s.index: s for s in parse_nvlink_status(run(["nvidia-smi", "nvlink", "-s"]))}
    except (OSError, subprocess.SubprocessError, FormatError) as exc:
        _log.info("nvidia-smi nvlink -s unusable (%s); NVLink version unknown", exc)
        status = {}
    all_rates = [rate for s in status.values() for rate in s.active_rates_GBps]
    links = []
    for i, label in enumerate(labels):
        rates = status[i].active_rates_GBps if i in status else ()
        version = nvlink_version_of_rate(statistics.median(rates or all_rates)) if (rates or all_rates) else None
        peers = {j: matrix.nvlinks(label, other) for j, other in enumerate(labels) if j != i}
        peers = {j: count for j, count in peers.items() if count}
        budget = len(rates) if rates else MAX_NVLINKS_PER_GPU
        if sum(peers.values()) > budget:
            links.append(ProbedNvlink(i, None, "nvswitch", len(rates) or max(peers.values()), version))
        else:
            links.extend(ProbedNvlink(i, j, None, count, version) for j, count in sorted(peers.items()))
    gpus = [replace(gpu, numa=matrix.numa.get(label)) for gpu, label in zip(gpus, labels)]
    affinity = tuple(
        (i, matrix.nic_names.get(nic, nic))
        for i, label in enumerate(labels)
        for nic in matrix.nics
        if matrix.cells.get((label, nic)) in ("PIX", "PXB")
    )
    return tuple(gpus), tuple(links), affinity


def _run_command(argv: list[str]) -> str:
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False)
    if completed.returncode != 0:
        reason = (completed.stderr or completed.stdout).strip().splitlines()
        raise subprocess.CalledProcessError(completed.returncode, argv, output=reason[0] if reason else "")
    return completed.stdout


def probe_machine(
    root: str | Path = "/",
    nvml: Any | None = None,
    run: Callable[[list[str]], str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> MachineProbe:
    """Return what this machine has: GPUs, NVLinks, NICs, each located on the PCIe tree.

    Parameters
    ----------
    root : str or Path
        Directory under which ``sys/`` is read (``"/"`` live; a fake tree in tests).
    nvml : module-like, optional
        The ``pynvml`` API; by default ``import pynvml`` is tried (package nvidia-ml-py).
    run : callable, optional
        ``run(argv) -> stdout`` for nvidia-smi; by default a subprocess. Raising ``OSError``
        (not installed) or ``subprocess.SubprocessError`` (failed) skips that source.
    progress : callable, optional
        Called with one line per source read.

    Raises
    ------
    TopologyError
        ``probe: gpus: no NVIDIA GPU found (...)`` when neither NVML nor nvidia-smi shows a GPU.
    """
    say = progress or (lambda message: None)
    notes: list[str] = []
    gpus, nvlinks, affinity, sources = _collect_gpus(nvml, run or _run_command, notes, say)
    if not gpus:
        raise _no_gpu_error(notes)
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        _log.warning("CUDA_VISIBLE_DEVICES is set; the probe describes every GPU of the machine (NVML ignores it)")
    gpus = tuple(_locate_gpu(root, gpu) for gpu in gpus)
    nics = _select_nics(read_sysfs_nics(root))
    say(f"sysfs under {root}: {len(nics)} NIC port(s)")
    return MachineProbe(gpus, nvlinks, nics, affinity, sources + (f"sysfs under {root}",), _hostname())


def _collect_gpus(
    nvml: Any | None, run: Callable[[list[str]], str], notes: list[str], say: Callable[[str], None]
) -> tuple:
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            notes.append("pynvml: not installed")
    if nvml is not None:
        nvml_error = getattr(nvml, "NVMLError", ())  # pynvml's root: driver not loaded, library not found, ...
        try:
            gpus, nvlinks = collect_nvml(nvml)
        except nvml_error as exc:
            notes.append(f"NVML: {exc}")
        else:
            say(f"NVML: {len(gpus)} GPU(s), {sum(link.count for link in nvlinks)} active NVLink end(s)")
            if gpus:
                return gpus, nvlinks, (), ("NVML (nvidia-ml-py)",)
            notes.append("NVML: 0 GPUs")
    try:
        gpus, nvlinks, affinity = collect_nvidia_smi(run)
    except FileNotFoundError:
        notes.append("nvidia-smi: not found")
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi: {getattr(exc, 'output', None) or exc}")
    else:
        say(f"nvidia-smi: {len(gpus)} GPU(s)")
        return gpus, nvlinks, affinity, ("nvidia-smi --query-gpu, topo -m, nvlink -s",)
    return (), (), (), ()


def _locate_gpu(root: str | Path, gpu: ProbedGpu) -> ProbedGpu:
    device = read_pci_device(root, gpu.pci_bus_id)
    if device is None:
        return gpu
    return replace(
        gpu,
        numa=device.numa if device.numa is not None else gpu.numa,
        chain=device.chain,
        pcie_bandwidth_GBps=device.bandwidth_GBps,
    )


def _select_nics(found: Sequence[SysfsNic]) -> tuple[ProbedNic, ...]:
    """Return the active ports; RDMA ports only when there is one (NCCL prefers IB/RoCE to sockets)."""
    active = [nic for nic in found if nic.state == "ACTIVE" and nic.rate_gbps > 0]
    for nic in found:
        if nic not in active:
            _log.info("NIC %s port %d left out: state %s, rate %s Gb/s", nic.name, nic.port, nic.state, nic.rate_gbps)
    chosen = [nic for nic in active if nic.rdma] or active
    return tuple(
        ProbedNic(
            name=nic.name,
            port=nic.port,
            net_kind=LinkKind.IB if nic.link_layer.lower() == "infiniband" else LinkKind.ETHERNET,
            rate_gbps=nic.rate_gbps,
            pci_bus_id=nic.device.bus_id,
            numa=nic.device.numa,
            chain=nic.device.chain,
            pcie_bandwidth_GBps=nic.device.bandwidth_GBps,
        )
        for nic in chosen
    )


def _hostname() -> str:
    try:
        return os.uname().nodename
    except AttributeError:  # not POSIX
        return ""


def probe_topology(
    root: str | Path = "/",
    nvml: Any | None = None,
    run: Callable[[list[str]], str] | None = None,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Topology:
    """Return the topology of the machine this runs on, ready for the rest of taccl_py.

    Arguments as ``probe_machine``; ``name`` defaults to ``"probed-<hostname>"``.

    Raises
    ------
    TopologyError
        When no GPU is found: one line naming each source tried and why it gave nothing.
    """
    return build_probed_topology(probe_machine(root, nvml, run, progress), name)
