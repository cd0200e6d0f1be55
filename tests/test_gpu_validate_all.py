"""``benchmarks/gpu_validate_all.py`` (issue 34 item 9): on a machine without CUDA it runs nothing, says so, exits 0."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the whole script (minutes)")
def test_without_cuda_nothing_runs_and_it_exits_0():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_validate_all.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "no CUDA device: nothing run\n", "")


def test_an_unknown_kind_is_refused_before_anything_runs():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_validate_all.py"), "--kinds", "zero3"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--kinds: unknown zero3" in done.stderr
