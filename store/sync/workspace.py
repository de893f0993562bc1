"""The sync workspace of a store root: ``{root}/.judgestore-sync/``.

Contract::

    {root}/.judgestore-sync/
        sync.db        the bookkeeping (store.sync.bookkeeping)
        lock           held by every push and fetch: one at a time per store root
        staging/       shards being built by a push (removed when it ends)
        quarantine/    shards and metadata.json files a fetch rejected, with the reason beside each

Everything sync writes lies in this one folder, which is never part of the
descriptor layout (``store.layout.walk`` does not look at it). A fetch's dry
run in a store that has none creates none (:func:`preview_root`).
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson
from filelock import FileLock

from store.backends.sqlite.errors import translated
from store.layout import sync_folder

ProgressCallback = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: called as work advances (the CLI draws one bar per phase with it)."""


def no_progress(phase: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True, slots=True)
class SyncProblem:
    """Something a push or fetch could not use, and why (the report lists them; nothing of it was imported)."""

    path: str
    reason: str
    saved_to: str | None = None  # where the rejected bytes were quarantined, if they were read

    def as_dict(self) -> dict[str, str | None]:
        return {"path": self.path, "reason": self.reason, "saved_to": self.saved_to}


def workspace(root: Path) -> Path:
    return sync_folder(root)


@contextmanager
def sync_lock(root: Path) -> Iterator[None]:
    """One push or fetch per store root at a time (a second one waits).

    Push and fetch record what they share in the workspace, so it must be
    writable: on a read-only (or full) disk this raises the typed error before
    anything is done. A raw SQLite or filesystem error raised inside comes
    from the workspace's own files (the bookkeeping, staged shards; descriptor
    databases and remotes raise typed errors) and is raised typed as well.
    """
    folder = workspace(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(folder / "lock")
        lock.acquire()
    except OSError as e:
        error = translated(folder, e)
        error.add_note(f"hub push and hub fetch record what they share in {folder}, so it must be writable.")
        raise error from e
    try:
        yield
    except (sqlite3.Error, OSError) as e:
        raise translated(folder, e) from e
    finally:
        lock.release()


@contextmanager
def preview_root(root: Path, dry_run: bool) -> Iterator[Path]:
    """The root whose workspace a push or a fetch uses: ``root``; for a dry run where ``root`` has no workspace
    yet, a throwaway folder (removed after) whose bookkeeping is empty, as ``root``'s would be: a preview of a store
    that never shared anything leaves no trace in it (a read-only store can be previewed too)."""
    if not dry_run or workspace(root).exists():
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="judgestore-preview-") as scratch:
        yield Path(scratch)


@contextmanager
def staging_folder(root: Path) -> Iterator[Path]:
    """A fresh staging folder, removed when the block ends, however it ends. Entered under :func:`sync_lock`, so
    any other folder in ``staging/`` is a killed push's (SIGKILL, a cluster's time limit): removed first, where it
    stayed for good, a shard's worth of bytes each (was)."""
    staging = workspace(root) / "staging"
    for stale in staging.iterdir() if staging.is_dir() else ():
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    folder = staging / uuid.uuid4().hex
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def quarantine(root: Path, remote_url: str, path: str, data: bytes, reason: str, revision: str | None) -> Path:
    """Keep rejected bytes for inspection under ``quarantine/{remote}/{path}``, with ``.reason.json`` beside them.

    ``path`` must already be a safe relative path (see :func:`store.sync.remote_layout.safe_segments`).
    """
    slug = hashlib.sha256(remote_url.encode()).hexdigest()[:12]
    target = workspace(root) / "quarantine" / slug / Path(*path.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    note = {"remote": remote_url, "path": path, "revision": revision, "reason": reason, "at": datetime.now(UTC)}
    target.with_name(target.name + ".reason.json").write_bytes(orjson.dumps(note, option=orjson.OPT_INDENT_2))
    return target
