"""docs/deploy.md: every shell command a CPU can run is run here, and succeeds.

A command is a ``$ `` line of a ```` ```console ```` block. Lines ending in ``# needs a GPU`` are
skipped; every other command must be a ``taccl`` command, run in-process in a fresh folder, in the
order the page gives them (later commands read what earlier ones wrote).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from taccl_py.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "deploy.md"
GPU_MARK = "# needs a GPU"
_FENCE = re.compile(r"^\s*```(\w*)\s*$")


def doc_commands(text: str) -> tuple[list[str], list[str]]:
    """Return the commands of the page's console blocks: (to run on a CPU, marked as needing a GPU)."""
    run, gpu = [], []
    language = None
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence:
            language = fence.group(1) if language is None else None
            continue
        stripped = line.strip()
        if language == "console" and stripped.startswith("$ "):
            command = stripped[2:]
            (gpu if command.endswith(GPU_MARK) else run).append(command)
    return run, gpu


def test_every_cpu_command_of_the_page_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, gpu = doc_commands(DOC.read_text())
    assert all(command.startswith("taccl ") for command in run), run
    # the page's steps: both exports, the registration dry run and the environments
    for step in ("taccl export-msccl ", "taccl export-mscclpp ", "taccl deploy mscclpp ", "taccl deploy msccl "):
        assert any(command.startswith(step) for command in run), step
    assert any("torchrun" in command for command in gpu) and any("libmscclpp_nccl.so" in c for c in gpu)
    monkeypatch.chdir(tmp_path)
    for command in run:
        status = main(shlex.split(command)[1:])
        captured = capsys.readouterr()
        assert status == 0, f"{command}: exit {status}: {captured.err}"
        if command.startswith("taccl deploy mscclpp"):
            assert "register_plans(" in captured.out and "served by" in captured.out
        if command.startswith("taccl deploy msccl "):
            assert "export MSCCL_ALGO_DIR=" in captured.out


def test_the_extractor_skips_other_blocks() -> None:
    text = (
        "```console\n$ taccl a\n$ make x  # needs a GPU\n```\n"
        "```python\n$ taccl b\n```\n"
        "  ```console\n  $ taccl c\n  ```\n"
    )
    assert doc_commands(text) == (["taccl a", "taccl c"], ["make x  # needs a GPU"])
