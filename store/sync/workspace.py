"""The sync workspace of a store root: ``{root}/.judgestore-sync/``.

Contract::

    {root}/.judgestore-sync/
        sync.db        the bookkeeping (store.sync.bookkeeping)
        lock           held by every push and fetch: one at a time per store root
        staging/       shards being built by a push (removed when it ends)
        quarantine/    shards and metadata.json files a fetch rejected, with the reason beside each

Everything sync writes lies in this one folder, which is never part of the
descriptor layout (``store.layout.walk`` does not look at it).
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson
from filelock import FileLock

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
    """One push or fetch per store root at a time (a second one waits)."""
    folder = workspace(root)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / "lock"):
        yield


@contextmanager
def staging_folder(root: Path) -> Iterator[Path]:
    """A fresh staging folder, removed when the block ends, however it ends."""
    folder = workspace(root) / "staging" / uuid.uuid4().hex
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
