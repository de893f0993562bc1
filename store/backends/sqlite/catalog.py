"""A folder store's catalog: what each database held when it was last read, believed only while its files are unchanged.

Contract:

* A cache of this machine, never part of the store:
  ``$XDG_CACHE_HOME/judgestore/catalogs/<hash of the root's real path>.json``
  (default ``~/.cache``), beside a server store's side files. Nothing under
  the root is written, so read-only commands may refresh it; deleting it
  costs one slower listing; a store copied elsewhere starts without one.
* The folders are always listed from the disk: a folder copied in by hand
  is found, a removed one is gone (its entry is dropped when the catalog is
  saved). Per database file the catalog keeps the file's :func:`stamp` and
  what was derived from the file at that stamp (its state and rows, the
  distinct values of the filter columns, its statistics). An entry is used
  only while the stamp read now equals the one recorded; any difference
  and the file is read again, so a stale entry is never believed.
* The stamp is taken *before* the file is read: a write during the read
  leaves the older stamp, and the next command reads the file again.
* What changes with the clock alone is never kept: a database's state while
  its claims hold live leases (a lease that passes its deadline is stale,
  with no write to the file) is read again by every command.
* Writing is best effort and atomic (a temporary file renamed over): a
  catalog that cannot be written (a read-only home, a full disk) means the
  next command reads the files again; one that cannot be parsed, or was
  written by another version, is ignored.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from store.layout import METADATA_FILE, SHM_SUFFIX, WAL_SUFFIX

CATALOG_FORMAT = "judgestore-catalog/v1"
WAL_HEADER_BYTES = 32  # magic, format, page size, checkpoint sequence, salts, checksum
SHM_HEADER_BYTES = 48  # the WAL-index header: a change counter per commit, the frame count, checksums, salts


def catalog_path(root: Path) -> Path:
    """Where this machine keeps the catalog of the store at ``root``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:32]
    return cache / "judgestore" / "catalogs" / f"{digest}.json"


def _file(path: str, header: int = 0) -> list[Any] | None:
    """A file's inode, size, modification and change times (ns), and its first ``header`` bytes (hex)."""
    try:
        st = os.stat(path)
        head = ""
        if header:
            with open(path, "rb") as f:
                head = f.read(header).hex()
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, head]


def stamp(db_path: Path | str) -> list[Any] | None:
    """What changes whenever the database's content or its folder's metadata may have changed (see the module
    docstring); None when the database file is not there."""
    path = str(db_path)
    main = _file(path)
    if main is None:
        return None
    metadata = os.path.join(os.path.dirname(path), METADATA_FILE)
    return [main, _file(path + WAL_SUFFIX, WAL_HEADER_BYTES), _file(path + SHM_SUFFIX, SHM_HEADER_BYTES),
            _file(metadata)]  # fmt: skip


class Catalog:
    """The catalog of one folder store (see the module docstring); ``save`` writes what changed."""

    def __init__(self, root: Path, path: Path | None = None) -> None:
        self.root = root
        self.path = path or catalog_path(root)
        self._prefix = os.path.join(str(root), "")
        self._entries: dict[str, dict[str, Any]] = {}
        self._dirty = False
        try:
            doc = orjson.loads(self.path.read_bytes())
            if type(doc) is dict and doc.get("format") == CATALOG_FORMAT and type(doc.get("entries")) is dict:
                self._entries = doc["entries"]
        except (OSError, ValueError):
            pass  # none yet, unreadable or damaged: it is rebuilt from the files

    def _key(self, db_path: Path) -> str:
        return str(db_path)[len(self._prefix) :]  # the path under the root (the layout's names hold no separator)

    def remembered(
        self, db_path: Path, kind: str, compute: Callable[[], Any], *, lasting: Callable[[Any], bool] | None = None
    ) -> Any:
        """``compute()`` (a JSON value derived from the database), or what it gave at the file's present stamp;
        a value ``lasting`` refuses (one the clock alone changes) is given back but not kept."""
        now = stamp(db_path)
        key = self._key(db_path)
        entry = self._entries.get(key)
        if now is not None and entry is not None and entry.get("stamp") == now and kind in entry:
            return entry[kind]
        value = orjson.loads(orjson.dumps(compute()))  # as it reads back from the catalog, kept or not
        if now is None or (lasting is not None and not lasting(value)):
            return value
        if entry is None or entry.get("stamp") != now:
            entry = self._entries[key] = {"stamp": now}
        entry[kind] = value
        self._dirty = True
        return value

    def keep_only(self, db_paths: Iterable[Path]) -> None:
        """Drop the entries of databases no longer in the store (``db_paths``: every one there is)."""
        present = {self._key(path) for path in db_paths}
        gone = [key for key in self._entries if key not in present]
        for key in gone:
            del self._entries[key]
        self._dirty = self._dirty or bool(gone)

    def save(self) -> None:
        """Write the catalog if anything changed (atomically; silently not at all where it cannot be written)."""
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".catalog.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(orjson.dumps({"format": CATALOG_FORMAT, "root": str(self.root), "entries": self._entries}))
                os.replace(temp, self.path)
            except BaseException:
                Path(temp).unlink(missing_ok=True)
                raise
        except OSError:
            return  # a cache: the next command reads the files again
        self._dirty = False
