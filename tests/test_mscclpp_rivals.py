"""Never worse than a baseline: a band's plan gives way to a baseline's plan that simulates faster."""

from __future__ import annotations

from dataclasses import replace

from taccl_py.baselines import best_baselines_by_band, ring_algorithm
from taccl_py.cli.mscclpp import library_rivals
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.mscclpp import parse_mscclpp_plan, verify_mscclpp_plan
from taccl_py.mscclpp.files import faster_rival_plan, fits_mscclpp, mscclpp_plan_text
from taccl_py.simulate import WHOLE_CHUNKS
from taccl_py.topology import load_topology

MIB = 1 << 20


def _band(algorithm, name: str):
    return replace(algorithm, name=name, min_bytes=MIB, max_bytes=8 * MIB)


def test_a_faster_rivals_plan_comes_back_verified_and_named() -> None:
    topology = load_topology("ndv2")
    one_ring = _band(ring_algorithm(topology, Collective.ALLGATHER, channels=1), "band")
    four_rings = ring_algorithm(topology, Collective.ALLGATHER, channels=4)
    text = mscclpp_plan_text(one_ring, topology, "Simple")
    for inplace in (False, True):
        rival_text, choice, why = faster_rival_plan(text, one_ring, topology, [four_rings], inplace=inplace)
        plan = parse_mscclpp_plan(rival_text, "rival")
        verify_mscclpp_plan(plan)
        assert plan.name == f"band-{four_rings.name}" + ("-inplace" if inplace else "")
        assert plan.inplace is inplace and (plan.min_message_size, plan.max_message_size) == (MIB, 8 * MIB - 1)
        assert why.startswith(f"baseline {four_rings.name} simulates ") and choice.protocol == "Simple"


def test_a_rival_refusing_sizes_the_band_serves_is_no_rival() -> None:
    topology = load_topology("ndv2")
    one_ring = _band(ring_algorithm(topology, Collective.ALLGATHER, channels=1), "band")
    text = mscclpp_plan_text(one_ring, topology, "Simple")
    # six rings simulate faster, but 6 chunks per rank take multiples of 768 bytes: no power of two
    six_rings = ring_algorithm(topology, Collective.ALLGATHER)
    assert fits_mscclpp(six_rings, topology) and not fits_mscclpp(six_rings, topology, powers_of_two=True)
    assert faster_rival_plan(text, one_ring, topology, [six_rings]) is None
    # four rings take powers of two from 512 bytes (16 x 4 chunks x 8 ranks): not where the band serves 128
    small = replace(one_ring, min_bytes=0, max_bytes=MIB)
    four_rings = ring_algorithm(topology, Collective.ALLGATHER, channels=4)
    small_text = mscclpp_plan_text(small, topology, "Simple")
    assert faster_rival_plan(small_text, small, topology, [four_rings], served_from=128) is None
    assert faster_rival_plan(small_text, small, topology, [four_rings], served_from=512) is not None


def test_rivals_as_the_export_builds_them_take_powers_of_two() -> None:
    topology = load_topology("ndv2")
    path = next(p for p in shipped_library_paths("ndv2", 1) if "reducescatter" in p.name)
    rivals = library_rivals(read_library(path), topology)
    names = {rival.name for band in rivals.values() for rival in band}
    assert "ring-4ch-1p" in names and "ring-6ch-1p" not in names  # the 6-ring's loadable variant competes
    assert all(fits_mscclpp(rival, topology, powers_of_two=True) for band in rivals.values() for rival in band)


def test_a_slower_rival_leaves_the_bands_plan() -> None:
    topology = load_topology("ndv2")
    six_rings = _band(ring_algorithm(topology, Collective.ALLGATHER), "band")
    one_ring = ring_algorithm(topology, Collective.ALLGATHER, channels=1)
    text = mscclpp_plan_text(six_rings, topology, "Simple")
    assert faster_rival_plan(text, six_rings, topology, [one_ring, six_rings]) is None  # a tie is no win


def test_best_baselines_by_band_names_each_bands_fastest_baselines() -> None:
    topology = load_topology("ndv2")
    path = next(p for p in shipped_library_paths("ndv2", 1) if "reducescatter" in p.name)
    library = read_library(path)
    rivals = best_baselines_by_band(library, topology, WHOLE_CHUNKS)
    assert sorted(rivals) == [index for index, band in enumerate(library.bands) if band.algorithm is not None]
    assert "ring-6ch-1p" in {rival.name for rival in rivals[max(rivals)]}  # the last band of ours, to 2 MiB


def test_a_baseline_with_no_plan_within_the_limits_is_no_rival(monkeypatch) -> None:
    topology = load_topology("ndv2")
    path = next(p for p in shipped_library_paths("ndv2", 1) if "reducescatter" in p.name)
    ring = ring_algorithm(topology, Collective.REDUCESCATTER)
    assert fits_mscclpp(ring, topology)
    rivals = best_baselines_by_band(read_library(path), topology, WHOLE_CHUNKS, keep=lambda a: "ring" not in a.name)
    last = rivals[max(rivals)]
    assert last and not any("ring" in rival.name for rival in last)
    monkeypatch.setattr("taccl_py.mscclpp.export.MAX_THREADBLOCKS_PER_GPU", 0)
    assert not fits_mscclpp(ring, topology)
