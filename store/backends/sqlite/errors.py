"""What a failure on a SQLite file means: typed errors naming the file and the next step, and lock retries.

Contract:

* :func:`translated` turns every SQLite, driver or filesystem failure on a
  file into a typed :class:`~store.errors.DatabaseFileError` that names the
  file and the next step: not a database, damaged (pages, or text that is
  not UTF-8), full disk, not writable, busy, an I/O error, a missing table,
  a write interrupted in the rollback journal (a hot ``-journal`` that a
  read-only open cannot roll back: never "not writable", and never to be
  deleted; a read-write open rolls it back),
  and, for whatever SQLite reports that has no name here, an
  :class:`~store.errors.UnexpectedDatabaseError` carrying SQLite's words.
* :func:`write_refusal` says, without writing, why a file could not be
  written (a read-only filesystem, permissions); a full disk is only known
  when a write meets it.
* A file's own lock (:func:`file_locked`: upgrades, vacuums) is waited for
  at most the busy timeout, then :class:`~store.errors.DatabaseBusyError`.
* A lock held past the busy timeout is retried by :func:`retry_while_locked`
  (backoff with jitter, ``lock_retries`` times), then raises
  :class:`~store.errors.DatabaseBusyError`; every writer of a SQLite file
  (descriptor databases, sync bookkeeping) retries through it.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import NoReturn, TypeVar

from filelock import FileLock, Timeout
from sqlalchemy.exc import DBAPIError, OperationalError

from store.errors import (
    CorruptDatabaseError,
    DamagedTextError,
    DatabaseBusyError,
    DatabaseIOError,
    InterruptedWriteError,
    JudgestoreError,
    NotADatabaseError,
    RefusedValueError,
    SchemaMismatchError,
    StoreFullError,
    StoreNotWritableError,
    UnexpectedDatabaseError,
)
from store.layout import JOURNAL_SUFFIX, lock_path, wal_path
from store.schema import foreign_name_error, missing_parts
from store.settings import Settings

T = TypeVar("T")

# SQLite's words for a name a statement uses that the file lacks (the name unqualified)
_MISSING_NAME = re.compile(r"no such (?P<kind>table|column): (?:\S+\.)?(?P<name>\S+)")
_FOREIGN_HINT = "a typo, or one added by hand to some databases only: pick those with a selector"

# SQLite's primary result codes (an extended code's low byte)
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 5, 6, 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_PROTOCOL, _SQLITE_NOLFS, _SQLITE_NOTADB = 13, 14, 15, 22, 26
_SQLITE_CONSTRAINT = 19
_SQLITE_READONLY_ROLLBACK = _SQLITE_READONLY | (3 << 8)  # extended: a hot journal, and no right to roll it back
_SQLITE_OS_FAILURES = frozenset({_SQLITE_PERM, _SQLITE_IOERR, _SQLITE_CANTOPEN, _SQLITE_PROTOCOL, _SQLITE_NOLFS})
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
NEARLY_FULL_BYTES = 1 << 20  # an I/O error with less than this free is the disk filling up
_UNDECODABLE = re.compile(r"could not decode to utf-8 column '([^']*)'", re.IGNORECASE)


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


def interrupted_write(db_path: Path) -> bool:
    """Whether a rollback journal holding a write's undo pages lies beside ``db_path`` (a writer in the middle of
    a transaction, or one that was interrupted: what a read-only open reports as :class:`InterruptedWriteError`)."""
    try:
        return db_path.with_name(db_path.name + JOURNAL_SUFFIX).stat().st_size > 0
    except OSError:
        return False


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
    if primary == _SQLITE_CONSTRAINT:  # the file is sound: a value of the statement broke one of its constraints
        return RefusedValueError(
            path,
            f"refused a value ({message}); nothing of the statement was kept. judgestore checks the rows it writes "
            "before it writes them: if the statement is your own (Store.execute, a session), a value of it is the "
            "cause",
        )
    if code == _SQLITE_READONLY_ROLLBACK:  # a hot journal that a read-only connection cannot roll back
        return InterruptedWriteError(path)
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
            "changed. `judgestore verify` names the rows and the `judgestore delete` that removes each from this "
            "database alone, so that it is recomputed; or restore the file from a backup",
        )
    missing = _MISSING_NAME.match(message)
    if missing is not None and (
        foreign := foreign_name_error(
            path, missing["kind"], missing["name"], message, _FOREIGN_HINT, whole=lambda: _schema_whole(path)
        )
    ):
        return foreign  # a name of the caller's statement (Store.execute), not a part the file lost
    if missing is not None:
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


def _schema_whole(path: Path) -> bool:
    """Whether the file holds every table and column its revision declares (read without writing a byte); False
    where that cannot be read."""
    try:
        with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as conn:
            tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            held = {t: {row[1] for row in conn.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    except (sqlite3.Error, OSError, ValueError):
        return False
    return missing_parts(held) is None


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


def is_locked(error: OperationalError | sqlite3.OperationalError) -> bool:
    message = str(error.orig if isinstance(error, OperationalError) else error).lower()
    return "database is locked" in message or "database is busy" in message


@contextmanager
def file_locked(db_path: Path, settings: Settings) -> Iterator[None]:
    """Hold ``db_path``'s own lock file (what upgrades, vacuums and the creation of its schema take) for the block,
    waiting at most the busy timeout for another process: past it, :class:`DatabaseBusyError` with nothing done
    (an upgrade or a vacuum of a large file elsewhere can hold it for minutes). A lock file that cannot be
    created (a read-only or full disk) raises its typed error."""
    lock = FileLock(lock_path(db_path), timeout=settings.busy_timeout_ms / 1000)
    try:
        lock.acquire()
    except Timeout as e:  # before OSError: filelock's Timeout is a TimeoutError
        raise DatabaseBusyError(
            db_path,
            f"another process (an upgrade, a vacuum) held its lock file {lock.lock_file} past the busy timeout "
            f"({settings.busy_timeout_ms} ms); nothing was changed. Try again once it is done (or raise "
            "JUDGESTORE_BUSY_TIMEOUT_MS)",
        ) from e
    except OSError as e:
        raise translated(db_path, e) from e
    try:
        yield
    finally:
        lock.release()


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
                        f"still locked after {tries + 1} {'try' if tries == 0 else 'tries'} of "
                        f"{settings.busy_timeout_ms} ms; "
                        "another process holds a long write transaction (raise "
                        "JUDGESTORE_BUSY_TIMEOUT_MS or JUDGESTORE_LOCK_RETRIES)",
                    ) from e
                raise
            time.sleep(min(2.0, 0.05 * 2**tries) * (0.5 + random.random()))
    raise AssertionError("unreachable")
