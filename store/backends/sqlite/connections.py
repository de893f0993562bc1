"""SQLite engines for descriptor databases: pragmas, journal policy, read-only opens.

Contract:

* Every connection gets a busy timeout, ``foreign_keys=ON`` and Python's
  sqlite3 in autocommit mode, so SQLAlchemy's ``begin`` event decides how a
  transaction starts: ``BEGIN IMMEDIATE`` for connections marked
  ``write=True`` (writers queue on the lock up front instead of failing at
  commit), plain ``BEGIN`` otherwise.
* Read-write opens choose the journal from :class:`~store.settings.Settings`
  ``journal_policy``: WAL on local disks; on a network filesystem (NFS,
  Lustre, GPFS, CIFS...: read from the mount table) the rollback journal with
  a :class:`NetworkFilesystemWarning`, or a refusal. Never silently.
  Switching the journal rewrites the file header, so it is not done on
  connect but by :func:`apply_journal_mode`, once the caller knows the file is
  ours (a foreign or newer file is refused untouched).
* Read-only opens write nothing at all: no ``-wal`` or ``-shm`` file is
  created. A WAL database that no writer has open is read as ``immutable``;
  one that a writer has open (its ``-wal`` exists) is read with ``mode=ro``.
  That choice is made again for every read-only connection (they are not
  pooled): an immutable connection kept open would never see a writer's later
  commits and would read their checkpointed pages as corruption.
* What a failure on a file means (typed errors) and retrying a lock are
  :mod:`store.backends.sqlite.errors`'s.
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Dialect
from sqlalchemy.pool import NullPool, QueuePool

from store import jsonvalues
from store.errors import (
    NetworkFilesystemError,
)
from store.layout import wal_path
from store.settings import Settings

T = TypeVar("T")

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph",
        "glusterfs", "fuse.glusterfs", "fuse.sshfs", "beegfs", "9p", "afs", "panfs", "wekafs",
    }
)  # fmt: skip
MOUNTS_FILE = Path("/proc/self/mounts")
_WAL_HEADER_BYTES = b"\x02\x02"  # bytes 18-19 of the file header: read/write version 2 = WAL


class NetworkFilesystemWarning(UserWarning):
    """The database is on a network filesystem: WAL is unsafe there, so the rollback journal is used."""


def _unescape_mount_path(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal (\040...); every
    # other character, non-ASCII ones included, is written as is.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: Path, mounts_file: Path | None = None) -> str | None:
    """Type of the filesystem holding ``path`` (its nearest existing ancestor), or None if unknown."""
    return Filesystems(mounts_file).type_of(path.resolve())


class Filesystems:
    """The filesystem types of paths, from one reading of the mount table.

    A store reads the table once, when it opens its first database, not once
    per database (mounts under a store root do not come and go while it is
    open). None when the table cannot be read.
    """

    def __init__(self, mounts_file: Path | None = None) -> None:
        try:
            text = (mounts_file or MOUNTS_FILE).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            self._table: dict[str, str] | None = None
        else:
            self._table = _mount_table(text)

    def type_of(self, resolved: Path) -> str | None:
        """:func:`filesystem_type` of a path already resolved (strings, not Paths: it runs on every open)."""
        if self._table is None:
            return None
        target = str(resolved)
        while not os.path.exists(target) and target != (parent := os.path.dirname(target)):
            target = parent
        while True:  # deepest first: the innermost mount holding the path
            if target in self._table:
                return self._table[target]
            parent = os.path.dirname(target)
            if parent == target:
                return None
            target = parent


@functools.lru_cache(maxsize=8)
def _mount_table(text: str) -> dict[str, str]:
    """Mount point -> filesystem type of a mounts file's text; the last line for a mount point wins (parsed once)."""
    table: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            table[str(Path(_unescape_mount_path(fields[1])))] = fields[2]
    return table


def journal_mode_for(
    path: Path,
    settings: Settings,
    mounts_file: Path | None = None,
    *,
    resolved: Path | None = None,
    filesystems: Filesystems | None = None,
) -> str:
    """``"wal"`` or ``"delete"`` for a read-write open of ``path``, per the journal policy.

    ``resolved`` (its ``resolve()``) and ``filesystems`` (a reading of the
    mount table) are used when the caller has them.
    """
    policy = settings.journal_policy
    if policy == "wal":
        return "wal"
    if policy == "rollback":
        return "delete"
    fstype = (filesystems or Filesystems(mounts_file)).type_of(resolved or path.resolve())
    if fstype not in NETWORK_FILESYSTEMS:
        return "wal"
    if policy == "refuse-network":
        raise NetworkFilesystemError(
            path,
            f"lies on a {fstype} network filesystem and JUDGESTORE_JOURNAL_POLICY=refuse-network. "
            "Move the store to a local disk, or set JUDGESTORE_JOURNAL_POLICY=auto to use "
            "the rollback journal there.",
        )
    warnings.warn(
        f"{path} lies on a {fstype} network filesystem: WAL needs shared memory that such "
        "filesystems do not provide, so the rollback journal is used (slower writes). "
        "Set JUDGESTORE_JOURNAL_POLICY=refuse-network to refuse instead.",
        NetworkFilesystemWarning,
        stacklevel=3,
    )
    return "delete"


