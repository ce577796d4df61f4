"""The CLI's shared formatting: ratios that never read 1.00x unless they are 1."""

from __future__ import annotations

import pytest

from taccl_py.cli._output import format_ratio


@pytest.mark.parametrize(
    ("ratio", "text"),
    [
        (431.4 / 462.4, "0.93x"),
        (431.4 / 433.5, "0.995x"),  # issue 14: this read "1.00x", as if the slower synthesis were as fast
        (433.5 / 431.4, "1.005x"),
        (0.99999, "0.99999x"),
        (1 - 1e-9, "0.999999x"),
        (1 + 1e-9, "1.000001x"),
        (1.0, "1.00x"),
        (2.5, "2.50x"),
    ],
)
def test_format_ratio_keeps_its_side_of_one(ratio, text):
    assert format_ratio(ratio) == text
