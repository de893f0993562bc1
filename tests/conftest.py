"""Fixtures every test shares: an isolated store root, a store, a descriptor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store.descriptor import ModelDescriptor
from store.settings import Settings
from store.store import Store


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches a real store: the default root points into the test's temp folder."""
    for name in list(__import__("os").environ):
        if name.startswith("JUDGESTORE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JUDGESTORE_STORE_ROOT", str(tmp_path / "store"))
    monkeypatch.setenv("JUDGESTORE_RUN_ID", "test-run")
    monkeypatch.setenv("JUDGESTORE_CREATED_BY", "tester")


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> Iterator[Store]:
    with Store(Settings(), root=store_root) as s:
        yield s


@pytest.fixture
def descriptor() -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model="Qwen/Qwen3-8B", sampling={"temperature": 0.0, "max_tokens": 64})
