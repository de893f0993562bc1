"""A folder store's catalog (:mod:`store.catalog`): where it is kept, and each database file's stamp.

Contract:

* The catalog of the store at ``root`` is
  ``$XDG_CACHE_HOME/judgestore/catalogs/<hash of the root's real path>.json``
  (:func:`catalog_path`), keyed by each database file's path under the root.
* The folders are always listed from the disk: a folder copied in by hand
  is found, a removed one is gone (its entry is dropped when the catalog is
  saved).
* A database's :func:`stamp` is its file's inode, size and times, the
  headers of its WAL and WAL-index (a commit changes them), its rollback
  journal (a hot journal left by a killed writer makes the file unreadable
  read-only until a writer rolls it back: its coming and going changes what
  a read finds, often with the database file untouched) and its folder's
  ``metadata.json``: whatever a write to the database, or a file copied over
  it, changes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from store.catalog import cache_home
from store.layout import JOURNAL_SUFFIX, METADATA_FILE, SHM_SUFFIX, WAL_SUFFIX

WAL_HEADER_BYTES = 32  # magic, format, page size, checkpoint sequence, salts, checksum
SHM_HEADER_BYTES = 48  # the WAL-index header: a change counter per commit, the frame count, checksums, salts
JOURNAL_HEADER_BYTES = 28  # magic (zeroed when committed, in PERSIST mode), page count, nonce, sizes


def catalog_path(root: Path) -> Path:
    """Where this machine keeps the catalog of the store at ``root``."""
    digest = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:32]  # the bytes the OS names it by
    return cache_home() / "catalogs" / f"{digest}.json"


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
            _file(path + JOURNAL_SUFFIX, JOURNAL_HEADER_BYTES), _file(metadata)]  # fmt: skip
