"""``taccl_py.build.memory``: the process tree a build samples, and the memory it reports.

A child of this process starts a grandchild that holds 64 MiB; both must be in the tree, found
from the kernel's per-thread children lists and, identically, from the full scan of /proc that
kernels without those lists get.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from taccl_py.build import memory
from taccl_py.build.memory import TreeMemory, process_tree

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="the process tree is read from Linux's /proc")

HELD_MB = 64
# The grandchild fills its buffer (resident, not just reserved) before it prints a line; the child
# then prints the grandchild's pid and waits for its own stdin to close.
GRANDCHILD = f"import sys; b = bytearray({HELD_MB} << 20); print(flush=True); sys.stdin.read()"
CHILD = (
    "import subprocess, sys; "
    f"g = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], stdout=subprocess.PIPE, text=True); "
    "g.stdout.readline(); print(g.pid, flush=True); sys.stdin.read(); g.kill(); g.wait()"
)


@pytest.fixture(scope="module")
def family() -> Iterator[tuple[int, int]]:
    """Return (child pid, grandchild pid) while both run, the grandchild holding ``HELD_MB``."""
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with subprocess.Popen([sys.executable, "-c", CHILD], **pipes) as child:
        yield child.pid, int(child.stdout.readline())
        child.stdin.close()  # the child kills the grandchild and ends; leaving the block waits for it


def test_the_tree_is_this_process_and_its_descendants(family: tuple[int, int]) -> None:
    tree = process_tree(os.getpid())
    assert tree[0] == os.getpid()
    assert set(family) <= set(tree)
    assert len(tree) == len(set(tree))
    assert process_tree(family[1]) == [family[1]], "a leaf's tree is itself"
    assert os.getppid() not in tree


def test_the_full_scan_finds_the_same_tree(family: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    walked = process_tree(os.getpid())
    monkeypatch.setattr(memory, "_has_children_files", lambda: False)
    assert sorted(process_tree(os.getpid())) == sorted(walked)


def test_a_grandchilds_memory_is_counted(family: tuple[int, int]) -> None:
    child, _ = family
    below = TreeMemory(child)
    below.sample()
    assert below.peak_process_MB >= HELD_MB, "the grandchild's high-water mark"
    assert below.peak_total_MB >= HELD_MB
    everything = TreeMemory(os.getpid())
    everything.sample()
    assert everything.peak_total_MB > below.peak_total_MB, "this process's memory on top"


def test_an_ended_process_is_its_own_tree_and_reads_no_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert process_tree(ended.pid) == [ended.pid]
    sampler = TreeMemory(ended.pid)
    sampler.sample()
    assert (sampler.peak_total_MB, sampler.peak_process_MB) == (0.0, 0.0)
    monkeypatch.setattr(memory, "_PROC", Path("/nonexistent-proc"))
    assert process_tree(os.getpid()) == [os.getpid()], "without /proc only the root"
