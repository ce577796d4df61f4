"""Deprecated: sketches moved to :mod:`taccl_py.stages.sketch`; this path goes in 0.3."""

from __future__ import annotations

import warnings

from taccl_py.stages import sketch as _moved


def __getattr__(name: str) -> object:
    """Return ``name`` from :mod:`taccl_py.stages.sketch` (``parse_sketch``, ``Sketch``, ...), with a warning."""
    value = getattr(_moved, name)
    warnings.warn(
        f"taccl_py.synth.sketch.{name} moved to taccl_py.stages.sketch.{name}; the old path goes in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
