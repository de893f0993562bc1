"""Fixtures of the sync tests: loopback only, a fake Hub, both kinds of remote, stores to push from and fetch into."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from store.settings import Settings
from store.store import Store
from tests import socket_guard
from tests.fake_hub import FakeHub, point_client_at
from tests.sync.helpers import READ_TOKEN, REPO, WRITE_TOKEN, RemoteSide, Sleeps


@pytest.fixture(autouse=True)
def _loopback_only() -> Iterator[None]:
    socket_guard.install()
    yield
    socket_guard.uninstall()


@pytest.fixture(autouse=True)
def _hub_client_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real client, pointed at nothing real: no Xet, no telemetry, no saved token, no shared cache."""
    point_client_at(monkeypatch, tmp_path / "hf-home", token=WRITE_TOKEN)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """A fake Hub holding an empty dataset repo; small listing pages, so pagination is always exercised."""
    with FakeHub(page_size=4, tokens={WRITE_TOKEN: "write", READ_TOKEN: "read"}) as fake:
        fake.create_repo(REPO)
        yield fake


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture(params=["dir", "hub"])
def side(request: pytest.FixtureRequest, tmp_path: Path) -> RemoteSide:
    """Each contract test runs against a shared folder and against the (fake) Hub."""
    folder = tmp_path / "shared-folder"
    folder.mkdir()
    hub = request.getfixturevalue("hub") if request.param == "hub" else None
    return RemoteSide(request.param, folder, hub)


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[[str], Store]]:
    """Separate store roots (one per colleague), closed at the end."""
    opened: list[Store] = []

    def make(name: str) -> Store:
        store = Store(Settings(), root=tmp_path / name)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
