"""The CLI's shared formatting: ratios that never read 1.00x unless they are 1, and the stderr progress callback."""

from __future__ import annotations

import pickle

import pytest

from taccl_py.cli import main
from taccl_py.cli._output import format_ratio, progress_to_stderr


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
        (1 - 2e-16, "1.00x"),  # a replay and a closed form of one ring, a bit apart: a tie
        (2.5, "2.50x"),
    ],
)
def test_format_ratio_keeps_its_side_of_one(ratio, text):
    assert format_ratio(ratio) == text


def test_progress_to_stderr_pickles_and_writes_one_line(capsys):
    """``taccl bench --progress`` hands the callback to the ranks it starts: it must pickle (issue 14)."""
    report = pickle.loads(pickle.dumps(progress_to_stderr("bench: ")))
    report("64MB done")
    captured = capsys.readouterr()
    assert captured.err == "bench: 64MB done\n"
    assert captured.out == ""


@pytest.mark.parametrize("command", ["verify", "convert"])
def test_verify_and_convert_help_name_mscclpp_plans(command, capsys):
    """Both read MSCCL++ execution plans; their --help said only taccl JSON and MSCCL XML (issue 43)."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    description, positional = text.split(" positional arguments: ", 1)
    assert "MSCCL++" in description
    assert "MSCCL++ execution plan" in positional.split(" options: ", 1)[0]
