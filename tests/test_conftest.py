"""CI's rule that every test runs (``JS_TEST_NO_SKIPS``, tests/conftest.py), whatever way a test would be skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NO_SKIPS

REPO = Path(__file__).resolve().parents[1]

SKIPPED_MODULE = """
import pytest

pytest.importorskip("a_module_nobody_installed", reason="the module is missing")


def test_never_collected() -> None:
    assert True
"""

SKIPPED_TEST = """
import pytest


def test_skips_itself() -> None:
    pytest.skip("not here")


def test_runs() -> None:
    assert True
"""


def run_pytest(folder: Path, source: str, *, no_skips: bool) -> subprocess.CompletedProcess[str]:
    """pytest on a test file holding ``source`` beside one that passes, with this suite's conftest as a plugin."""
    (folder / "test_subject.py").write_text(source)
    (folder / "test_other.py").write_text("def test_passes() -> None:\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if k != NO_SKIPS} | {"PYTHONPATH": str(REPO)}
    if no_skips:
        env[NO_SKIPS] = "1"
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "-rA",
            "."]  # fmt: skip
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("source", [SKIPPED_MODULE, SKIPPED_TEST], ids=["module-level-importorskip", "test-skip"])
def test_a_skip_fails_the_run_under_the_rule_and_only_under_it(source: str, tmp_path: Path) -> None:
    allowed = run_pytest(tmp_path, source, no_skips=False)
    assert allowed.returncode == 0 and "1 skipped" in allowed.stdout, allowed.stdout + allowed.stderr
    refused = run_pytest(tmp_path, source, no_skips=True)
    assert refused.returncode != 0, refused.stdout
    assert f"{NO_SKIPS} says every test must run here" in refused.stdout
    assert "module is missing" in refused.stdout or "not here" in refused.stdout
