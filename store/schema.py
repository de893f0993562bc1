"""Schema revisions of descriptor databases: classify on open, create, upgrade many.

Contract:

* :func:`classify` tells, with one SELECT on the happy path, whether a database
  is ``empty``, ``current``, ``behind`` (an older revision of ours), ``ahead``
  (a revision this library does not know) or ``foreign`` (tables, but no
  ``judgestore_alembic_version``).
* The Alembic script directory is read once per process (:func:`revisions`);
  Alembic itself is imported only when a migration actually runs.
* :func:`create_at_head` builds an empty database at head inside the caller's
  transaction; :func:`upgrade_database` takes a file lock, re-checks, backs the
  file up, migrates inside one write transaction, verifies row counts and
  restores the backup byte for byte on any failure. :func:`upgrade_databases`
  does that for many files, one bad file never stopping the others; a second
  run does nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from filelock import FileLock
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DatabaseError, OperationalError

from store.errors import (
    CorruptDatabaseError,
    DatabaseFileError,
    ForeignDatabaseError,
    MigrationScriptsError,
    NotADatabaseError,
    SchemaAheadError,
    SchemaBehindError,
)
from store.models import Base, UTCDateTime
from store.settings import Settings

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

VERSION_TABLE = "judgestore_alembic_version"
MIGRATION_OPTIONS: dict[str, Any] = {
    "version_table": VERSION_TABLE,
    "render_as_batch": True,  # SQLite cannot ALTER most things: copy-and-move tables instead
    "compare_type": True,
    "compare_server_default": True,
    "target_metadata": Base.metadata,
    "render_item": lambda kind, obj, _ctx: (
        "sa.DateTime()" if kind == "type" and isinstance(obj, UTCDateTime) else False
    ),
}
_SQLITE_NOTADB, _SQLITE_CORRUPT = 26, 11


class SchemaState(enum.StrEnum):
    EMPTY = "empty"
    CURRENT = "current"
    BEHIND = "behind"
    AHEAD = "ahead"
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class Revisions:
    """What this library's migration scripts know: the head and every revision."""

    head: str
    known: frozenset[str]


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    state: SchemaState
    revision: str | None  # what the file records (None: no version table or no row)
    head: str
    tables: tuple[str, ...] = ()  # filled for empty/foreign only


def migrations_dir() -> Path:
    """The Alembic script directory shipped inside the installed package."""
    return Path(str(files("migrations")))


def read_script_directory(*extra_versions: Path) -> ScriptDirectory:
    """Read the shipped revision scripts, plus those in ``extra_versions`` folders (imports Alembic).

    The extra folders hold revisions that build on the shipped ones (the
    tests' synthetic revisions). Cached callers: :func:`script_directory`.
    """
    from alembic.script import ScriptDirectory

    locations = [migrations_dir() / "versions", *extra_versions]
    return ScriptDirectory(str(migrations_dir()), version_locations=[str(p) for p in locations])


@functools.cache
def script_directory() -> ScriptDirectory:
    return read_script_directory()


@functools.cache
def revisions() -> Revisions:
    """Head and known revisions of the shipped scripts, read once per process."""
    return revisions_of(script_directory())


def revisions_of(script: ScriptDirectory) -> Revisions:
    heads = script.get_heads()
    if len(heads) != 1:
        raise MigrationScriptsError(f"migrations must have exactly one head, found {heads}")
    return Revisions(head=heads[0], known=frozenset(s.revision for s in script.walk_revisions()))


def translated(path: Path, error: DatabaseError) -> Exception:
    """The typed error an SQLite failure stands for ('not a database', 'damaged'), else ``error`` itself."""
    code = getattr(error.orig, "sqlite_errorcode", None)
    if code == _SQLITE_NOTADB:
        return NotADatabaseError(path, "is not an SQLite database (wrong header); it was not touched")
    if code == _SQLITE_CORRUPT:
        return CorruptDatabaseError(
            path,
            "is damaged (truncated or malformed pages); it was not touched. Restore it from "
            "a backup (`*.bak-*` beside it after an upgrade) or delete it to recompute its rows",
        )
    return error


def raise_translated(path: Path, error: DatabaseError) -> NoReturn:
    """Re-raise an SQLite failure as a typed error when it means 'not a database' or 'damaged'."""
    typed = translated(path, error)
    if typed is error:
        raise error
    raise typed from error


def classify(conn: Connection, path: Path, known: Revisions | None = None) -> SchemaStatus:
    """Where the database behind ``conn`` stands; one SELECT when it has our version table."""
    known = known or revisions()
    try:
        rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        if rows and len(rows) == 1:
            revision = rows[0][0]
            if revision == known.head:
                return SchemaStatus(SchemaState.CURRENT, revision, known.head)
            state = SchemaState.BEHIND if revision in known.known else SchemaState.AHEAD
            return SchemaStatus(state, revision, known.head)
    except OperationalError as e:
        if "no such table" not in str(e.orig):
            raise_translated(path, e)
    except DatabaseError as e:
        raise_translated(path, e)
    # No version table, or a version table without exactly one row: is anything else here?
    try:
        tables = tuple(sorted(inspect(conn).get_table_names()))
    except DatabaseError as e:
        raise_translated(path, e)
    state = SchemaState.FOREIGN if tables else SchemaState.EMPTY
    return SchemaStatus(state, None, known.head, tables)


def raise_for_status(status: SchemaStatus, path: Path) -> None:
    """The typed error that refuses to open a database in ``status``, if any."""
    if status.state is SchemaState.BEHIND:
        raise SchemaBehindError(path, str(status.revision), status.head)
    if status.state is SchemaState.AHEAD:
        raise SchemaAheadError(path, str(status.revision), status.head)
    if status.state is SchemaState.FOREIGN:
        raise ForeignDatabaseError(path, list(status.tables))


