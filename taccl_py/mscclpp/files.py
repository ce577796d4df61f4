"""MSCCL++ plan files: one algorithm, or every size band of a library, verified twice before anything is written.

The algorithm is verified in our IR (``taccl_py.verify``), and the plan generated from it is read
back and replayed with MSCCL++'s semantics (``taccl_py.mscclpp.replay``), so a fault of the
translation is caught here rather than on a GPU. A library gives one plan per band and placement:
MSCCL++ selects a plan by collective, message size (``min_message_size``..``max_message_size``,
inclusive) and ``inplace``, so a band that is also safe in place gets a second, in-place plan.

Never worse than a baseline: given ``rivals`` (the baselines fastest at each band's sample sizes,
``taccl_py.baselines.best_baselines_by_band``), a band whose plan simulates slower than a rival's
plan by more than ``NEAR_TIE`` gets the rival's plan instead, named after it (``faster_rival_plan``).

Loadable at every size a framework passes: MSCCL++'s executor refuses a size its buffers do not
split into the plan's chunks (``taccl_py.mscclpp.sizes``), and its NCCL shim selects by range alone,
so a refused size is a failed call. Every plan written takes every power of two (and 3, 25 and
100 MiB) in its range: a plan refusing the smallest of its band serves from the first size it takes
(the sizes below are left to NCCL), one taking no power of two is left out, and a rival must take
every size the band's own plan would serve. Ranges end where an offset would pass 2^32 bytes.

Each plan is written in the protocol that simulates faster as MSCCL++ runs it (whole chunks,
``taccl_py.mscclpp.simulate``) at the band's sample sizes: LL (packets) must beat Simple by
``NEAR_TIE``. LL is not tried where it cannot win (twice the bandwidth term of the lower bound, as
packets carry half data, already exceeds Simple's time) or in an open-ended band, whose LL scratch
(packets and a double buffer: 4x the bytes received) would have no bound.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from taccl_py._io import write_text_atomic
from taccl_py.bounds import lower_bounds
from taccl_py.errors import ArgumentError, VerificationError
from taccl_py.ir.algorithm import Algorithm
from taccl_py.ir.library import AlgorithmLibrary, export_stem, write_band_files
from taccl_py.mscclpp.export import generate_mscclpp_plan
from taccl_py.mscclpp.parse import parse_mscclpp_plan
from taccl_py.mscclpp.plan import ExecutionPlan
from taccl_py.mscclpp.ranges import PlanRange, served_plans
from taccl_py.mscclpp.replay import verify_mscclpp_plan
from taccl_py.mscclpp.simulate import simulate_mscclpp_plan
from taccl_py.mscclpp.sizes import (
    acceptance_rule,
    first_accepted_min,
    framework_sizes,
    refused_sizes,
    size_multiple,
)
from taccl_py.simulate import WHOLE_CHUNKS, simulate_sizes
from taccl_py.simulate.leave_to_nccl import LeftToNccl, NcclTime
from taccl_py.simulate.protocol import LL, LL_DATA_FRACTION, NEAR_TIE, SIMPLE, band_sample_sizes
from taccl_py.topology.model import Topology
from taccl_py.verify import check_algorithm, exported_inplace_form

__all__ = [
    "LibraryPlans",
    "PlanProtocol",
    "PlanRange",
    "choose_plan_protocol",
    "faster_rival_plan",
    "fits_mscclpp",
    "generate_library_plans",
    "library_plan_name",
    "mscclpp_plan_text",
    "write_library_plans",
    "write_mscclpp_plan",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanProtocol:
    """A plan's protocol, why, and the sizes (bytes) where each protocol simulated was timed (µs), Simple first."""

    protocol: str
    why: str
    sizes_bytes: tuple[int, ...] = ()
    times_us: tuple[tuple[str, tuple[float, ...]], ...] = ()


@dataclass(frozen=True)
class LibraryPlans:
    """The plan files of a library as (file name, JSON text), and the placements left out as (band index, why).

    ``protocols`` holds (file name, PlanProtocol) for every file, in the same order; ``baselines``
    (file name, why) for every file that holds a baseline's plan instead of the band's; ``ranges``
    a PlanRange per file, in the same order; ``to_nccl`` (file name, LeftToNccl) for each run of a
    band's sizes left to NCCL, faster there; ``removed`` the files of an earlier export that
    writing removed.
    """

    files: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[int, str], ...]
    protocols: tuple[tuple[str, PlanProtocol], ...] = ()
    baselines: tuple[tuple[str, str], ...] = ()
    removed: tuple[str, ...] = ()
    ranges: tuple[PlanRange, ...] = ()
    to_nccl: tuple[tuple[str, LeftToNccl], ...] = ()


