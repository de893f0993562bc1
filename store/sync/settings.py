"""Settings of sharing (``JUDGESTORE_HUB_*``, ``JUDGESTORE_SYNC_*``), and building a remote from them.

Contract: like :mod:`store.settings`, nothing is read at import time.
:func:`open_remote` picks, in order: an explicit folder, an explicit Hub
repository, ``JUDGESTORE_SYNC_DIR``, ``JUDGESTORE_HUB_REPO``; with none of
them it raises :class:`~store.errors.InvalidInputError` naming the options.
Building a Hub remote is the only place ``huggingface_hub`` gets imported.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from store.errors import InvalidInputError
from store.sync.remote import DirectoryRemote, Remote
from store.sync.shards import DEFAULT_MAX_BYTES, DEFAULT_TARGET_BYTES


class SyncSettings(BaseSettings):
    """Where and how caches are shared; environment variables use the ``JUDGESTORE_`` prefix."""

    model_config = SettingsConfigDict(env_prefix="JUDGESTORE_", extra="ignore")

    hub_repo: str | None = Field(default=None, description="Dataset repository (ORG/NAME) pushed to and fetched from.")
    hub_revision: str = Field(default="main", description="Branch to push to; branch, tag or commit to fetch.")
    sync_dir: Path | None = Field(default=None, description="A shared folder to use as the remote instead of the Hub.")
    shard_target_bytes: int = Field(default=DEFAULT_TARGET_BYTES, ge=1, description="Uncompressed bytes per shard.")
    max_shard_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1, description="Largest shard a fetch accepts.")
    fetch_before_run: bool = Field(
        default=False, description="`judgestore generate/judge` fetch their descriptor folder from the remote first."
    )


def open_remote(
    *,
    repo: str | None = None,
    directory: Path | None = None,
    revision: str | None = None,
    token: str | None = None,
    settings: SyncSettings | None = None,
) -> Remote:
    """The remote named by the arguments, else by the settings (see the module docstring)."""
    if repo is not None and directory is not None:
        raise InvalidInputError("name one remote: a Hub repository (--repo) or a folder (--dir), not both")
    settings = settings or SyncSettings()
    if directory is None and repo is None:
        directory, repo = settings.sync_dir, settings.hub_repo
    if directory is not None:
        return DirectoryRemote(directory)
    if repo is None:
        raise InvalidInputError(
            "no remote given: pass --repo ORG/NAME (a Hugging Face dataset repository) or --dir PATH "
            "(a shared folder), or set JUDGESTORE_HUB_REPO or JUDGESTORE_SYNC_DIR"
        )
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise InvalidInputError(f"--repo must be ORG/NAME (a dataset repository id), got {repo!r}")
    from store.sync.hub import HubRemote

    return HubRemote(repo, revision=revision or settings.hub_revision, token=token)
