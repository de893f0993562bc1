"""Fixtures for the inference tests: tiny local models and a CPU-friendly vLLM setup.

The models are built once per run, shared by every test process (a few seconds
each, no network); engines are built by the test modules that need them, once
per module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.backends.vllm.tiny_model import build_tiny_model
from tests.built_once import built_once

# vLLM on a small CPU machine: engine core in-process (no worker processes to
# start), no torch.compile, no network, no usage reports, one OpenMP thread.
VLLM_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TORCH_COMPILE_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}

# Full vllm.LLM kwargs for the tiny model, execution-only settings included.
# CPU attention wants a block size that is a multiple of 32.
TINY_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 256,
    "seed": 0,
    "enforce_eager": True,
    "max_num_seqs": 8,
    "kv_cache_memory_bytes": 64 << 20,
    "block_size": 32,
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, built once per run (read-only: copy it to change a file)."""
    return (
        built_once(tmp_path_factory, "tiny-model", lambda f: build_tiny_model(f / "tiny-llama", seed=0)) / "tiny-llama"
    )


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer as :func:`tiny_model_dir`, other weights."""
    return (
        built_once(tmp_path_factory, "tiny-model-b", lambda f: build_tiny_model(f / "tiny-llama", seed=1))
        / "tiny-llama"
    )


@pytest.fixture(scope="session")
def vllm_env() -> Iterator[None]:
    """The CPU settings above for the whole session, restored at its end.

    Set before vLLM is first imported: it reads some of them only once.
    """
    with pytest.MonkeyPatch.context() as mp:
        for name, value in VLLM_ENV.items():
            mp.setenv(name, value)
        yield


REPO_ROOT = Path(__file__).resolve().parents[2]


def judgestore_here(*args: str, root: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``judgestore ARGS`` run in this test process, as :func:`~tests.inference.test_cli.judgestore` runs it anew.

    For a run whose point is not the process: a process that loads vLLM
    imports it first (12-17 s of CPU here), and a test process imports it
    once. A run that must show what a fresh process does (``vllm_imported``,
    the engine's log on stderr, a signal) runs in a process of its own; each
    command keeps one test that runs it so.
    """
    import tqdm  # noqa: F401  # its TQDM_* defaults are read once, at its first import: read them now, not below
    from typer.testing import CliRunner

    from inference.backends.vllm import engine_logs
    from inference.cli.app import app

    # What the command changes for the rest of its process (quiet_engine: environment variables, warning filters,
    # a flag) is put back, as the end of its process would: the next test in this process starts as it did. The
    # command line is the command's, as in its own process (a hint that quotes it back reads sys.argv).
    environ, quiet, argv = dict(os.environ), engine_logs._quiet, sys.argv
    env = {**VLLM_ENV, "JUDGESTORE_STORE_ROOT": str(root), "COLUMNS": "200"}
    try:
        sys.argv = ["judgestore", *args]
        with warnings.catch_warnings():
            result = CliRunner().invoke(app(), list(args), env=env)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        engine_logs._quiet, sys.argv = quiet, argv
    if isinstance(result.exception, Exception) and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback the command would have printed: the test shows it
    done = subprocess.CompletedProcess(["judgestore", *args], result.exit_code, result.stdout, result.stderr)
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def run_fresh_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter that imports this checkout; fail the test on error."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result
