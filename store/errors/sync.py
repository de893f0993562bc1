"""Sharing (push / fetch): a remote that cannot be used, and content on it that is not what judgestore writes.

Contract: a path inside a remote is ``remote_path`` (a POSIX string), never
a :class:`~pathlib.Path`. Neither family leaves anything half-done (see
:class:`SyncError`).
"""

from __future__ import annotations

from store.errors.base import JudgestoreError

__all__ = [
    "BookkeepingError",
    "RemoteAuthError",
    "RemoteError",
    "RemoteMetadataError",
    "RemoteNotFoundError",
    "RemoteUnavailableError",
    "ShardError",
    "SyncError",
    "UnsafeRemotePathError",
    "UntrustedContentError",
]


class SyncError(JudgestoreError):
    """Base class of every push/fetch error.

    Two families: :class:`RemoteError` (the remote cannot be used right now;
    nothing was half-done: a push records nothing it could not confirm, a
    fetch imports nothing it did not validate) and :class:`UntrustedContentError`
    (something on the remote is not what judgestore writes; fetch reports it
    per file and carries on; nothing of it is imported).
    """


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

    def __init__(self, remote_path: str, message: str) -> None:
        self.remote_path = remote_path
        self.reason = message
        super().__init__(f"{remote_path}: {message}")


class UnsafeRemotePathError(UntrustedContentError):
    """A remote path that is absolute, climbs out with ``..``, or is not canonically encoded."""


class ShardError(UntrustedContentError):
    """A shard failed validation (size, gzip, SHA-256, header, a row)."""


class RemoteMetadataError(UntrustedContentError):
    """A remote metadata.json that does not match its folder or this library's bytes."""


class BookkeepingError(SyncError):
    """The sync bookkeeping database cannot be used (e.g. written by a newer judgestore)."""
