"""The error hierarchy: user faults keep where they are when they cross processes."""

from __future__ import annotations

import pickle

import pytest

from taccl_py.errors import ArgumentError, FormatError, SketchError, TopologyError


@pytest.mark.parametrize("kind", [ArgumentError, FormatError, SketchError, TopologyError])
def test_an_input_error_survives_pickling_with_its_parts(kind: type) -> None:
    error = kind("lib.json", "bands[2]", "overlaps band 1", "disjoint bands")
    copy = pickle.loads(pickle.dumps(error))
    assert (
        type(copy) is kind and str(copy) == str(error) == "lib.json: bands[2]: overlaps band 1; expected disjoint bands"
    )
    assert (copy.source, copy.field, copy.fault, copy.expected) == (
        error.source,
        error.field,
        error.fault,
        error.expected,
    )
