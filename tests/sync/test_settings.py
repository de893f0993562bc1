"""Which remote a command uses: its options first, then JUDGESTORE_SYNC_DIR / JUDGESTORE_HUB_REPO."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from store.errors import InvalidInputError
from store.store import Store
from store.sync import DirectoryRemote, HubRemote, fetch, open_remote, push
from tests.sync.helpers import completions, fill


def test_options_win_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGESTORE_HUB_REPO", "org/from-env")
    monkeypatch.setenv("JUDGESTORE_HUB_REVISION", "dev")
    from_env = open_remote()
    assert isinstance(from_env, HubRemote) and (from_env.repo_id, from_env.revision) == ("org/from-env", "dev")
    assert isinstance(open_remote(directory=tmp_path), DirectoryRemote)
    named = open_remote(repo="org/named", revision="main")
    assert isinstance(named, HubRemote) and (named.repo_id, named.revision) == ("org/named", "main")
    monkeypatch.setenv("JUDGESTORE_SYNC_DIR", str(tmp_path))
    with pytest.raises(InvalidInputError, match="JUDGESTORE_SYNC_DIR and JUDGESTORE_HUB_REPO are both set"):
        open_remote()  # neither silently wins, as --dir and --repo together are refused
    assert isinstance(open_remote(directory=tmp_path), DirectoryRemote)  # an option still says which
    assert isinstance(open_remote(repo="org/named"), HubRemote)


@pytest.mark.parametrize("repo", ["not a repo", " ", "org/a/b"])
def test_a_bad_repository_in_the_environment_is_named_by_its_variable(
    repo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGESTORE_HUB_REPO", repo)
    with pytest.raises(InvalidInputError, match=r"^JUDGESTORE_HUB_REPO must be ORG/NAME"):
        open_remote()


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


def test_push_and_fetch_through_the_api_read_the_shard_settings(
    tmp_path: Path, make_store: Callable[[str], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the API (and a run's fetch before it, CachedModel's) used the defaults whatever the variables said, so
    JUDGESTORE_MAX_SHARD_BYTES, a safety limit, held for `hub fetch` only."""
    ours, theirs = make_store("ours"), make_store("theirs")
    fill(ours, completions(range(40)))
    (tmp_path / "shared").mkdir()
    remote = DirectoryRemote(tmp_path / "shared")
    monkeypatch.setenv("JUDGESTORE_SHARD_TARGET_BYTES", "4000")
    pushed = push(ours, remote)
    assert pushed.shards > 1  # the default target would put 40 small rows in one shard
    monkeypatch.setenv("JUDGESTORE_MAX_SHARD_BYTES", "10")
    refused = fetch(theirs, remote)
    assert refused.rows == 0 and refused.rejected_paths and not refused.ok  # listed sizes over the cap: not downloaded
    assert all("over the cap of 10" in p.reason for p in refused.rejected_paths)
    monkeypatch.delenv("JUDGESTORE_MAX_SHARD_BYTES")
    assert fetch(theirs, remote).rows == 40
