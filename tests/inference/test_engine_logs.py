"""What of the engine's own output reaches a command's: its warnings, in the engine core's own process too."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from inference.backends.vllm import engine_logs
from inference.backends.vllm.engine_logs import ENGINE_QUIET_ENV, quiet_engine

WARN = (
    "import warnings; warnings.warn('old', FutureWarning); warnings.warn('older', DeprecationWarning, stacklevel=1); "
    "warnings.warn('kept', UserWarning)"
)


def _quieted(monkeypatch: pytest.MonkeyPatch, **given: str) -> dict[str, str]:
    """The environment :func:`quiet_engine` leaves, from this one without its variables but ``given``."""
    environ = {k: v for k, v in os.environ.items() if k not in ENGINE_QUIET_ENV} | given
    monkeypatch.setattr(os, "environ", environ)  # what the call sets stays in this copy
    monkeypatch.setattr(engine_logs, "_quiet", False)
    with warnings.catch_warnings():  # and its filters in this block
        quiet_engine()
    return environ


def test_the_engine_core_process_gets_no_deprecation_warnings_and_keeps_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's engine core runs in a process of its own (its default), which imports vLLM and torch again without
    this process's warning filters: their deprecations reached a run's stderr, `--json` runs' too (was)."""
    environ = _quieted(monkeypatch)
    child = subprocess.run([sys.executable, "-c", WARN], env=environ, capture_output=True, text=True, check=True)
    assert "FutureWarning" not in child.stderr and "DeprecationWarning" not in child.stderr
    assert "UserWarning: kept" in child.stderr  # only the libraries' deprecations are kept out


def test_a_warning_setting_the_user_made_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = _quieted(monkeypatch, PYTHONWARNINGS="always")
    assert environ["PYTHONWARNINGS"] == "always"
    child = subprocess.run([sys.executable, "-c", WARN], env=environ, capture_output=True, text=True, check=True)
    assert "FutureWarning: old" in child.stderr
