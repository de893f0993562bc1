"""Sharing caches: push rows to a remote as immutable shards, fetch and validate other people's.

The library surface (the CLI in :mod:`store.cli.hub` and the inference
layer call these):

* :func:`push` / :func:`fetch` with a :class:`~store.layout.Selector`
  (role, task, provider, model, descriptor) return a :class:`PushReport` /
  :class:`FetchReport`.
* ``Selector.of(role, task, descriptor)`` selects exactly one descriptor
  folder: the inference layer fetches the folder of a run with it before
  planning the run.
* :func:`open_remote` builds a :class:`HubRemote` (a Hugging Face dataset
  repository) or a :class:`DirectoryRemote` (a shared folder) from arguments
  or ``JUDGESTORE_HUB_REPO`` / ``JUDGESTORE_SYNC_DIR`` (one of them: both set
  is refused, as ``--repo`` with ``--dir`` is).

Importing this package does not import ``huggingface_hub``; building a Hub
remote does. The protocol and its guarantees are in ``docs/sharing.md`` and
the docstrings of :mod:`store.sync.push` and :mod:`store.sync.fetch`.
:func:`open_remote` is defined here, above both kinds of remote, so that the
imports run one way (this package -> :mod:`store.sync.hub` ->
:mod:`store.sync.remote`).
"""

from __future__ import annotations

from pathlib import Path

from store.errors import InvalidInputError
from store.settings import SyncSettings, from_environment, home_expanded
from store.sync.fetch import FetchReport, fetch
from store.sync.hub import HubRemote, RetryPolicy, check_repo_id, check_token
from store.sync.push import PushReport, push
from store.sync.remote import DirectoryRemote, Remote

__all__ = [
    "DirectoryRemote",
    "FetchReport",
    "HubRemote",
    "PushReport",
    "Remote",
    "RetryPolicy",
    "SyncSettings",
    "check_repo_id",
    "check_token",
    "fetch",
    "open_remote",
    "push",
]


def open_remote(
    *,
    repo: str | None = None,
    directory: Path | None = None,
    revision: str | None = None,
    token: str | None = None,
    settings: SyncSettings | None = None,
) -> Remote:
    """The remote the arguments name (a repository or a folder, not both), else the settings' (not both either).

    ``revision`` names a branch, tag or commit of a repository; a folder, which has none, refuses one.
    """
    if repo is not None and directory is not None:
        raise InvalidInputError("name one remote: a Hub repository (--repo) or a folder (--dir), not both")
    settings = settings or from_environment(SyncSettings)
    if directory is None and repo is None:
        directory, repo = settings.sync_dir, settings.hub_repo
        if directory is not None and repo is not None:
            raise InvalidInputError(
                "JUDGESTORE_SYNC_DIR and JUDGESTORE_HUB_REPO are both set, so which remote is meant is unclear: "
                "unset one (`hub push` and `hub fetch` may instead name theirs with --dir or --repo)"
            )
        if repo is not None:
            check_repo_id(repo, "JUDGESTORE_HUB_REPO")
    if directory is not None:
        if revision is not None:  # a folder has one line of history: pushing "to a branch" would publish to all
            raise InvalidInputError(
                f"a folder remote has no branches or tags: --revision {revision} applies to a Hub repository "
                "(--repo); use another folder for rows you do not want to share yet"
            )
        return DirectoryRemote(home_expanded(directory))  # a caller's ~ (open_remote(directory=Path("~/x")))
    if repo is None:
        raise InvalidInputError(
            "no remote given: pass --repo ORG/NAME (a Hugging Face dataset repository) or --dir PATH "
            "(a shared folder), or set JUDGESTORE_HUB_REPO or JUDGESTORE_SYNC_DIR"
        )
    return HubRemote(repo, revision=revision or settings.hub_revision, token=token)
