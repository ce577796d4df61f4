"""Choosing a library's bands again under another execution model (issue 30)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from taccl_py.baselines import compare_baselines
from taccl_py.errors import ArgumentError
from taccl_py.ir.library import read_library, shipped_library_dir, shipped_library_paths
from taccl_py.simulate import DEFAULT_MODEL, MSCCL_LOOP, WHOLE_CHUNKS, execution_model, simulate
from taccl_py.synth.candidates import exportable
from taccl_py.synth.rechoose import band_algorithms, rechoose_bands, times_one_pass_alike
from taccl_py.topology import builtin_topology_names, load_topology


def _shipped(name: str, nodes: int, collective: str):
    path = next(p for p in shipped_library_paths(name, nodes) if p.name == f"{collective}.library.json")
    return read_library(path)


def test_every_shipped_library_was_chosen_under_the_default_model():
    # one machine's libraries were chosen under msccl, which times a schedule on one machine exactly
    # as msccl-net does (no send crosses machines: tests/test_network_pipelined.py)
    root = shipped_library_dir()
    checked = 0
    for name in builtin_topology_names():
        for folder in (root / name).iterdir() if (root / name).is_dir() else ():
            for path in folder.iterdir():
                if path.name.endswith(".library.json"):
                    provenance = json.loads(path.read_text(encoding="utf-8"))["provenance"]
                    chosen_under = {DEFAULT_MODEL.name} | ({MSCCL_LOOP.name} if folder.name == "n1" else set())
                    assert provenance.get("execution_model") in chosen_under, f"{name}/{folder.name}/{path.name}"
                    checked += 1
    assert checked >= 90


def test_a_shipped_library_chosen_again_under_its_model_is_unchanged():
    # Not NDv2's: NCCL's unloadable 6-channel ring now counts as native there (issue 47) and would take
    # 4 MB and up, which its shipped library predates; DGX-A100's bands do not depend on that rule.
    library = _shipped("dgx-a100", 1, "allgather")
    again, _ = rechoose_bands(library, load_topology("dgx-a100"))
    assert [(b.min_bytes, b.max_bytes) for b in again.bands] == [(b.min_bytes, b.max_bytes) for b in library.bands]
    assert [b.algorithm.ranks for b in again.bands] == [b.algorithm.ranks for b in library.bands]
    assert [b.algorithm.meta("source_algorithm") for b in again.bands] == [
        b.algorithm.meta("source_algorithm") for b in library.bands
    ]


def test_a_band_that_loses_under_the_slice_loop_is_replaced():
    topology = load_topology("ndv2")
    library = _shipped("ndv2", 1, "allgather")
    small = library.bands[0]  # tuned for latency: one piece per rank, shallow trees
    widened = replace(library, bands=(replace(small, min_bytes=0, max_bytes=None),))
    rechosen, choices = rechoose_bands(widened, topology)
    assert len(rechosen.bands) > 1 and rechosen.provenance.execution_model == "msccl-net"
    assert "chosen again under the msccl-net model" in rechosen.provenance.note
    largest = choices[-1]
    assert largest.chosen_result.model == "msccl-net"
    assert largest.chosen_result.time_us <= simulate(small.algorithm, topology, largest.size_bytes).time_us
    (compared,) = compare_baselines(topology, "allgather", (largest.size_bytes,), keep=exportable)
    assert largest.chosen_result.time_us <= compared.kept[1].time_us
    assert largest.baseline_name == compared.fastest[0].name


def test_band_algorithms_keep_their_synthesized_names():
    library = _shipped("ndv2", 1, "allgather")
    names = [algorithm.name for algorithm in band_algorithms(library)]
    sources = {b.algorithm.meta("source_algorithm") for b in library.bands if not b.native}  # native: no algorithm
    assert len(names) == len(set(names)) == len(sources)
    assert not any(name.startswith("allgather-") for name in names)


def test_another_model_gives_other_times():
    library = _shipped("ndv2", 1, "allgather")
    _, choices = rechoose_bands(library, load_topology("ndv2"), model=WHOLE_CHUNKS)
    assert {choice.chosen_result.model for choice in choices} == {"chunks"}


def test_bad_libraries_are_refused():
    library = _shipped("ndv2", 1, "allgather")
    with pytest.raises(ArgumentError, match="no sizes recorded"):
        rechoose_bands(replace(library, provenance=None), load_topology("ndv2"))
    with pytest.raises(ArgumentError, match="8 ranks but topology"):
        rechoose_bands(library, load_topology("ndv2", nodes=2))


def test_edges_to_native_bands_move_to_where_nccl_takes_over():
    """At every power of two between the chosen sizes, the band in effect is ours only where ours is faster."""
    from taccl_py.baselines.nccl import modelled_results
    from taccl_py.ir.library import NATIVE_ALGORITHM, AlgorithmLibrary, Provenance, SizeBand, shipped_library_paths
    from taccl_py.msccl.selection import power_of_two_sizes
    from taccl_py.simulate import simulate_sizes
    from taccl_py.synth.rechoose import refine_native_edges

    topology = load_topology("dgx-h100", nodes=2)
    shipped = read_library(next(p for p in shipped_library_paths("dgx-h100", 2) if p.name.startswith("allreduce")))
    ours = shipped.bands[0].algorithm
    edge = 2_048_000  # the geometric middle of the two chosen sizes
    bands = (SizeBand(0, edge, ours, "allreduce-0.json"), SizeBand(edge, None, None, NATIVE_ALGORITHM))
    provenance = Provenance(
        taccl_py="test", solver="highs", solver_options={}, sketch="auto", sizes=(1_024_000, 4_096_000)
    )
    library = AlgorithmLibrary("dgx-h100", 2, ours.collective, 16, bands, provenance)
    refined = refine_native_edges(library, topology)
    probes = power_of_two_sizes(1_024_001, 4_095_999)
    mine = [r.time_us for r in simulate_sizes(ours, topology, probes)]
    nccl = [
        min(times)
        for times in zip(*([r.time_us for r in rs] for _, rs in modelled_results(topology, "allreduce", probes)))
    ]
    for size, us, them in zip(probes, mine, nccl):
        assert (refined.select(size) is not None) == (us <= them), size
    assert refined.bands[0].max_bytes == refined.bands[1].min_bytes != edge


def test_a_model_that_times_network_sends_otherwise_re_chooses_every_size():
    two = load_topology("dgx-h100", nodes=2)
    net = execution_model("msccl-net")
    # msccl serializes sends between machines and msccl-net pipelines them: a single pass differs
    assert not times_one_pass_alike("msccl", net, two)
    assert times_one_pass_alike("msccl-net", net, two)
    # inside one machine both serialize, as whole chunks (a library recording no model) do
    assert times_one_pass_alike("msccl", net, load_topology("dgx-h100"))
    assert times_one_pass_alike(None, execution_model("msccl"), two)
