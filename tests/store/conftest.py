"""Fixtures of the store tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import fill_small_store


@pytest.fixture
def filled(store_root: Path) -> Path:
    """A store root holding two completion databases and one judgement database (see fill_small_store)."""
    return fill_small_store(store_root)