def migrate(conn: Connection, destination: str = "heads", script: ScriptDirectory | None = None) -> None:
    """Run the upgrade scripts on ``conn`` inside the caller's transaction."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    script = script or script_directory()

    def steps(current: Any, _context: Any) -> Any:
        return script._upgrade_revs(destination, current)  # what `alembic upgrade` itself calls

    context = MigrationContext.configure(connection=conn, opts={**MIGRATION_OPTIONS, "fn": steps})
    with Operations.context(context):
        context.run_migrations()


def create_at_head(conn: Connection) -> None:
    """Build the schema of an empty database (caller holds the write transaction and a file lock)."""
    migrate(conn)


# ---------------------------------------------------------------- upgrades


class UpgradeOutcome(enum.StrEnum):
    UPGRADED = "upgraded"
    UP_TO_DATE = "up-to-date"
    REFUSED = "refused"  # ahead, foreign, not a database, corrupt: never touched
    FAILED = "failed"  # the migration failed and the backup was restored


@dataclass(frozen=True, slots=True)
class UpgradeResult:
    path: Path
    outcome: UpgradeOutcome
    from_revision: str | None
    to_revision: str | None
    backup: Path | None = None
    rows: dict[str, int] | None = None
    error: str | None = None


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def _row_counts(conn: Connection) -> dict[str, int]:
    tables = [t for t in inspect(conn).get_table_names() if t != VERSION_TABLE]
    return {t: conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables}


def _database_files(db_path: Path) -> list[Path]:
    return [p for p in (db_path, Path(f"{db_path}-wal")) if p.exists()]


def _backup(db_path: Path, revision: str | None) -> Path:
    """Copy the database (and its WAL, if it holds anything) byte for byte; return the main copy's path."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    target = db_path.with_name(f"{db_path.name}.bak-{revision}-{stamp}")
    for source in _database_files(db_path):
        if source == db_path or source.stat().st_size > 0:  # an empty WAL (our own connection's) holds nothing
            shutil.copy2(source, Path(str(source).replace(str(db_path), str(target), 1)))
    return target


def _restore(db_path: Path, backup: Path) -> None:
    """Put the backed-up bytes back where they differ (a migration that committed part of its work).

    When the failed migration was rolled back, as transactional DDL is, the
    bytes already match and nothing is written. Without a saved WAL, a live
    one would replay the failed migration's frames onto the restored file: it goes.
    """
    live_wal, saved_wal = Path(f"{db_path}-wal"), Path(f"{backup}-wal")
    for live, saved in ((db_path, backup), (live_wal, saved_wal)):
        if saved.exists() and (not live.exists() or live.read_bytes() != saved.read_bytes()):
            shutil.copy2(saved, live)
    if not saved_wal.exists():
        live_wal.unlink(missing_ok=True)
        Path(f"{db_path}-shm").unlink(missing_ok=True)


def upgrade_database(
    db_path: Path,
    settings: Settings,
    *,
    script: ScriptDirectory | None = None,
    keep_backup: bool = True,
) -> UpgradeResult:
    """Upgrade one database to head; see the module docstring for the guarantees."""
    from store.engine import create_sqlite_engine

    script = script or script_directory()
    known = revisions() if script is script_directory() else revisions_of(script)
    with FileLock(lock_path(db_path)):
        engine = create_sqlite_engine(db_path, settings, pooled=False)
        try:
            result = _upgrade_locked(engine, db_path, known, script)
        finally:
            engine.dispose()
    if result.backup is not None and result.outcome is UpgradeOutcome.UPGRADED and not keep_backup:
        for path in _database_files(result.backup):
            path.unlink()
        result = dataclasses.replace(result, backup=None)
    return result


def _upgrade_locked(engine: Engine, db_path: Path, known: Revisions, script: ScriptDirectory) -> UpgradeResult:
    backup: Path | None = None
    found: str | None = None
    try:
        with engine.connect().execution_options(write=True) as conn, conn.begin():  # BEGIN IMMEDIATE
            status = classify(conn, db_path, known)
            found = status.revision
            if status.state is SchemaState.CURRENT:
                return UpgradeResult(db_path, UpgradeOutcome.UP_TO_DATE, found, found)
            if status.state is SchemaState.EMPTY:
                return UpgradeResult(db_path, UpgradeOutcome.REFUSED, None, None, error="empty database: no tables")
            if status.state is not SchemaState.BEHIND:
                raise_for_status(status, db_path)
            before = _row_counts(conn)
            backup = _backup(db_path, found)
            migrate(conn, script=script)
            after = _row_counts(conn)
            changed = {t: (n, after.get(t)) for t, n in before.items() if after.get(t) != n}
            if changed:
                raise DatabaseFileError(db_path, f"row counts changed during the upgrade (before, after): {changed}")
            reached = classify(conn, db_path, known).revision
    except Exception as e:
        if backup is None:  # refused before anything was written
            if isinstance(e, DatabaseError):  # e.g. not a database at all, failing on BEGIN
                e = translated(db_path, e)
            if isinstance(e, DatabaseFileError | DatabaseError):
                return UpgradeResult(db_path, UpgradeOutcome.REFUSED, found, None, error=str(e))
            raise
        engine.dispose()  # release the file before its bytes are put back
        _restore(db_path, backup)
        return UpgradeResult(db_path, UpgradeOutcome.FAILED, found, None, backup, error=f"{type(e).__name__}: {e}")
    return UpgradeResult(db_path, UpgradeOutcome.UPGRADED, found, reached, backup, before)


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
