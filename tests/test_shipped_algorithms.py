"""The shipped libraries in algorithms/: complete, well formed, and every algorithm in them verified.

Libraries of up to ``FAST_RANKS`` GPUs are verified in the default run; the larger ones (32 and
64 GPUs take tens of seconds each to replay) are verified under ``-m slow``.
"""

from __future__ import annotations

import itertools
import json

import pytest

from taccl_py.ir.library import read_library, shipped_library_dir, shipped_library_paths
from taccl_py.errors import ArgumentError
from taccl_py.msccl import generate_msccl_xml, read_msccl_xml
from taccl_py.topology import builtin_topology_names

from helpers import assert_valid_algorithm

ROOT = shipped_library_dir()
LIBRARIES = sorted(ROOT.rglob("*.library.json"))
COLLECTIVES = ("allgather", "reducescatter", "allreduce")
NODES = (1, 2, 4)
FAST_RANKS = 16


def _header(path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _ids(path) -> str:
    return str(path.relative_to(ROOT))


SMALL = [p for p in LIBRARIES if _header(p)["num_ranks"] <= FAST_RANKS]
LARGE = [p for p in LIBRARIES if _header(p)["num_ranks"] > FAST_RANKS]


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
        for band in _header(path)["bands"]:
            referenced.add(path.parent / band["algorithm"])
            if band["xml"] is not None:
                referenced.add(path.parent / band["xml"])
    stray = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and p not in referenced)
    assert not stray, f"files no library names: {stray}"


@pytest.mark.parametrize("path", LIBRARIES, ids=_ids)
def test_library_is_well_formed(path):
    header = _header(path)
    topology, nodes = path.parts[-3], int(path.parts[-2][1:])
    assert (header["topology"], header["nodes"], header["collective"]) == (topology, nodes, path.name.split(".")[0])
    bands = header["bands"]
    assert bands[0]["min_bytes"] == 0 and bands[-1]["max_bytes"] is None
    for before, after in zip(bands, bands[1:]):
        assert before["max_bytes"] == after["min_bytes"] > before["min_bytes"]
    for band in bands:
        assert (path.parent / band["algorithm"]).is_file()
        assert band["xml"] is None or (path.parent / band["xml"]).is_file()


def _verify(path) -> None:
    library = read_library(path)
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


@pytest.mark.parametrize("path", SMALL, ids=_ids)
def test_library_is_verified(path):
    _verify(path)


@pytest.mark.slow
@pytest.mark.parametrize("path", LARGE, ids=_ids)
def test_large_library_is_verified(path):
    _verify(path)
