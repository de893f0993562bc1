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
* :func:`translated` turns every SQLite, driver or filesystem failure on a
  file into a typed :class:`~store.errors.DatabaseFileError` that names the
  file and the next step: not a database, damaged (pages, or text that is
  not UTF-8), full disk, not writable, busy, an I/O error, a missing table,
  and, for whatever SQLite reports that has no name here, an
  :class:`~store.errors.UnexpectedDatabaseError` carrying SQLite's words.
* A lock held past the busy timeout is retried by :func:`retry_while_locked`
  (backoff with jitter, ``lock_retries`` times), then raises
  :class:`~store.errors.DatabaseBusyError`; every writer of a SQLite file
  (descriptor databases, sync bookkeeping) retries through it.
"""

from __future__ import annotations

import errno
import functools
import os
import random
import re
import shutil
import sqlite3
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import NullPool, QueuePool

from store import jsonvalues
from store.errors import (
    CorruptDatabaseError,
    DamagedTextError,
    DatabaseBusyError,
    DatabaseIOError,
    JudgestoreError,
    NetworkFilesystemError,
    NotADatabaseError,
    SchemaMismatchError,
    StoreFullError,
    StoreNotWritableError,
    UnexpectedDatabaseError,
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
# SQLite's primary result codes (an extended code's low byte)
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 5, 6, 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_PROTOCOL, _SQLITE_NOLFS, _SQLITE_NOTADB = 13, 14, 15, 22, 26
_SQLITE_OS_FAILURES = frozenset({_SQLITE_PERM, _SQLITE_IOERR, _SQLITE_CANTOPEN, _SQLITE_PROTOCOL, _SQLITE_NOLFS})
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
NEARLY_FULL_BYTES = 1 << 20  # an I/O error with less than this free is the disk filling up
_UNDECODABLE = re.compile(r"could not decode to utf-8 column '([^']*)'", re.IGNORECASE)
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


def free_bytes(path: Path) -> int | None:
    """Bytes free on the filesystem holding ``path`` (its nearest existing ancestor), or None if unknown."""
    target = path
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        return shutil.disk_usage(target).free
    except OSError:
        return None


def _readable(path: Path) -> bool:
    """Whether this process (its effective user, as the OS checks it) may read ``path``."""
    return os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids)


def _on_readonly_filesystem(path: Path) -> bool:
    target = path
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        return bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def write_refusal(db_path: Path) -> JudgestoreError | None:
    """The typed error writing ``db_path`` would meet, if it can be known without writing, else None.

    The file (if it exists) and the nearest folder that exists must be writable: a read-only
    filesystem or missing permissions are known in advance; a full disk is not.
    """
    folder = next(f for f in db_path.parents if f.exists())
    for target in (db_path, folder) if db_path.exists() else (folder,):
        if _on_readonly_filesystem(target):
            return StoreNotWritableError(target, "a read-only filesystem")
        if not os.access(target, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
            return StoreNotWritableError(target, "this user may not write it: permission denied")
    return None


def translated(path: Path, error: BaseException, *, needed_bytes: int | None = None) -> JudgestoreError:
    """The typed error that a failure on ``path`` stands for (see the module docstring).

    ``error`` is an SQLAlchemy ``DBAPIError``, a raw ``sqlite3.Error`` or an
    ``OSError`` (a typed error is returned as it is). ``needed_bytes``, when
    known, is what the failed write needed (a full disk says so).
    """
    if isinstance(error, JudgestoreError):
        return error
    if isinstance(error, OSError):
        return _os_failure(path, error, needed_bytes)
    orig = error.orig if isinstance(error, DBAPIError) else error
    code = getattr(orig, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    message = str(orig)
    if primary == _SQLITE_NOTADB:
        return NotADatabaseError(path, "is not an SQLite database (wrong header); it was not touched")
    if primary == _SQLITE_CORRUPT:
        return CorruptDatabaseError(
            path,
            "is damaged (truncated or malformed pages); it was not touched. Restore it from "
            "a backup (`*.bak-*` beside it after an upgrade) or delete it to recompute its rows",
        )
    if primary == _SQLITE_FULL:
        return StoreFullError(path, free_bytes=free_bytes(path), needed_bytes=needed_bytes)
    if primary == _SQLITE_READONLY:
        return StoreNotWritableError(path, "a read-only filesystem, or no write permission on the file or its folder")
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return DatabaseBusyError(
            path,
            "another process kept it locked past the busy timeout; try again (or raise JUDGESTORE_BUSY_TIMEOUT_MS)",
        )
    if primary == _SQLITE_CANTOPEN and path.exists() and not _readable(path):
        return DatabaseIOError(
            path,
            "permission denied: this user may not read it; the operation was not completed. Fix its "
            "permissions (a writer also creates -wal, -shm and .lock files beside it), or run as a user who may",
        )
    if primary in (_SQLITE_CANTOPEN, _SQLITE_IOERR) and wal_path(path).exists() and _on_readonly_filesystem(path):
        return DatabaseIOError(
            path,
            "cannot be read here: its write-ahead log (-wal) still holds commits (a writer was interrupted, or the "
            "copy was taken while one wrote), and on a read-only filesystem SQLite cannot create the -shm file it "
            "needs to read them; nothing was changed. Open it once where it can be written (remount read-write, "
            "or copy the folder elsewhere and run `judgestore verify` on the copy)",
        )
    if primary == _SQLITE_CANTOPEN and _on_readonly_filesystem(path):
        return StoreNotWritableError(path, "a read-only filesystem: SQLite cannot create its -wal and -shm files there")
    if primary in _SQLITE_OS_FAILURES:
        free = free_bytes(path)
        if primary == _SQLITE_IOERR and free is not None and free < NEARLY_FULL_BYTES:
            # SQLite reports a write or a -shm mapping that ran out of space as an I/O error
            return StoreFullError(path, free_bytes=free, needed_bytes=needed_bytes)
        return DatabaseIOError(
            path,
            f"the operating system failed to open, read or write it ({message}); the operation was not "
            "completed. Check the disk and the permissions of the file and its folder (a writer also creates "
            "-wal, -shm and .lock files beside it), then run `judgestore verify`",
        )
    undecodable = _UNDECODABLE.search(message)
    if undecodable is not None:
        return DamagedTextError(
            path,
            f"holds text that is not valid UTF-8 in column {undecodable.group(1)} (a damaged page); nothing was "
            "changed. `judgestore verify` names the rows: delete them with `judgestore delete --input-hash HASH` "
            "so that they are recomputed, or restore the file from a backup",
        )
    if message.startswith(("no such table", "no such column")):
        return SchemaMismatchError(
            path,
            f"lacks a table or column its schema revision has ({message}): another tool edited it. Restore "
            "it from a backup (`*.bak-*` beside it after an upgrade), or delete it to recompute its rows",
        )
    name = getattr(orig, "sqlite_errorname", None)
    return UnexpectedDatabaseError(
        path,
        f"SQLite failed: {message}{f' ({name})' if name else ''}. Run `judgestore verify` to check the file; "
        "if it is damaged, restore it from a backup or delete it to recompute its rows",
    )


def _os_failure(path: Path, error: OSError, needed_bytes: int | None) -> JudgestoreError:
    where = Path(error.filename) if isinstance(error.filename, str) else path
    if error.errno in _NO_SPACE:
        return StoreFullError(where, free_bytes=free_bytes(where), needed_bytes=needed_bytes)
    if error.errno == errno.EROFS:
        return StoreNotWritableError(where, "a read-only filesystem")
    if error.errno in (errno.EACCES, errno.EPERM):
        return DatabaseIOError(
            where,
            f"permission denied ({error.strerror}); the operation was not completed. Fix the permissions of "
            "the file and its folder (a writer also creates -wal, -shm and .lock files beside it), or run as "
            "a user who may use them",
        )
    return DatabaseIOError(
        where,
        f"{error.strerror or error}; the operation was not completed. Check the disk and the path (for a "
        "store's file, then run `judgestore verify`)",
    )


def raise_translated(path: Path, error: BaseException, *, needed_bytes: int | None = None) -> NoReturn:
    """Raise the typed error of a failure on ``path`` (see :func:`translated`), chaining the original."""
    raise translated(path, error, needed_bytes=needed_bytes) from error


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


def is_locked(error: OperationalError | sqlite3.OperationalError) -> bool:
    message = str(error.orig if isinstance(error, OperationalError) else error).lower()
    return "database is locked" in message or "database is busy" in message


def retry_while_locked(attempt: Callable[[], T], path: Path, settings: Settings) -> T:
    """Run ``attempt``; if the database stays locked past the busy timeout, back off and retry.

    ``attempt`` may use SQLAlchemy or a raw sqlite3 connection: both kinds of lock error are retried.
    """
    for tries in range(settings.lock_retries + 1):
        try:
            return attempt()
        except (OperationalError, sqlite3.OperationalError) as e:
            if not is_locked(e) or tries == settings.lock_retries:
                if is_locked(e):
                    raise DatabaseBusyError(
                        path,
                        f"still locked after {tries + 1} tries of {settings.busy_timeout_ms} ms; "
                        "another process holds a long write transaction (raise "
                        "JUDGESTORE_BUSY_TIMEOUT_MS or JUDGESTORE_LOCK_RETRIES)",
                    ) from e
                raise
            time.sleep(min(2.0, 0.05 * 2**tries) * (0.5 + random.random()))
    raise AssertionError("unreachable")
