"""bench/gpu_bench.py refuses at once where there is no GPU: it built a 2 GB model first, then failed on memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_bench_refuses_without_a_gpu_before_building_anything(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the bench would run")
    model_dir = tmp_path / "model"
    result = subprocess.run(
        [sys.executable, "bench/gpu_bench.py", "--prompts", "1", "--model-dir", str(model_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "no CUDA GPU here" in result.stderr, result.stderr
    assert not model_dir.exists()
