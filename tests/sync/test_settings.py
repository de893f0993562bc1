"""Which remote a command uses: its options first, then JUDGESTORE_SYNC_DIR / JUDGESTORE_HUB_REPO."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.errors import InvalidInputError
from store.sync import DirectoryRemote, HubRemote, open_remote


def test_options_win_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGESTORE_HUB_REPO", "org/from-env")
    monkeypatch.setenv("JUDGESTORE_HUB_REVISION", "dev")
    from_env = open_remote()
    assert isinstance(from_env, HubRemote) and (from_env.repo_id, from_env.revision) == ("org/from-env", "dev")
    assert isinstance(open_remote(directory=tmp_path), DirectoryRemote)
    named = open_remote(repo="org/named", revision="main")
    assert isinstance(named, HubRemote) and (named.repo_id, named.revision) == ("org/named", "main")
    monkeypatch.setenv("JUDGESTORE_SYNC_DIR", str(tmp_path))
    assert isinstance(open_remote(), DirectoryRemote)  # a folder named in the environment wins over a repo


@pytest.mark.parametrize("repo", ["just-a-name", "a/b/c", "/name", "org/"])
def test_a_repository_id_is_org_slash_name(repo: str) -> None:
    with pytest.raises(InvalidInputError, match="ORG/NAME"):
        open_remote(repo=repo)


def test_one_remote_at_a_time(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not both"):
        open_remote(repo="org/x", directory=tmp_path)


def test_a_folder_remote_refuses_a_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder has no branches: a push "to a branch" of it would publish into what every colleague fetches."""
    with pytest.raises(InvalidInputError, match="no branches"):
        open_remote(directory=tmp_path, revision="exp")
    monkeypatch.setenv("JUDGESTORE_SYNC_DIR", str(tmp_path))
    with pytest.raises(InvalidInputError, match="--revision exp"):
        open_remote(revision="exp")
    assert isinstance(open_remote(), DirectoryRemote)
