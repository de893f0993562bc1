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
  it, changes. A write changes a time only by the filesystem's tick, though:
  two writes within one tick (a second, where a filesystem keeps whole
  seconds: ext4 with small inodes, HFS+, some network mounts) that leave the
  size as it was leave the stamp as it was. So a stamp taken within
  :data:`RACY_NS` of its files' last change (within :data:`RACY_COARSE_NS`
  where their times are whole seconds) is no stamp (None): a database
  just written is read again until its files have stood still that long.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from store.catalog import cache_home
from store.layout import JOURNAL_SUFFIX, METADATA_FILE, SHM_SUFFIX, WAL_SUFFIX

WAL_HEADER_BYTES = 32  # magic, format, page size, checkpoint sequence, salts, checksum
SHM_HEADER_BYTES = 48  # the WAL-index header: a change counter per commit, the frame count, checksums, salts
JOURNAL_HEADER_BYTES = 28  # magic (zeroed when committed, in PERSIST mode), page count, nonce, sizes
RACY_NS = 50_000_000  # a filesystem keeping sub-second times ticks by a few milliseconds at most (a kernel's jiffy)
RACY_COARSE_NS = 2_000_000_000  # one keeping whole seconds (FAT keeps two)


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
    docstring); None when the database file is not there, or its files changed too recently to tell."""
    path = str(db_path)
    main = _file(path)
    if main is None:
        return None
    metadata = os.path.join(os.path.dirname(path), METADATA_FILE)
    files = [main, _file(path + WAL_SUFFIX, WAL_HEADER_BYTES), _file(path + SHM_SUFFIX, SHM_HEADER_BYTES),
             _file(path + JOURNAL_SUFFIX, JOURNAL_HEADER_BYTES), _file(metadata)]  # fmt: skip
    times = [t for f in files if f is not None for t in (f[2], f[3])]
    # Two writes within one tick of the filesystem's clock, the size kept, left one stamp: a catalog taken between
    # them was believed after the second (was). The tick is unknown: whole seconds say a coarse clock.
    window = RACY_COARSE_NS if all(t % 1_000_000_000 == 0 for t in times) else RACY_NS
    if time.time_ns() - max(times) < window:
        return None
    return files
