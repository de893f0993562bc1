"""Errors of sharing caches through a remote (the Hub or a shared folder).

Every error is a :class:`~store.errors.JudgestoreError`, so the CLI edge
prints it as one line. Two families:

* :class:`RemoteError`: the remote cannot be used right now (wrong token, no
  such repo, still failing after every retry). Nothing was half-done: a push
  records nothing it could not confirm, a fetch imports nothing it did not
  validate.
* :class:`UntrustedContentError`: something on the remote is not what
  judgestore writes (a path that escapes its folder, a shard whose bytes do
  not match its name, a metadata.json that does not match its folder). Fetch
  reports these per file and carries on with the rest; nothing of a rejected
  file is imported.
"""

from __future__ import annotations

from store.errors import JudgestoreError


class SyncError(JudgestoreError):
    """Base class of every push/fetch error."""


class RemoteError(SyncError):
    """The remote refused or failed a request."""

    def __init__(self, remote: str, message: str) -> None:
        self.remote = remote
        super().__init__(f"{remote}: {message}")


class RemoteAuthError(RemoteError):
    """401/403: the token is missing, invalid, or lacks the permission (never retried)."""


class RemoteNotFoundError(RemoteError):
    """404: no such repository or revision (never retried)."""


class RemoteUnavailableError(RemoteError):
    """A transient failure (409, 429, 5xx, timeouts) that outlasted every retry."""


class UntrustedContentError(SyncError):
    """A file on the remote is not what judgestore writes; nothing of it is used."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}")


class UnsafeRemotePathError(UntrustedContentError):
    """A remote path that is absolute, climbs out with ``..``, or is not canonically encoded."""


class ShardError(UntrustedContentError):
    """A shard failed validation (size, gzip, SHA-256, header, a row)."""


class RemoteMetadataError(UntrustedContentError):
    """A remote metadata.json that does not match its folder or this library's bytes."""


class BookkeepingError(SyncError):
    """The sync bookkeeping database cannot be used (e.g. written by a newer judgestore)."""
