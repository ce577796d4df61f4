"""The code passes the project's ruff configuration (pyproject.toml): lint and formatting."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKED = ("taccl_py", "tests", "scripts", "topologies", "algorithms")
RUFF_TIMEOUT_S = 120


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed; it comes with the test extra: pip install -e '.[test]'")
    command = [sys.executable, "-m", "ruff", *args, *CHECKED]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=RUFF_TIMEOUT_S)


def test_ruff_lint_passes():
    done = _ruff("check", "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is():
    done = _ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
