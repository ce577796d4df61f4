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

from helpers import error_line

REPO = Path(__file__).resolve().parents[1]


def _taccl(args: list[str], *, blocked: tuple[str, ...] = (), **options) -> subprocess.CompletedProcess:
    """Run ``python -m taccl_py args`` in a fresh process, with ``blocked`` packages made unimportable."""
    block = "".join(f"sys.modules[{name!r}] = None; " for name in blocked)
    code = f"import sys; {block}from taccl_py.cli import main; sys.exit(main({args!r}))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, **options
    )


# -- item 1: a missing optional package names the extra ---------------------------------------------


def test_drawing_without_matplotlib_names_the_plot_extra(tmp_path: Path) -> None:
    target = tmp_path / "x.png"
    done = _taccl(["topo", "draw", "dgx2", "--nodes", "2", "-o", str(target)], blocked=("matplotlib",))
    assert done.returncode == EXIT_INPUT
    line = error_line(done.stderr)
    assert line.endswith("matplotlib is not installed; expected " + PLOT_HINT)
    assert not target.exists()


PLOT_HINT = "pip install 'taccl-py[plot]' (from a clone: pip install -e '.[plot]')"


def test_simulate_plot_without_matplotlib_fails_before_reading_anything(tmp_path: Path) -> None:
    target = tmp_path / "x.png"
    # the algorithm file is missing too: the plot extra is checked first, before any work
    argv = ["simulate", str(tmp_path / "missing.json"), "-t", "ndv2", "--plot", str(target)]
    done = _taccl(argv, blocked=("matplotlib",))
    assert done.returncode == EXIT_INPUT
    assert error_line(done.stderr) == f"error: taccl simulate: matplotlib is not installed; expected {PLOT_HINT}"
    assert list(tmp_path.iterdir()) == []


def test_every_install_hint_names_the_release_and_the_clone() -> None:
    from taccl_py.cli import OPTIONAL_PACKAGES
    from taccl_py.solvers.cbc import CBC_INSTALL_HINT

    for hint in [*OPTIONAL_PACKAGES.values(), CBC_INSTALL_HINT]:
        assert hint.startswith("pip install 'taccl-py[") and "(from a clone: pip install -e '.[" in hint, hint


def test_bench_without_torch_names_the_runtime_extra() -> None:
    done = _taccl(["bench", "--library", "ndv2", "--nproc", "4"], blocked=("torch",))
    assert done.returncode == EXIT_INPUT
    expected = (
        "torch is not installed; expected pip install 'taccl-py[runtime]' (from a clone: pip install -e '.[runtime]')"
    )
    assert error_line(done.stderr).endswith(expected)


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


