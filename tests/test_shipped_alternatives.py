"""The healthy machines' shipped algorithms as baselines on degraded and mixed clusters."""

from __future__ import annotations

from taccl_py.baselines.shipped import healthy_machines, shipped_alternatives
from taccl_py.ir.collectives import Collective
from taccl_py.ir.library import read_library, shipped_library_paths
from taccl_py.simulate import simulate
from taccl_py.topology.builtins import load_topology
from taccl_py.topology.cluster import load_cluster
from taccl_py.verify import verify_algorithm


def test_healthy_machines_of_degraded_and_mixed_clusters_but_not_of_a_healthy_one():
    assert healthy_machines(load_cluster(topology="dgx-a100", nodes=4, nics_down=["1:nic3"])) == ("dgx-a100",)
    assert healthy_machines(load_cluster(cluster="dgx-a100:2,dgx-h100:2")) == ("dgx-a100", "dgx-h100")
    assert healthy_machines(load_cluster(topology="ndv2", nodes=2, nic_speeds=["1:nic0:4.76"])) == ("ndv2",)
    assert healthy_machines(load_topology("ndv2", 2)) == ()
    assert healthy_machines(load_topology("dgx-a100", 3)) == ()  # no shipped library at 3 nodes


def test_the_shipped_band_runs_on_the_degraded_cluster_and_is_timed_there():
    degraded = load_cluster(topology="dgx-a100", nodes=2, nics_down=["1:nic3"])
    sizes = (1_000_000, 64_000_000)
    found = shipped_alternatives(degraded, Collective.ALLGATHER, sizes)
    (path,) = [p for p in shipped_library_paths("dgx-a100", 2) if p.name == "allgather.library.json"]
    library = read_library(path)
    for size, (algorithm, result) in zip(sizes, found):
        band = library.select(size)
        assert algorithm.name.startswith("shipped-dgx-a100x2-") and algorithm.ranks == band.ranks
        assert verify_algorithm(algorithm).ok
        on_degraded = simulate(band, degraded, size).time_us
        assert result.time_us == on_degraded
        # A dead NIC can only slow the healthy schedule down.
        assert on_degraded >= simulate(band, load_topology("dgx-a100", 2), size).time_us
