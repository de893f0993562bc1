"""Fixtures of the sync tests: loopback only, a fake Hub, both kinds of remote, stores to push from and fetch into."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from store.settings import Settings
from store.store import Store
from tests.sync import socket_guard
from tests.sync.fake_hub import FakeHub
from tests.sync.helpers import READ_TOKEN, REPO, WRITE_TOKEN, RemoteSide, Sleeps


@pytest.fixture(autouse=True)
def _loopback_only() -> Iterator[None]:
    socket_guard.install()
    yield
    socket_guard.uninstall()


@pytest.fixture(autouse=True)
def _hub_client_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real client, pointed at nothing real: no Xet, no telemetry, no saved token, no shared cache."""
    for name in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    import huggingface_hub.constants as constants
    from huggingface_hub.utils.tqdm import disable_progress_bars

    # constants are read when huggingface_hub is first imported, which may have been before this fixture
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    # the vLLM tests run offline (HF_HUB_OFFLINE=1); if the client was first imported then, it is offline for good
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    disable_progress_bars()


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
