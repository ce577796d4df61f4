"""Tests of the AlltoAll cut bound (``taccl_py.bounds.alltoall``)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from fractions import Fraction

import pytest

from taccl_py.bounds import alltoall as alltoall_bound
from taccl_py.bounds.alltoall import alltoall_cut
from taccl_py.bounds.cut import route_links
from taccl_py.topology import Link, LinkKind, load_topology

HASH_SEEDS = ("0", "1", "2", "3")
SHOW_TIMEOUT_S = 60  # one `taccl topo show` takes ~0.6 s; the limit only stops a hung child


def show_json(args: list[str], hash_seed: str) -> str:
    """Return the stdout of ``taccl topo show ARGS --json`` run under PYTHONHASHSEED=hash_seed."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    command = [sys.executable, "-m", "taccl_py", "topo", "show", *args, "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SHOW_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


# A subprocess per seed, not main([...]) in-process: string hashing is fixed when the
# interpreter starts. ndv2 showed two different NUMA cuts, dgx2:2 the last digit of the NIC cut.
@pytest.mark.parametrize("args", [["ndv2"], ["dgx2", "--nodes", "2"]], ids=["ndv2", "dgx2x2"])
def test_topo_show_prints_the_same_bytes_under_every_hash_seed(args):
    outputs = {seed: show_json(args, seed) for seed in HASH_SEEDS}
    assert len(set(outputs.values())) == 1, f"stdout differs between PYTHONHASHSEED values {sorted(outputs)}"


def test_equal_numa_cuts_go_to_the_first_in_topology_order():
    topology = load_topology("ndv2")
    cut = alltoall_cut(topology, route_links(topology))
    assert cut.cut == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert cut.description.startswith("NUMA cut: gpu0, gpu1, gpu2, gpu3 (4 GPUs)")


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_min_cut_capacity_is_the_exact_sum_in_any_link_order(order):
    # 0.1 + 0.2 + 0.3 is 0.6000000000000001 summed left to right, 0.6 right to left
    rates_GBps = (0.1, 0.2, 0.3)
    links = [Link("gpu0", f"gpu{i + 1}", LinkKind.NVLINK, 0.7, rates_GBps[i]) for i in order]
    capacity, kinds = alltoall_bound._min_cut(alltoall_bound._graph(links), ["gpu0"], ["gpu1", "gpu2", "gpu3"])
    assert capacity == sum(map(Fraction, rates_GBps))
    assert float(capacity) == 0.6
    assert kinds == {"nvlink": 3}
