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


@pytest.mark.multiprocess
def test_every_tour_command_that_needs_no_gpu_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch", reason="the tour's bench line needs the runtime extra")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for command, comment in tour_lines():
        if NEEDS_GPU in comment:
            continue
        words = shlex.split(command)
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