def _ctrl_c_as_in_a_terminal() -> None:
    """Give the child SIGINT as a terminal's foreground job has it: default action, not blocked.

    A child inherits an ignored or blocked SIGINT across exec; an earlier test's library (native
    thread pools, a solver's interrupt handler) can leave the test process so, and the child would
    then never see the Ctrl-C this test sends.
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        preexec_fn=_ctrl_c_as_in_a_terminal,
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
    """Worker: the Communicator's fall-back to torch is a WARNING on rank 0, seen under default logging.

    The other ranks say it at DEBUG, so a job of N ranks prints it once, not N times.
    """
    import torch

    from taccl_py.runtime.communicator import Communicator

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("taccl_py.runtime.communicator")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        Communicator(None, None, timeout_s=30).all_reduce(torch.ones(8))
    finally:
        logger.removeHandler(handler)
    levels = [r.levelname for r in records if "using torch.distributed's own" in r.getMessage()]
    expected = ["WARNING"] if rank == 0 else ["DEBUG"]
    return [] if levels == expected else [f"expected the fall-back line once, at {expected}, got {levels}"]


@pytest.mark.multiprocess
def test_the_fallback_to_torch_is_a_warning() -> None:
    from mp_utils import assert_no_mismatches, run_ranks

    assert_no_mismatches(run_ranks(fallback_worker, 2))


# -- issue 28 item 5: outputs that cannot be written, --nodes, option names, help texts ---------------------

#: A folder no one can create a file in (Linux: /proc refuses new files, even to root).
UNWRITABLE = Path("/proc")

#: Every command that writes a file, by the option naming it: (argv before the path, the file name to write).
FILE_WRITERS = {
    "baseline -o": (["baseline", "ring", "-t", "ndv2", "-c", "allgather", "-o"], "x.xml"),
    "convert -o": (["convert", "{algorithm}", "-o"], "x.xml"),
    "topo import -o": (["topo", "import", str(REPO / "topologies" / "ndv2.json"), "-o"], "x.json"),
    "topo draw -o": (["topo", "draw", "ndv2", "-o"], "x.png"),
    "topo export-nccl -o": (["topo", "export-nccl", "ndv2", "-o"], "x.xml"),
    "topo probe -o": (["topo", "probe", "--sysfs-root", "{folder}", "-o"], "x.json"),
    "synthesize -o": (["synthesize", "-t", "ndv2", "-c", "allgather", "--size", "1MB", "--jobs", "1", "-o"], "x.json"),
    "synthesize --xml": (
        ["synthesize", "-t", "ndv2", "-c", "allgather", "--size", "1MB", "-o", "{folder}/ok.json", "--xml"],
        "x.xml",
    ),
    "simulate --plot": (["simulate", "{algorithm}", "-t", "ndv2", "--sizes", "1MB", "--plot"], "x.png"),
}
#: Every command that writes into a folder (created if missing), by the option naming it.
FOLDER_WRITERS = {
    "export-msccl -o": ["export-msccl", "ndv2", "-o"],
    "bench --write-library": ["bench", "--library", "{folder}/ag.library.json", "--calibration", "c.json"]
    + ["--nproc", "2", "--write-library"],
}


def _files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


def _writer_argv(words: list[str], folder: Path, algorithm: Path, target: str) -> list[str]:
    return [w.format(folder=folder, algorithm=algorithm) for w in words] + [target]


@pytest.fixture
def algorithm_file(tmp_path: Path) -> Path:
    path = tmp_path / "ag.json"
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allgather", "-o", str(path)]) == 0
    return path


@pytest.mark.parametrize("fault", ["a directory", "an unwritable folder"])
@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_an_output_file_that_cannot_be_written_is_one_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm_file: Path, writer: str, fault: str
) -> None:
    words, name = FILE_WRITERS[writer]
    option = writer.split()[-1]
    if fault == "a directory":
        target = tmp_path / name
        target.mkdir()
        expected = f"{target}: {option}: is a directory; expected a file path"
    else:
        if not UNWRITABLE.is_dir():
            pytest.skip("needs Linux's /proc as a folder no file goes into")
        target = UNWRITABLE / name
        expected = f"{target}: {option}: cannot create a file in {UNWRITABLE}: "
    capsys.readouterr()
    before = _files_under(tmp_path)
    assert main(_writer_argv(words, tmp_path, algorithm_file, str(target))) == EXIT_INPUT
    captured = capsys.readouterr()
    assert error_line(captured.err).startswith(f"error: {expected}")
    assert captured.out == ""  # refused before any work
    assert _files_under(tmp_path) == before  # nothing written, no temporary left
    assert not target.exists() or list(target.iterdir()) == []


@pytest.mark.parametrize("fault", ["a file", "an unwritable folder"])
@pytest.mark.parametrize("writer", sorted(FOLDER_WRITERS))
def test_an_output_folder_that_cannot_be_written_is_one_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], writer: str, fault: str
) -> None:
    option = writer.split()[-1]
    if fault == "a file":
        target = tmp_path / "out"
        target.write_text("not a folder")
        expected = f"{target}: {option}: is a file; expected a folder (created if missing)"
    else:
        if not UNWRITABLE.is_dir():
            pytest.skip("needs Linux's /proc as a folder no folder goes into")
        target = UNWRITABLE / "taccl-out"
        expected = f"{target}: {option}: cannot create a file in {UNWRITABLE}: "
    before = _files_under(tmp_path)
    assert main(_writer_argv(FOLDER_WRITERS[writer], tmp_path, tmp_path, str(target))) == EXIT_INPUT
    assert error_line(capsys.readouterr().err).startswith(f"error: {expected}")
    assert _files_under(tmp_path) == before


def test_an_existing_output_folder_is_written_into(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "msccl").mkdir()
    assert main(["export-msccl", "ndv2", "-o", str(tmp_path / "msccl")]) == 0
    assert list((tmp_path / "msccl").glob("*.xml"))


@pytest.mark.parametrize(
    "command",
    [
        ["topo", "show", "dgx2"],
        ["topo", "draw", "dgx2", "-o", "{folder}/x.png"],
        ["synthesize", "-t", "dgx2", "-c", "allgather", "-o", "{folder}/x.json"],
        ["baseline", "ring", "-t", "dgx2", "-c", "allgather", "-o", "{folder}/x.json"],
        ["simulate", "{folder}/missing.json", "-t", "dgx2"],
        ["place", "-t", "dgx2", "--stages", "4"],
        ["export-msccl", "dgx2", "-o", "{folder}/msccl"],
    ],
)
@pytest.mark.parametrize("nodes", ["1025", "0"])
def test_nodes_out_of_range_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], nodes: str
) -> None:
    argv = [word.format(folder=tmp_path) for word in command] + ["--nodes", nodes]
    assert main(argv) == EXIT_INPUT
    line = error_line(capsys.readouterr().err)
    assert line == f"error: --nodes: {nodes} nodes; expected an integer from 1 to 1024"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--sizes", "-5"], "error: --sizes: cannot read size '-5'; expected a number with B, KB"),
        (["--sizes", "1MB-"], "error: --sizes: cannot read size '1MB-'; expected a number with B, KB"),
        (["--sizes", "4MB-1MB"], "error: --sizes: range '4MB-1MB' runs backwards"),
        (["--size", "0"], "error: --size: size '0' is not positive"),
        (["--size", "1.5B"], "error: --size: size '1.5B' is 1.5 bytes"),
        (["--jobs", "0"], "error: --jobs: 0 jobs; expected a positive number of worker processes"),
        (["--node-limit", "0"], "error: --node-limit: 0 nodes; expected a positive number of nodes"),
        (["--time-limit", "-1"], "error: --time-limit: -1.0 s; expected a positive number of seconds"),
        (["--solver", "cpsat", "--node-limit", "5"], "error: --node-limit: 5 nodes with cpsat"),
    ],
)
def test_synthesis_faults_name_the_option_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    target = tmp_path / "x.json"
    argv = ["synthesize", "--topology", "ndv2", "-c", "allgather", "--jobs", "1", *options, "-o", str(target)]
    assert main(argv) == EXIT_INPUT
    assert error_line(capsys.readouterr().err).startswith(message)
    assert not target.exists()


def test_the_python_api_keeps_naming_its_parameters() -> None:
    from taccl_py.errors import ArgumentError
    from taccl_py.synth import synthesize
    from taccl_py.topology import load_topology

    with pytest.raises(ArgumentError, match="^jobs: 0 jobs; expected a positive number of worker processes"):
        synthesize(load_topology("ndv2"), "allgather", size_bytes=10**6, jobs=0)
    with pytest.raises(ArgumentError, match="^nodes: 1025 nodes; expected an integer from 1 to 1024"):
        load_topology("ndv2", nodes=1025)


def test_synthesize_help_says_what_sizes_writes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["synthesize", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "MSCCL XML per band" not in text
    assert "one algorithm JSON per band" in text and "taccl export-msccl" in text


@pytest.mark.parametrize("command", [["topo", "show"], ["topo", "draw"]])
def test_topo_show_and_draw_take_topology_like_every_other_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    output = ["-o", str(tmp_path / "t.png")] if "draw" in command else ["--sizes", "1MB"]
    assert main([*command, "--topology", "ndv2", "--nodes", "2", *output]) == 0
    by_option = capsys.readouterr().out
    assert main([*command, "ndv2", "--nodes", "2", *output]) == 0
    assert capsys.readouterr().out == by_option
    assert main([*command, "-t", "ndv2", *output]) == 0
    capsys.readouterr()


def test_topo_show_refuses_both_a_positional_and_topology(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show", "dgx2", "--topology", "ndv2"]) == EXIT_INPUT
    line = error_line(capsys.readouterr().err)
    assert line == "error: ndv2: --topology: given with TOPO 'dgx2'; expected either TOPO or --topology TOPO"


# -- sizes past the limit and backwards ranges -----------------------------------------------------------

_HUGE = "99999999999999999999999999GB"


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["synthesize", "-t", "ndv2", "-c", "allgather", "--size", _HUGE, "-o", "{folder}/x.json"], "--size"),
        (
            ["synthesize", "-t", "ndv2", "-c", "allgather", "--sizes", f"1KB-{_HUGE}", "-o", "{folder}/x.json"],
            "--sizes",
        ),
        (["simulate", "{folder}/missing.json", "-t", "ndv2", "--sizes", f"1KB,{_HUGE}"], "--sizes"),
        (["baseline", "ring", "-t", "ndv2", "-c", "allgather", "--size", _HUGE, "-o", "{folder}/x.json"], "--size"),
        (["place", "-t", "ndv2", "--stages", "4", "--activation-size", _HUGE], "--activation-size"),
        (["topo", "show", "ndv2", "--sizes", _HUGE], "--sizes"),
        (["export-msccl", "ndv2", "-o", "{folder}/msccl", "--check-selection", f"1KiB-{_HUGE}"], "--check-selection"),
        (["bench", "--library", "ndv2", "--nproc", "2", "--sizes", _HUGE], "--sizes"),
        (["profile", "--nproc", "2", "--sizes", f"1KB,{_HUGE}", "-o", "{folder}/m.json"], "--sizes"),
    ],
)
def test_a_size_past_the_limit_is_one_error_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], option: str
) -> None:
    if command[0] in ("bench", "profile"):
        pytest.importorskip("torch", reason="torch is not installed (the runtime extra)")
    assert main([word.format(folder=tmp_path) for word in command]) == EXIT_INPUT
    line = error_line(capsys.readouterr().err)
    assert line == f"error: {option}: size '{_HUGE}' is more than 1TiB; expected at most 1TiB (1099511627776 bytes)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [
        ["export-msccl", "ndv2", "-o", "{folder}/msccl", "--check-selection", "1GiB-1KiB"],
        ["simulate", "{folder}/missing.json", "-t", "ndv2", "--sizes", "1GiB-1KiB"],
        ["topo", "show", "ndv2", "--sizes", "1GiB-1KiB"],
    ],
)
def test_a_backwards_range_reads_the_same_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main([word.format(folder=tmp_path) for word in command]) == EXIT_INPUT
    line = error_line(capsys.readouterr().err)
    assert line == f"error: {command[-2]}: range '1GiB-1KiB' runs backwards; expected LOW-HIGH with LOW <= HIGH"
    assert list(tmp_path.iterdir()) == []


# -- output free of the project's history -------------------------------------------------------------

_HISTORY = ("old bound", "issue", "before issue")


def test_tables_carry_no_project_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ring = tmp_path / "ring.json"
    assert main(["baseline", "ring", "-t", "ndv2", "-c", "allreduce", "-o", str(ring)]) == 0
    assert main(["simulate", str(ring), "-t", "ndv2", "--sizes", "1KB,1GB", "--no-baselines"]) == 0
    assert main(["topo", "show", "ndv2", "--nodes", "2", "--sizes", "1MB"]) == 0
    captured = capsys.readouterr()
    text = (captured.out + captured.err).lower()
    assert "of rs+ag bound" in text and "cut bound" in text
    assert [word for word in _HISTORY if word in text] == []
