"""scripts/train_3d.py: a TP x DP job on 8 local gloo ranks routes its subgroups' collectives, trains as gloo does."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:  # the ranks import the script by name, as run_local's children do
    sys.path.insert(0, str(SCRIPTS))

import train_3d  # noqa: E402

FINAL_LINE = re.compile(r"^subgroup collectives routed: (\d+) of (\d+); max parameter difference: (\S+)$")
STEPS = 2
WORLD = 8


def _run(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, int, int, float]:
    """Return the script's exit status and its final line's R, T and D."""
    status = train_3d.main(["--nproc", str(WORLD), "--topology", "ndv2", "--steps", str(STEPS), *options])
    lines = capsys.readouterr().out.strip().splitlines()
    match = FINAL_LINE.match(lines[-1]) if lines else None
    assert match, f"final line {lines[-1:]!r} is not the summary"
    return status, int(match[1]), int(match[2]), float(match[3])


def _tp_calls() -> int:
    """Return the TP all-reduces of a run over all ranks: one forward and one backward per block and step."""
    return WORLD * STEPS * train_3d.BLOCKS * 2


# the second layout takes another ~12-35 s (8 ranks on 2 cores): --runslow
@pytest.mark.parametrize(
    "tp, dp", [pytest.param(4, 2, id="tp4-dp2"), pytest.param(2, 4, id="tp2-dp4", marks=pytest.mark.slow)]
)
def test_subgroups_routed_and_trained_alike(capsys: pytest.CaptureFixture[str], tp: int, dp: int) -> None:
    status, routed, total, difference = _run(capsys, "--tp", str(tp), "--dp", str(dp))
    # on top of the TP calls: DDP's gradient all-reduces (a bucket per step at least) and its all-gather
    assert total >= _tp_calls() + WORLD * (STEPS + 1)
    assert routed == total
    assert difference < train_3d.TOLERANCE
    assert status == 0


def test_missing_library_is_counted_and_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without the DP groups' all-gather library, DDP's all-gather runs on gloo: R < T, and the status says so."""
    options = train_3d.Options("ndv2", 1, 4, 2, STEPS, 0, None)
    train_3d.synthesize_library(options, tmp_path)
    removed = sorted(tmp_path.glob("dp-*/allgather*"))
    assert removed, "no DP all-gather library was written"
    for path in removed:
        path.unlink()
    status, routed, total, difference = _run(capsys, "--tp", "4", "--dp", "2", "--library", str(tmp_path))
    assert total - routed == WORLD  # one all-gather per rank, in DDP's constructor
    assert difference < train_3d.TOLERANCE
    assert status == 1


def test_layout_must_fill_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert train_3d.main(["--nproc", "8", "--topology", "ndv2", "--tp", "2", "--dp", "2"]) == 2
    assert "tp·dp = 4; expected 8 (the job's ranks)" in capsys.readouterr().err
