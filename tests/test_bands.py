"""Writing a size-band library: a band beyond MSCCL's limits ships without XML, never half-written."""

from __future__ import annotations

import logging

from taccl_py.ir.algorithm import Buffer
from taccl_py.ir.library import AlgorithmLibrary, SizeBand, read_library
from taccl_py.ir.collectives import Collective
from taccl_py.ir.lowering import Transfer, lower_plan
from taccl_py.synth.bands import write_library

from helpers import ring_algorithm


def _too_many_steps():
    """Return a 2-rank allgather that sends one chunk at a time: 80 steps on one threadblock."""
    plan = [Transfer(0, 1, (Buffer.INPUT, i), (Buffer.OUTPUT, i)) for i in range(80)]
    plan += [Transfer(1, 0, (Buffer.INPUT, i), (Buffer.OUTPUT, 80 + i)) for i in range(80)]
    return lower_plan("long", Collective.ALLGATHER, 2, 160, plan)


def test_band_beyond_msccl_limits_has_no_xml_and_says_so(tmp_path, caplog):
    ring = ring_algorithm(Collective.ALLGATHER, 2)
    library = AlgorithmLibrary("toy", 1, Collective.ALLGATHER, 2, (
        SizeBand(0, 1000, ring, "x.json", "x.xml"),
        SizeBand(1000, None, _too_many_steps(), "y.json", "y.xml"),
    ))
    with caplog.at_level(logging.WARNING):
        write_library(library, tmp_path / "ag.library.json", compress=True)
    written = read_library(tmp_path / "ag.library.json")
    assert [band.xml_file for band in written.bands] == ["ag-0.xml.gz", None]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ag-0.json.gz", "ag-0.xml.gz", "ag-1.json.gz", "ag.library.json"]
    assert "ag-1: no MSCCL XML" in caplog.text and "at most 64 steps" in caplog.text
