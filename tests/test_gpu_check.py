"""scripts/gpu_check.py end to end where CUDA is present: both NCCL transports, the backend, DDP and FSDP2.

Two ranks share GPU 0 (``--share-gpu``: NCCL links them through loopback sockets), so one GPU is
enough; the check exits non-zero when any result differs from NCCL's own. Skips without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.mark.multiprocess
def test_gpu_check_agrees_with_nccl_on_a_shared_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available: the GPU check needs a GPU")
    pytest.importorskip("cupy", reason="CUDA not available: CuPy is not installed")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(SCRIPT), "--share-gpu", "--iters", "1", "--sizes", "1048576"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "## training" in done.stdout and "DIFFER" not in done.stdout, done.stdout
