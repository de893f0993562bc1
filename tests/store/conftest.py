"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import schema
from store.descriptor import ModelDescriptor
from store.layout import Location, Selector, select
from store.rows import DeletePlan, FoundRow, RowCount
from store.schema import read_script_directory, revisions_of
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import SYNTHETIC_REVISIONS, fill_small_store


@pytest.fixture
def filled(store_root: Path) -> Path:
    """A store root holding two completion databases and one judgement database (see fill_small_store)."""
    return fill_small_store(store_root)


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="module")
def synthetic() -> Any:
    """The script directory with a synthetic revision on top of the shipped head."""
    return read_script_directory(SYNTHETIC_REVISIONS)


def know_synthetic_revision(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make this process's library know the synthetic test revision, so databases at the shipped head are behind."""
    script = read_script_directory(SYNTHETIC_REVISIONS)
    known = revisions_of(script)
    monkeypatch.setattr(schema, "script_directory", lambda: script)
    monkeypatch.setattr(schema, "revisions", lambda: known)
    return known.head


@pytest.fixture
def synthetic_head(monkeypatch: pytest.MonkeyPatch) -> str:
    """See :func:`know_synthetic_revision` (databases made in the test are made at the synthetic head)."""
    return know_synthetic_revision(monkeypatch)


def location_of(root: Path, descriptor: ModelDescriptor) -> Location:
    return next(loc for loc in select(root) if loc.descriptor_hash16 == descriptor.hash16())


def query_rows(
    root: Path, settings: Settings, selector: Selector, flt: RowFilter, *, limit: int | None = None
) -> Iterator[FoundRow]:
    """Rows across a store root, read-only, as `judgestore query` reads them."""
    with Store(settings, root=root, readonly=True) as store:
        yield from store.query_rows(selector, flt, limit=limit)


def plan_delete(root: Path, settings: Settings, selector: Selector, flt: RowFilter) -> DeletePlan:
    with Store(settings, root=root, readonly=True) as store:
        return store.plan_delete(selector, flt)


def delete_rows(root: Path, settings: Settings, plan: DeletePlan) -> list[RowCount]:
    with Store(settings, root=root) as store:
        return store.delete_rows(plan)
