"""``taccl --help`` and ``--version`` start without the library behind the commands (issue 43: every
command, ``--version`` included, imported everything up front and took seconds to start).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taccl_py.cli import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
#: What a command may need and ``--help`` never does (the solver's packages, the array and graph libraries).
HEAVY = frozenset({"networkx", "numpy", "pulp", "highspy", "torch", "scipy"})

_BUILD_THE_PARSER = """
import json, sys
from taccl_py.cli import build_parser
build_parser().format_help()
print(json.dumps(sorted(sys.modules)))
"""


def _imported_by(args: list[str]) -> set[str]:
    """Return the top-level packages ``python -X importtime ARGS`` imported (its stderr lists each import)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0 and done.stdout, done.stderr[-2000:]
    rows = [line.rpartition("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {name.partition(".")[0] for name in rows}


@pytest.mark.parametrize("option", ["--version", "--help"])
def test_help_and_version_import_no_command_library(option: str) -> None:
    imported = _imported_by(["-m", "taccl_py", option])
    assert "taccl_py" in imported, "the probe saw no import at all"
    assert imported & HEAVY == set()


def test_building_the_parser_imports_no_command_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_THE_PARSER], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {name.partition(".")[0] for name in json.loads(done.stdout)}
    assert imported & HEAVY == set()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_is_registered_by_the_module_commands_names(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command listed under the wrong module would be parsed by a stand-in that knows no option, not even -h."""
    with pytest.raises(SystemExit) as done:
        build_parser(command).parse_args([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: taccl {command} ")
