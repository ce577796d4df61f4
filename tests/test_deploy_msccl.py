"""taccl_py.deploy.msccl: the environment under which msccl-executor-nccl or RCCL loads an exported XML folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from taccl_py.cli import main
from taccl_py.deploy.msccl import MscclRuntime, format_environment, msccl_environment
from taccl_py.errors import ArgumentError, FormatError


@pytest.fixture(scope="module")
def xml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped NDv2 x1 libraries as MSCCL XML, in a folder whose name needs shell quoting."""
    folder = tmp_path_factory.mktemp("xml") / "nd v2's files"
    assert main(["export-msccl", "ndv2", "-o", str(folder)]) == 0
    return folder


def _exported(block: str) -> dict[str, str]:
    """Return the variables a POSIX shell has after running ``block`` (what a user pastes)."""
    names = [line.split()[1].split("=")[0] for line in block.splitlines() if line.startswith("export ")]
    script = block + "\n" + "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    values = subprocess.run(["sh", "-c", script], capture_output=True, check=True, text=True).stdout.split("\0")
    return dict(zip(names, values))


def test_executor_environment(xml_dir: Path) -> None:
    environment = msccl_environment(xml_dir)
    assert environment.runtime is MscclRuntime.EXECUTOR
    assert environment.mapping == {"MSCCL_ALGO_DIR": str(xml_dir.resolve()), "NCCL_MSCCL_ENABLE": "1"}
    assert environment.files == len(list(xml_dir.iterdir())) and environment.rank_counts == (8,)
    block = format_environment(environment)
    assert _exported(block) == environment.mapping
    assert "make -j src.build" in block and "LD_PRELOAD=<msccl-executor-nccl>/build/lib/libnccl.so.2" in block


def test_rccl_environment(xml_dir: Path) -> None:
    environment = msccl_environment(xml_dir, "rccl")
    assert environment.mapping == {
        "MSCCL_ALGO_DIR": str(xml_dir.resolve()),
        "RCCL_MSCCL_ENABLE": "1",
        "RCCL_MSCCL_FORCE_ENABLE": "1",
        "RCCL_MSCCLPP_ENABLE": "0",
    }
    assert "RCCL_MSCCLPP_ENABLE" not in msccl_environment(xml_dir, "rccl", keep_rccl_mscclpp=True).mapping
    assert _exported(format_environment(environment)) == environment.mapping


def test_folder_faults(xml_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="no such folder"):
        msccl_environment(tmp_path / "missing")
    with pytest.raises(ArgumentError, match="holds no file"):
        msccl_environment(tmp_path)
    shutil.copy(next(xml_dir.iterdir()), tmp_path / "a.xml")
    (tmp_path / "notes.txt").write_text("not xml")
    with pytest.raises(FormatError, match=r"notes\.txt: not MSCCL-IR XML .*parses every file of its folder"):
        msccl_environment(tmp_path)
    (tmp_path / "notes.txt").unlink()
    assert msccl_environment(tmp_path).files == 1
    with pytest.raises(ArgumentError, match="runtime: unknown runtime 'nccl'"):
        msccl_environment(tmp_path, "nccl")


def test_cli(xml_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "msccl", str(xml_dir), "--runtime", "rccl"]) == 0
    out = capsys.readouterr().out
    assert "export RCCL_MSCCL_FORCE_ENABLE=1\n" in out and out.startswith("# rccl: load the ")
    (tmp_path / "x.xml").write_text("<algo")
    assert main(["deploy", "msccl", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: {tmp_path / 'x.xml'}: not MSCCL-IR XML")