def _is_wal_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(20)[18:20] == _WAL_HEADER_BYTES
    except OSError:
        return False


class FileStamp(NamedTuple):
    """What a writer changes: the main file's identity, size and mtime, and whether its WAL exists."""

    inode: int
    size: int
    mtime_ns: int
    wal_exists: bool


def file_stamp(path: Path) -> FileStamp:
    st = path.stat()
    return FileStamp(st.st_ino, st.st_size, st.st_mtime_ns, wal_path(path).exists())


def readonly_uri(path: Path) -> str:
    """SQLite URI that reads ``path`` without creating or changing any file."""
    base = f"file:{quote(str(path.resolve()))}?mode=ro"
    wal_exists = wal_path(path).exists()
    return base if wal_exists or not _is_wal_file(path) else base + "&immutable=1"


# What every SQLite engine of a store is given, and what the raw fast paths use (store.repository):
# one dialect configured the same way, so both bind and read columns through the same processors.
JSON_OPTIONS: dict[str, Any] = {
    "json_serializer": jsonvalues.dumps,  # canonical JSON; NaN and infinities kept exactly
    "json_deserializer": jsonvalues.loads,
}


@functools.cache
def sqlite_dialect() -> Dialect:
    """The SQLite dialect of the store's engines (its JSON options), for compiling statements once per process."""
    from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

    return SQLiteDialect_pysqlite(dbapi=SQLiteDialect_pysqlite.import_dbapi(), **JSON_OPTIONS)


def sqlite_connector(
    path: Path, settings: Settings, *, readonly: bool = False, filesystems: Filesystems | None = None
) -> tuple[Callable[[], sqlite3.Connection], str | None]:
    """A function opening a connection to ``path`` with the store's pragmas, and the journal mode chosen.

    The journal mode is None for read-only connections; for read-write ones
    it is to be applied once the file is known to be ours
    (:func:`set_journal_mode`). Read-only connections choose ``immutable``
    afresh each time (see the module docstring). ``filesystems``: the mount
    table as the caller read it (:class:`Filesystems`), else it is read now.
    """
    resolved = path.resolve()
    journal = None if readonly else journal_mode_for(path, settings, resolved=resolved, filesystems=filesystems)
    read_write_uri = f"file:{quote(str(resolved))}?mode=rwc"
    timeout_s = settings.busy_timeout_ms / 1000
    pragmas = [f"PRAGMA busy_timeout = {int(settings.busy_timeout_ms)}", "PRAGMA foreign_keys = ON"]
    if journal is not None:
        # NORMAL is durable in WAL mode except for the last commits on power loss.
        pragmas.append(f"PRAGMA synchronous = {'NORMAL' if journal == 'wal' else 'FULL'}")

    def connect() -> sqlite3.Connection:
        uri = readonly_uri(path) if readonly else read_write_uri
        conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None, check_same_thread=False)
        try:
            for pragma in pragmas:
                conn.execute(pragma)
        except BaseException:
            conn.close()
            raise
        return conn

    return connect, journal


def create_sqlite_engine(path: Path, settings: Settings, *, readonly: bool = False, pooled: bool = True) -> Engine:
    """An engine over one SQLite file; see the module docstring for what it guarantees.

    ``pooled=False`` gives a NullPool engine for one-off work (upgrades) whose
    connections close, and release the file, as soon as they are returned.
    Read-only engines are never pooled (see the module docstring).
    """
    connect, journal = sqlite_connector(path, settings, readonly=readonly)
    return sqlite_engine(connect, journal, pooled=pooled and not readonly)


def sqlite_engine(connect: Callable[[], sqlite3.Connection], journal: str | None, *, pooled: bool = True) -> Engine:
    """The engine of :func:`create_sqlite_engine` over connections that ``connect`` (:func:`sqlite_connector`) opens."""
    engine = create_engine(
        "sqlite://",
        creator=connect,
        poolclass=QueuePool if pooled else NullPool,
        execution_options={"journal_mode": journal},  # applied by apply_journal_mode
        **JSON_OPTIONS,
    )

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get("write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def apply_journal_mode(engine: Engine) -> None:
    """Put the file in the journal mode chosen for ``engine`` (no-op for read-only engines).

    Call it only once the file is known to be ours (current, or just created):
    the switch is persistent and rewrites the file header.
    """
    journal = engine.get_execution_options().get("journal_mode")
    if journal is None:
        return
    raw = engine.raw_connection()
    try:
        set_journal_mode(raw.driver_connection, journal)  # type: ignore[arg-type]
    finally:
        raw.close()


def set_journal_mode(conn: sqlite3.Connection, journal: str) -> None:
    """:func:`apply_journal_mode` on one raw connection (same conditions: the file is known to be ours)."""
    conn.execute(f"PRAGMA journal_mode = {journal}").fetchall()
