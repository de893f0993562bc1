"""Folders the tests build once per run, however many processes run the tests.

Contract: :func:`built_once` returns ``<run's temp folder>/built-once/<name>``, built
by ``build`` the first time any test process of this run asks for it and reused as
it is afterwards. Under pytest-xdist the workers share one run folder (the parent
of each worker's own), so the first worker builds while the others wait on a file
lock, and a folder whose build failed is built again from scratch. Callers treat
the folder as read-only (copy it before changing it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder ``name``, built by ``build(folder)`` once for the whole run (see the module docstring)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # every worker's base temp folder sits in the run's
    folder = base / "built-once" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        done = folder / ".built"
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way starts again
            folder.mkdir()
            build(folder)
            done.touch()
    return folder
