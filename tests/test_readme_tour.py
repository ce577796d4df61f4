"""The README's tour of the command line runs as written, from a folder holding the repository's examples/.

Every ``taccl`` line runs in-process (``taccl_py.cli.main``), ``mkdir`` with ``os.makedirs`` and
``torchrun`` as a child process; a line whose comment says it needs NVIDIA GPUs is left out.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taccl_py.cli import main

REPO = Path(__file__).resolve().parents[1]
NEEDS_GPU = "needs NVIDIA GPUs"


def tour_lines() -> list[tuple[str, str]]:
    """Return the tour's (command, comment) lines, in order."""
    text = (REPO / "README.md").read_text()
    block = text.split("## A tour of the command line", 1)[1].split("```\n", 2)[1]
    lines = []
    for line in block.splitlines():
        command, _, comment = line.partition("  #")
        if command.strip():
            lines.append((command.strip(), comment.strip()))
    return lines


def test_the_tour_has_the_commands_it_promises() -> None:
    commands = [command.split()[:2] for command, _ in tour_lines()]
    for expected in (["taccl", "synthesize"], ["taccl", "verify"], ["torchrun", "--nproc-per-node"]):
        assert expected in commands, commands


def test_the_tour_says_which_commands_make_their_output_folder() -> None:
    """A file's folder comes from a ``mkdir`` line; the exporters make their ``-o`` folder, as its comment says."""
    lines = tour_lines()
    made = {shlex.split(command)[-1] for command, _ in lines if command.startswith("mkdir")}
    mkdir_comment = " ".join(comment for command, comment in lines if command.startswith("mkdir"))
    for command, _ in lines:
        words = shlex.split(command)
        if "-o" not in words:
            continue
        target = words[words.index("-o") + 1]
        if words[1] in ("export-msccl", "export-mscclpp"):
            assert target not in made and words[1] in mkdir_comment, command
        elif os.path.dirname(target):
            assert os.path.dirname(target) in made, command


# Lines (by a word they hold) that the default run leaves to --runslow: the syntheses of a library (20-40 s
# each on a busy core), the picture, the 8-rank torchrun, and the lines that read what those write. The
# default run keeps the topology, baseline, verify, simulate (of a shipped library), export-msccl (of
# shipped libraries), profile, bench and place lines and the cheap dgx1 AllToAll synthesis; the slow
# test runs the others, so that between them every line runs.
SLOW_WORDS = (
    "lib/ar.library.json",
    "mscclpp/",
    "ag.json",
    "lib/h100.library.json",
    "--parallel",
    "topo draw",
    "torchrun",
)


def is_slow_line(command: str) -> bool:
    """Return whether the tour line ``command`` runs only with --runslow (``mkdir`` lines run in both)."""
    return any(word in command for word in SLOW_WORDS)


def run_tour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], slow: bool) -> int:
    """Run the tour's lines that need no GPU and are (``slow``) or are not slow lines, as written; return how many."""
    pytest.importorskip("torch", reason="the tour's bench line needs the runtime extra")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    ran = 0
    for command, comment in tour_lines():
        words = shlex.split(command)
        if NEEDS_GPU in comment or (words[0] != "mkdir" and is_slow_line(command) != slow):
            continue
        ran += 1
        if words[0] == "mkdir":
            os.makedirs(words[-1], exist_ok=True)
        elif words[0] == "taccl":
            status = main(words[1:])
            if status != 0 and words[1] == "profile":  # a measurement: a busy CI core can flatten one run's times
                capsys.readouterr()
                status = main(words[1:])
            assert status == 0, f"{command}: exit {status}\n{capsys.readouterr().err[-3000:]}"
        elif words[0] == "torchrun":
            done = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", *words[1:]],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-3000:]}"
        else:
            pytest.fail(f"the tour runs {words[0]!r}, which this test does not know how to run")
    return ran


def test_the_default_run_reads_nothing_a_slow_line_writes() -> None:
    """A default-run line reads only examples and what default-run lines write; the slow lines are the costly ones."""
    lines = [shlex.split(command) for command, comment in tour_lines() if NEEDS_GPU not in comment]
    slow = [words for words in lines if words[0] != "mkdir" and is_slow_line(shlex.join(words))]
    assert sum(words[1] == "synthesize" for words in slow) == 4 and len(slow) < len(lines) // 2, slow
    written = {words[words.index("-o") + 1] for words in slow if "-o" in words}
    for words in lines:
        if words in slow:
            continue
        read = [word for i, word in enumerate(words) if i == 0 or words[i - 1] != "-o"]
        assert not [word for word in read for path in written if word == path or word.startswith(path + "/")], words


@pytest.mark.multiprocess
def test_every_tour_command_that_needs_no_gpu_and_no_slow_line_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_tour(tmp_path, monkeypatch, capsys, slow=False) > 10


@pytest.mark.slow
@pytest.mark.multiprocess
def test_every_slow_tour_command_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The synthesizing lines and their readers (``SLOW_WORDS``); the default run has the rest of the tour."""
    assert run_tour(tmp_path, monkeypatch, capsys, slow=True) > 5
