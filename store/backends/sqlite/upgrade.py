"""Upgrading descriptor databases to this library's head revision, one file at a time, safely.

Contract:

* :func:`upgrade_database` takes the file's lock (waiting at most the busy
  timeout for another process's upgrade or vacuum), re-checks its revision
  inside it, keeps a byte-for-byte backup beside it
  (:func:`store.layout.backup_path`; the WAL is checkpointed into the file
  first, so that one copy holds every committed row), migrates inside one
  write transaction, verifies the row counts, and restores the backup on any
  failure. Only a ``behind`` database is written; ahead, foreign, empty and
  damaged files (SQLite's ``quick_check``, run before the backup) are reported
  (``refused``) untouched; a current one is ``up-to-date``. A disk without
  room for the backup, or that cannot be written, refuses the upgrade before
  anything is written (a copy that fails midway is removed).
  The backup is copied under a temporary name, flushed to the disk, then
  renamed: a process killed while copying leaves no file under a backup's
  name, only a temporary one that ``judgestore verify`` reports as a stray
  (Ctrl-C while copying removes it).
* :func:`upgrade_databases` does that for many files, one bad file never
  stopping the others; a second run does nothing. :func:`upgrade_store` does
  it for descriptor folders of a store, refusing, read-only, every folder that
  is not ``behind`` (metadata.json that does not match, for instance); a
  file whose write was interrupted in the rollback journal (unreadable
  read-only) is opened for writing, which rolls that write back.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, closing
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from store import schema
from store.backends.sqlite.connections import classify, create_sqlite_engine
from store.backends.sqlite.errors import (
    NEARLY_FULL_BYTES,
    file_locked,
    free_bytes,
    interrupted_write,
    translated,
    write_refusal,
)
from store.backends.sqlite.info import database_info
from store.backends.sqlite.verify import DAMAGE_ADVICE, integrity_damage
from store.errors import DatabaseFileError, StoreFullError
from store.interrupts import MIGRATING, carrying
from store.layout import (
    Location,
    backup_path,
    backup_temp_path,
    database_files,
    database_size,
    shm_path,
    wal_path,
)
from store.reports import UpgradeOutcome, UpgradeResult
from store.schema import (
    VERSION_TABLE,
    DatabaseState,
    Revisions,
    migrate,
    raise_for_status,
    revisions_of,
    status_error,
)
from store.settings import Settings

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

BACKUP = "the upgrade's backup (a copy of the file beside it)"


def _row_counts(conn: Connection) -> dict[str, int]:
    tables = [t for t in inspect(conn).get_table_names() if t != VERSION_TABLE]
    return {t: conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables}


def _checkpoint(db_path: Path) -> None:
    """Write every committed WAL frame into the database file, so that the file alone holds every row.

    Runs while the caller holds the write lock (no frame can be added meanwhile), on a connection of its
    own: a passive checkpoint needs no writer lock. It changes no row, only where the rows live. A reader
    still on an older snapshot can keep frames out of the file: then the upgrade is refused, untouched.
    """
    if not wal_path(db_path).exists():
        return
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        busy, logged, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    if busy or done < logged:
        raise DatabaseFileError(
            db_path,
            f"its write-ahead log could not be checkpointed ({done} of {logged} frames; a reader holds an older "
            "snapshot), so the backup would not hold every row; the file was not upgraded. Retry once readers "
            "have finished",
        )


def _backup(db_path: Path, revision: str | None) -> Path:
    """Checkpoint the WAL into the database, then copy the database file byte for byte; return the copy's path.

    The copy is one self-contained file holding every committed row (``cp`` it in place to go back).
    It is written under a temporary name and renamed once on the disk, so a file under a backup's name is
    always whole: a process killed midway leaves only the temporary (a stray to verify). A copy that fails
    (a full disk) leaves nothing behind and raises the typed error.
    """
    _checkpoint(db_path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = backup_path(db_path, revision, stamp)
    temp = backup_temp_path(target)
    try:
        shutil.copy2(db_path, temp)
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes are on the disk before the name says the backup is whole
        finally:
            os.close(fd)
        os.replace(temp, target)
    except OSError as e:
        temp.unlink(missing_ok=True)
        typed = translated(target, e)
        if isinstance(typed, StoreFullError):
            typed = StoreFullError(
                db_path, free_bytes=typed.free_bytes, needed_bytes=database_size(db_path), needed_for=BACKUP
            )
        raise typed from e
    except BaseException:  # Ctrl-C while copying: only a process killed outright leaves the temporary behind
        temp.unlink(missing_ok=True)
        raise
    return target


Shape = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]  # what _shape reads


def _shape(conn: sqlite3.Connection) -> Shape:
    """What a migration changes: every table, index and trigger as ``sqlite_master`` holds it, and the revision."""
    schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    return schema, conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()


def _restore(db_path: Path, backup: Path, shape: Shape) -> None:
    """Put the backup back where the failed migration left a trace (it committed part of its work).

    ``shape`` is the file's :func:`_shape` before the migration. When the
    migration was rolled back, as transactional DDL is, the file has the same
    shape and nothing is touched: what was committed since is another
    process's (a job of the previous release, holding the file open, whose
    writer waited on the migration's lock), and it stays, with the WAL and
    its index. Otherwise the backup is copied back (it holds every row: the
    WAL was checkpointed into it) and a live WAL, which would replay the
    failed migration's frames onto it, goes. A part of a migration that
    changed rows alone, and committed, is not seen: the shipped migrations
    commit nothing before they end.
    """
    try:
        with closing(sqlite3.connect(db_path)) as conn:
            if _shape(conn) == shape:
                return
    except sqlite3.Error:
        pass  # not even readable: the backup goes back
    shutil.copy2(backup, db_path)
    wal_path(db_path).unlink(missing_ok=True)
    shm_path(db_path).unlink(missing_ok=True)


def upgrade_database(
    db_path: Path,
    settings: Settings,
    *,
    script: ScriptDirectory | None = None,
    keep_backup: bool = True,
) -> UpgradeResult:
    """Upgrade one database to head; see the module docstring for the guarantees."""
    script = script or schema.script_directory()
    known = schema.revisions() if script is schema.script_directory() else revisions_of(script)
    refused = _refused_before_writing(db_path)
    if refused is not None:
        return refused
    with ExitStack() as held:
        try:
            held.enter_context(file_locked(db_path, settings))
        except DatabaseFileError as e:  # held past the busy timeout, or a lock file the disk cannot hold: untouched
            return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, None, None, error=str(e))
        engine = create_sqlite_engine(db_path, settings, pooled=False)
        try:
            result = _upgrade_locked(engine, db_path, known, script)
        finally:
            engine.dispose()
    if result.backup is not None and result.outcome is UpgradeOutcome.UPGRADED and not keep_backup:
        for path in database_files(result.backup):
            path.unlink()
        result = dataclasses.replace(result, backup=None)
    return result


def _refused_before_writing(db_path: Path) -> UpgradeResult | None:
    """The refusal of an upgrade known before any write: no room for the backup, a file or filesystem that may
    not be written."""
    needed, free = database_size(db_path), free_bytes(db_path)
    if free is not None and free < needed + NEARLY_FULL_BYTES:
        full = StoreFullError(db_path, free_bytes=free, needed_bytes=needed + NEARLY_FULL_BYTES, needed_for=BACKUP)
        return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, None, None, error=str(full))
    refusal = write_refusal(db_path)
    if refusal is not None:
        return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, None, None, error=str(refusal))
    return None


EMPTY_REFUSAL = "empty database: no tables"


def _damaged(conn: Connection, db_path: Path) -> DatabaseFileError | None:
    """SQLite's ``quick_check`` of a file about to be migrated, as the error that refuses it; None when whole.

    A migration copies what the tables' b-trees lead to, and the row counts read them the same way: on a damaged
    page the rows the damage hides would be gone from the upgraded file, unnoticed.
    """
    damage = integrity_damage(conn.exec_driver_sql("PRAGMA quick_check").all())
    if damage is None:
        return None
    return DatabaseFileError(
        db_path,
        f"{damage}. Not upgraded (a migration would drop the rows the damage hides); nothing was changed. "
        f"{DAMAGE_ADVICE}",
    )


def would_upgrade(db_path: Path, settings: Settings, known: Revisions) -> UpgradeResult:
    """What :func:`upgrade_database` would do, read-only and without the file's lock: every check it makes
    before it writes (room for the backup, a writable file, the revision, SQLite's ``quick_check``) and the rows
    each table holds; ``would_upgrade`` when they all pass. The migration itself is not run."""
    refused = _refused_before_writing(db_path)
    if refused is not None:
        return refused
    found: str | None = None
    engine = create_sqlite_engine(db_path, settings, readonly=True, pooled=False)
    try:
        with engine.connect() as conn:
            status = classify(conn, db_path, known)
            found = status.revision
            if status.state is DatabaseState.CURRENT:
                return UpgradeResult(str(db_path), UpgradeOutcome.UP_TO_DATE, found, found)
            if status.state is DatabaseState.BEHIND:
                damaged = _damaged(conn, db_path)
                error = None if damaged is None else str(damaged)
            else:
                error = EMPTY_REFUSAL if status.state is DatabaseState.EMPTY else status_error(status, db_path)
            if error is not None:
                return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, found, None, error=error)
            rows = _row_counts(conn)
            conn.rollback()
    except (DBAPIError, sqlite3.Error, OSError) as e:
        return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, found, None, error=str(translated(db_path, e)))
    except DatabaseFileError as e:
        return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, found, None, error=str(e))
    finally:
        engine.dispose()
    return UpgradeResult(str(db_path), UpgradeOutcome.WOULD_UPGRADE, found, known.head, rows=rows)


def _upgrade_locked(engine: Engine, db_path: Path, known: Revisions, script: ScriptDirectory) -> UpgradeResult:
    backup: Path | None = None
    found: str | None = None
    shape: Shape = ([], [])
    try:
        with engine.connect().execution_options(write=True) as conn, conn.begin():  # BEGIN IMMEDIATE
            status = classify(conn, db_path, known)
            found = status.revision
            if status.state is DatabaseState.CURRENT:
                return UpgradeResult(str(db_path), UpgradeOutcome.UP_TO_DATE, found, found)
            if status.state is DatabaseState.EMPTY:
                return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, None, None, error=EMPTY_REFUSAL)
            if status.state is not DatabaseState.BEHIND:
                raise_for_status(status, db_path)
            if (damaged := _damaged(conn, db_path)) is not None:
                raise damaged
            before = _row_counts(conn)
            shape = _shape(conn.connection.driver_connection)  # type: ignore[arg-type]  # the sqlite3 connection
            backup = _backup(db_path, found)
            migrate(conn, script=script)
            after = _row_counts(conn)
            changed = {t: (n, after.get(t)) for t, n in before.items() if after.get(t) != n}
            if changed:
                raise DatabaseFileError(db_path, f"row counts changed during the upgrade (before, after): {changed}")
            reached = classify(conn, db_path, known).revision
    except Exception as e:
        if backup is None:  # refused before anything was written
            if isinstance(e, DBAPIError | sqlite3.Error | OSError):  # not a database, failing on BEGIN; read-only
                e = translated(db_path, e)
            if isinstance(e, DatabaseFileError):
                return UpgradeResult(str(db_path), UpgradeOutcome.REFUSED, found, None, error=str(e))
            raise
        engine.dispose()  # release the file before its bytes are put back
        _restore(db_path, backup, shape)
        if isinstance(e, DBAPIError | sqlite3.Error | OSError):  # a full disk, an I/O error: in the store's words
            e = translated(db_path, e)
        error = str(e) if isinstance(e, DatabaseFileError) else f"{type(e).__name__}: {e}"
        if isinstance(e, StoreFullError):  # said for an upgrade: its backup is the room a retry needs
            error = str(
                StoreFullError(
                    db_path,
                    free_bytes=e.free_bytes,
                    needed_bytes=e.needed_bytes,
                    then=f"run `judgestore db upgrade` again. The file was put back as it was; its backup "
                    f"{backup.name} beside it holds the same bytes: delete it to give a retry the room its own "
                    "backup needs",
                )
            )
        return UpgradeResult(str(db_path), UpgradeOutcome.FAILED, found, None, backup, error=error)
    return UpgradeResult(str(db_path), UpgradeOutcome.UPGRADED, found, reached, backup, before)


# A dry run's word on a file whose write was interrupted (read-only, its revision cannot be read)
INTERRUPTED_FIRST = (
    "a write to it was interrupted: the upgrade opens it for writing first, which rolls that write back, then "
    "migrates it if it is behind"
)


def upgrade_store(
    root: Path,
    locations: Iterable[Location],
    settings: Settings,
    *,
    keep_backup: bool = True,
    script: ScriptDirectory | None = None,
    dry_run: bool = False,
) -> Iterator[UpgradeResult]:
    """Upgrade every ``behind`` database among ``locations``; report the others without writing to them.
    ``dry_run``: what each ``behind`` one would give (:func:`would_upgrade`), nothing written.

    Each database is looked at read-only first (:func:`store.backends.sqlite.info.database_info`,
    metadata.json included): current and empty ones are ``up-to-date`` (an
    empty one is created at head when it is first written); every state but
    ``behind`` is ``refused`` with its reason, and its file is never opened for
    writing. The ``behind`` ones go through :func:`upgrade_databases`.
    """
    known = schema.revisions() if script is None else revisions_of(script)
    for location in locations:
        info = database_info(root, location, settings, known=known, count_rows=False)
        # A write interrupted in the rollback journal cannot be read read-only; opening it for writing rolls it
        # back (then it is current, or behind and upgraded): what InterruptedWriteError tells the user to do.
        interrupted = info.state is DatabaseState.UNREADABLE and interrupted_write(Path(info.where))
        if dry_run and interrupted:
            yield UpgradeResult(info.where, UpgradeOutcome.WOULD_UPGRADE, None, known.head, error=INTERRUPTED_FIRST)
        elif dry_run and info.state is DatabaseState.BEHIND:
            yield would_upgrade(Path(info.where), settings, known)
        elif info.state is DatabaseState.BEHIND or interrupted:
            with carrying(MIGRATING, info.where):  # Ctrl-C in it: the command asks whether its commit finished
                yield from upgrade_databases([Path(info.where)], settings, script=script, keep_backup=keep_backup)
        elif info.ok:
            yield UpgradeResult(info.where, UpgradeOutcome.UP_TO_DATE, info.revision, info.revision)
        else:
            yield UpgradeResult(info.where, UpgradeOutcome.REFUSED, info.revision, None, error=info.error)


def upgrade_databases(
    paths: Iterable[Path],
    settings: Settings,
    *,
    on_result: Callable[[UpgradeResult], None] | None = None,
    script: ScriptDirectory | None = None,
    keep_backup: bool = True,
) -> Iterator[UpgradeResult]:
    """Upgrade each database in turn, yielding one result per file."""
    for path in paths:
        result = upgrade_database(path, settings, script=script, keep_backup=keep_backup)
        if on_result is not None:
            on_result(result)
        yield result
