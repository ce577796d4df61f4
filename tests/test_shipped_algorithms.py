"""The shipped libraries in algorithms/: complete, and every file in them verified."""

from __future__ import annotations

import itertools

import pytest

from taccl_py.algorithm_library import read_library, shipped_library_dir, shipped_library_paths
from taccl_py.errors import ArgumentError
from taccl_py.msccl import generate_msccl_xml, read_msccl_xml
from taccl_py.topology import builtin_topology_names

from helpers import assert_valid_algorithm

ROOT = shipped_library_dir()
LIBRARIES = sorted(ROOT.rglob("*.library.json"))
COLLECTIVES = ("allgather", "reducescatter", "allreduce")
NODES = (1, 2, 4)


def test_every_builtin_topology_has_its_libraries():
    missing = [
        f"{name}/n{nodes}/{collective}"
        for name, nodes, collective in itertools.product(builtin_topology_names(), NODES, COLLECTIVES)
        if ROOT / name / f"n{nodes}" / f"{collective}.library.json" not in shipped_library_paths(name, nodes)
    ]
    assert not missing, f"no shipped library for {missing} (run scripts/build_algorithms.py)"


def test_no_stray_files():
    referenced = set(LIBRARIES)
    for path in LIBRARIES:
        for band in read_library(path).bands:
            referenced.add(path.parent / band.algorithm_file)
            if band.xml_file is not None:
                referenced.add(path.parent / band.xml_file)
    stray = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and p not in referenced)
    assert not stray, f"files no library names: {stray}"


@pytest.mark.parametrize("path", LIBRARIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_is_verified(path):
    library = read_library(path)
    topology, nodes = path.parts[-3], int(path.parts[-2][1:])
    assert (library.topology, library.nodes, library.collective.value) == (topology, nodes, path.name.split(".")[0])
    assert library.bands[0].min_bytes == 0 and library.bands[-1].max_bytes is None
    for before, after in zip(library.bands, library.bands[1:]):
        assert before.max_bytes == after.min_bytes
    for band in library.bands:
        algorithm = band.algorithm
        assert algorithm.num_ranks == library.num_ranks and algorithm.collective is library.collective
        assert (algorithm.min_bytes, algorithm.max_bytes) == (band.min_bytes, band.max_bytes)
        assert_valid_algorithm(algorithm)
        if band.xml_file is None:  # only a schedule beyond MSCCL's runtime limits may ship without XML
            with pytest.raises(ArgumentError, match="expected at most"):
                generate_msccl_xml(algorithm)
            continue
        xml = read_msccl_xml(str(path.parent / band.xml_file))
        assert (xml.num_ranks, xml.chunks_per_loop, xml.min_bytes) == (algorithm.num_ranks, algorithm.chunks_per_loop, band.min_bytes)