def _verified_plan(algorithm: Algorithm, topology: Topology | None, protocol: str) -> tuple[str, ExecutionPlan]:
    text = json.dumps(generate_mscclpp_plan(algorithm, topology, protocol=protocol), indent=2) + "\n"
    plan = parse_mscclpp_plan(text, f"{algorithm.name} (exported)")
    verify_mscclpp_plan(plan)
    return text, plan


def _times_us(plan: ExecutionPlan, topology: Topology, sizes: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(result.time_us for result in simulate_mscclpp_plan(plan, topology, sizes, model=WHOLE_CHUNKS))


def choose_plan_protocol(algorithm: Algorithm, topology: Topology | None) -> tuple[str, PlanProtocol]:
    """Return the verified plan text of ``algorithm`` in the protocol that simulates faster, and the choice.

    Raises as ``mscclpp_plan_text``.
    """
    algorithm = check_algorithm(algorithm)
    simple_text, simple = _verified_plan(algorithm, topology, SIMPLE)
    if topology is None:
        return simple_text, PlanProtocol(SIMPLE, "no machine to time LL on")
    if algorithm.max_bytes is None:
        return simple_text, PlanProtocol(SIMPLE, "open-ended band: LL's scratch would have no bound")
    sizes = band_sample_sizes(algorithm.min_bytes, algorithm.max_bytes)
    times = ((SIMPLE, _times_us(simple, topology, sizes)),)
    simple_total = sum(times[0][1])
    bounds = lower_bounds(topology, algorithm.collective, sizes)
    if sum(bound.bandwidth_time_us for bound in bounds) / LL_DATA_FRACTION >= (1 - NEAR_TIE) * simple_total:
        return simple_text, PlanProtocol(SIMPLE, "LL cannot win: its bytes alone take longer", sizes, times)
    try:
        ll_text, ll = _verified_plan(algorithm, topology, LL)
    except ArgumentError as error:  # an LL plan past MSCCL++'s limits leaves Simple's
        return simple_text, PlanProtocol(SIMPLE, f"no LL plan: {error}", sizes, times)
    times += ((LL, _times_us(ll, topology, sizes)),)
    speedup = simple_total / sum(times[1][1])
    if speedup * (1 - NEAR_TIE) > 1:
        return ll_text, PlanProtocol(LL, f"LL simulates {speedup:.2f}x faster than Simple", sizes, times)
    return simple_text, PlanProtocol(SIMPLE, f"LL simulates {speedup:.2f}x Simple's speed", sizes, times)


def _plan_and_protocol(algorithm: Algorithm, topology: Topology | None, protocol: str | None):
    if protocol is None:
        return choose_plan_protocol(algorithm, topology)
    return mscclpp_plan_text(algorithm, topology, protocol), PlanProtocol(protocol, "asked for")


def _plan_floor_us(algorithm: Algorithm, topology: Topology, sizes: tuple[int, ...], protocol: str | None) -> float:
    """Return the least a plan of ``algorithm`` may take over ``sizes`` (µs, summed): its schedule in a protocol."""
    protocols = [protocol] if protocol is not None else [SIMPLE] + ([LL] if algorithm.max_bytes is not None else [])
    totals = []
    for name in protocols:
        results = simulate_sizes(replace(algorithm, protocol=name), topology, sizes, model=WHOLE_CHUNKS)
        totals.append(sum(result.time_us for result in results))
    return min(totals)


def faster_rival_plan(
    text: str,
    band: Algorithm,
    topology: Topology,
    rivals: Sequence[Algorithm],
    protocol: str | None = None,
    inplace: bool = False,
    ours_us: float | None = None,
    served_from: int | None = None,
) -> tuple[str, PlanProtocol, str] | None:
    """Return the verified plan of the fastest rival that beats the plan ``text`` of ``band``, its protocol and why.

    Times are summed over the band's sample sizes (whole-chunk model, µs); a rival must be faster by
    more than ``NEAR_TIE``. Its plan takes the band's sizes and the placement ``inplace``, and is
    named ``<band name>-<rival name>``. A plan costs at least its algorithm in the plan's protocol,
    so only a rival whose algorithm simulates faster in some protocol the plan may take gets a plan
    built; one with no plan within MSCCL++'s limits, or no in-place form, drops out, and so does one
    whose executor refuses a framework size (``sizes.framework_sizes``) from ``served_from`` bytes
    (default: the band's least) to its maximum. ``ours_us``: the plan's time over the sample sizes
    where already simulated. None: no rival is faster.
    """
    sizes = band_sample_sizes(band.min_bytes, band.max_bytes)
    ours = sum(_times_us(parse_mscclpp_plan(text, band.name), topology, sizes)) if ours_us is None else ours_us
    best = None
    for baseline in rivals:
        rival = replace(baseline, name=f"{band.name}-{baseline.name}")
        rival = replace(rival, min_bytes=band.min_bytes, max_bytes=band.max_bytes)
        if _plan_floor_us(rival, topology, sizes, protocol) >= ours:
            continue
        if inplace and (rival := exported_inplace_form(rival)[0]) is None:
            continue
        try:
            rival_text, choice = _plan_and_protocol(rival, topology, protocol)
        except ArgumentError:  # past MSCCL++'s limits
            continue
        except VerificationError as error:  # a fault of ours: say so, and keep the band's plan
            logger.warning("baseline %s gives no verified plan for %s: %s", baseline.name, band.name, error)
            continue
        rival_plan = parse_mscclpp_plan(rival_text, rival.name)
        low = band.min_bytes if served_from is None else served_from
        if refused := refused_sizes(rival_plan, framework_sizes(low, acceptance_rule(rival_plan).max_bytes)):
            logger.info(
                "baseline %s refuses %d sizes of %s, %d bytes first", baseline.name, len(refused), band.name, refused[0]
            )
            continue
        theirs = sum(_times_us(rival_plan, topology, sizes))
        if theirs * (1 + NEAR_TIE) < ours and (best is None or theirs < best[0]):
            speedup = ours / theirs
            best = (theirs, rival_text, choice, f"baseline {baseline.name} simulates {speedup:.2f}x faster")
    return None if best is None else best[1:]


def fits_mscclpp(algorithm: Algorithm, topology: Topology | None = None, powers_of_two: bool = False) -> bool:
    """Return whether ``algorithm`` lowers to a plan within MSCCL++'s limits (the plan is not verified here).

    ``powers_of_two``: and whether the plan's chunk counts take every power of two from some size on.
    """
    try:
        plan = generate_mscclpp_plan(algorithm, topology)
    except ArgumentError:
        return False
    if not powers_of_two:
        return True
    chunks = [(gpu["input_chunks"], gpu["output_chunks"]) for gpu in plan["gpus"]]
    multiple = size_multiple(plan["collective"], len(plan["gpus"]), plan["buffer_alignment"], chunks)
    return multiple & (multiple - 1) == 0


def mscclpp_plan_text(algorithm: Algorithm, topology: Topology | None = None, protocol: str | None = None) -> str:
    """Return ``algorithm`` as the JSON text of an MSCCL++ plan, both verified.

    ``protocol``: ``"Simple"``, ``"LL"``, or None for the faster (``choose_plan_protocol``).
    Raises ``VerificationError`` when the algorithm, or the plan read back, is wrong, and
    ``ArgumentError`` where the plan would pass MSCCL++'s limits (``generate_mscclpp_plan``).
    """
    if protocol is None:
        return choose_plan_protocol(algorithm, topology)[0]
    return _verified_plan(check_algorithm(algorithm), topology, protocol)[0]


def write_mscclpp_plan(
    algorithm: Algorithm, path: str | Path, topology: Topology | None = None, protocol: str | None = None
) -> None:
    """Write ``algorithm`` to ``path`` as a verified MSCCL++ plan; nothing is written when it fails."""
    write_text_atomic(path, mscclpp_plan_text(algorithm, topology, protocol))


def library_plan_name(library: AlgorithmLibrary, index: int, inplace: bool = False) -> str:
    """Return the plan file name of band ``index``: unique across machines, node counts, collectives and placements.

    >>> from taccl_py.ir import AlgorithmLibrary, Collective
    >>> library_plan_name(AlgorithmLibrary("ndv2", 2, Collective.ALLGATHER, 16, ()), 3, inplace=True)
    'ndv2-n2-allgather-3-inplace.json'
    """
    suffix = "-inplace" if inplace else ""
    return f"{export_stem(library)}-{index}{suffix}.json"


def generate_library_plans(
    library: AlgorithmLibrary,
    topology: Topology | None = None,
    protocol: str | None = None,
    rivals: Mapping[int, Sequence[Algorithm]] | None = None,
    nccl_times: Mapping[int, NcclTime] | None = None,
) -> LibraryPlans:
    """Return the verified MSCCL++ plans of every band of ``library``, in and out of place, and what was left out.

    ``protocol``: ``"Simple"``, ``"LL"``, or None for each plan's faster (``choose_plan_protocol``).
    ``rivals``: band index -> baselines whose plan replaces the band's where faster
    (``faster_rival_plan``; needs ``topology``). ``nccl_times``: NCCL's best at every
    ``library_probe_sizes`` size of the bands (``nccl_best_times`` under MSCCL's loop; needs
    ``topology``): a plan then serves only the runs of sizes where it is not slower
    (``ranges.served_plans``), each run its own file.

    A "native" band gets no plan: where no plan covers a size, MSCCL++'s NCCL-compatible library
    runs its own collective, which is what the band asks for. Nor does a placement whose plan takes
    no power of two; a plan refusing its band's least sizes serves from the first it takes
    (``sizes.first_accepted_min``, ``LibraryPlans.ranges``).
    """
    files, skipped, protocols, replaced, ranges, to_nccl = [], [], [], [], [], []
    for index, band in enumerate(library.bands):
        if band.native:
            continue
        # The band's range is what MSCCL++ selects by, whatever range the algorithm was saved with.
        name = library_plan_name(library, index).removesuffix(".json")
        base = replace(band.algorithm, name=name, min_bytes=band.min_bytes, max_bytes=band.max_bytes)
        # MSCCL++ selects by one inplace flag, so an in-place form is always a plan of its own.
        variant, why_not = exported_inplace_form(base)
        if why_not is not None:
            skipped.append((index, f"no in-place plan: {why_not}"))
        for algorithm in [base] if variant is None else [base, variant]:
            file_name = library_plan_name(library, index, algorithm.inplace)
            placement = "in place" if algorithm.inplace else "out of place"
            try:
                text, choice = _plan_and_protocol(algorithm, topology, protocol)
            except (ArgumentError, VerificationError) as error:
                skipped.append((index, f"{placement}: {error}"))
                continue
            plan = parse_mscclpp_plan(text, file_name)
            if (served_from := first_accepted_min(plan)) is None:
                why = f"its plan takes {acceptance_rule(plan).describe()}; its sizes are left to NCCL"
                skipped.append((index, f"{placement}: {why}"))
                continue
            if rivals and topology is not None and rivals.get(index):
                timed = dict(choice.times_us).get(choice.protocol)  # the protocol choice timed it at these sizes
                ours_us = None if timed is None else sum(timed)
                rival = faster_rival_plan(
                    text, base, topology, rivals[index], protocol, algorithm.inplace, ours_us, served_from
                )
                if rival is not None:
                    text, choice, why = rival
                    plan = parse_mscclpp_plan(text, file_name)
                    replaced.append((file_name, why))
            pieces, left = served_plans(file_name, text, base.min_bytes, base.max_bytes, topology, nccl_times)
            for piece_name, piece_text, served in pieces:
                files.append((piece_name, piece_text))
                protocols.append((piece_name, choice))
                ranges.append(served)
            to_nccl += [(file_name, run) for run in left]
    return LibraryPlans(
        tuple(files), tuple(skipped), tuple(protocols), tuple(replaced), ranges=tuple(ranges), to_nccl=tuple(to_nccl)
    )


def write_library_plans(
    library: AlgorithmLibrary,
    folder: str | Path,
    topology: Topology | None = None,
    protocol: str | None = None,
    rivals: Mapping[int, Sequence[Algorithm]] | None = None,
    replace_earlier: bool = False,
    nccl_times: Mapping[int, NcclTime] | None = None,
) -> LibraryPlans:
    """Write the verified plans of every band of ``library`` into ``folder``; return what was written and left out.

    Every text is generated and verified before the first file is written, each file through a temporary name.
    ``replace_earlier``: then remove the plans of an earlier export of ``library`` (its machine, node
    count and collective, by our file names) that this one does not overwrite, so that none of
    their size ranges outlives the export; their names are returned (``LibraryPlans.removed``).
    Other arguments as ``generate_library_plans``.
    """
    plans = generate_library_plans(library, topology, protocol, rivals, nccl_times)
    removed = write_band_files(library, folder, plans.files, ".json", replace_earlier)
    return replace(plans, removed=removed)
