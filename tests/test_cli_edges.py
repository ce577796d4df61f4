"""The CLI's edges: missing extras, Ctrl-C, a closed pipe, output paths, file modes, small options."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taccl_py import __version__
from taccl_py.cli import EXIT_CLOSED_PIPE, EXIT_INPUT, EXIT_INTERRUPTED, main

REPO = Path(__file__).resolve().parents[1]


def _taccl(args: list[str], *, blocked: tuple[str, ...] = (), **options) -> subprocess.CompletedProcess:
    """Run ``python -m taccl_py args`` in a fresh process, with ``blocked`` packages made unimportable."""
    block = "".join(f"sys.modules[{name!r}] = None; " for name in blocked)
    code = f"import sys; {block}from taccl_py.cli import main; sys.exit(main({args!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, **options
    )


def _one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# -- item 1: a missing optional package names the extra ---------------------------------------------


def test_drawing_without_matplotlib_names_the_plot_extra(tmp_path: Path) -> None:
    target = tmp_path / "x.png"
    done = _taccl(["topo", "draw", "dgx2", "--nodes", "2", "-o", str(target)], blocked=("matplotlib",))
    assert done.returncode == EXIT_INPUT
    line = _one_error_line(done.stderr)
    assert "matplotlib is not installed; expected pip install 'taccl-py[plot]'" in line
    assert not target.exists()


def test_bench_without_torch_names_the_runtime_extra() -> None:
    done = _taccl(["bench", "--library", "ndv2", "--nproc", "4"], blocked=("torch",))
    assert done.returncode == EXIT_INPUT
    assert "torch is not installed; expected pip install 'taccl-py[runtime]'" in _one_error_line(done.stderr)


# -- item 3: a closed pipe and Ctrl-C ------------------------------------------------------------------


def test_a_closed_pipe_is_quiet() -> None:
    reader = subprocess.Popen(
        [sys.executable, "-m", "taccl_py", "topo", "show", "dgx2", "--nodes", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        bufsize=0,
    )
    reader.stdout.read(10)  # `| head -c 10`
    reader.stdout.close()
    with reader.stderr:
        stderr = reader.stderr.read().decode()
    assert reader.wait(timeout=120) in (0, EXIT_CLOSED_PIPE)  # 0 when everything fitted the pipe's buffer
    assert stderr == ""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_during_synthesis_is_one_line_and_status_130(tmp_path: Path, jobs: str) -> None:
    target = tmp_path / "ag.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "taccl_py", "synthesize", "-t", "ndv2", "-c", "allgather", "--sizes", "1KB-1GB"]
        + ["--jobs", jobs, "--progress", "-o", str(target)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches the workers too
    )
    started = time.monotonic()
    for line in process.stderr:  # interrupt once synthesis is under way
        if "candidate" in line or time.monotonic() - started > 60:
            break
    os.killpg(process.pid, signal.SIGINT)
    with process.stderr:
        rest = process.stderr.read()
    assert process.wait(timeout=300) == EXIT_INTERRUPTED
    assert "Traceback" not in rest and rest.rstrip().endswith("interrupted"), rest[-2000:]
    assert not target.exists()


def test_synthesis_progress_is_off_unless_asked_when_stderr_is_no_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["synthesize", "-t", "pcie-8gpu", "-c", "allgather", "--size", "1MB", "--jobs", "1"]
    assert main([*argv, "-o", str(tmp_path / "quiet.json")]) == 0
    quiet = capsys.readouterr().err
    assert main([*argv, "--progress", "-o", str(tmp_path / "loud.json")]) == 0
    loud = capsys.readouterr().err
    assert "candidate" not in quiet and "budget" in quiet  # the verdict lines stay
    assert "candidate" in loud and len(loud.splitlines()) > len(quiet.splitlines())


# -- items 6 and 7: output paths and modes --------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["baseline", "ring", "-t", "ndv2", "-c", "allgather", "-o"],
        ["topo", "draw", "ndv2", "-o"],
        ["synthesize", "-t", "dgx2", "--nodes", "4", "-c", "allreduce", "-o"],  # refused before minutes of work
    ],
)
def test_an_output_in_a_missing_folder_is_one_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    target = tmp_path / "no" / "such" / ("x.png" if "draw" in command else "x.json")
    assert main([*command, str(target)]) == EXIT_INPUT
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: ") and "no/such does not exist" in line and "\n" not in line
    assert list(tmp_path.iterdir()) == []


def test_drawings_and_algorithms_get_the_same_file_mode(tmp_path: Path) -> None:
    drawing, algorithm = tmp_path / "t.png", tmp_path / "a.json"
    assert main(["topo", "draw", "ndv2", "-o", str(drawing)]) == 0
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allgather", "-o", str(algorithm)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    for path in (drawing, algorithm):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


# -- item 13: small options and reports -------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"taccl {__version__}"


def test_place_takes_t_like_every_other_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "-t", "ndv2", "--nodes", "2", "--stages", "4"]) == 0
    assert capsys.readouterr().out


def test_a_hierarchical_baseline_is_named_for_every_channel_it_uses() -> None:
    from taccl_py.baselines.hierarchical import hierarchical_algorithm
    from taccl_py.topology import load_topology

    algorithm = hierarchical_algorithm(load_topology("ndv2", nodes=2), "allgather", channels=2)
    assert algorithm.num_channels == 3  # two local rings and the ring across machines
    assert algorithm.name == "hierarchical-3ch-1p" and dict(algorithm.metadata)["channels"] == "3"


def fallback_worker(rank: int, world: int) -> list[str]:
    """Worker: the Communicator's fall-back to torch is a WARNING, seen under default logging."""
    import torch

    from taccl_py.runtime.communicator import Communicator

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(handler)
    try:
        Communicator(None, None, timeout_s=30).all_reduce(torch.ones(8))
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in records if "using torch.distributed's own" in r.getMessage()]
    return [] if len(lines) == 1 else [f"expected one fall-back warning, got {lines}"]


@pytest.mark.multiprocess
def test_the_fallback_to_torch_is_a_warning() -> None:
    from mp_utils import assert_no_mismatches, run_ranks

    assert_no_mismatches(run_ranks(fallback_worker, 2))
